#!/usr/bin/env bash
# Real-kernel tier (what `make test` runs after the unit and functional tiers): the
# agent against real kernels with the mtty sample driver, in QEMU (TCG) guests built
# and booted by lab.sh, one per lab profile (labs/*.sh):
#   host    the distribution's default kernel, the host's root (docs/design.md §12);
#   trixie  Debian's 6.12 kernel, a trixie userland with QEMU 10 and libvirt 11: a real
#           live migration through two agents (docs/design.md §7.4, §12).
#   igb     lab 2's kernel and userland with QEMU's SR-IOV NIC (-device igb): VF settings
#           and the vfio-pci hand-over on the real igb/igbvf drivers.
#   systemd bookworm's kernel, a bookworm userland booting systemd as PID 1: the package
#           (make deb) installed with apt, its unit driven by systemctl, a reboot.
#
# Decides whether this host can run the tier.  If not, prints
#   realkernel tier: SKIPPED (reason: ...)
# and exits 0.  Otherwise runs each lab, prints
#   realkernel LAB: N passed, N failed in Ns
# then the total, and exits non-zero on any failure (with the tail of that guest's
# console and of the logs its tests kept: both agents', both libvirtds').
#
# env:
#   ACCEL_REALKERNEL=0        skip the tier
#   ACCEL_REALKERNEL=1        the tier must run: being unable to run is an error
#   (unset)                   run when possible, else skip with the reason
#   ACCEL_REALKERNEL_LABS     the labs to run, in order (default "host trixie igb systemd")
#   ACCEL_REALKERNEL_CACHE, _ABI, _TRIXIE_ABI, _RESULTS, _TIMEOUT, _PYTEST_ARGS: see lab.sh
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ACCEL_REALKERNEL_CACHE:-/var/cache/accel-agent-realkernel}
RESULTS=${ACCEL_REALKERNEL_RESULTS:-$HERE/results}
export ACCEL_REALKERNEL_CACHE=$CACHE ACCEL_REALKERNEL_RESULTS=$RESULTS
MODE=${ACCEL_REALKERNEL:-}
LABS=${ACCEL_REALKERNEL_LABS:-host trixie igb systemd}

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

	# Memory for the largest guest (the labs run one after the other) and 512 MiB
	# more, also under strict overcommit (vm.overcommit_memory=2).
	local lab mib guest_mib=0 need_kib avail_kib limit_kib committed_kib
	for lab in $LABS; do
		[[ $lab =~ ^[a-z0-9-]+$ ]] && [ -f "$HERE/labs/$lab.sh" ] ||
			{ echo "no lab profile '$lab' (tests/realkernel/labs/*.sh)"; return; }
		mib=$(sed -n 's/^LAB_MEMORY_MB=\([0-9]*\)$/\1/p' "$HERE/labs/$lab.sh")
		[ "${mib:-0}" -le "$guest_mib" ] || guest_mib=$mib
	done
	need_kib=$(((guest_mib + 512) * 1024))
	avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
	[ "${avail_kib:-0}" -ge "$need_kib" ] ||
		{ echo "less than $((need_kib / 1024)) MiB of memory available for a $guest_mib MiB guest"; return; }
	if [ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" = 2 ]; then
		limit_kib=$(awk '/^CommitLimit:/ { print $2 }' /proc/meminfo)
		committed_kib=$(awk '/^Committed_AS:/ { print $2 }' /proc/meminfo)
		[ $((limit_kib - committed_kib)) -ge "$need_kib" ] ||
			{ echo "strict overcommit leaves less than $((need_kib / 1024)) MiB to commit for the guest"; return; }
	fi

	# Cache: writable; a first (cold) build needs ~400 MB at peak per kernel and
	# ~700 MB for a rootfs with its venv and wheelhouse; little afterwards.
	dir=$CACHE
	while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
	[ -w "$dir" ] || { echo "cache $CACHE is not writable (set ACCEL_REALKERNEL_CACHE)"; return; }
	if compgen -G "$CACHE/*/kernel" >/dev/null && compgen -G "$CACHE/rootfs-*/packages.txt" >/dev/null; then
		[ "$(free_mib "$CACHE")" -ge 200 ] || { echo "less than 200 MB free for $CACHE"; return; }
	else
		[ "$(free_mib "$CACHE")" -ge 1500 ] ||
			{ echo "less than 1500 MB free for a first build in $CACHE"; return; }
	fi
	[ "$(free_mib "$(dirname "$RESULTS")")" -ge 20 ] || { echo "no space for $RESULTS"; return; }
}

