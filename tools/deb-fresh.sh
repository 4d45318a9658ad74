#!/usr/bin/env bash
# `make deb`, unless dist/ already holds both packages and no file they are built
# from changed since (in `make test` the real-kernel systemd lab has just built
# them: the package tier then checks those same packages instead of spending
# minutes building identical ones).  The rule is the lab's own (lab.sh
# ensure_deb), over every input of the sdist.
set -euo pipefail
cd "$(dirname "$0")/.."
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
