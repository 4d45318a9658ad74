"""Steady-state rescans: re-read only what changes (DESIGN.md §9).

A full :func:`scan` reads every attribute of every type: ~25,000 files on a
host of 256 parents x 24 types.  Between two rescans of a running daemon
almost none of that changes: ``name``, ``description`` and ``device_api`` are
fixed by the driver; the parent set changes only when a driver (un)registers.
What moves is ``available_instances`` and the mdev list.

:class:`Rescanner` keeps the last snapshot and, on each rescan:

* lists ``class/mdev_bus``; a parent that appeared, or whose link now points
  elsewhere, is read in full; a vanished one is dropped;
* re-reads ``available_instances`` of the types asked for (the configured
  type of each parent for the inventory path; every type when a caller
  needs all counters, e.g. ``GET /v1/types``);
* lists ``bus/mdev/devices`` and reads only the mdevs it has not seen, or
  whose link target changed (a UUID removed and re-created elsewhere).

The result is a new immutable :class:`HostSnapshot`, equal to what a full
scan would return for everything it re-read.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from types import MappingProxyType

from accel_agent import exception
from accel_agent.sysfs import scanner
from accel_agent.sysfs.model import HostSnapshot, Mdev, Parent

# parent -> the type ids whose counters to refresh (None: all of them)
CounterFilter = Callable[[Parent], "set[str] | None"]


class Rescanner:
    def __init__(self, sysfs_root: str) -> None:
        self.sysfs_root = sysfs_root
        self._lock = threading.Lock()
        self._snapshot: HostSnapshot | None = None
        self._parent_targets: dict[str, str] = {}
        self._parent_links: dict[str, str] = {}
        self._mdev_targets: dict[str, str] = {}

    def full(self) -> HostSnapshot:
        """A complete scan; resets the cache."""
        snapshot = scanner.scan(self.sysfs_root)
        with self._lock:
            self._remember(snapshot)
        return snapshot

    def _remember(self, snapshot: HostSnapshot) -> None:
        root = snapshot.root
        self._snapshot = snapshot
        self._parent_targets = {
            name: os.path.join(root, p.device_path) for name, p in snapshot.parents.items()
        }
        self._parent_links = {}
        for name in snapshot.parents:
            try:
                self._parent_links[name] = os.readlink(os.path.join(root, scanner.MDEV_BUS, name))
            except OSError:
                continue
        bus = os.path.join(root, scanner.MDEV_DEVICES)
        self._mdev_targets = {}
        for uuid in snapshot.mdevs:
            try:
                self._mdev_targets[uuid] = os.readlink(os.path.join(bus, uuid))
            except OSError:
                continue

    def rescan(self, counters: CounterFilter | None = None) -> HostSnapshot:
        """A snapshot as fresh as a full scan for parents, mdevs and the
        counters ``counters`` selects (all counters when None)."""
        with self._lock:
            if self._snapshot is None:
                snapshot = scanner.scan(self.sysfs_root)
                self._remember(snapshot)
                return snapshot
            return self._rescan(self._snapshot, counters)

    def _rescan(self, old: HostSnapshot, counters: CounterFilter | None) -> HostSnapshot:
        if not os.path.isdir(self.sysfs_root):
            raise exception.SysfsRootNotFound(root=self.sysfs_root)
        walker = scanner._Scan(self.sysfs_root)
        root = walker.root
        parents: dict[str, Parent] = {}
        targets: dict[str, str] = {}
        links: dict[str, str] = {}
        bus_dir = os.path.join(root, scanner.MDEV_BUS)
        bus_fd = scanner.open_dir(bus_dir)
        try:
            names = walker.listdir(bus_fd) if bus_fd is not None else []
            for name in names:
                try:
                    link = os.readlink(name, dir_fd=bus_fd)
                except OSError:
                    link = ""
                cached = old.parents.get(name)
                if cached is not None and link and self._parent_links.get(name) == link:
                    # Same link text as last time: same device (a readlink,
                    # not a realpath walk, per parent).
                    target = self._parent_targets[name]
                    parents[name] = self._refresh_counters(walker, cached, target, counters)
                else:
                    fresh = walker.parent(name)
                    if fresh is None:
                        continue
                    parents[name] = fresh
                    # The scan resolved the device already (as _remember does).
                    target = os.path.join(root, fresh.device_path)
                targets[name] = target
                links[name] = link
        finally:
            if bus_fd is not None:
                os.close(bus_fd)
        mdevs, mdev_targets = self._rescan_mdevs(walker, old)
        by_parent: dict[str, list[Mdev]] = {}
        for mdev in sorted(mdevs.values(), key=lambda m: m.uuid):
            by_parent.setdefault(mdev.parent, []).append(mdev)
        snapshot = HostSnapshot(
            root=root,
            parents=MappingProxyType(parents),
            mdevs=MappingProxyType(mdevs),
            warnings=tuple(walker.warnings),
            by_parent=MappingProxyType({k: tuple(v) for k, v in by_parent.items()}),
        )
        self._snapshot = snapshot
        self._parent_targets = targets
        self._parent_links = links
        self._mdev_targets = mdev_targets
        return snapshot

    @staticmethod
    def _refresh_counters(
        walker: scanner._Scan, parent: Parent, device: str, counters: CounterFilter | None
    ) -> Parent:
        wanted = set(parent.types) if counters is None else (counters(parent) or set())
        wanted &= set(parent.types)
        types = dict(parent.types)
        # Not followed, as in the full scan: a link here could lead out of the root.
        types_fd = scanner.open_dir(os.path.join(device, scanner.SUPPORTED_TYPES), follow=False)
        if types_fd is None:
            walker.warn(f"parent {parent.name}: mdev_supported_types vanished")
            return dataclasses.replace(parent, types=MappingProxyType({}))
        try:
            names, others = scanner.type_dirs(types_fd)
            if others or names != sorted(parent.types):
                # The driver re-registered with other types, or a type is no
                # longer a real directory (one scandir per parent buys this
                # check): read the parent again in full.
                return walker.parent(parent.name) or parent
            for type_id in wanted:
                owner = f"parent {parent.name}: type {type_id}"
                raw = walker.attribute(types_fd, f"{type_id}/available_instances", owner)
                available = (
                    None if raw is None else walker.available_instances(owner, raw)
                )
                if available is None:
                    if raw is None:
                        walker.warn(f"{owner} has no readable available_instances; skipped")
                    del types[type_id]
                    continue
                if available != types[type_id].available_instances:
                    types[type_id] = dataclasses.replace(
                        types[type_id], available_instances=available
                    )
        finally:
            os.close(types_fd)
        return dataclasses.replace(parent, types=MappingProxyType(types))

    def _rescan_mdevs(
        self, walker: scanner._Scan, old: HostSnapshot
    ) -> tuple[dict[str, Mdev], dict[str, str]]:
        bus = os.path.join(walker.root, scanner.MDEV_DEVICES)
        if not os.path.isdir(bus):
            mdevs = walker.mdevs(dict(old.parents))
            return mdevs, {}
        mdevs: dict[str, Mdev] = {}
        targets: dict[str, str] = {}
        bus_fd = scanner.open_dir(bus)
        try:
            for name in walker.listdir(bus):
                try:
                    target = os.readlink(name, dir_fd=bus_fd) if bus_fd is not None else ""
                except OSError:
                    target = ""
                cached = old.mdevs.get(name)
                if cached is not None and target and self._mdev_targets.get(name) == target:
                    mdevs[name] = cached
                    targets[name] = target
                    continue
                mdev = walker.mdev(os.path.join(bus, name))
                if mdev is not None:
                    mdevs[name] = mdev
                    targets[name] = target
        finally:
            if bus_fd is not None:
                os.close(bus_fd)
        return mdevs, targets
