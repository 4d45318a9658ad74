"""The random-kill harness's multi-process model in ``make test``: the real
daemon driven through its API beside reloads, offline readers, restarts,
stalled and killed privileged helpers, held devices and libvirt domains, with
at least 20 SIGKILLs at random instants; every answer the API confirmed must
be in the ledger afterwards (tests/functional/daemonharness.py says what is
checked; ``make soak`` runs it at length)."""

from __future__ import annotations

import os

import pytest

from tests.functional.daemon_fixture import short_dir
from tests.functional.daemonharness import STEPS, DaemonHarness, harness_host
from tests.functional.privsep_fixture import skip_unless_root

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

KILLS = int(os.environ.get("ACCEL_KILLS_DAEMON", "20"))
SEED = int(os.environ.get("ACCEL_KILL_SEED", "20261126"))
STOP_ON_VIOLATION = os.environ.get("ACCEL_KILL_STOP_ON_VIOLATION") == "1"


def test_random_sigkills_of_the_running_daemon_lose_no_confirmed_answer(tmp_path):
    skip_unless_root()
    lines: list[str] = []
    with harness_host(tmp_path) as host, short_dir() as sockdir:
        harness = DaemonHarness(host, sockdir, SEED, lines.append)
        stats = harness.run(KILLS, stop_on_violation=STOP_ON_VIOLATION)
    summary = stats.to_dict()
    print(summary)
    print("\n".join(lines[-40:]))
    assert stats.violations == [], "\n".join(stats.violations[:10])
    assert stats.kills >= KILLS, summary
    assert set(stats.steps) == set(STEPS), summary
    # The model reached what it is for: confirmed answers checked after kills,
    # refused and applied reloads, answers lost to a kill.
    assert stats.confirmed_checked > 0 and sum(stats.lost.values()) > 0, summary
    assert any("refused" in k for k in stats.reloads), summary
    assert any("applied" in k for k in stats.reloads), summary
