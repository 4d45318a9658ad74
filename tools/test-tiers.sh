#!/usr/bin/env bash
# `make test`'s tiers, with the real-kernel tier beside the others.
#
# The real-kernel labs (tests/realkernel/run.sh: four QEMU guests under TCG, about
# 23 minutes one after the other) run in the background from the start, while the
# unit and functional tiers and the Nova-code tier run in the foreground: those
# spend much of their time waiting (daemons starting, FUSE round trips, timeouts
# that must expire), which the guests' vCPUs use.  Every test is already required
# to be deterministic on a busy machine (make test-stress keeps both cores busy),
# so running them together changes what is measured by nobody.  The package tier
# runs in the foreground too, after the Nova tier, beside the last labs: the labs
# are the longer of the two paths, and once the unit and functional tiers end
# they leave a core idle.  The package tier and the systemd lab, the last lab,
# need the same .deb: whichever asks first builds it, the other waits for it
# (tools/deb-fresh.sh and its lock).  Building it at the start instead would put
# its minutes where both cores are busy.  The labs' output goes to a log and is
# shown, from its start, once the foreground tiers end.
#
# Every tier runs even when an earlier one failed, so one CI run reports all of
# them; the exit status is non-zero when any failed.  Called by `make test` with
# PY, MAKE, PROMTOOL and PYTEST_ARGS/TEST_WORKERS in the environment.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
MAKE=${MAKE:-make}
WORKERS=${TEST_WORKERS:-2}
read -r -a pytest_args <<<"${PYTEST_ARGS:-}"
mkdir -p .stamps
labs_log=.stamps/realkernel.log
failed=()

labs_pid=.stamps/realkernel.pid
rm -f "$labs_pid"
# run.sh is a grandchild, reaped by its own subshell the moment it ends: tail
# --pid below then sees it gone (a child of ours would linger as a zombie,
# which kill -0 still finds).
(
	bash tests/realkernel/run.sh >"$labs_log" 2>&1 &
	echo $! >"$labs_pid"
	wait $!
) &
labs=$!
stop_labs() {
	[ -s "$labs_pid" ] && kill "$(cat "$labs_pid")" 2>/dev/null # run.sh's trap stops QEMU
	wait "$labs" 2>/dev/null
	exit 130
}
trap stop_labs INT TERM
echo "realkernel tier: running in the background (log: $labs_log)"

"$PY" -m pytest -n "$WORKERS" --dist worksteal tests/unit tests/functional "${pytest_args[@]}" ||
	failed+=("unit+functional")
"$MAKE" --no-print-directory test-nova || failed+=("nova")
"$MAKE" --no-print-directory test-package || failed+=("package")

echo "realkernel tier: its log so far, then until it ends:"
while [ ! -s "$labs_pid" ]; do sleep 0.2; done
tail -n +1 -f --pid="$(cat "$labs_pid")" "$labs_log" &
tailer=$!
wait "$labs" || failed+=("realkernel")
# tail ends by itself once run.sh is gone, after printing the rest; a bound in
# case the PID was taken again in between.
for _ in 1 2 3 4 5; do kill -0 "$tailer" 2>/dev/null || break; sleep 1; done
kill "$tailer" 2>/dev/null
wait "$tailer" 2>/dev/null
trap - INT TERM

if [ "${#failed[@]}" -gt 0 ]; then
	echo "make test: FAILED tiers: ${failed[*]}" >&2
	exit 1
fi
echo "make test: every tier passed"