reason=$(cannot_run_reason)
[ -z "$reason" ] || skip "$reason"

# --- run the labs; never leave QEMU behind --------------------------------------------

# lab.sh writes why it cannot run (exit status 75) into this file.
export LAB_REASON_FILE
LAB_REASON_FILE=$(mktemp)
LAB_PID='' LAB=''
# shellcheck disable=SC2317 # called by the EXIT trap
stop_lab() {
	local pid
	if [ -n "$LAB_PID" ] && kill -0 "$LAB_PID" 2>/dev/null; then
		kill -TERM "$LAB_PID" 2>/dev/null
		wait "$LAB_PID" 2>/dev/null
	fi
	# lab.sh kills its QEMU on every exit path; this is the safety net.
	pid=$(cat "$RESULTS/$LAB/qemu.pid" 2>/dev/null)
	if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = qemu-system-x86 ]; then
		kill -TERM "$pid" 2>/dev/null
	fi
	rm -f "$LAB_REASON_FILE"
}
trap stop_lab EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# On failure: the end of the guest's console and of every log the tests kept.
show_failure() {
	local out=$1 log
	if [ -s "$out/console.log" ]; then
		echo "---- last lines of the guest console ($out/console.log) ----" >&2
		tail -n 60 "$out/console.log" >&2
	fi
	while IFS= read -r log; do
		echo "---- last lines of $log ----" >&2
		tail -n 25 "$log" >&2
	done < <(find "$out/logs" -name '*.log' -type f 2>/dev/null | sort)
	echo "----" >&2
}

total_passed=0 total_failed=0 status=0
for LAB in $LABS; do
	out=$RESULTS/$LAB
	started=$(date +%s)
	: >"$LAB_REASON_FILE"
	# A lab that fails before its guest runs must not be read from an earlier junit file.
	rm -f "$out/realkernel.junit.xml"
	"$HERE/lab.sh" --lab "$LAB" &
	LAB_PID=$!
	wait "$LAB_PID"
	rc=$?
	LAB_PID=
	elapsed=$(($(date +%s) - started))

	if [ "$rc" = 75 ]; then
		skip "lab $LAB: $(cat "$LAB_REASON_FILE")"
	fi
	JUNIT=$out/realkernel.junit.xml
	counts=
	if [ -s "$JUNIT" ]; then
		counts=$("$REPO/.venv/bin/python" "$HERE/labtool.py" summary "$JUNIT" 2>/dev/null)
	fi
	if [ -n "$counts" ]; then
		read -r passed failed errors skipped <<<"$counts"
		line="realkernel $LAB: $passed passed, $((failed + errors)) failed"
		[ "$skipped" = 0 ] || line="$line, $skipped skipped"
		echo "$line in ${elapsed}s (junit: $JUNIT)"
		total_passed=$((total_passed + passed))
		total_failed=$((total_failed + failed + errors))
		# A guest run in which nothing passed proves nothing (e.g. everything skipped).
		if [ "$rc" = 0 ] && [ "$passed" = 0 ]; then
			echo "realkernel $LAB: no test passed in the guest" >&2
			rc=1
		fi
	else
		echo "realkernel $LAB: no test results (lab exit status $rc) after ${elapsed}s" >&2
		[ "$rc" != 0 ] || rc=1
		total_failed=$((total_failed + 1))
	fi
	if [ "$rc" != 0 ]; then
		if [ -n "$counts" ] && [ "$((failed + errors))" = 0 ]; then
			echo "realkernel $LAB: the lab failed (exit status $rc)" >&2
			total_failed=$((total_failed + 1))
		fi
		show_failure "$out"
		status=1
	fi
done
echo "realkernel: $total_passed passed, $total_failed failed"
exit "$status"
