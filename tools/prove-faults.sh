#!/usr/bin/env bash
# Prove that the crash-safety and concurrency tests catch what they claim to:
# apply each deliberate fault of tests/faults/*.patch to a throw-away copy of
# HEAD and run the test that must catch it; the fault must make it FAIL.
#
#   tools/prove-faults.sh [PATCH...]      (make prove-faults; needs root and FUSE)
#
# Each patch names the test that catches it, and what its failure must say
# (a failure for another reason is not a catch), in its first lines:
#   # caught-by: tests/functional/test_random_kill.py
#   # expect: leaked
# or, for a test of a real-kernel lab, the lab and the test (run in that lab's guest by
# lab.sh, ~3 minutes each; exit status 1, pytest's "tests failed", is the failure):
#   # caught-by-lab: trixie tests/realkernel/migration/test_migration_real.py::test_x
# Exit status 0 when every fault was caught, 1 otherwise.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$REPO/.venv/bin/python
cd "$REPO"
patches=("$@")
[ ${#patches[@]} -gt 0 ] || patches=(tests/faults/*.patch)
missed=0
for patch in "${patches[@]}"; do
	name=$(basename "$patch" .patch)
	tests=$(sed -n 's/^# caught-by: //p' "$patch")
	lab=$(sed -n 's/^# caught-by-lab: //p' "$patch")
	expect=$(sed -n 's/^# expect: //p' "$patch")
	[ -n "$tests$lab" ] && [ -n "$expect" ] ||
		{ echo "$patch: no '# caught-by:' (or '# caught-by-lab:') and '# expect:' line" >&2; exit 2; }
	work=$(mktemp -d "/tmp/accel-fault-$name.XXXXXX")
	git worktree add -q --detach "$work" HEAD
	trap 'git -C "$REPO" worktree remove --force "$work" 2>/dev/null || true' EXIT
	git -C "$work" apply "$REPO/$patch"
	echo "== $name: expecting ${tests:-$lab} to fail"
	start=$(date +%s)
	failed=no
	if [ -n "$lab" ]; then
		# The lab installs the patched tree into its guest; 70/75 would be the lab
		# itself failing, not the test.
		read -r lab_name lab_tests <<<"$lab"
		rc=0
		(cd "$work" && ACCEL_REALKERNEL_RESULTS="$work.results" \
			ACCEL_REALKERNEL_PYTEST_ARGS="-x $lab_tests" \
			tests/realkernel/lab.sh --lab "$lab_name" >"$work.log" 2>&1) || rc=$?
		[ "$rc" != 1 ] || failed=yes
		cat "$work.results/$lab_name/console.log" >>"$work.log" 2>/dev/null || true
		rm -rf "$work.results"
	else
		# PYTHONPATH: the patched tree wins over the venv's editable install, in
		# every process (children, accelctl, the privsep helper).
		# A leak window is a fraction of one operation: give the harness up to
		# PROVE_KILLS kills (it stops at the first violation; seen: 10-120).
		(cd "$work" && PYTHONPATH=$work ACCEL_KILL_STOP_ON_VIOLATION=1 \
			ACCEL_KILLS=${PROVE_KILLS:-400} ACCEL_KILLS_VFIO=${PROVE_KILLS:-400} \
			ACCEL_KILLS_ATTACH=${PROVE_KILLS:-400} \
			"$PY" -m pytest -q -x -p no:cacheprovider $tests >"$work.log" 2>&1) || failed=yes
	fi
	if [ "$failed" = no ]; then
		echo "== $name: NOT CAUGHT, the test passed ($(($(date +%s) - start)) s; log $work.log)"
		missed=1
	elif ! grep -qE "$expect" "$work.log"; then
		echo "== $name: NOT CAUGHT, the test failed without '$expect' (log $work.log)"
		missed=1
	else
		echo "== $name: caught ($(($(date +%s) - start)) s):"
		grep -m1 -E "$expect" "$work.log" | cut -c1-400 | sed 's/^/   /'
		rm -f "$work.log"
	fi
	git worktree remove --force "$work"
	trap - EXIT
done
exit $missed
