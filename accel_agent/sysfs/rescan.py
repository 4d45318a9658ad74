"""Steady-state rescans: re-read only what changes (docs/design.md §9).

(Why one module of ~540 lines: the rules below, what may be skipped and why
each skip stays true, and the concurrency of overlapping scans are one
argument; each half is only correct given the other.)

A full :func:`scan` reads every attribute of every type: ~25,000 files on a
host of 256 parents x 24 types.  Between two rescans of a running daemon
almost none of that changes: ``name``, ``description`` and ``device_api`` are
fixed by the driver; the parent set changes only when a driver (un)registers.
What moves is ``available_instances`` and the mdev list.

:class:`Rescanner` keeps the last snapshot and, on each rescan:

* lists ``bus/mdev/devices`` and reads only the mdevs it has not seen, or
  whose link target changed (a UUID removed and re-created elsewhere);
  a tree without it (copied without ``bus/``) lists each parent's device
  directory instead, where the kernel puts its mdevs
  (:meth:`scanner._Scan.child_mdevs`), with the same rules;
* lists ``class/mdev_bus``; a parent that appeared, or whose link now points
  elsewhere, is read in full; a vanished one is dropped.  Only the kernel's
  own link (named after the device it leads to, its text ending in that
  name) is trusted by its text; any other entry (an alias, a chain of links)
  is resolved again each time, and settled into one parent per device as a
  full scan does (:meth:`scanner._Scan.settle`);
* re-reads the ``available_instances`` its caller needs: :meth:`rescan`
  those of the types asked for (the configured type of each parent for the
  inventory and every decision of the manager; every type for the daemon's
  periodic safety net), :meth:`listing` only those that can have changed.

Why :meth:`listing` may skip a counter (the daemon answers ``GET
/v1/types``, ``/v1/mdevs`` and ``/v1/inventory`` from it, docs/design.md §9):
``available_instances`` of a type is the room its parent has left, and what
takes room is mdevs.  Room is shared on one *physical GPU*: the types of a
parent share it (a create of one type lowers the others'), and the SR-IOV VFs
of one card share the card's (NVIDIA: a vGPU on one VF zeroes its siblings).
So the counters of a parent can change only when the set of mdevs on its
physical GPU changes, whoever made the change: the agent, another process,
a guest teardown.  A virtual parent (``mtty``, ``matrix``) has no hardware
of its own: its room is whatever its driver module keeps, which may be one
pool for all of the module's parents (mtty's ports are), so for those the
group is the driver instead of the GPU.  The mdev list is cheap to re-read (one directory and one
readlink per mdev), so every listing re-reads it, and re-reads every counter
of a parent whose GPU's mdev set differs from the one listed just before its
counters were last read.  The list is taken *before* the counters, so a
create that races with the read leaves the recorded set behind, and the next
listing reads the counters again: a counter is never stuck stale.

What no mdev change accompanies, and the listing therefore does not see at
once: a driver re-registering a parent with other types under the same link
(the udev watcher and the next rescan's type listing catch it), and room
taken outside the mdev ABI (NVIDIA MIG-backed types after ``nvidia-smi mig``
changes).  The daemon's periodic rescan (``[DEFAULT] rescan_interval``)
re-reads every counter and every mdev, which bounds how long either can go
unseen.

The result is a new immutable :class:`HostSnapshot`, equal to what a full
scan would return for everything it re-read, or the previous snapshot object
itself when nothing changed, so that callers can keep what they built from
it (the daemon keeps the encoded listings).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

from accel_agent import exception
from accel_agent.sysfs import scanner
from accel_agent.sysfs.model import HostSnapshot, Mdev, Parent

# parent -> the type ids whose counters to refresh (None: all of them)
CounterFilter = Callable[[Parent], "set[str] | None"]
# (parent, whether the mdevs on its physical GPU changed since all its
# counters were last read) -> the type ids to re-read (None: all of them)
_Refresh = Callable[[Parent, bool], "set[str] | None"]
# The mdevs sharing a parent's room, as (uuid, link target): listed just
# before all of its counters were last read; None when no list vouches for them.
_Basis = frozenset[tuple[str, str]] | None


class ScanStopped(Exception):
    """The agent is stopping: a scan run inside :func:`interruptible` gave up
    between two parents (or two mdevs) and read nothing more."""


_local = threading.local()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Scans made by this thread inside the block stop (ScanStopped) once
    :meth:`Rescanner.interrupt` was called: the daemon's rescan thread and
    its start-up, whose scans of a large host SIGTERM must not wait for.  An
    API request's scan is short and finishes (the server drains requests)."""
    previous = getattr(_local, "interruptible", False)
    _local.interruptible = True
    try:
        yield
    finally:
        _local.interruptible = previous


