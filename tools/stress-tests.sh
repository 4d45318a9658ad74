#!/usr/bin/env bash
# Run the unit and functional tiers RUNS times in a row while another process
# keeps every core busy (stress-ng --cpu 0, one worker per core), as a loaded
# CI machine would: a test that depends on timing fails here.  The tiers run
# as make test runs them (TEST_WORKERS pytest-xdist workers, 2 by default).
#
#   tools/stress-tests.sh [RUNS]        (make test-stress; default 10)
#
# Prints one line per run and exits 1 if any run failed (its log is kept).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-10}
cd "$REPO"
if ! command -v stress-ng >/dev/null; then
	[ "$(id -u)" = 0 ] || { echo "stress-ng is missing (apt-get install stress-ng)" >&2; exit 2; }
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null
fi
stress-ng --cpu 0 --timeout 0 --quiet &
STRESS=$!
trap 'kill $STRESS 2>/dev/null; wait $STRESS 2>/dev/null || true' EXIT
failed=0
for run in $(seq 1 "$RUNS"); do
	log=$(mktemp "/tmp/accel-stress-$run.XXXXXX.log")
	start=$(date +%s)
	if .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist worksteal \
		tests/unit tests/functional >"$log" 2>&1; then
		echo "run $run/$RUNS: $(tail -n 1 "$log") ($(($(date +%s) - start)) s)"
		rm -f "$log"
	else
		echo "run $run/$RUNS: FAILED ($(($(date +%s) - start)) s), log $log"
		grep -E "^(FAILED|ERROR)" "$log" | sed 's/^/    /' || true
		failed=1
	fi
done
exit $failed
