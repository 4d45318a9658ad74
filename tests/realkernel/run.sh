#!/usr/bin/env bash
# Real-kernel tier (what `make test` runs after the unit and functional tiers):
# the agent against Debian's kernel with the mtty sample mdev driver, in a QEMU
# (TCG) guest built and booted by lab.sh; recipe in research/mtty-lab.md.
#
# Decides whether this host can run the tier.  If not, prints
#   realkernel tier: SKIPPED (reason: ...)
# and exits 0.  Otherwise runs it, prints
#   realkernel: N passed, N failed
# and exits non-zero on any failure (with the tail of the guest's console).
#
# env:
#   ACCEL_REALKERNEL=0        skip the tier
#   ACCEL_REALKERNEL=1        the tier must run: being unable to run is an error
#   (unset)                   run when possible, else skip with the reason
#   ACCEL_REALKERNEL_CACHE, _ABI, _RESULTS, _TIMEOUT, _PYTEST_ARGS: see lab.sh
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ACCEL_REALKERNEL_CACHE:-/var/cache/accel-agent-realkernel}
RESULTS=${ACCEL_REALKERNEL_RESULTS:-$HERE/results}
export ACCEL_REALKERNEL_CACHE=$CACHE ACCEL_REALKERNEL_RESULTS=$RESULTS
MODE=${ACCEL_REALKERNEL:-}
START=$(date +%s)

case "$MODE" in
0)
	echo "realkernel tier: SKIPPED (reason: ACCEL_REALKERNEL=0)"
	exit 0
	;;
1 | "") ;;
*)
	echo "realkernel tier: ACCEL_REALKERNEL must be 0, 1 or unset (got '$MODE')" >&2
	exit 2
	;;
esac

skip() {
	if [ "$MODE" = 1 ]; then
		echo "realkernel tier: FAILED (cannot run and ACCEL_REALKERNEL=1; reason: $1)" >&2
		exit 1
	fi
	echo "realkernel tier: SKIPPED (reason: $1)"
	exit 0
}

# Free MiB on the filesystem that holds $1 (or would, once created).
free_mib() {
	local dir=$1
	while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
	df -Pm "$dir" | awk 'NR == 2 { print $4 }'
}

