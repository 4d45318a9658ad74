#!/usr/bin/env bash
# `make deb`, unless dist/ already holds both packages and no file they are built
# from changed since (in `make test` the real-kernel systemd lab and the package
# tier need the same packages: the second one to ask checks those the first one
# built instead of spending minutes building identical ones).  Both call this script, the lab
# (lab.sh ensure_deb) and the package tier (make test-package), and in `make
# test` they run at the same time: the lock makes the second one wait for the
# first one's packages instead of building over them (`make dist` starts with
# rm -rf dist).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .stamps
exec 8>.stamps/deb.lock
flock -w 1800 8 || { echo "deb: timed out waiting for another make deb (.stamps/deb.lock)" >&2; exit 1; }
shopt -s nullglob
agent=(dist/accel-agent_*.deb)
simulator=(dist/accel-agent-simulator_*.deb)
shopt -u nullglob
if [ "${#agent[@]}" -eq 1 ] && [ "${#simulator[@]}" -eq 1 ]; then
	oldest=${agent[0]}
	[ "${simulator[0]}" -nt "$oldest" ] || oldest=${simulator[0]}
	newer=$(find accel_agent systemd packaging etc tools docs README.md BENCHMARKS.md \
		MANIFEST.in pyproject.toml constraints.txt Makefile \
		-newer "$oldest" -type f ! -name '*.pyc' -print -quit 2>/dev/null)
	if [ -z "$newer" ]; then
		echo "deb: dist/ holds $(basename "${agent[0]}") and $(basename "${simulator[0]}"), newer than their sources"
		exit 0
	fi
	echo "deb: $newer changed since dist/'s packages: building them again"
fi
exec "${MAKE:-make}" -s deb
