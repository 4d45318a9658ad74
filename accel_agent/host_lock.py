"""One agent per host: the locks an agent takes before it touches anything.

Two agents on one host undo each other's work: two writers of one ledger,
two Placement reporters of one host, or a second agent with a ledger of its
own that types VFs the first one then finds foreign.  So before the socket,
the ports, the ledger or any device, the daemon takes two host-wide locks
and refuses to start when another agent holds either:

* one keyed by the real path of ``[DEFAULT] sysfs_root``: one agent per set
  of devices (``/sys`` on a real host; each simulated host of the tests has a
  root of its own, so their agents never collide);
* one keyed by the real path of ``[DEFAULT] state_dir``: one writer of a
  ledger, even between agents given different sysfs roots.

Both live in :data:`LOCK_DIR` (``/run/lock/accel-agent``: a tmpfs, emptied at
boot, so no lock outlives the host's run), a directory made root's own
(mode 0755) and refused when someone else could write it; each file is 0600
and says who holds it (pid, config files, sysfs root, state directory), so
the refusal names the other agent.  The state directory is not used for its
lock: a file there before the ledger's first open would read as an agent
that ran before and lost its ledger (devices.ledger).

The locks are ``flock`` locks: the kernel drops them when the holder dies,
whatever killed it, so a lock that is held is an agent that runs.  The file
is unlinked by its holder at a clean stop; a taker checks that the file it
locked is still the one at the path (another agent may have unlinked it in
between) and tries again if not.

``accelctl``'s offline writers take neither lock: they are not agents; the
manager's file lock in ``state_dir`` serialises them with the daemon.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from accel_agent import exception

LOCK_DIR = "/run/lock/accel-agent"
LOCK_DIR_MODE = 0o755
LOCK_FILE_MODE = 0o600
# Files of another shape than ours are never read further than this.
_MAX_HOLDER = 64 * 1024


@dataclass(frozen=True)
class Holder:
    """What an agent writes into the lock files it holds."""

    pid: int
    sysfs_root: str
    state_dir: str
    config: tuple[str, ...]
    socket: str

    def text(self) -> str:
        return (
            f"pid={self.pid}\n"
            f"config={' '.join(self.config)}\n"
            f"sysfs_root={self.sysfs_root}\n"
            f"state_dir={self.state_dir}\n"
            f"socket={self.socket}\n"
        )


def describe(text: str) -> str:
    """The other agent as its lock file says it: pid and config files."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    pid = fields.get("pid", "").strip() or "?"
    config = fields.get("config", "").strip() or "the default files"
    return f"pid {pid}, config {config}"


def lock_path(kind: str, path: str, directory: str | None = None) -> str:
    """The lock file of ``kind`` (sysfs, state) for ``path``, by its real path."""
    real = os.path.realpath(path)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(directory or LOCK_DIR, f"{kind}-{digest}.lock")