# The first reason this host cannot run the tier, or nothing.
cannot_run_reason() {
	local path dir
	[ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
	[ "$(uname -m)" = x86_64 ] || { echo "host is $(uname -m); the lab boots Debian's amd64 kernel"; return; }
	[ "${ACCEL_REALKERNEL_GUEST:-}" = 1 ] && { echo "already inside the lab's guest"; return; }
	if [ ! -r /proc/meminfo ] || [ ! -r /proc/self/status ]; then
		echo "/proc is not mounted or not readable"
		return
	fi
	for tool in apt-get apt-cache dpkg-deb dpkg-query flock timeout; do
		command -v "$tool" >/dev/null || { echo "no $tool: not a Debian/APT host"; return; }
	done
	[ -x "$REPO/.venv/bin/python" ] || { echo "$REPO/.venv/bin/python is missing or not executable by this user (make venv)"; return; }
	for path in "$REPO" "$CACHE" "$RESULTS"; do
		[[ $path =~ ^/[A-Za-z0-9._/+-]+$ ]] ||
			{ echo "path '$path' must be absolute and free of spaces (kernel command line, 9p)"; return; }
	done

	# QEMU: present, or installable (root + a candidate in the APT sources).
	if command -v qemu-system-x86_64 >/dev/null; then
		qemu-system-x86_64 -accel help 2>/dev/null | grep -qx tcg ||
			{ echo "this qemu-system-x86_64 has no TCG accelerator"; return; }
		qemu-system-x86_64 -device help 2>/dev/null | grep -q '"virtio-9p-pci"' ||
			{ echo "this qemu-system-x86_64 has no virtio-9p (virtfs) support"; return; }
	elif [ "$(id -u)" != 0 ]; then
		echo "qemu-system-x86_64 is not installed and installing it needs root"
		return
	fi

	# Memory for a 1 GiB guest, also under strict overcommit (vm.overcommit_memory=2).
	local avail_kib limit_kib committed_kib
	avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
	[ "${avail_kib:-0}" -ge $((1536 * 1024)) ] ||
		{ echo "less than 1.5 GiB of memory available for a 1 GiB guest"; return; }
	if [ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" = 2 ]; then
		limit_kib=$(awk '/^CommitLimit:/ { print $2 }' /proc/meminfo)
		committed_kib=$(awk '/^Committed_AS:/ { print $2 }' /proc/meminfo)
		[ $((limit_kib - committed_kib)) -ge $((1536 * 1024)) ] ||
			{ echo "strict overcommit leaves less than 1.5 GiB to commit for the guest"; return; }
	fi

	# Cache: writable; ~400 MB at peak for a first (cold) build, little afterwards.
	dir=$CACHE
	while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
	[ -w "$dir" ] || { echo "cache $CACHE is not writable (set ACCEL_REALKERNEL_CACHE)"; return; }
	if compgen -G "$CACHE/*/kernel" >/dev/null; then
		[ "$(free_mib "$CACHE")" -ge 100 ] || { echo "less than 100 MB free for $CACHE"; return; }
	else
		[ "$(free_mib "$CACHE")" -ge 600 ] ||
			{ echo "less than 600 MB free for a first build in $CACHE"; return; }
	fi
	[ "$(free_mib "$(dirname "$RESULTS")")" -ge 20 ] || { echo "no space for $RESULTS"; return; }
}

reason=$(cannot_run_reason)
[ -z "$reason" ] || skip "$reason"

# --- run the lab; never leave QEMU behind --------------------------------------------

# lab.sh writes why it cannot run (exit status 75) into this file.
export LAB_REASON_FILE
LAB_REASON_FILE=$(mktemp)
LAB_PID=''
# shellcheck disable=SC2317 # called by the EXIT trap
stop_lab() {
	local pid
	if [ -n "$LAB_PID" ] && kill -0 "$LAB_PID" 2>/dev/null; then
		kill -TERM "$LAB_PID" 2>/dev/null
		wait "$LAB_PID" 2>/dev/null
	fi
	# lab.sh kills its QEMU on every exit path; this is the safety net.
	pid=$(cat "$RESULTS/qemu.pid" 2>/dev/null)
	if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = qemu-system-x86 ]; then
		kill -TERM "$pid" 2>/dev/null
	fi
	rm -f "$LAB_REASON_FILE"
}
trap stop_lab EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$HERE/lab.sh" &
LAB_PID=$!
wait "$LAB_PID"
rc=$?
LAB_PID=
elapsed=$(($(date +%s) - START))

if [ "$rc" = 75 ]; then
	skip "$(cat "$LAB_REASON_FILE")"
fi

JUNIT=$RESULTS/realkernel.junit.xml
counts=
if [ -s "$JUNIT" ]; then
	counts=$("$REPO/.venv/bin/python" "$HERE/labtool.py" summary "$JUNIT" 2>/dev/null)
fi
if [ -n "$counts" ]; then
	read -r passed failed errors skipped <<<"$counts"
	line="realkernel: $passed passed, $((failed + errors)) failed"
	[ "$skipped" = 0 ] || line="$line, $skipped skipped"
	echo "$line in ${elapsed}s (junit: $JUNIT)"
	# A guest run in which nothing passed proves nothing (e.g. everything skipped).
	if [ "$rc" = 0 ] && [ "$passed" = 0 ]; then
		echo "realkernel: no test passed in the guest" >&2
		rc=1
	fi
else
	echo "realkernel: no test results (lab exit status $rc) after ${elapsed}s" >&2
	[ "$rc" != 0 ] || rc=1
fi

if [ "$rc" != 0 ]; then
	if [ -s "$RESULTS/console.log" ]; then
		echo "---- last lines of the guest console ($RESULTS/console.log) ----" >&2
		tail -n 60 "$RESULTS/console.log" >&2
		echo "----" >&2
	fi
	exit 1
fi
exit 0
