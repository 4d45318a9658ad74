"""The privileged helper under faults (accel_agent.privileged.guard): a helper
that stops answering, or dies with a call in flight, is killed and replaced;
the caller gets PrivilegedHelperUnavailable instead of waiting forever.

Through the REAL privsep-helper daemon on a plain /sys-shaped tree (the
same tree as test_privsep_daemon.py).  A call that would hang is run in a
thread joined with a generous bound: the test fails on a hang instead of
hanging the suite, and asserts nothing about speed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from accel_agent import exception, privileged
from tests.functional.privsep_fixture import PrivsepDaemon, privsep_daemon
from tests.functional.test_privsep_daemon import NV, PCI, U_FIFO, _tree

pytestmark = pytest.mark.privsep

NEW = "5d6e7f80-1a2b-4c3d-8e4f-a0b1c2d3e4f5"
# Far beyond what any of these calls needs, even on a loaded machine: only a
# hang (the behaviour before the guard) reaches it.
HANG = 120.0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[PrivsepDaemon, Path]]:
    root = tmp_path / "sys"
    _tree(root)
    privileged.set_call_timeout(2.0)
    try:
        with privsep_daemon(tmp_path, root) as daemon:
            yield daemon, root
    finally:
        privileged.set_call_timeout(30.0)


def _outcome(call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; its exception (None: it returned).  Fails
    the test when it has not ended within HANG seconds."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            box.append(exc)
        else:
            box.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    if thread.is_alive():
        pytest.fail(f"the privileged call still hangs after {HANG:g} s")
    return box[0]


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs no code either way)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait(predicate: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + HANG
    while not predicate():
        if time.monotonic() > give_up:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def _guard_ok_with_new_pid(old: int) -> bool:
    health = privileged.guard_of(privileged.sysfs_admin).health()
    return health.state == "ok" and health.pid not in (None, old)


def test_a_stopped_helper_is_killed_at_its_deadline_and_replaced(env) -> None:
    daemon, root = env
    create = root / "devices" / "pci0000:80" / PCI / "mdev_supported_types" / NV / "create"
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        error = _outcome(lambda: privileged.create_mdev(PCI, NV, NEW, sysfs_root=str(root)))
        assert isinstance(error, exception.PrivilegedHelperUnavailable), error
        assert "no answer within" in error.message
        _wait(lambda: _dead(daemon.pid), "the stopped helper was killed")
    finally:
        if not _dead(daemon.pid):
            os.kill(daemon.pid, signal.SIGCONT)
    assert create.read_text() == ""  # it was stopped before the write
    health = privileged.guard_of(privileged.sysfs_admin).health()
    assert health.restarts == 1 and "no answer within" in (health.last_error or "")
    _wait(lambda: _guard_ok_with_new_pid(daemon.pid), "a new helper answers")
    # The new helper does the work.
    privileged.create_mdev(PCI, NV, NEW, sysfs_root=str(root))
    assert create.read_text() == NEW


def test_a_helper_killed_with_a_call_in_flight_fails_the_call_and_is_replaced(env) -> None:
    daemon, root = env
    # A remove whose write blocks (a FIFO in place of remove, like a held
    # device's): the call waits in the helper, well within its deadline.
    errors: list[BaseException | None] = []
    caller = threading.Thread(
        target=lambda: errors.append(_outcome(lambda: privileged.remove_mdev(U_FIFO, 60.0))),
        daemon=True,
    )
    caller.start()
    _wait(_call_in_flight, "the remove call waits for the helper's answer")
    os.kill(daemon.pid, signal.SIGKILL)
    caller.join(HANG + 5)
    error = errors[0]
    assert isinstance(error, exception.PrivilegedHelperUnavailable), error
    # Told because the connection ended, not because the deadline passed.
    assert "connection ended" in error.message
    _wait(lambda: _guard_ok_with_new_pid(daemon.pid), "a new helper answers")
    privileged.create_mdev(PCI, NV, NEW, sysfs_root=str(root))


def test_calls_after_the_helper_died_idle_go_to_a_new_helper(env) -> None:
    daemon, root = env
    os.kill(daemon.pid, signal.SIGKILL)
    _wait(lambda: _guard_ok_with_new_pid(daemon.pid), "the dead helper was noticed and replaced")
    error = _outcome(lambda: privileged.create_mdev(PCI, NV, NEW, sysfs_root=str(root)))
    assert error is None


def test_restarts_leave_no_descriptor_behind(env) -> None:
    daemon, _root = env
    before = len(os.listdir("/proc/self/fd"))
    pid = daemon.pid
    for _ in range(3):
        os.kill(pid, signal.SIGKILL)
        _wait(lambda old=pid: _guard_ok_with_new_pid(old), "a new helper answers")
        pid = privileged.guard_of(privileged.sysfs_admin).health().pid
    _wait(lambda: len(os.listdir("/proc/self/fd")) <= before, "the old channels' sockets closed")


def _call_in_flight() -> bool:
    channel = privileged.sysfs_admin.channel
    return channel is not None and bool(channel.outstanding_msgs)


def test_a_remove_slow_to_let_go_gets_its_own_wait_before_the_deadline(env) -> None:
    """A remove waits up to its ``remove_timeout`` in the helper (a device a
    VM is slow to let go): its call's deadline is the call timeout (2 s
    here) plus that wait, so the helper answers MdevRemoveTimeout (the
    device kept) instead of being killed as if it were wedged (issue 33)."""
    daemon, _root = env
    guard = privileged.guard_of(privileged.sysfs_admin)
    restarts = guard.health().restarts  # the guard outlives each test's helper
    remove_timeout = 5.0  # beyond the call timeout: a deadline without it kills
    error = _outcome(lambda: privileged.remove_mdev(U_FIFO, remove_timeout))
    assert isinstance(error, exception.MdevRemoveTimeout), error
    health = guard.health()
    assert (health.restarts, health.pid, health.state) == (restarts, daemon.pid, "ok")