@dataclasses.dataclass(frozen=True)
class _State:
    """One scan's result: immutable, published whole or merged (see
    :func:`_merge`).  ``seq``: the scan's number, in the order the scans
    started; ``base_seq``: the state it started from (0: none)."""

    snapshot: HostSnapshot
    # The kernel's own class/mdev_bus links (name -> link text), whose
    # unchanged text means an unchanged device (cacheable_links).
    parent_links: Mapping[str, str]
    mdev_targets: Mapping[str, str]
    # parent -> the mdevs sharing its room (uuid, link target) listed just
    # before all of its counters were last read (None: no list vouches).
    basis: Mapping[str, _Basis]
    # parent -> the scan that last read all of its counters.
    read_by: Mapping[str, int]
    seq: int
    base_seq: int = 0


_NOTHING: Mapping = MappingProxyType({})


class Rescanner:
    """Steady-state rescans (module docstring), safe from any number of threads.

    No lock is held while sysfs is read: a scan starts from the state last
    published, reads without the lock, and publishes its result under it
    (a few dict operations).  So a listing or an allocation never waits for
    another thread's scan, however long that one is (the daemon's periodic
    re-read of every counter takes seconds on a host with thousands of
    parents, minutes behind a slow FUSE tree).  When scans overlap, each
    caller still gets the snapshot of its own reads; what is kept for the
    next scan is, per parent, what was read last, and the newest parent and
    mdev lists (:func:`_merge`)."""

    def __init__(self, sysfs_root: str) -> None:
        self.sysfs_root = sysfs_root
        self._lock = threading.Lock()
        self._state: _State | None = None
        self._next_seq = 1
        self._stop = threading.Event()

    def interrupt(self) -> None:
        """The agent is stopping: scans inside :func:`interruptible` raise
        ScanStopped at their next parent or mdev, now and from now on."""
        self._stop.set()

    def _check_stop(self) -> None:
        if self._stop.is_set() and getattr(_local, "interruptible", False):
            raise ScanStopped("the agent is stopping")

    def seed(self, snapshot: HostSnapshot, mdev_targets: Mapping[str, str] | None) -> bool:
        """Start from a cold scan made moments ago (``scanner.scan``: the
        daemon's start-up check), instead of reading every attribute again:
        the next scan re-reads the parent and mdev lists and the counters it
        needs, like any rescan.  ``mdev_targets``: the mdev links listed just
        before that scan (None: not listed), the basis of its counters when
        the scan found the same mdevs.  False (nothing done) once a scan ran."""
        if mdev_targets is not None and mdev_targets.keys() != snapshot.mdevs.keys():
            mdev_targets = None  # an mdev came or went during the scan
        signatures = (
            None
            if mdev_targets is None
            else _room_signatures(snapshot.parents, snapshot.mdevs, mdev_targets)
        )
        texts = {}
        for name in snapshot.parents:
            try:
                texts[name] = os.readlink(os.path.join(snapshot.root, scanner.MDEV_BUS, name))
            except OSError:
                continue
        links = {name: parent.device_path for name, parent in snapshot.parents.items()}
        state = _State(
            snapshot,
            MappingProxyType(cacheable_links(snapshot.parents, links, texts)),
            MappingProxyType(dict(mdev_targets or {})),
            MappingProxyType({
                name: None if signatures is None else signatures.get(_room(p), frozenset())
                for name, p in snapshot.parents.items()
            }),
            MappingProxyType(dict.fromkeys(snapshot.parents, 0)),
            0,
        )
        with self._lock:
            if self._state is not None:
                return False
            self._state = state
        return True

    def full(self) -> HostSnapshot:
        """A complete scan; what was cached is not used (and is replaced)."""
        return self._scan(lambda parent, gpu_changed: None, reread_mdevs=True, cold=True)

    def rescan(
        self, counters: CounterFilter | None = None, *, reread_mdevs: bool = False
    ) -> HostSnapshot:
        """A snapshot as fresh as a full scan for parents, mdevs and the
        counters ``counters`` selects (all counters when None).
        ``reread_mdevs``: read every mdev again, even those whose link is
        unchanged (the periodic safety net)."""

        def refresh(parent: Parent, gpu_changed: bool) -> set[str] | None:
            return None if counters is None else (counters(parent) or set())

        return self._scan(refresh, reread_mdevs)

    def listing(self) -> HostSnapshot:
        """A snapshot whose every counter is true, re-reading only those that
        can have changed since they were read (see the module's docstring)."""
        return self._scan(lambda parent, gpu_changed: None if gpu_changed else set())

    def _scan(self, refresh: _Refresh, reread_mdevs: bool = False, cold: bool = False
              ) -> HostSnapshot:
        with self._lock:
            base = None if cold else self._state
            seq = self._next_seq
            self._next_seq += 1
        if base is None:
            # The first scan reads every parent in full, after the mdev list,
            # like a new parent of a steady rescan: its counters come with
            # their basis, so the first listing re-reads none of them.
            base = _State(_EMPTY, _NOTHING, _NOTHING, _NOTHING, _NOTHING, 0)
            refresh, reread_mdevs = (lambda parent, gpu_changed: None), True
        state = self._rescan(base, refresh, reread_mdevs, seq)
        with self._lock:
            self._state = state if cold else _merge(self._state, state)
        return state.snapshot

    def _rescan(self, old: _State, refresh: _Refresh, reread_mdevs: bool, seq: int) -> _State:
        if not os.path.isdir(self.sysfs_root):
            raise exception.SysfsRootNotFound(root=self.sysfs_root)
        walker = scanner._Scan(self.sysfs_root)
        root = walker.root
        # The mdevs first: a counter read after the list can only be fresher
        # than the list, which the next rescan notices (module docstring).
        listed = self._rescan_mdevs(walker, old, reread_mdevs)
        if listed is None:
            # No bus/mdev/devices: each parent's device directory lists its
            # mdevs (scanner.child_mdevs); those known from the last scan
            # are listed now, before any counter, like the bus.
            listed_early = self._child_mdevs(
                walker, old, {p.device_path for p in old.snapshot.parents.values()},
                reread_mdevs,
            )
        fresh_texts: dict[str, str] = {}  # entries resolved again: name -> link text
        trusted: dict[str, str] = {}  # the next rescan's parent_links
        cached: set[str] = set()  # device directories whose parent is reused
        basis: dict[str, _Basis] = {}
        read_by: dict[str, int] = {}
        bus_dir = os.path.join(root, scanner.MDEV_BUS)
        bus_fd = scanner.open_dir(bus_dir)
        try:
            names = walker.listdir(bus_fd) if bus_fd is not None else []
            for name in names:
                self._check_stop()
                try:
                    text = os.readlink(name, dir_fd=bus_fd)
                except OSError:
                    text = ""
                reused = old.snapshot.parents.get(name)
                if reused is not None and text and old.parent_links.get(name) == text:
                    # The kernel's link, same text as last time: same device
                    # (a readlink, not a realpath walk, per parent).
                    walker.links[name] = reused.device_path
                    if reused.device_path not in walker.devices:
                        walker.devices[reused.device_path] = reused
                        cached.add(reused.device_path)
                    trusted[name] = text
                else:
                    # New, moved, or not the kernel's own link: resolved (and
                    # its device read, unless an entry before led there).
                    walker.parent(name)
                    fresh_texts[name] = text
        finally:
            if bus_fd is not None:
                os.close(bus_fd)
        parents = walker.settle()
        listed_late: set[str] = set()  # device directories listed after their counters
        if listed is None:
            # A parent new to this scan (read in full above) is listed only
            # now, after its counters: no list vouches for them (basis None,
            # re-read by the next listing).
            now_paths = {p.device_path for p in parents.values()}
            listed_late = now_paths - listed_early.keys()
            late = self._child_mdevs(walker, old, listed_late, reread_mdevs)
            mdevs, mdev_targets = {}, {}
            for path in sorted(now_paths):
                found, targets = late.get(path) or listed_early[path]
                mdevs.update(found)
                mdev_targets.update(targets)
            mdevs = dict(sorted(mdevs.items()))  # in UUID order, as the bus lists them
        else:
            mdevs, mdev_targets = listed
        signatures = _room_signatures(parents, mdevs, mdev_targets)
        for name, parent in parents.items():
            now = signatures.get(_room(parent), frozenset())
            if parent.device_path not in cached:
                # Read in full above, after the mdev list (unless listed late).
                basis[name] = None if parent.device_path in listed_late else now
                read_by[name] = seq
                continue
            self._check_stop()
            known = old.basis.get(name)
            gpu_changed = known is None or known != now
            wanted = refresh(parent, gpu_changed)
            fresh = self._refresh_counters(walker, parent, wanted)
            parents[name] = fresh
            read_all = wanted is None or fresh.types.keys() != parent.types.keys()
            basis[name] = now if read_all else known
            read_by[name] = seq if read_all else old.read_by.get(name, 0)
        trusted.update(cacheable_links(parents, walker.links, fresh_texts))
        if _unchanged(old.snapshot, parents, mdevs, walker.warnings):
            snapshot = old.snapshot
        else:
            snapshot = _snapshot(root, parents, mdevs, walker.warnings)
        return _State(
            snapshot,
            MappingProxyType(trusted),
            MappingProxyType(mdev_targets),
            MappingProxyType(basis),
            MappingProxyType(read_by),
            seq,
            old.seq,
        )

    @staticmethod
    def _refresh_counters(
        walker: scanner._Scan, parent: Parent, wanted: set[str] | None
    ) -> Parent:
        """``parent`` with the counters of ``wanted`` (None: all) re-read; the
        same object when none changed."""
        if wanted is not None and not (wanted & parent.types.keys()):
            return parent  # nothing to read: no syscall at all
        wanted = set(parent.types) if wanted is None else wanted & parent.types.keys()
        types = dict(parent.types)
        changed = False
        # Not followed, as in the full scan: a link here could lead out of the root.
        types_dir = f"{walker.root}/{parent.device_path}/{scanner.SUPPORTED_TYPES}"
        types_fd = scanner.open_dir(types_dir, follow=False)
        if types_fd is None:
            walker.warn(f"parent {parent.name}: mdev_supported_types vanished")
            return dataclasses.replace(parent, types=MappingProxyType({}))
        try:
            names, others = scanner.type_dirs(types_fd)
            if others or names != sorted(parent.types):
                # The driver re-registered with other types, or a type is no
                # longer a real directory (one scandir per parent buys this
                # check): read the parent again in full.
                return walker.reread(parent) or parent
            for type_id in wanted:
                if not types[type_id].has_create:
                    # 0 whatever its counter says; a create file does not
                    # appear in a type the driver registered (a re-registration
                    # changes the listing above and rereads the parent).
                    continue
                owner = f"parent {parent.name}: type {type_id}"
                raw = walker.attribute(types_fd, f"{type_id}/available_instances", owner)
                available = (
                    None if raw is None else walker.available_instances(owner, raw)
                )
                if available is None:
                    if raw is None:
                        walker.warn(f"{owner} has no readable available_instances; skipped")
                    del types[type_id]
                    changed = True
                    continue
                if available != types[type_id].available_instances:
                    types[type_id] = dataclasses.replace(
                        types[type_id], available_instances=available
                    )
                    changed = True
        finally:
            os.close(types_fd)
        if not changed:
            return parent
        return dataclasses.replace(parent, types=MappingProxyType(types))

    @staticmethod
    def mdev_targets(sysfs_root: str) -> dict[str, str] | None:
        """uuid -> link target of bus/mdev/devices (None without it): what
        :meth:`seed` wants listed before a cold scan."""
        bus = os.path.join(sysfs_root, scanner.MDEV_DEVICES)
        bus_fd = scanner.open_dir(bus)
        if bus_fd is None:
            return None
        targets: dict[str, str] = {}
        try:
            for name in scanner._Scan.listdir(bus_fd):
                with contextlib.suppress(OSError):
                    targets[name] = os.readlink(name, dir_fd=bus_fd)
        finally:
            os.close(bus_fd)
        return targets

    def _child_mdevs(
        self, walker: scanner._Scan, old: _State, device_paths: set[str], reread: bool
    ) -> dict[str, tuple[dict[str, Mdev], dict[str, str]]]:
        """device directory -> (its mdevs, their "targets"), listed from the
        directory itself (without bus/mdev/devices), reading only mdevs new
        there (every one with ``reread``).  The target of such an mdev is its
        device directory, which is what the bus's link leads to."""
        listed: dict[str, tuple[dict[str, Mdev], dict[str, str]]] = {}
        for path in device_paths:
            self._check_stop()
            mdevs: dict[str, Mdev] = {}
            targets: dict[str, str] = {}
            for uuid in walker.child_mdevs(path):
                target = f"{path}/{uuid}"
                cached = old.snapshot.mdevs.get(uuid)
                if not reread and cached is not None and old.mdev_targets.get(uuid) == target:
                    mdevs[uuid] = cached
                else:
                    mdev = walker.mdev_at(uuid, os.path.join(walker.root, target))
                    if mdev is None:
                        continue  # removed while it was read: not listed
                    mdevs[uuid] = cached if cached == mdev else mdev
                targets[uuid] = target
            listed[path] = (mdevs, targets)
        return listed

    def _rescan_mdevs(
        self, walker: scanner._Scan, old: _State, reread: bool = False
    ) -> tuple[dict[str, Mdev], dict[str, str]] | None:
        """The mdevs of bus/mdev/devices and their link targets, reading only
        new or moved ones (every one with ``reread``); None without that
        directory."""
        bus = os.path.join(walker.root, scanner.MDEV_DEVICES)
        if not os.path.isdir(bus):
            return None
        mdevs: dict[str, Mdev] = {}
        targets: dict[str, str] = {}
        bus_fd = scanner.open_dir(bus)
        try:
            for name in walker.listdir(bus):
                self._check_stop()
                try:
                    target = os.readlink(name, dir_fd=bus_fd) if bus_fd is not None else ""
                except FileNotFoundError:
                    continue  # removed since the listing: not listed, not a warning
                except OSError:
                    target = ""
                cached = old.snapshot.mdevs.get(name)
                if (
                    not reread
                    and cached is not None
                    and target
                    and old.mdev_targets.get(name) == target
                ):
                    mdevs[name] = cached
                    targets[name] = target
                    continue
                mdev = walker.mdev(os.path.join(bus, name))
                if mdev is not None:
                    # An unchanged mdev keeps its object (snapshot identity).
                    mdevs[name] = cached if cached == mdev else mdev
                    targets[name] = target
        finally:
            if bus_fd is not None:
                os.close(bus_fd)
        return mdevs, targets