def ensure_lock_dir(directory: str) -> None:
    """``directory`` as root's own (0755, made if missing); refused when it is
    not a directory, not ours, or writable by group or others: whoever can
    write it can delete a lock file and start a second agent."""
    parent = os.path.dirname(directory)
    try:
        # /run/lock is the FHS's, made by systemd-tmpfiles at boot; a host
        # without it (an init without tmpfiles, a container) gets it as root's
        # own 0755, which is what the agent's lock directory needs above it.
        os.mkdir(parent, LOCK_DIR_MODE)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise exception.AgentLockUnusable(
            lock=directory,
            reason=f"its parent {parent} does not exist, nor {os.path.dirname(parent)}",
        ) from None
    except OSError as exc:
        raise exception.AgentLockUnusable(lock=directory, reason=_reason(exc)) from None
    else:
        os.chmod(parent, LOCK_DIR_MODE)  # mkdir's mode went through the umask
    try:
        os.mkdir(directory, LOCK_DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise exception.AgentLockUnusable(lock=directory, reason=_reason(exc)) from None
    else:
        os.chmod(directory, LOCK_DIR_MODE)  # mkdir's mode went through the umask
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode):
        raise exception.AgentLockUnusable(
            lock=directory, reason="it is not a directory (remove it)"
        )
    if found.st_uid != os.geteuid():
        raise exception.AgentLockUnusable(
            lock=directory,
            reason=f"the directory belongs to uid {found.st_uid}, not to the agent's "
            f"uid {os.geteuid()} (remove it)",
        )
    if found.st_mode & 0o022:
        raise exception.AgentLockUnusable(
            lock=directory,
            reason=f"the directory is writable by group or others (mode "
            f"{stat.S_IMODE(found.st_mode):04o}): chmod 0755 it",
        )


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class HeldLock:
    """One lock file, locked by this process until :meth:`release`."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlink the file (while still holding it: a taker that opened it
        meanwhile sees that it is gone and tries again), then unlock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.unlink(self.path)
        os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def take(path: str, what: str, holder: Holder) -> HeldLock:
    """Lock ``path`` for this agent, writing ``holder`` into it; raises
    AgentLockHeld naming the agent that holds it."""
    for _attempt in range(100):
        try:
            fd = os.open(
                path,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                LOCK_FILE_MODE,
            )
        except OSError as exc:
            raise exception.AgentLockUnusable(lock=path, reason=_reason(exc)) from None
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
                raise exception.AgentLockUnusable(
                    lock=path, reason="it is not a regular file of the agent's user (remove it)"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise exception.AgentLockUnusable(lock=path, reason=_reason(exc)) from None
                text = os.pread(fd, _MAX_HOLDER, 0).decode("utf-8", "replace")
                raise exception.AgentLockHeld(
                    holder=describe(text), what=what, lock=path
                ) from None
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is None or current.st_ino != found.st_ino:
                # Its holder unlinked it between our open and our lock: the
                # lock that counts is on the file now at the path.
                os.close(fd)
                continue
            os.fchmod(fd, LOCK_FILE_MODE)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.text().encode("utf-8", "surrogateescape"), 0)
            return HeldLock(path, fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    raise exception.AgentLockUnusable(
        lock=path, reason="it kept being replaced while it was taken"
    )


class AgentLocks:
    """The two locks of one agent (sysfs root, state directory)."""

    def __init__(self, locks: Sequence[HeldLock]) -> None:
        self.locks = list(locks)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
        self.locks = []


def take_agent_locks(
    sysfs_root: str,
    state_dir: str,
    config: Sequence[str],
    socket: str,
    directory: str | None = None,
) -> AgentLocks:
    """Both locks, or AgentLockHeld / AgentLockUnusable and none held."""
    directory = directory or LOCK_DIR
    ensure_lock_dir(directory)
    holder = Holder(
        pid=os.getpid(),
        sysfs_root=os.path.realpath(sysfs_root),
        state_dir=os.path.realpath(state_dir),
        config=tuple(config),
        socket=socket,
    )
    taken: list[HeldLock] = []
    try:
        taken.append(take(
            lock_path("sysfs", sysfs_root, directory),
            f"the sysfs root {holder.sysfs_root}",
            holder,
        ))
        taken.append(take(
            lock_path("state", state_dir, directory),
            f"the state directory {holder.state_dir}",
            holder,
        ))
    except BaseException:
        AgentLocks(taken).release()
        raise
    return AgentLocks(taken)


# --- the start's check: who holds a lock, without taking it -------------------------------

PROC_LOCKS = "/proc/locks"


def _flock_holders(proc_locks: str = PROC_LOCKS) -> dict[tuple[int, int, int], int]:
    """(major, minor, inode) -> pid of every FLOCK lock the kernel lists
    (``/proc/locks``: ``1: FLOCK  ADVISORY  WRITE 4242 fd:01:12345 0 EOF``,
    the device's major and minor in hex)."""
    holders: dict[tuple[int, int, int], int] = {}
    try:
        with open(proc_locks, encoding="ascii", errors="replace") as listing:
            lines = listing.read(1 << 20).splitlines()
    except OSError:
        return holders
    for line in lines:
        fields = line.split()
        # A lock that waits for another is listed with "->" before its fields.
        if fields[1:2] == ["->"]:
            fields = fields[:1] + fields[2:]
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            holders[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
        except ValueError:
            continue
    return holders


def held_locks(
    sysfs_root: str, state_dir: str, directory: str | None = None,
    proc_locks: str = PROC_LOCKS,
) -> list[tuple[int, exception.AgentLockHeld]]:
    """The agent locks held now: (the holder's pid as the kernel lists it,
    the refusal the start's :func:`take` would raise); read-only (never locks, never creates:
    a probe that locked even for an instant could refuse a real start).  What
    it cannot read (no lock directory yet, /proc not mounted) is no lock."""
    directory = directory or LOCK_DIR
    holders = _flock_holders(proc_locks)
    found = []
    for kind, path, what in (
        ("sysfs", sysfs_root, f"the sysfs root {os.path.realpath(sysfs_root)}"),
        ("state", state_dir, f"the state directory {os.path.realpath(state_dir)}"),
    ):
        lock = lock_path(kind, path, directory)
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
            pid = holders.get(key)
            if pid is None:
                continue
            text = os.pread(fd, _MAX_HOLDER, 0).decode("utf-8", "replace")
        finally:
            os.close(fd)
        found.append((pid, exception.AgentLockHeld(holder=describe(text), what=what, lock=lock)))
    return found
