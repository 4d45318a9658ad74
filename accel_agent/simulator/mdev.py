"""The mdev side of the simulated host: parents, their types, mdevs and their group nodes.

:class:`MdevBus` owns every mdev parent and every mdev of the model and the
files the mdev core gives them; :class:`~.model.SimulatedHost` wires it to
the tree, the PCI bus and the event log.  Like :class:`~.pci.PciBus` it is
not thread-safe on its own: the host calls it under its lock, and every
store it installs runs under that lock (:mod:`.kernfs`).

Layout it adds (beside the model module's)::

  <parent>/mdev_supported_types/<type>/{name?,description?,device_api,
      available_instances,create,devices/<uuid> -> ../../../<uuid>}
  <parent>/<uuid>/{mdev_type,remove,iommu_group,driver,subsystem,uevent}
  devices/virtual/<driver>/<name>/{uevent,subsystem}   virtual parent (mtty)
  class/<driver>/<name> -> ../../devices/virtual/<driver>/<name>
  class/mdev_bus/<parent>                  one per *registered* parent
  bus/mdev/devices/<uuid>, bus/mdev/drivers/<mdev drv>/<uuid>
  kernel/iommu_groups/<N>/devices/<uuid>   one group per mdev
  vfio/<N>                                 stand-in for /dev/vfio/<N>

The mdev core's rules, in the kernel's order (research
docs/design.md §4.3, §4.4, measured in tests/realkernel/; drivers/vfio/mdev/):

===================================  =======  ==================================
write / event                        errno    source
===================================  =======  ==================================
create: not 36 or 37 bytes, or not   EINVAL   mdev_sysfs.c create_store();
  a UUID                                      guid_parse() reads 36 bytes only,
                                              so the 37th is not checked
create: the UUID exists              EEXIST   mdev_core.c mdev_device_create()
create: core counter exhausted       EUSERS   mdev_core.c (the per-parent
  (policy core)                               ``available`` of mdpy, ccw, ap)
create: parent going away            ENODEV   mdev_device_create()
create: the vendor probe refuses     policy   the driver's probe (ENOSPC, or
  (count at 0, type locked out)               EINVAL for NVIDIA: :mod:`.policies`);
                                              an injected fault
                                              (``fail_next_create``) comes first
remove: ``0``                        ok       mdev_sysfs.c remove_store(): no-op
remove: not a number                 EINVAL   kstrtoul()
remove: second writer                ENODEV   device_remove_file_self(): the
                                              ``remove`` file is gone at once
                                              (a new open: ENOENT)
remove: VM holds the device          blocks   mdev_device_remove() waits in
                                              vfio_unregister_group_dev()
mdev_unregister_parent()             -        every child vanishes without a
                                              remove write, then the types and
                                              ``class/mdev_bus/<parent>``
open vfio/<N> already open / held    EBUSY    vfio/group.c vfio_group_fops_open()
===================================  =======  ==================================

Choices: the kernel waits forever on a held device; the simulator gives up
after ``remove_block_timeout`` seconds with EINTR and puts ``remove`` back,
so a broken guard fails a test instead of hanging it (each such write is a
:class:`BlockedRemove`).  ``vfio/<N>`` is not part of a real /sys: it plays
the VFIO group node (``/dev/vfio/<N>``, root 0600) that the agent probes
before a remove; one opener at a time, and while it is open (or the mdev is
``hold``-ed, a VM holding the device) a ``remove`` write blocks.

An mdev parent's types live on its driver binding: unbinding the PCI
function's own driver unregisters the parent (its mdevs vanish, as with
mdev_unregister_parent() in the driver's remove), binding it back
registers it; a held mdev refuses the unbind with EBUSY (a choice: the
kernel would block until the VM lets go).  :class:`MdevBus` is that
listener of the PCI bus.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import UUID_LEN, kstrtoul, uuid_is_valid
from accel_agent.simulator.pci import PciFunction
from accel_agent.simulator.policies import Counters
from accel_agent.simulator.spec import MdevSpec, ParentSpec
from accel_agent.simulator.tree import Attr, Path, oserror

DEFAULT_REMOVE_BLOCK_TIMEOUT = 60.0

Emit = Callable[..., None]


@dataclass
class _Mdev:
    uuid: str
    parent: str
    type_id: str
    group: int
    held: bool = False  # a VM holds it (control ``hold``)
    opened: bool = False  # its vfio/<N> group node is open
    # ``hold --after-probe``: the holder arrives right after the next group
    # open closes, i.e. between the agent's in-use probe and its remove write.
    late_hold: bool = False

    @property
    def busy(self) -> bool:
        return self.held or self.opened


@dataclass
class _Parent:
    spec: ParentSpec
    path: Path
    registered: bool = True
    mdevs: dict[str, _Mdev] = field(default_factory=dict)


@dataclass(frozen=True)
class MdevInfo:
    uuid: str
    parent: str
    type_id: str
    iommu_group: int
    held: bool


@dataclass
class BlockedRemove:
    """A ``remove`` write that had to wait for a held device (the agent's guard
    is supposed to make this never happen; tests assert on this record)."""

    uuid: str
    started: float
    finished: float | None = None
    outcome: str = "waiting"  # released | vanished | timeout


class GroupNode(Attr):
    """``vfio/<N>``: the group node of one mdev (see the module docstring)."""

    __slots__ = ("uuid",)

    def __init__(self, uuid: str) -> None:
        super().__init__(mode=0o600)
        self.uuid = uuid


def _uevent_store(data: bytes) -> int:
    return len(data)  # a synthetic uevent request: accepted and ignored


def _subsystem(spec: ParentSpec) -> str:
    return "pci" if spec.kind == "pci" else spec.driver


class MdevBus:
    """Every mdev parent of a host and its mdevs (module docstring)."""

    def __init__(self, tree: t.Tree, cond: threading.Condition, emit: Emit,
                 changed: Callable[[], None], alloc_group: Callable[[], int],
                 free_group: Callable[[int], None], remove_block_timeout: float) -> None:
        self._tree = tree
        self._cond = cond  # of the host's lock: a blocked remove sleeps on it
        self._emit = emit  # emit(action, path, subsystem, **env)
        self._changed = changed
        self._alloc_group = alloc_group
        self._free_group = free_group
        self.remove_block_timeout = remove_block_timeout
        self._mdevs: dict[str, _Mdev] = {}
        self._parents: dict[str, _Parent] = {}
        self._faults: list[tuple[int, str | None, str | None]] = []
        self.blocked_removes: list[BlockedRemove] = []
        self._counters = Counters(self._parents)  # reads _parents live; rebuilt by boot()

    # ---------------------------------------------------------------- construction

    def add_parent(self, spec: ParentSpec, pci_path: Path | None) -> None:
        """A parent, not registered yet: a PCI one lives at its function's
        ``pci_path``; a virtual one gets its device directory here."""
        if spec.kind == "virtual":
            path: Path = ("devices", "virtual", spec.driver, spec.name)
            self._tree.attr((*path, "uevent"), f"DEVNAME={spec.name}\n", store=_uevent_store)
            self._tree.symlink((*path, "subsystem"), ("class", spec.driver))
            self._tree.symlink(("class", spec.driver, spec.name), path)
        else:
            assert pci_path is not None
            path = pci_path
        self._parents[spec.name] = _Parent(spec=spec, path=path)

    def boot(self, mdevs: Iterable[MdevSpec]) -> None:
        """Every parent registers, then the mdevs that exist at boot are created."""
        self._counters = Counters(self._parents)  # groups VFs and pools of the full set
        for parent in self._parents.values():
            self._register(parent)
        for m in mdevs:
            self._create(m.parent, m.type_id, m.uuid)
            self._mdevs[m.uuid].held = m.held

    # ---------------------------------------------------------------- parents

    def _register(self, parent: _Parent) -> None:
        tr = self._tree
        spec = parent.spec
        types_dir = (*parent.path, "mdev_supported_types")
        tr.mkdir(types_dir)
        for ts in spec.types:
            tdir = (*types_dir, ts.type_id)
            if ts.name is not None:
                tr.attr((*tdir, "name"), ts.name + "\n")
            if ts.description is not None:
                tr.attr((*tdir, "description"), ts.description + "\n")
            tr.attr((*tdir, "device_api"), ts.device_api + "\n")
            tr.attr((*tdir, "available_instances"), self._avail_show(spec.name, ts.type_id))
            tr.attr((*tdir, "create"), store=self._create_store(spec.name, ts.type_id))
            tr.mkdir((*tdir, "devices"))
        tr.mkdir(("bus", "mdev", "drivers", spec.effective_mdev_driver))
        tr.symlink(("class", "mdev_bus", spec.name), parent.path)
        parent.registered = True
        self._emit("change", parent.path, _subsystem(spec), MDEV_STATE="registered")
        self._changed()

    def _avail_show(self, parent: str, type_id: str) -> Callable[[], bytes]:
        return lambda: f"{self._counters.available(parent, type_id)}\n".encode()

    def _create_store(self, parent: str, type_id: str) -> Callable[[bytes], int]:
        def store(data: bytes) -> int:
            # create_store(): count must be 36 or 37; guid_parse() reads the first 36
            # bytes only, so the 37th byte is not checked (normally the "\n").
            if not UUID_LEN <= len(data) <= UUID_LEN + 1:
                raise oserror(errno.EINVAL, f"write of {len(data)} bytes, expected 36 or 37")
            if not uuid_is_valid(data):
                raise oserror(errno.EINVAL, "not a UUID")
            self._create(parent, type_id, data[:UUID_LEN].decode("ascii").lower())
            return len(data)
        return store

    def register(self, name: str) -> None:
        """The driver registers the parent again (module load, VF enabled): types
        come back, no mdevs (the kernel never restores them)."""
        parent = self.parent(name)
        if not parent.registered:
            self._register(parent)

    def unregister(self, name: str) -> None:
        """``mdev_unregister_parent()``: every child mdev vanishes without a remove
        write, then the types and the ``class/mdev_bus`` link go.  A stale file
        descriptor on the parent's ``create`` then gets ENODEV."""
        parent = self.parent(name)
        if not parent.registered:
            return
        for m in list(parent.mdevs.values()):
            self._destroy(m)
        self._tree.remove(("class", "mdev_bus", name))
        self._tree.remove((*parent.path, "mdev_supported_types"))
        parent.registered = False
        self._emit("change", parent.path, _subsystem(parent.spec), MDEV_STATE="unregistered")
        self._changed()

    def parent(self, name: str) -> _Parent:
        parent = self._parents.get(name)
        if parent is None:
            raise exception.ParentNotFound(parent=name, root="the simulated host")
        return parent

    def names(self, registered_only: bool = False) -> list[str]:
        return [n for n, p in self._parents.items() if p.registered or not registered_only]

    # ---------------------------------------------------------------- mdevs

    def _create(self, parent_name: str, type_id: str, uuid: str) -> None:
        """``mdev_device_create()`` in the kernel's order of checks."""
        if uuid in self._mdevs:
            raise oserror(errno.EEXIST, f"mdev {uuid} exists")
        parent = self._parents[parent_name]
        counters = self._counters
        if counters.is_core(parent_name) and counters.available(parent_name, type_id) == 0:
            raise oserror(errno.EUSERS, f"{parent_name} has no instances left")
        if not parent.registered:
            raise oserror(errno.ENODEV, f"{parent_name} is going away")
        for i, (code, f_parent, f_type) in enumerate(self._faults):
            if f_parent in (None, parent_name) and f_type in (None, type_id):
                del self._faults[i]
                raise oserror(code, "injected probe failure")
        refusal = counters.refusal(parent_name, type_id)
        if refusal is not None:
            raise oserror(refusal, f"{parent_name} refuses another {type_id}")
        mdev = _Mdev(uuid, parent_name, type_id, self._alloc_group())
        self._mdevs[uuid] = mdev
        parent.mdevs[uuid] = mdev
        self._build_mdev(parent, mdev)
        self._emit("add", (*parent.path, uuid), "mdev", MDEV_TYPE=type_id)
        self._emit("bind", (*parent.path, uuid), "mdev", DRIVER=parent.spec.effective_mdev_driver)
        self._changed()

    def _build_mdev(self, parent: _Parent, mdev: _Mdev) -> None:
        tr = self._tree
        path = (*parent.path, mdev.uuid)
        drv = parent.spec.effective_mdev_driver
        group = ("kernel", "iommu_groups", str(mdev.group))
        tr.mkdir(path)
        tr.symlink((*path, "mdev_type"), (*parent.path, "mdev_supported_types", mdev.type_id))
        self._add_remove_attr(mdev)
        tr.symlink((*path, "iommu_group"), group)
        tr.symlink((*path, "driver"), ("bus", "mdev", "drivers", drv))
        tr.symlink((*path, "subsystem"), ("bus", "mdev"))
        tr.attr((*path, "uevent"), f"DRIVER={drv}\n", store=_uevent_store)
        tr.symlink((*parent.path, "mdev_supported_types", mdev.type_id, "devices", mdev.uuid), path)
        tr.symlink(("bus", "mdev", "devices", mdev.uuid), path)
        tr.symlink(("bus", "mdev", "drivers", drv, mdev.uuid), path)
        tr.symlink((*group, "devices", mdev.uuid), path)
        tr.add(("vfio", str(mdev.group)), GroupNode(mdev.uuid))

    def _add_remove_attr(self, mdev: _Mdev) -> None:
        path = (*self._parents[mdev.parent].path, mdev.uuid, "remove")
        node = self._tree.attr(path, mode=t.WO_MODE)
        node.store = lambda data: self._remove_store(mdev, data)

    def _remove_store(self, mdev: _Mdev, data: bytes) -> int:
        """``remove_store()``: kstrtoul, ``0`` is a no-op, then
        ``device_remove_file_self()`` (the ``remove`` file disappears at once, so a
        second writer gets ENODEV/ENOENT) and ``mdev_device_remove()``, which blocks
        while a VM holds the device.  The kernel waits forever; the simulator gives
        up after ``remove_block_timeout`` seconds with EINTR and puts ``remove``
        back, so a broken guard fails a test instead of hanging it."""
        if kstrtoul(data) == 0:
            return len(data)
        parent = self._parents[mdev.parent]
        self._tree.remove((*parent.path, mdev.uuid, "remove"))
        if mdev.busy:
            record = BlockedRemove(mdev.uuid, time.monotonic())
            self.blocked_removes.append(record)
            deadline = record.started + self.remove_block_timeout
            while mdev.busy and self._mdevs.get(mdev.uuid) is mdev:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            record.finished = time.monotonic()
            if self._mdevs.get(mdev.uuid) is not mdev:
                record.outcome = "vanished"
                return len(data)
            if mdev.busy:
                record.outcome = "timeout"
                self._add_remove_attr(mdev)
                raise oserror(errno.EINTR, f"{mdev.uuid} still held after "
                                           f"{self.remove_block_timeout:g} s")
            record.outcome = "released"
        if self._mdevs.get(mdev.uuid) is mdev:
            self._destroy(mdev)
        return len(data)

    def _destroy(self, mdev: _Mdev) -> None:
        parent = self._parents[mdev.parent]
        path = (*parent.path, mdev.uuid)
        drv = parent.spec.effective_mdev_driver
        tr = self._tree
        for link in (
            ("vfio", str(mdev.group)),
            ("kernel", "iommu_groups", str(mdev.group)),
            ("bus", "mdev", "drivers", drv, mdev.uuid),
            ("bus", "mdev", "devices", mdev.uuid),
            (*parent.path, "mdev_supported_types", mdev.type_id, "devices", mdev.uuid),
            path,
        ):
            tr.remove(link)
        self._free_group(mdev.group)
        del self._mdevs[mdev.uuid]
        del parent.mdevs[mdev.uuid]
        mdev.held = mdev.opened = mdev.late_hold = False
        self._emit("remove", path, "mdev", MDEV_TYPE=mdev.type_id)
        self._changed()
        self._cond.notify_all()  # a blocked remove of this device may finish now

    def open_group(self, node: GroupNode, path: str) -> Callable[[], None]:
        """vfio_group_fops_open(): one opener at a time, else EBUSY; returns
        what closing it does (to be run under the host's lock)."""
        mdev = self._mdevs.get(node.uuid)
        if mdev is None or not node.alive:
            raise oserror(errno.ENODEV, path)
        if mdev.busy:
            raise oserror(errno.EBUSY, f"group {mdev.group} of {mdev.uuid} is in use")
        mdev.opened = True

        def close() -> None:
            mdev.opened = False
            if mdev.late_hold and self._mdevs.get(mdev.uuid) is mdev:
                mdev.late_hold, mdev.held = False, True
            self._cond.notify_all()

        return close

    # ---------------------------------------------------------------- host operations

    def _mdev(self, uuid: str) -> _Mdev:
        mdev = self._mdevs.get(uuid.lower())
        if mdev is None:
            raise exception.MdevNotFound(uuid=uuid)
        return mdev

    def hold(self, uuid: str, after_probe: bool = False) -> None:
        mdev = self._mdev(uuid)
        if after_probe:
            mdev.late_hold = True
        else:
            mdev.held = True

    def release(self, uuid: str) -> None:
        mdev = self._mdev(uuid)
        mdev.held = mdev.late_hold = False
        self._cond.notify_all()

    def release_all(self) -> None:
        for m in self._mdevs.values():
            m.held = m.late_hold = False
        self._cond.notify_all()

    def fail_next_create(self, code: int, parent: str | None, type_id: str | None) -> None:
        if parent is not None:
            self.parent(parent)
        self._faults.append((code, parent, type_id))

    def destroy_all(self) -> None:
        """The host goes down: every mdev is gone (counters restored)."""
        for m in list(self._mdevs.values()):
            self._destroy(m)

    def rebooted(self) -> None:
        """The host is up again: every parent registered, injected faults forgotten."""
        for parent in self._parents.values():
            if not parent.registered:
                self._register(parent)
        self._faults.clear()

    # ---------------------------------------------------------------- introspection

    def infos(self) -> list[MdevInfo]:
        return [MdevInfo(m.uuid, m.parent, m.type_id, m.group, m.busy)
                for m in sorted(self._mdevs.values(), key=lambda m: (m.parent, m.uuid))]

    def parents_status(self, with_counters: bool) -> list[dict[str, Any]]:
        parents = []
        for name, p in self._parents.items():
            entry: dict[str, Any] = {"name": name, "path": "/".join(p.path),
                                     "registered": p.registered, "policy": p.spec.policy,
                                     "mdevs": len(p.mdevs)}
            if with_counters and p.registered:
                entry["available"] = {ts.type_id: self._counters.available(name, ts.type_id)
                                      for ts in p.spec.types}
            parents.append(entry)
        return parents

    # ---------------------------------------------------------------- parent binding
    # (a DriverListener of the host's PCI bus: see the module docstring)

    def _bound_parent(self, fn: PciFunction) -> _Parent | None:
        parent = self._parents.get(fn.address)
        if parent is None or fn.driver != parent.spec.driver:
            return None
        return parent

    def check_unbind(self, fn: PciFunction) -> None:
        parent = self._bound_parent(fn)
        if parent is not None and any(m.busy for m in parent.mdevs.values()):
            raise oserror(errno.EBUSY, f"{fn.address}: an mdev of it is in use")

    def bound(self, fn: PciFunction) -> None:
        parent = self._bound_parent(fn)
        if parent is not None and not parent.registered:
            self._register(parent)

    def unbound(self, fn: PciFunction) -> None:
        parent = self._bound_parent(fn)
        if parent is not None and parent.registered:
            self.unregister(parent.spec.name)