_EMPTY = HostSnapshot(
    root="",
    parents=MappingProxyType({}),
    mdevs=MappingProxyType({}),
    warnings=(),
    by_parent=MappingProxyType({}),
)


def _snapshot(
    root: str, parents: Mapping[str, Parent], mdevs: Mapping[str, Mdev], warnings: list[str]
) -> HostSnapshot:
    by_parent: dict[str, list[Mdev]] = {}
    for mdev in sorted(mdevs.values(), key=lambda m: m.uuid):
        by_parent.setdefault(mdev.parent, []).append(mdev)
    return HostSnapshot(
        root=root,
        parents=MappingProxyType(dict(parents)),
        mdevs=MappingProxyType(dict(mdevs)),
        warnings=tuple(warnings),
        by_parent=MappingProxyType({k: tuple(v) for k, v in by_parent.items()}),
    )


def _merge(published: _State | None, new: _State) -> _State:
    """What to keep when ``new`` finishes: itself when nothing was published
    since it started (the usual case); otherwise the parent and mdev lists
    of the scan that started last, and for each parent there (the same
    device) what the scan that read its counters last read: its counters and
    basis agree with each other, whichever scan read them."""
    if published is None or published.seq == new.base_seq:
        return new
    newest, other = (new, published) if new.seq > published.seq else (published, new)
    parents = dict(newest.snapshot.parents)
    basis = dict(newest.basis)
    read_by = dict(newest.read_by)
    links = dict(newest.parent_links)
    taken = False
    for name, parent in newest.snapshot.parents.items():
        theirs = other.snapshot.parents.get(name)
        if (
            theirs is not None
            and theirs.device_path == parent.device_path
            and other.read_by.get(name, 0) > newest.read_by.get(name, 0)
        ):
            parents[name] = theirs
            basis[name] = other.basis.get(name)
            read_by[name] = other.read_by[name]
            links.pop(name, None)  # resolved again next time
            if name in other.parent_links:
                links[name] = other.parent_links[name]
            taken = True
    if not taken:
        return newest
    snapshot = _snapshot(
        newest.snapshot.root, parents, newest.snapshot.mdevs, list(newest.snapshot.warnings)
    )
    return _State(
        snapshot,
        MappingProxyType(links),
        newest.mdev_targets,
        MappingProxyType(basis),
        MappingProxyType(read_by),
        newest.seq,
    )


