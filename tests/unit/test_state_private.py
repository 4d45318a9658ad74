"""Nothing in the state directory is another user's to read or lock, whatever
the directory's mode (issue 33, item 11): with ``state_dir`` pre-created
0755 the manager's lock file was 0644, and any user who opened it and took a
shared ``lockf`` made root's allocations wait until they let go.  Each of
the manager's lock files (the lock's name and the name an older agent takes,
both taken by every operation so that the two releases serialise during an
upgrade) is private alike.

The manager over a static simulated tree, in process (the lock is taken by
every mutation: ``allocate`` here); the other holder of the lock is a real
second process.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices import manager as manager_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from accel_agent.devices.protocol import LEGACY_LOCK_NAME, LOCK_NAME, LOCK_NAMES
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.configutil import make_conf
from tests.unit.test_sysfs_hostile import NO_HANG, bounded

TYPE = "nvidia-35"
NOBODY = 65534


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # a host's usual umask: what made the file 0644
    try:
        yield
    finally:
        os.umask(old)


def manager(root: str, state: Path, on_step=None) -> manager_mod.DeviceManager:
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    return manager_mod.DeviceManager(
        sysfs_root=root,
        policy=policy_mod.build_policy(conf),
        host="testhost",
        ledger=ledger_mod.Ledger(str(state)),
        writer=writers.DirectWriter(root),
        on_step=on_step,
    )


def allocate(root: str, state: Path, instance: str = "vm-1") -> list[str]:
    """One mutation (it takes the manager's lock), in a thread: a lock held
    by another process must not hang the test."""
    devices = manager(root, state)
    try:
        return bounded(lambda: devices.allocate(instance, 1), []).uuids
    finally:
        devices.ledger.close()


@pytest.fixture
def host(tmp_path) -> str:
    return materialise(SimulatedHost(build_spec(["nvidia-pf"], gpus=1)), tmp_path / "sys")


def mode_and_owner(path: Path) -> tuple[str, int]:
    found = path.stat()
    return f"{stat.S_IMODE(found.st_mode):04o}", found.st_uid


def test_the_lock_file_is_private_in_a_state_directory_others_may_list(
    tmp_path, host, umask_022
):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    allocate(host, state)
    assert LOCK_NAMES == (LOCK_NAME, LEGACY_LOCK_NAME)
    for name in LOCK_NAMES:
        assert mode_and_owner(state / name) == ("0600", os.geteuid()), name
    # The ledger and SQLite's files beside it (they copy the ledger's mode).
    for name in ("ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"):
        if (state / name).exists():
            assert mode_and_owner(state / name)[0] == "0600", name


@pytest.mark.parametrize("name", LOCK_NAMES)
def test_a_lock_file_another_process_opened_while_it_was_readable_blocks_nothing(
    tmp_path, host, umask_022, name
):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    lock = state / name
    lock.touch(mode=0o644)  # as oslo.concurrency made it
    old_inode = lock.stat().st_ino
    # Another process holds a shared lockf on it, as any user who could open
    # it could (read access is all lockf's shared lock needs).
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         f"f = open({str(lock)!r})\n"
         "fcntl.lockf(f, fcntl.LOCK_SH)\n"
         "print('held', flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        # Before: the allocation waited for as long as the holder liked.
        assert len(allocate(host, state)) == 1
        assert holder.poll() is None  # it still holds its lock: of a file that is gone
    finally:
        holder.kill()
        holder.wait(NO_HANG)
    assert lock.stat().st_ino != old_inode
    assert mode_and_owner(lock) == ("0600", os.geteuid())


@pytest.mark.parametrize("name", LOCK_NAMES)
def test_a_lock_path_that_is_no_regular_file_is_one_error_naming_it(tmp_path, host, name):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    fifo = state / name
    os.mkfifo(fifo)
    devices = manager(host, state)
    try:
        with pytest.raises(exception.LedgerError) as refused:
            bounded(lambda: devices.allocate("vm-1", 1), [str(fifo)])
    finally:
        devices.ledger.close()
    assert refused.value.message == (
        f"mdev ledger error: the manager's lock file {fifo} is a FIFO, not a regular file; "
        "remove it (the agent makes a new one)"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a process of another user")
def test_a_user_cannot_open_the_lock_file_to_hold_it(host, umask_022):
    # Not under tmp_path (0700 above it): a directory another user may enter.
    top = Path(tempfile.mkdtemp(prefix="accel-state-"))
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir(mode=0o755)
        allocate(host, state)
        for name in LOCK_NAMES:
            lock = state / name
            # It can list the directory (0755), and it could open the 0644 file.
            tried = subprocess.run(
                ["/bin/sh", "-c", f"ls {top / 'state'} && exec 3< {lock}"],
                user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True,
                timeout=NO_HANG,
            )
            assert name in tried.stdout
            assert tried.returncode != 0
            assert "Permission denied" in tried.stderr
    finally:
        shutil.rmtree(top)


# Another process tries each lock file as oslo.concurrency's external lock
# takes it (fasteners: an exclusive lockf), without waiting: "held" when
# someone holds it.
TRY_LOCK = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'a')\n"
    "try:\n"
    "    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "except OSError:\n"
    "    print('held')\n"
    "else:\n"
    "    print('free')\n"
)


def try_lock(path: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(path)],
        capture_output=True, text=True, check=True, timeout=NO_HANG,
    ).stdout.strip()


def test_an_operation_holds_the_lock_an_older_agent_takes_too(tmp_path, host):
    """During an upgrade an older process (an offline accelctl, the old daemon
    stopping) takes the lock by its former name only: an operation holds
    both names, so the two never interleave, whichever starts first (an
    older process's lock makes this one wait in turn: the same lockf)."""
    state = tmp_path / "state"
    seen: dict[str, dict[str, str]] = {}

    def at_step(step: str) -> None:
        if step == "allocate.intent":  # inside the operation: between its writes
            seen[step] = {name: try_lock(state / name) for name in LOCK_NAMES}

    devices = manager(host, state, on_step=at_step)
    try:
        assert len(bounded(lambda: devices.allocate("vm-1", 1), []).uuids) == 1
    finally:
        devices.ledger.close()
    held = seen["allocate.intent"]
    assert held[LOCK_NAME] == "held", "the operation's lock is not held"
    assert held[LEGACY_LOCK_NAME] == "held", "the lock by the name older releases take is free"
    # ... and let go after it: nobody waits on a lock no operation holds.
    assert {name: try_lock(state / name) for name in LOCK_NAMES} == {
        LOCK_NAME: "free", LEGACY_LOCK_NAME: "free"
    }


def test_an_existing_ledger_readable_by_others_is_made_private(tmp_path, umask_022):
    state = tmp_path / "state"
    ledger_mod.Ledger(str(state)).close()
    book = ledger_mod.Ledger(str(state))  # keeps -wal and -shm while open
    try:
        files = [state / n for n in ("ledger.sqlite3", "ledger.sqlite3-wal",
                                     "ledger.sqlite3-shm") if (state / n).exists()]
        assert len(files) == 3
        for path in files:
            path.chmod(0o644)  # a copy restored with cp, an older tool
        ledger_mod.Ledger(str(state), read_only=True).close()  # a reader changes nothing
        assert {mode_and_owner(p)[0] for p in files} == {"0644"}
    finally:
        book.close()
    ledger_mod.Ledger(str(state)).close()  # the writer's open
    for path in files:
        if path.exists():
            assert mode_and_owner(path)[0] == "0600", path
    assert mode_and_owner(state / "ledger.sqlite3")[0] == "0600"
