"""A tiny in-memory sysfs: directories, attributes and relative symlinks.

Both fronts (FUSE and the static materialiser) and in-process tests read the
same node tree, so they cannot disagree about layout or contents.  The tree
is not thread-safe on its own: :class:`~accel_agent.simulator.kernfs.Kernfs` (the
host's file side) guards every access with its lock.

Attributes behave like kernfs ones: ``show`` computes the value on each read
(so counters are always fresh), ``store`` is called with the raw bytes of one
``write(2)``, and an attribute removed from the tree is marked dead so that a
file descriptor opened before the removal gets ENODEV, as a kernfs node that
was deactivated does.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Path = tuple[str, ...]

DIR_MODE = 0o755
RO_MODE = 0o444
WO_MODE = 0o200
RW_MODE = 0o644
# sysfs reports every attribute as one page long, whatever its content.
ATTR_SIZE = 4096
_MAX_LINKS = 40  # the VFS's own limit (ELOOP)


def oserror(code: int, detail: str | None = None) -> OSError:
    """An OSError carrying a kernel errno; both fronts pass ``.errno`` through."""
    msg = os.strerror(code)
    return OSError(code, f"{msg} ({detail})" if detail else msg)


class Dir:
    __slots__ = ("children", "mode", "subdirs")

    def __init__(self, mode: int = DIR_MODE) -> None:
        # Changed only through Tree (mkdir, add, remove), which keeps
        # ``subdirs`` (the count ``st_nlink`` needs) in step.
        self.children: dict[str, Node] = {}
        self.mode = mode
        self.subdirs = 0

    def put(self, name: str, node: Node) -> None:
        old = self.children.get(name)
        self.subdirs += isinstance(node, Dir) - isinstance(old, Dir)
        self.children[name] = node

    def pop(self, name: str) -> Node | None:
        node = self.children.pop(name, None)
        self.subdirs -= isinstance(node, Dir)
        return node


class Attr:
    __slots__ = ("alive", "mode", "show", "store")

    def __init__(
        self,
        show: bytes | Callable[[], bytes] | None = None,
        store: Callable[[bytes], int] | None = None,
        mode: int | None = None,
    ) -> None:
        self.show = show
        self.store = store
        if mode is None:
            mode = RW_MODE if (show is not None and store) else (WO_MODE if store else RO_MODE)
        self.mode = mode
        self.alive = True

    def read(self) -> bytes:
        if not self.alive:
            raise oserror(errno.ENODEV, "attribute removed")
        if self.show is None:
            # dev_attr_show() without a show method: -EIO (root gets past the mode bits).
            raise oserror(errno.EIO, "write-only attribute")
        return self.show() if callable(self.show) else self.show

    def write(self, data: bytes) -> int:
        if not self.alive:
            raise oserror(errno.ENODEV, "attribute removed")
        if self.store is None:
            raise oserror(errno.EIO, "read-only attribute")
        if not data:
            return 0  # kernfs returns before calling store for an empty write
        return self.store(data)


class Link:
    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        self.target = target


Node = Dir | Attr | Link


@dataclass(frozen=True)
class NodeStat:
    """What ``lstat`` reports: full ``st_mode`` (type bits included), size, links."""

    mode: int
    size: int
    nlink: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


def node_stat(node: Node) -> NodeStat:
    if isinstance(node, Dir):
        return NodeStat(stat.S_IFDIR | node.mode, 0, 2 + node.subdirs)
    if isinstance(node, Link):
        return NodeStat(stat.S_IFLNK | 0o777, len(node.target), 1)
    return NodeStat(stat.S_IFREG | node.mode, ATTR_SIZE, 1)


def relative(from_dir: Path, to: Path) -> str:
    """The relative link text from directory ``from_dir`` to ``to`` (both from root),
    the way sysfs spells its links (``../../devices/...``)."""
    common = 0
    for a, b in zip(from_dir, to, strict=False):
        if a != b:
            break
        common += 1
    ups = [".."] * (len(from_dir) - common)
    return "/".join(ups + list(to[common:])) or "."


def split(path: str | Path) -> Path:
    if isinstance(path, tuple):
        return path
    return tuple(c for c in path.split("/") if c and c != ".")


class Tree:
    """The node tree plus path resolution with symlink following.

    Resolved paths are remembered until the tree next changes: the FUSE
    front resolves the whole path from the root on every request (one per
    path component of every lookup, thousands a second during a scan), and
    the tree changes only on a create, a remove, a (un)registration."""

    def __init__(self) -> None:
        self.root = Dir()
        self._resolved: dict[tuple[str | Path, bool], tuple[Node, Path]] = {}

    def _changed(self) -> None:
        self._resolved.clear()

    # -- building -----------------------------------------------------------------

    def mkdir(self, path: Path) -> Dir:
        """``mkdir -p``: the directory at ``path``, created with its ancestors."""
        node = self.root
        for name in path:
            child = node.children.get(name)
            if child is None:
                child = Dir()
                node.put(name, child)
                self._changed()
            elif not isinstance(child, Dir):
                raise AssertionError(f"{'/'.join(path)}: {name} is not a directory")
            node = child
        return node

    def add(self, path: Path, node: Node) -> Node:
        self.mkdir(path[:-1]).put(path[-1], node)
        self._changed()
        return node

    def attr(self, path: Path, show: bytes | str | Callable[[], bytes] | None = None,
             store: Callable[[bytes], int] | None = None, mode: int | None = None) -> Attr:
        if isinstance(show, str):
            show = show.encode()
        node = Attr(show, store, mode)
        self.add(path, node)
        return node

    def symlink(self, path: Path, target: Path) -> Link:
        node = Link(relative(path[:-1], target))
        self.add(path, node)
        return node

    def remove(self, path: Path) -> Node | None:
        """Detach ``path`` (and everything below it); attributes become dead."""
        try:
            parent = self.lookup(path[:-1], follow_final=False)
        except OSError:
            return None
        if not isinstance(parent, Dir):
            return None
        node = parent.pop(path[-1])
        if node is not None:
            self._changed()
            _kill(node)
        return node

    # -- resolution ----------------------------------------------------------------------

    def resolve(self, path: str | Path, follow_final: bool = True) -> tuple[Node, Path]:
        """The node at ``path`` and its physical path (links followed on the way,
        ``..`` taken physically after a link, as the VFS does)."""
        key = (path, follow_final)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = self._resolve(path, follow_final)
        return found

    def _resolve(self, path: str | Path, follow_final: bool) -> tuple[Node, Path]:
        pending = deque(split(path))
        stack: list[tuple[str, Node]] = []
        node: Node = self.root
        hops = 0
        while pending:
            name = pending.popleft()
            if name == "..":
                if stack:
                    stack.pop()
                node = stack[-1][1] if stack else self.root
                continue
            if not isinstance(node, Dir):
                raise oserror(errno.ENOTDIR, "/".join(n for n, _ in stack))
            child = node.children.get(name)
            if child is None:
                raise oserror(errno.ENOENT, "/".join([*(n for n, _ in stack), name]))
            if isinstance(child, Link) and (pending or follow_final):
                hops += 1
                if hops > _MAX_LINKS:
                    raise oserror(errno.ELOOP, name)
                target = child.target
                if target.startswith("/"):
                    stack.clear()
                    node = self.root
                pending.extendleft(reversed(split(target)))
                continue
            stack.append((name, child))
            node = child
        return node, tuple(n for n, _ in stack)

    def lookup(self, path: str | Path, follow_final: bool = True) -> Node:
        return self.resolve(path, follow_final)[0]

    def walk(self) -> Iterator[tuple[Path, Node]]:
        """Pre-order walk (a directory before its contents), names sorted."""
        todo: list[tuple[Path, Node]] = [((), self.root)]
        while todo:
            path, node = todo.pop()
            yield path, node
            if isinstance(node, Dir):
                for name in sorted(node.children, reverse=True):
                    todo.append(((*path, name), node.children[name]))


def _kill(node: Node) -> None:
    if isinstance(node, Attr):
        node.alive = False
    elif isinstance(node, Dir):
        todo = [node]
        while todo:
            d = todo.pop()
            for child in d.children.values():
                if isinstance(child, Attr):
                    child.alive = False
                elif isinstance(child, Dir):
                    todo.append(child)