def cacheable_links(
    parents: Mapping[str, Parent], links: Mapping[str, str], texts: Mapping[str, str]
) -> dict[str, str]:
    """name -> link text of the class/mdev_bus entries a rescan may trust by
    their text alone: the kernel's own, named after the device they lead to
    and whose text ends in that name.  An alias, or a link to another link,
    is resolved again each time: the link it passes through may change
    while its own text does not."""
    trusted = {}
    for name, text in texts.items():
        parent = parents.get(name)
        if (
            parent is not None
            and text
            and links.get(name) == parent.device_path
            and os.path.basename(text.rstrip("/")) == name
        ):
            trusted[name] = text
    return trusted


def _room(parent: Parent) -> str:
    """The parents whose mdevs take room from each other: those of one
    physical GPU, or of one driver for virtual parents (module docstring)."""
    if parent.pci_address is not None:
        return parent.physical_gpu
    return f"driver {parent.driver}"


def _room_signatures(
    parents: Mapping[str, Parent], mdevs: Mapping[str, Mdev], targets: Mapping[str, str]
) -> dict[str, frozenset[tuple[str, str]]]:
    """room (:func:`_room`) -> the mdevs on its parents, as (uuid, link target)."""
    in_room: dict[str, set[tuple[str, str]]] = {}
    for uuid, mdev in mdevs.items():
        parent = parents.get(mdev.parent)
        if parent is not None:
            in_room.setdefault(_room(parent), set()).add((uuid, targets.get(uuid, "")))
    return {room: frozenset(items) for room, items in in_room.items()}


def _unchanged(
    old: HostSnapshot,
    parents: Mapping[str, Parent],
    mdevs: Mapping[str, Mdev],
    warnings: list[str],
) -> bool:
    return (
        len(parents) == len(old.parents)
        and all(old.parents.get(name) is parent for name, parent in parents.items())
        and len(mdevs) == len(old.mdevs)
        and all(old.mdevs.get(uuid) is mdev for uuid, mdev in mdevs.items())
        and tuple(warnings) == old.warnings
    )
