"""The file side of the simulated host: one node tree under one lock, served as files.

:class:`Kernfs` is what both fronts call (the FUSE filesystem, the static
materialiser) and what in-process tests read and write: ``lstat``,
``readdir``, ``readlink``, ``open``/``read``/``write``.  It knows nothing of
mdevs or PCI: :class:`~.model.SimulatedHost` builds on it and adds the
devices whose attributes live in the tree.

kernfs rules it keeps (fs/kernfs/file.c, fs/seq_file.c):

* a :class:`Handle` keeps the node it opened, so a write after the node was
  removed (parent unregistered, mdev removed) gets ENODEV, as a kernfs node
  that was deactivated does (the node's ``alive`` flag, see :mod:`.tree`);
* a read is a ``seq_file``: the value is produced at offset 0 and later reads
  of the same open file continue in that snapshot;
* ``open`` of a directory is EISDIR, ``readdir`` of a file ENOTDIR,
  ``readlink`` of anything but a link EINVAL.

Threading: one ``RLock`` guards the tree and everything built on it; its
condition ``_cond`` is the one every waiter of the model sleeps on (a
remove blocked on a held device, a stalled read), and whatever may end a
wait notifies it.  Each store runs under the lock, so a store that waits
(a blocked remove) releases it only while it sleeps.

``stall_reads`` plays a slow driver for tests: a read of a matching path
waits on that condition (the lock released meanwhile, so other requests are
served) before it is answered.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from accel_agent.simulator import tree as t
from accel_agent.simulator.tree import Attr, Dir, Link, NodeStat, oserror


@dataclass(frozen=True)
class TreeEntry:
    path: str
    kind: str  # dir | file | link
    mode: int  # permission bits only
    data: bytes | None = None  # file content (None: unreadable, i.e. create/remove)
    target: str | None = None  # link text


class Handle:
    """An open attribute: keeps the node itself, so a write after the node was
    removed (parent unregistered, mdev removed) gets ENODEV like kernfs."""

    def __init__(self, host: Kernfs, node: Attr, path: str,
                 on_close: Callable[[], None] | None = None) -> None:
        self._host = host
        self._node = node
        self.path = path
        self._cache = b""
        self._on_close = on_close

    @property
    def lets_go_at_close(self) -> bool:
        """A VFIO group node's handle: something is let go when it closes."""
        return self._on_close is not None

    def close(self) -> None:
        """The file was closed (FUSE ``flush`` or ``release``); idempotent."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def read(self) -> bytes:
        with self._host._lock:
            return self._node.read()

    def pread(self, size: int, offset: int) -> bytes:
        # seq_file semantics: the value is produced at offset 0 and later reads
        # continue in that same snapshot.
        if offset == 0 or not self._cache:
            self._host._stall_read(self.path)
            self._cache = self.read()
        return self._cache[offset:offset + size]

    def write(self, data: bytes) -> int:
        with self._host._lock:
            return self._node.write(bytes(data))


class Kernfs:
    """The tree, its lock and the file operations (see the module docstring).
    A subclass opens its special nodes (VFIO group stand-ins) in
    :meth:`_open_attr`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._tree = t.Tree()
        # stall_reads(): (path substring, seconds per read or None: until unstall)
        self._stall: tuple[str, float | None] | None = None
        self.stalled_reads = 0  # reads that matched, in all
        self.stalled_readers = 0  # readers waiting now

    def _open_attr(self, node: Attr, path: str, flags: int) -> Handle:
        """Open one attribute, lock held; a subclass adds what its nodes do on
        open (``flags``: open(2)'s, for a node whose opener matters)."""
        return Handle(self, node, path)

    def _locked(self, func: Callable[[], None]) -> Callable[[], None]:
        """``func`` run under the lock (for what a close does, called without it)."""
        def run() -> None:
            with self._lock:
                func()
        return run

    # ---------------------------------------------------------------- file API

    def lstat(self, path: str) -> NodeStat:
        """``lstat``: intermediate links followed, the last component not."""
        with self._lock:
            return t.node_stat(self._tree.lookup(path, follow_final=False))

    def stat(self, path: str) -> NodeStat:
        with self._lock:
            return t.node_stat(self._tree.lookup(path))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except OSError:
            return False
        return True

    def listdir(self, path: str = "") -> list[str]:
        with self._lock:
            node = self._tree.lookup(path)
            if not isinstance(node, Dir):
                raise oserror(errno.ENOTDIR, path)
            return sorted(node.children)

    def scandir(self, path: str = "") -> list[tuple[str, NodeStat]]:
        """Names with their lstat, in one locked pass (what readdir-plus wants)."""
        with self._lock:
            node = self._tree.lookup(path)
            if not isinstance(node, Dir):
                raise oserror(errno.ENOTDIR, path)
            return [(name, t.node_stat(node.children[name])) for name in sorted(node.children)]

    def readlink(self, path: str) -> str:
        with self._lock:
            node = self._tree.lookup(path, follow_final=False)
            if not isinstance(node, Link):
                raise oserror(errno.EINVAL, f"{path} is not a symlink")
            return node.target

    def realpath(self, path: str) -> str:
        with self._lock:
            return "/".join(self._tree.resolve(path)[1])

    def open(self, path: str, flags: int = os.O_RDONLY) -> Handle:
        with self._lock:
            node = self._tree.lookup(path)
            if isinstance(node, Dir):
                raise oserror(errno.EISDIR, path)
            assert isinstance(node, Attr)
            return self._open_attr(node, path, flags)

    @property
    def lock(self) -> threading.RLock:
        """The one lock of the tree and all built on it (for :mod:`.nvml`)."""
        return self._lock

    def read(self, path: str) -> bytes:
        return self.open(path).read()

    def write(self, path: str, data: bytes | str) -> int:
        if isinstance(data, str):
            data = data.encode()
        return self.open(path).write(data)

    def export_tree(self) -> list[TreeEntry]:
        """A consistent snapshot of the whole tree, directories before their
        contents (for the static materialiser)."""
        out: list[TreeEntry] = []
        with self._lock:
            for path, node in self._tree.walk():
                rel = "/".join(path)
                if isinstance(node, Dir):
                    out.append(TreeEntry(rel, "dir", node.mode))
                elif isinstance(node, Link):
                    out.append(TreeEntry(rel, "link", 0o777, target=node.target))
                else:
                    try:
                        data = node.read() if node.show is not None else None
                    except OSError:
                        data = None  # unreadable now (gpu_instance_id of a free VF: ENXIO)
                    out.append(TreeEntry(rel, "file", node.mode, data=data))
        return out

    # ---------------------------------------------------------------- slow reads

    def stall_reads(self, match: str, seconds: float | None = None) -> None:
        """A slow driver, for tests: every read of a file whose path contains
        ``match`` waits ``seconds`` before it is answered, or (None) until
        :meth:`unstall_reads`.  Other requests are served meanwhile."""
        if not match or (seconds is not None and not 0 <= seconds <= 3600):
            raise ValueError("stall_reads needs a path fragment and 0..3600 seconds")
        with self._lock:
            self._stall = (match, seconds)

    def unstall_reads(self) -> None:
        with self._lock:
            self._stall = None
            self._cond.notify_all()

    def _stall_read(self, path: str) -> None:
        stall = self._stall
        if stall is None or stall[0] not in path:
            return
        with self._lock:
            self.stalled_reads += 1
            self.stalled_readers += 1
            try:
                if stall[1] is None:
                    while self._stall is stall:
                        self._cond.wait()
                else:
                    deadline = time.monotonic() + stall[1]
                    while self._stall is stall and time.monotonic() < deadline:
                        self._cond.wait(deadline - time.monotonic())
            finally:
                self.stalled_readers -= 1
