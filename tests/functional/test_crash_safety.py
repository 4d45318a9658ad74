"""Kill a real process (SIGKILL) at every step of allocate and release, restart
with ``accelctl recover``, and check: no leaked mdev, no double assignment, no
lost assignment.  Every step, not one: the steps are recorded from a real run."""

import os
import signal
import subprocess
import sys

import pytest

from tests import ledger_sql
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

CONF = "[devices]\nenabled_mdev_types = nvidia-15\n[libvirt]\nuri =\n"
FOREIGN = "f0f0f0f0-0000-4000-8000-00000000000f"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("crash"), ["nvidia-pf"], gpus=1) as host:
        yield host


def worker(config, operation, instance, count, step="-", nth=1):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.functional.crash_worker",
            config,
            operation,
            instance,
            str(count),
            step,
            str(nth),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def recover(config):
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", config, "recover"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr


def baseline(host, config):
    """Another instance holding one mdev, one free owned mdev, one foreign mdev."""
    host.reset()
    host.create_foreign("0000:84:00.0", "nvidia-15", FOREIGN)
    manager = host.manager(CONF)
    other = manager.allocate("other", 1).uuids
    manager.allocate("spare", 1)
    manager.release("spare")
    manager.ledger.close()
    return other


def check_invariants(host, other, vm_holds):
    # Plain SQL, read-only: the ledger as its file says (tests/ledger_sql.py).
    rows = ledger_sql.rows(host.state_dir)
    sysfs = host.sysfs_uuids()
    assert ledger_sql.pending_intents(host.state_dir) == 0
    assert ledger_sql.unsettled(host.state_dir) == []
    # no leaked mdev: everything in sysfs is recorded or the foreign one
    assert sysfs - {r.uuid for r in rows} <= {FOREIGN}
    assert FOREIGN in sysfs
    # every recorded mdev exists
    assert {r.uuid for r in rows} <= sysfs
    # no lost assignment
    assert [r.uuid for r in rows if r.owner == "other"] == other
    # all or nothing for the crashed operation, and exactly which of the two
    held = [r for r in rows if r.owner == "vm"]
    assert len(held) == vm_holds
    return held


def steps_of(host, config, operation):
    if operation == "release":
        host.manager(CONF).allocate("vm", 3)
    proc = worker(config, operation, "vm", 3)
    assert proc.returncode == 0, proc.stderr
    return [tuple(line.split()) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("operation", ["allocate", "release"])
def test_sigkill_at_every_step_then_recover(host, operation):
    config = host.config(CONF)
    baseline(host, config)
    steps = steps_of(host, config, operation)
    expected = {"allocate": "allocate.assigned", "release": "release.forgotten"}[operation]
    assert (expected, "1") in steps or (expected, "3") in steps
    assert len(steps) >= 4  # every step of the operation, each a kill point
    for step, nth in steps:
        other = baseline(host, config)
        if operation == "release":
            host.manager(CONF).allocate("vm", 3)
        proc = worker(config, operation, "vm", 3, step, nth)
        assert proc.returncode == -signal.SIGKILL, (step, nth, proc.stderr)
        recover(config)
        # The settlement is one commit: killed after it (allocate.assigned), the
        # allocation stands; killed before it, recovery drops all of it.  A
        # release drops the assignments in its first commit, before any step.
        settled = operation == "allocate" and step == "allocate.assigned"
        check_invariants(host, other, 3 if settled else 0)
        # The host stays usable: redo the operation and land in the final state.
        manager = host.manager(CONF)
        if operation == "allocate":
            assert len(manager.allocate("vm", 3).mdevs) == 3
        else:
            manager.release("vm", remove=True)
            assert manager.allocation("vm").mdevs == ()
        manager.ledger.close()
        check_invariants(host, other, 3 if operation == "allocate" else 0)
