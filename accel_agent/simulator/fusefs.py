"""Serve a :class:`SimulatedHost` as a FUSE filesystem (mfusepy on libfuse3).

Choices, and why:

* **No kernel caching of names or contents** (``entry_timeout=0``,
  ``negative_timeout=0``, ``direct_io``): a write to ``create`` must make
  ``bus/mdev/devices/<uuid>`` visible to the very next ``stat``, and counters
  must be re-read on every ``read``, exactly like sysfs.  ``direct_io`` also
  maps every ``write(2)`` to one ``store`` call (no page-cache merging), which
  is what kernfs does.  Attributes (mode, size, link count) are kept for
  ``attr_timeout``: every path walk still looks each name up (which returns
  them fresh), so only a ``fstat`` of a descriptor held across a change could
  see an old link count; without it, the kernel's permission check asked
  for them again on every path component, a second upcall per component.
* **No flush for attributes** (``FOPEN_NOFLUSH``, libfuse >= 3.11 and Linux
  >= 5.17): sysfs has no ``flush``; without FLUSH an attribute read costs a
  third fewer upcalls.
* **A VFIO group node lets go at close(2)**: the kernel's
  ``vfio_group_fops_release()`` runs before ``close(2)`` (or the death of the
  holder) returns, so the next write finds the group free.  FUSE sends RELEASE
  *after* ``close(2)`` returned, in the background, and a multi-threaded loop
  may serve the caller's next write first: an unbind right after the agent's
  in-use probe then failed with EBUSY (about 3 in 100 on an idle machine).  A
  group node's handle therefore lets go at FLUSH, which ``close(2)`` and a
  dying process's exit wait for.  FLUSH comes at the close of each
  descriptor, not the last: a dup()ed or inherited group descriptor would let
  go early, and nothing here makes one (a choice).  ``raw_fi`` is what lets
  ``open`` set ``noflush`` per file.
* **Errno pass-through**: the model raises ``OSError(errno)``; mfusepy turns
  it into ``-errno`` for the kernel, so ``echo``/``os.write`` see EEXIST,
  EINVAL, ENOSPC, EUSERS, ENODEV as on a real host.
* **Multi-threaded loop**: a remove of a held mdev blocks its FUSE request
  (the writer's ``write(2)`` blocks, as in the kernel) while other requests and
  the control socket's ``release`` keep being served.
* **default_permissions**: the kernel checks the mode bits itself, so a
  non-root reader gets EACCES on ``create`` like on sysfs, while root passes
  (CAP_DAC_OVERRIDE) and then gets the attribute's own EIO on a read of a
  write-only file.  **allow_other** when running as root, so the agent's
  unprivileged reader (another uid) can scan the tree; it needs root or
  ``user_allow_other`` in /etc/fuse.conf, so it is off for non-root users.
* ``O_TRUNC`` (shell ``>``) arrives as a truncate call and is accepted and
  ignored, like sysfs does.  Creating new files gives EACCES, other namespace
  changes EPERM, as sysfs does.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import mfusepy

from accel_agent.simulator.control import FSNAME, SUBTYPE
from accel_agent.simulator.kernfs import Handle
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.tree import oserror

# Seconds the kernel keeps a node's mode, size and link count (module docstring).
ATTR_TIMEOUT = 60.0


class SysfsOperations(mfusepy.Operations):
    """mfusepy operations over a SimulatedHost.  Paths from FUSE are absolute
    (``/class/mdev_bus``); the model takes them relative to its root."""

    use_ns = True

    def __init__(self, host: SimulatedHost, on_init: Callable[[], None] | None = None) -> None:
        self._host = host
        self._on_init = on_init
        self._handles: dict[int, Handle] = {}
        self._ids = itertools.count(1)
        self._hlock = threading.Lock()
        self._time = time.time_ns()

    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        if config_3 is not None:
            # Also passed as -o options; set here too so the values cannot be lost
            # in the option parsing of a different libfuse version.
            config_3.entry_timeout = 0.0
            config_3.attr_timeout = ATTR_TIMEOUT
            config_3.negative_timeout = 0.0
            config_3.direct_io = 1
        if self._on_init is not None:
            self._on_init()

    # -- metadata ---------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = self._host.lstat(path)
        t = self._time
        return {"st_mode": st.mode, "st_nlink": st.nlink, "st_size": st.size,
                "st_uid": 0, "st_gid": 0, "st_atime": t, "st_mtime": t, "st_ctime": t}

    def readdir(self, path: str, fh: int) -> list[Any]:
        entries = self._host.scandir(path)
        here = {"st_mode": self._host.stat(path).mode}
        # Giving the type bits lets scandir()'s is_dir()/is_symlink() answer
        # without an extra lstat per entry.
        return [(".", here, 0), ("..", here, 0),
                *((name, {"st_mode": st.mode}, 0) for name, st in entries)]

    def readlink(self, path: str) -> str:
        return self._host.readlink(path)

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    # -- files ----------------------------------------------------------------------

    # With ``raw_fi`` the file operations get libfuse's ``fuse_file_info``
    # (``fi``); the handle number is its ``fh``.

    def open(self, path: str, fi: Any) -> int:
        # The flags matter to a VFIO group node: a VM opens it read-write.
        handle = self._host.open(path, fi.flags)
        with self._hlock:
            fh = next(self._ids)
            self._handles[fh] = handle
        fi.fh = fh
        if not handle.lets_go_at_close and hasattr(fi, "noflush"):
            fi.noflush = 1  # an attribute: no FLUSH (module docstring)
        return 0

    def _handle(self, fi: Any) -> Handle:
        handle = self._handles.get(fi.fh)
        if handle is None:
            raise oserror(errno.EBADF)
        return handle

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        return self._handle(fi).pread(size, offset)

    def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        # sysfs ignores the offset: every write(2) is one store() of its bytes.
        return self._handle(fi).write(data)

    def truncate(self, path: str, length: int, fi: Any = None) -> int:
        if self._host.lstat(path).is_dir:
            raise oserror(errno.EISDIR)
        return 0

    def flush(self, path: str, fi: Any) -> int:
        """close(2) of a VFIO group node: the group lets go now, before the
        caller's close returns (module docstring).  Attributes ask for no FLUSH."""
        with self._hlock:
            handle = self._handles.get(fi.fh)
        if handle is not None:
            handle.close()
        return 0

    def release(self, path: str, fi: Any) -> int:
        with self._hlock:
            handle = self._handles.pop(fi.fh, None)
        if handle is not None:
            handle.close()  # idempotent: a group node let go at its FLUSH
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._host.lstat(path)
        return 0

    # -- namespace changes: refused like sysfs ---------------------------------------------

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        raise oserror(errno.EACCES)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise oserror(errno.EACCES)

    def mkdir(self, path: str, mode: int) -> int:
        raise oserror(errno.EPERM)

    def unlink(self, path: str) -> int:
        raise oserror(errno.EPERM)

    def rmdir(self, path: str) -> int:
        raise oserror(errno.EPERM)

    def rename(self, old: str, new: str) -> int:
        raise oserror(errno.EPERM)

    def symlink(self, target: str, source: str) -> int:
        raise oserror(errno.EPERM)

    def link(self, target: str, source: str) -> int:
        raise oserror(errno.EPERM)

    def chmod(self, path: str, mode: int) -> int:
        raise oserror(errno.EPERM)

    def chown(self, path: str, uid: int, gid: int) -> int:
        raise oserror(errno.EPERM)


def mount(host: SimulatedHost, mountpoint: str, *, on_init: Callable[[], None] | None = None,
          allow_other: bool | None = None, debug: bool = False) -> None:
    """Serve ``host`` at ``mountpoint`` in the foreground until unmounted or
    signalled (SIGTERM/SIGINT/SIGHUP end the loop and unmount).  Must run in the
    main thread: libfuse installs its signal handlers there."""
    if allow_other is None:
        allow_other = os.geteuid() == 0
    options: dict[str, Any] = {
        "foreground": True,
        "fsname": FSNAME,
        "subtype": SUBTYPE,
        "default_permissions": True,
        "entry_timeout": 0,
        "attr_timeout": ATTR_TIMEOUT,
        "negative_timeout": 0,
        "direct_io": True,
    }
    if allow_other:
        options["allow_other"] = True
    if debug:
        options["debug"] = True
    mfusepy.FUSE(SysfsOperations(host, on_init), mountpoint, raw_fi=True, **options)
