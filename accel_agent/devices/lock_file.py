"""The manager's lock file: one no other user can open, so no other user can
hold the lock.

oslo.concurrency's external lock (fasteners) opens ``<state_dir>/<name>``
with ``open(path, "a")`` and takes a POSIX ``lockf`` on it: the file is
created 0666 & ~umask (0644), and any user who can read a file can take a
shared ``lockf`` on it.  One such user makes every allocation of root's
wait for as long as they like, in a state directory that is merely 0755.
:func:`private_lock_dir` runs before lockutils opens the file and makes
sure that it is a regular file of this process's user, mode 0600.

A lock file found with another mode or owner is not chmod-ed but replaced
by a new file (a new inode, atomically renamed over it): a process that
opened the old one while it was readable keeps its descriptor through a
chmod, and could still hold the old file's lock; the old inode locks
nothing any more.  That happens once, on the first operation after an
older agent made the file.

No descriptor of the lock file is opened here: closing any descriptor of
a file drops every POSIX lock this process holds on it, and another thread
of the process may hold the lock at that moment.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile

from accel_agent import exception
from accel_agent.config import files as safe_files

LOG = logging.getLogger(__name__)


def _fresh_file(directory: str) -> str:
    """A new empty file in ``directory``, mode 0600, no descriptor left open."""
    fd, path = tempfile.mkstemp(dir=directory, prefix=".lock-")
    os.close(fd)  # no one else has it: closing it drops no one's lock
    return path


def private_lock_dir(directory: str, name: str) -> str:
    """``directory``, once ``directory/name`` is a regular file of this
    user's, mode 0600 (made, or put in place of another); LedgerError naming
    the path when it cannot be."""
    path = os.path.join(directory, name)
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None:
        if not stat.S_ISREG(found.st_mode):
            raise exception.LedgerError(
                reason=f"the manager's lock file {path} is a {safe_files.kind(found.st_mode)}, "
                "not a regular file; remove it (the agent makes a new one)"
            )
        if found.st_uid == os.geteuid() and not stat.S_IMODE(found.st_mode) & 0o077:
            return directory
    try:
        fresh = _fresh_file(directory)
        try:
            if found is None:
                try:
                    os.link(fresh, path)  # never over a file another process made meanwhile
                except FileExistsError:
                    return private_lock_dir(directory, name)
            else:
                os.replace(fresh, path)
                LOG.warning(
                    "the manager's lock file %s was mode %04o (owner uid %d), which let others "
                    "open it and hold the lock: replaced by a new file of mode 0600",
                    path, stat.S_IMODE(found.st_mode), found.st_uid,
                )
        finally:
            if os.path.lexists(fresh):
                os.unlink(fresh)
    except OSError as exc:
        raise exception.LedgerError(
            reason=f"cannot make the manager's lock file {path} private: {exc.strerror}"
        ) from None
    return directory
