"""One agent per host (issue 33 item 5): the locks an agent takes before it
touches anything (accel_agent.host_lock).  The daemons themselves:
test_standing_layout.py (a second agent on one simulated host) and
test_daemon_lifecycle.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel_agent import exception, host_lock

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lock_dir(tmp_path) -> str:
    return str(tmp_path / "locks")


def take(lock_dir: str, root: Path, state: Path, config: str = "/etc/a.conf"):
    return host_lock.take_agent_locks(str(root), str(state), [config], "/run/a.sock",
                                      directory=lock_dir)


def test_a_second_agent_on_the_same_sysfs_root_is_refused_naming_the_first(tmp_path, lock_dir):
    """The first agent is another process (the locks are the kernel's, per
    open file): the refusal names its pid and its config files."""
    root, state = tmp_path / "sys", tmp_path / "state-1"
    root.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""\
            import sys
            from accel_agent import host_lock
            host_lock.take_agent_locks({str(root)!r}, {str(state)!r},
                                       ["/etc/first.conf", "/etc/first.d"], "/run/first.sock",
                                       directory={lock_dir!r})
            print("held", flush=True)
            sys.stdin.read()
            """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # The start's check reads who holds them from /proc/locks, in the words
        # the start's take refuses with, and takes nothing itself.
        probed = host_lock.held_locks(str(root), str(state), directory=lock_dir)
        assert [pid for pid, _ in probed] == [holder.pid, holder.pid]
        assert not any(f" {os.getpid()} " in line for line in Path("/proc/locks").read_text()
                       .splitlines() if " FLOCK " in line)
        assert host_lock.held_locks(str(tmp_path / "free"), str(tmp_path / "free-state"),
                                    directory=lock_dir) == []
        with pytest.raises(exception.AgentLockHeld) as refused:
            take(lock_dir, root, tmp_path / "state-2")
        assert refused.value.message == probed[0][1].message
        assert refused.value.message == (
            f"refusing to start: another accel-agent (pid {holder.pid}, config "
            f"/etc/first.conf /etc/first.d) already uses the sysfs root {root} (lock "
            f"{host_lock.lock_path('sysfs', str(root), lock_dir)}); one agent per host: "
            "stop it first"
        )
        # Nothing was left held by the refused one: its state lock is free.
        with pytest.raises(exception.AgentLockHeld):
            take(lock_dir, tmp_path / "other-root", state)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    # The holder exited (the kernel dropped its locks): the root is free.
    take(lock_dir, root, tmp_path / "state-2").release()


def test_the_state_directory_has_its_own_lock(tmp_path, lock_dir):
    """Two agents given different sysfs roots but one state directory (two
    writers of one ledger): refused, naming the state directory."""
    (tmp_path / "root-a").mkdir()
    (tmp_path / "root-b").mkdir()
    first = take(lock_dir, tmp_path / "root-a", tmp_path / "state")
    try:
        with pytest.raises(exception.AgentLockHeld) as refused:
            take(lock_dir, tmp_path / "root-b", tmp_path / "state", "/etc/b.conf")
        assert f"already uses the state directory {tmp_path / 'state'}" in refused.value.message
        assert f"pid {os.getpid()}, config /etc/a.conf" in refused.value.message
        # The refused agent released the sysfs root lock it had taken.
        take(lock_dir, tmp_path / "root-b", tmp_path / "state-b").release()
    finally:
        first.release()


def test_roots_are_compared_by_their_real_path(tmp_path, lock_dir):
    """Agents on different simulated hosts never collide (the tests run many
    at once); a root named through a link is the same root."""
    for name in ("root-a", "root-b"):
        (tmp_path / name).mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "root-a")
    first = take(lock_dir, tmp_path / "root-a", tmp_path / "state-a")
    second = take(lock_dir, tmp_path / "root-b", tmp_path / "state-b")
    try:
        with pytest.raises(exception.AgentLockHeld, match="already uses the sysfs root"):
            take(lock_dir, tmp_path / "link", tmp_path / "state-c")
    finally:
        first.release()
        second.release()


def test_lock_files_are_private_say_who_holds_them_and_go_with_their_holder(tmp_path, lock_dir):
    (tmp_path / "sys").mkdir()
    locks = take(lock_dir, tmp_path / "sys", tmp_path / "state")
    paths = [lock.path for lock in locks.locks]
    try:
        assert stat.S_IMODE(os.stat(lock_dir).st_mode) == 0o755
        assert os.stat(lock_dir).st_uid == os.geteuid()
        for path in paths:
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
            text = Path(path).read_text()
            assert f"pid={os.getpid()}\n" in text and "config=/etc/a.conf\n" in text
            assert f"sysfs_root={tmp_path / 'sys'}\n" in text
    finally:
        locks.release()
    assert not any(os.path.exists(path) for path in paths)
    locks.release()  # twice: nothing


def test_a_lock_directory_others_can_write_is_refused(tmp_path, lock_dir):
    os.mkdir(lock_dir)
    os.chmod(lock_dir, 0o777)
    with pytest.raises(exception.AgentLockUnusable, match="writable by group or others"):
        take(lock_dir, tmp_path, tmp_path / "state")
    os.chmod(lock_dir, 0o755)
    take(lock_dir, tmp_path, tmp_path / "state").release()


def test_a_missing_lock_parent_is_made_once_and_a_deeper_one_named(tmp_path):
    """/run/lock may be missing (an init without systemd-tmpfiles): made, root's
    0755; a path whose grandparent is missing too is refused, naming both."""
    take(str(tmp_path / "lock" / "accel-agent"), tmp_path, tmp_path / "state").release()
    assert stat.S_IMODE(os.stat(tmp_path / "lock").st_mode) == 0o755
    with pytest.raises(exception.AgentLockUnusable, match=r"its parent .* does not exist, nor"):
        take(str(tmp_path / "no" / "lock" / "accel-agent"), tmp_path, tmp_path / "state")
