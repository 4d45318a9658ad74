"""``SimulatedHost``: a reactive, kernel-faithful model of the mdev sysfs ABI.

The host owns a :class:`~accel_agent.simulator.tree.Tree` laid out like
``/sys`` and mutates it exactly when the kernel would: a write to a type's
``create`` adds the mdev directory and every link before it returns, a write to
an mdev's ``remove`` deletes them and restores the counters, a parent's
unregistration destroys its children.  Failures are ``OSError`` with the
kernel's errno (research sysfs-mdevctl-kubevirt.md §1.4/§1.5, mtty-lab.md), so
the FUSE front and in-process callers see the same numbers.

Threading: one ``RLock`` guards all state; a remove that blocks on a held
device waits on a condition of that lock, so other callers (the FUSE worker
threads, the control socket's ``release``) keep running meanwhile.

The PCI side (driver binding, ``driver_override``, SR-IOV VFs that come and
go with ``sriov_numvfs``) is :mod:`.pci`'s, the ``nvidia/`` files of NVIDIA
vGPU 17+ VFs are :mod:`.nvidia_vfio`'s; the host wires them in and keeps one
lock and one event log for all.  An mdev parent's types exist while its PCI
function is bound to its own driver: unbinding it unregisters the parent
(EBUSY while one of its mdevs is held), binding it back registers it again.

Tree layout (every link relative, every value ending in ``\\n``)::

  devices/pci<dom>:<root>/[<root port>/]<addr>/   PCI function (parent or bare device)
      vendor device class numa_node uevent
      driver -> ../../../../bus/pci/drivers/<drv>      subsystem -> .../bus/pci
      iommu_group -> .../kernel/iommu_groups/<N>
      physfn -> ../<PF>  (VFs)        virtfn<i> -> ../<VF>, sriov_totalvfs, sriov_numvfs (PFs)
      mdev_supported_types/<type>/{name?,description?,device_api,available_instances,create,devices/}
      <uuid>/{mdev_type,remove,iommu_group,driver,subsystem,uevent}
  devices/virtual/<driver>/<name>/                 virtual parent (mtty), same mdev subtree
  class/mdev_bus/<parent> -> ../../devices/...     one per *registered* parent
  class/<driver>/<name> -> ../../devices/virtual/<driver>/<name>
  bus/pci/devices/<addr>, bus/pci/drivers/<drv>/<addr>
  bus/mdev/devices/<uuid>, bus/mdev/drivers/<mdev drv>/<uuid>
  kernel/iommu_groups/<N>/devices/<addr|uuid>
  vfio/<N>                                         stand-in for /dev/vfio/<N> of a group
  (PCI binding, SR-IOV and nvidia/ files: see the pci and nvidia_vfio modules)

``vfio/<N>`` is not part of a real /sys: it plays the VFIO group node
(``/dev/vfio/<N>``, root 0600) that the agent probes before a remove.  Like the
kernel's group file, one opener at a time: a second ``open`` gets EBUSY, and
while it is open (or the mdev is ``hold``-ed, a VM holding the device) a
``remove`` write blocks.  PCI functions have one too (:mod:`.pci`).

The root port directory above a PCI function is derived from its address
alone (so combining profiles never moves a device): bus ``b`` hangs off root
bus ``r = b & 0xc0`` (``pci0000:80``); a function on ``r`` itself sits directly
below it (the iGPU ``pci0000:00/0000:00:02.0``); otherwise it sits below the
bridge ``<dom>:<r>:<(b - r + 3) // 4>.0`` (``0000:84:00.0`` lives in
``pci0000:80/0000:80:01.0/``), or on root bus 0 below a PCH-style port
``00:1c.0``-``00:1f.7`` (``0000:06:00.0`` in ``pci0000:00/0000:00:1c.5/``).
SR-IOV VFs are siblings of their PF.  Bridges are plain directories, not PCI
devices of the model.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import UUID_LEN, kstrtoul, pci_path, uuid_is_valid
from accel_agent.simulator.nvidia_vfio import NvidiaVgpus
from accel_agent.simulator.pci import PciBus, PciFunction, PciGroupNode
from accel_agent.simulator.policies import Counters
from accel_agent.simulator.spec import HostSpec, ParentSpec, PciDeviceSpec
from accel_agent.simulator.tree import Attr, Dir, Link, NodeStat, Path, oserror
from accel_agent.sysfs import address

DEFAULT_REMOVE_BLOCK_TIMEOUT = 60.0


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


@dataclass(frozen=True)
class Event:
    """A udev-like event: what a pyudev monitor on the real host would see."""

    seq: int
    action: str  # add | remove | change | bind | unbind
    devpath: str
    subsystem: str
    env: dict[str, str]


@dataclass(frozen=True)
class TreeEntry:
    path: str
    kind: str  # dir | file | link
    mode: int  # permission bits only
    data: bytes | None = None  # file content (None: unreadable, i.e. create/remove)
    target: str | None = None  # link text


class GroupNode(Attr):
    """``vfio/<N>``: the group node of one mdev (see the module docstring)."""

    __slots__ = ("uuid",)

    def __init__(self, uuid: str) -> None:
        super().__init__(mode=0o600)
        self.uuid = uuid


class Handle:
    """An open attribute: keeps the node itself, so a write after the node was
    removed (parent unregistered, mdev removed) gets ENODEV like kernfs."""

    def __init__(self, host: SimulatedHost, node: Attr, path: str,
                 on_close: Callable[[], None] | None = None) -> None:
        self._host = host
        self._node = node
        self.path = path
        self._cache = b""
        self._on_close = on_close

    def close(self) -> None:
        """The last reference went (FUSE ``release``); idempotent."""
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


class SimulatedHost:
    """The live model.  See the module docstring for the layout and semantics."""

    def __init__(self, spec: HostSpec,
                 remove_block_timeout: float = DEFAULT_REMOVE_BLOCK_TIMEOUT) -> None:
        if not isinstance(spec, HostSpec):
            raise exception.SimulatorSpecInvalid(reason=f"expected a HostSpec, got {spec!r}")
        self.spec = spec
        self.remove_block_timeout = remove_block_timeout
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._tree = t.Tree()
        self._mdevs: dict[str, _Mdev] = {}
        self._parents: dict[str, _Parent] = {}
        self._groups_used: set[int] = set()
        self._faults: list[tuple[int, str | None, str | None]] = []
        self._events: deque[Event] = deque(maxlen=4096)
        self._seq = 0
        self.generation = 0
        self.blocked_removes: list[BlockedRemove] = []
        # stall_reads(): (path substring, seconds per read or None: until unstall)
        self._stall: tuple[str, float | None] | None = None
        self.stalled_reads = 0  # reads that matched, in all
        self.stalled_readers = 0  # readers waiting now
        self.boot_count = 1
        self._counters = Counters(self._parents)  # reads _parents live; filled by _build
        for base in (("class", "mdev_bus"), ("bus", "mdev", "devices"), ("bus", "mdev", "drivers"),
                     ("bus", "pci", "devices"), ("bus", "pci", "drivers"),
                     ("kernel", "iommu_groups"), ("devices", "virtual"), ("vfio",)):
            self._tree.mkdir(base)
        self._pci = PciBus(self._tree, self._event, self._changed, self._alloc_group,
                           self._groups_used.discard)
        self._vgpus = NvidiaVgpus(self._tree, self._changed)
        self._pci.add_listener(_MdevParentBinding(self))
        self._pci.add_listener(self._vgpus)
        with self._lock:
            self._build()

    # ---------------------------------------------------------------- construction

    def _build(self) -> None:
        tr = self._tree
        pfs: dict[str, Path] = {}
        vfs_of: dict[str, list[str]] = {}
        pci: list[ParentSpec | PciDeviceSpec] = [*self.spec.devices,
                                                 *(p for p in self.spec.parents if p.kind == "pci")]
        for dev in pci:
            phys = getattr(dev, "physfn", None)
            if phys:
                vfs_of.setdefault(phys, []).append(_addr(dev))
        # PFs (and plain functions) first, then VFs beside their PF.
        pci.sort(key=lambda d: (getattr(d, "physfn", None) is not None, _addr(d)))
        for dev in pci:
            addr = _addr(dev)
            phys = getattr(dev, "physfn", None)
            path = (*pfs[phys][:-1], addr) if phys else pci_path(addr)
            pfs[addr] = path
            self._pci.add_static(dev, path, phys, sorted(vfs_of.get(addr, [])))
        for pf in sorted(self.spec.sriov_pfs, key=lambda p: p.address):
            self._pci.add_sriov_pf(pf, pci_path(pf.address))
        self._pci.boot()
        for p in self.spec.parents:
            if p.kind == "virtual":
                path = ("devices", "virtual", p.driver, p.name)
                tr.attr((*path, "uevent"), f"DEVNAME={p.name}\n", store=self._uevent_store)
                tr.symlink((*path, "subsystem"), ("class", p.driver))
                tr.symlink(("class", p.driver, p.name), path)
            else:
                path = pfs[p.name]
            self._parents[p.name] = _Parent(spec=p, path=path)
        self._counters = Counters(self._parents)  # groups VFs and pools of the full set
        for parent in self._parents.values():
            self._register(parent)
        for m in self.spec.mdevs:
            self._create(m.parent, m.type_id, m.uuid)
            self._mdevs[m.uuid].held = m.held

    def _uevent_store(self, data: bytes) -> int:
        return len(data)  # a synthetic uevent request: accepted and ignored

    def _alloc_group(self) -> int:
        # ida_alloc(): the lowest free id, so numbers are reused after removal.
        n = 0
        while n in self._groups_used:
            n += 1
        self._groups_used.add(n)
        return n

    def _event(self, action: str, path: Path, subsystem: str, **env: str) -> None:
        self._seq += 1
        self._events.append(Event(self._seq, action, "/" + "/".join(path), subsystem, env))

    def _changed(self) -> None:
        self.generation += 1

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
        self._event("change", parent.path, "pci" if spec.kind == "pci" else spec.driver,
                    MDEV_STATE="registered")
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

    def register_parent(self, name: str) -> None:
        """The driver registers the parent again (module load, VF enabled): types
        come back, no mdevs (the kernel never restores them)."""
        with self._lock:
            parent = self._parent(name)
            if not parent.registered:
                self._register(parent)

    def unregister_parent(self, name: str) -> None:
        """``mdev_unregister_parent()``: every child mdev vanishes without a remove
        write, then the types and the ``class/mdev_bus`` link go.  A stale file
        descriptor on the parent's ``create`` then gets ENODEV."""
        with self._lock:
            parent = self._parent(name)
            if not parent.registered:
                return
            for m in list(parent.mdevs.values()):
                self._destroy(m)
            self._tree.remove(("class", "mdev_bus", name))
            self._tree.remove((*parent.path, "mdev_supported_types"))
            parent.registered = False
            self._event("change", parent.path, "pci" if parent.spec.kind == "pci"
                        else parent.spec.driver, MDEV_STATE="unregistered")
            self._changed()

    def _parent(self, name: str) -> _Parent:
        parent = self._parents.get(name)
        if parent is None:
            raise exception.ParentNotFound(parent=name, root="the simulated host")
        return parent

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
        self._event("add", (*parent.path, uuid), "mdev", MDEV_TYPE=type_id)
        self._event("bind", (*parent.path, uuid), "mdev", DRIVER=parent.spec.effective_mdev_driver)
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
        tr.attr((*path, "uevent"), f"DRIVER={drv}\n", store=self._uevent_store)
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
        self._groups_used.discard(mdev.group)
        del self._mdevs[mdev.uuid]
        del parent.mdevs[mdev.uuid]
        mdev.held = mdev.opened = mdev.late_hold = False
        self._event("remove", path, "mdev", MDEV_TYPE=mdev.type_id)
        self._changed()
        self._cond.notify_all()  # a blocked remove of this device may finish now

    # ---------------------------------------------------------------- host operations

    def reboot(self) -> None:
        """A host reboot: every mdev is gone (counters restored), the PCI side is
        back to the spec's boot state (VFs enabled again as the spec says, every
        vGPU type 0, every function on its own driver, no driver_override),
        every parent is registered again, holds and injected faults are
        forgotten."""
        with self._lock:
            for m in list(self._mdevs.values()):
                self._destroy(m)
            self._pci.reboot()
            self._vgpus.reset()
            for parent in self._parents.values():
                if not parent.registered:
                    self._register(parent)
            self._faults.clear()
            self.boot_count += 1
            self._changed()

    def hold(self, uuid: str, after_probe: bool = False) -> None:
        """Mark an mdev (by UUID) or a PCI function bound to a VFIO driver (by
        address: a VF given to a VM) as opened by a VM: its group node answers
        EBUSY, a remove write blocks, a VF's vGPU cannot be destroyed.
        ``after_probe``: not yet; the VM arrives right after the next open of the
        group node is closed (the race between an in-use probe and the write
        that follows it)."""
        with self._lock:
            if address.is_pci_address(uuid):
                self._pci.hold(address.parse_pci_address(uuid), after_probe)
                return
            mdev = self._mdev(uuid)
            if after_probe:
                mdev.late_hold = True
            else:
                mdev.held = True

    def release(self, uuid: str) -> None:
        """The VM lets go: a blocked remove completes."""
        with self._lock:
            if address.is_pci_address(uuid):
                self._pci.release(address.parse_pci_address(uuid))
                return
            mdev = self._mdev(uuid)
            mdev.held = mdev.late_hold = False
            self._cond.notify_all()

    def release_all(self) -> None:
        with self._lock:
            for m in self._mdevs.values():
                m.held = m.late_hold = False
            self._pci.release_all()
            self._cond.notify_all()

    def fail_next_create(self, code: int, parent: str | None = None,
                         type_id: str | None = None) -> None:
        """Make the next matching create fail with ``code`` as the vendor probe would
        (e.g. i915's ENOSPC although ``available_instances`` read 1)."""
        with self._lock:
            if parent is not None:
                self._parent(parent)
            self._faults.append((code, parent, type_id))

    def fail_next_vgpu_write(self, code: int, vf: str | None = None,
                             type_id: int | None = None) -> None:
        """Make the next matching ``nvidia/current_vgpu_type`` write fail with
        ``code`` (``type_id`` 0 matches a destroy)."""
        with self._lock:
            if vf is not None:
                vf = address.parse_pci_address(vf)
                self._pci.function(vf)
            self._vgpus.fail_next_write(code, vf, type_id)

    def accept_held_vgpu_destroy(self, accept: bool = True) -> None:
        """Make the ``nvidia`` driver destroy a vGPU whose VF a VM holds when
        ``0`` is written (instead of EBUSY), until ``accept`` False or the next
        reboot: a driver that does not refuse, so that only the agent's in-use
        probe stands between the write and the VM."""
        with self._lock:
            self._vgpus.accept_held_destroy = bool(accept)

    def vgpu_writes(self) -> list[dict[str, Any]]:
        """The recorded ``nvidia/current_vgpu_type`` writes (see nvidia_vfio)."""
        with self._lock:
            return self._vgpus.writes()

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

    def _mdev(self, uuid: str) -> _Mdev:
        mdev = self._mdevs.get(uuid.lower())
        if mdev is None:
            raise exception.MdevNotFound(uuid=uuid)
        return mdev

    # convenience wrappers over the file API, for in-process callers

    def type_dir(self, parent: str, type_id: str) -> str:
        return f"class/mdev_bus/{parent}/mdev_supported_types/{type_id}"

    def create_mdev(self, parent: str, type_id: str, uuid: str) -> str:
        """Write ``uuid`` to the type's ``create`` like the agent's privileged helper."""
        self.write(f"{self.type_dir(parent, type_id)}/create", uuid.encode() + b"\n")
        return uuid.lower()

    def remove_mdev(self, uuid: str) -> None:
        self.write(f"bus/mdev/devices/{uuid.lower()}/remove", b"1\n")

    def available(self, parent: str, type_id: str) -> int:
        return int(self.read(f"{self.type_dir(parent, type_id)}/available_instances"))

    # ---------------------------------------------------------------- introspection

    def mdevs(self) -> list[MdevInfo]:
        with self._lock:
            return [MdevInfo(m.uuid, m.parent, m.type_id, m.group, m.busy)
                    for m in sorted(self._mdevs.values(), key=lambda m: (m.parent, m.uuid))]

    def vfs(self) -> list[dict[str, Any]]:
        """Every SR-IOV VF of the dynamic PFs with its binding and vGPU type."""
        with self._lock:
            return self._pci_status()["vfs"]

    def vgpus(self) -> list[dict[str, Any]]:
        """Every typed VF of a vendor-VFIO GPU (address, physfn, type, group, held)."""
        with self._lock:
            return self._vgpus.vgpus()

    def _pci_status(self) -> dict[str, Any]:
        out = self._pci.status()
        for vf in out["vfs"]:
            vf["vgpu_type"] = self._vgpus.type_of(vf["address"])
        return out

    def parent_names(self, registered_only: bool = False) -> list[str]:
        with self._lock:
            return [n for n, p in self._parents.items() if p.registered or not registered_only]

    def parent_path(self, name: str) -> str:
        with self._lock:
            return "/".join(self._parent(name).path)

    def events_since(self, seq: int = 0) -> list[Event]:
        with self._lock:
            return [e for e in self._events if e.seq > seq]

    def status(self, with_counters: bool = True) -> dict[str, Any]:
        with self._lock:
            parents = []
            for name, p in self._parents.items():
                entry: dict[str, Any] = {"name": name, "path": "/".join(p.path),
                                         "registered": p.registered, "policy": p.spec.policy,
                                         "mdevs": len(p.mdevs)}
                if with_counters and p.registered:
                    entry["available"] = {ts.type_id: self._counters.available(name, ts.type_id)
                                          for ts in p.spec.types}
                parents.append(entry)
            return {
                "generation": self.generation,
                "boot_count": self.boot_count,
                "stalled_reads": self.stalled_reads,
                "stalled_readers": self.stalled_readers,
                "parents": parents,
                "mdevs": [{"uuid": i.uuid, "parent": i.parent, "type_id": i.type_id,
                           "iommu_group": i.iommu_group, "held": i.held} for i in self.mdevs()],
                "blocked_removes": [vars(b).copy() for b in self.blocked_removes],
                **self._pci_status(),
                "vgpus": self._vgpus.vgpus(),
                "vgpu_writes": self._vgpus.writes(),
            }

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

    def open(self, path: str) -> Handle:
        with self._lock:
            node = self._tree.lookup(path)
            if isinstance(node, Dir):
                raise oserror(errno.EISDIR, path)
            assert isinstance(node, Attr)
            if isinstance(node, GroupNode):
                return self._open_group(node, path)
            if isinstance(node, PciGroupNode):
                return Handle(self, node, path, on_close=self._locked(self._pci.open_group(
                    node, path)))
            return Handle(self, node, path)

    def _locked(self, func: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with self._lock:
                func()
        return run

    def _open_group(self, node: GroupNode, path: str) -> Handle:
        """vfio_group_fops_open(): one opener at a time, else EBUSY."""
        mdev = self._mdevs.get(node.uuid)
        if mdev is None or not node.alive:
            raise oserror(errno.ENODEV, path)
        if mdev.busy:
            raise oserror(errno.EBUSY, f"group {mdev.group} of {mdev.uuid} is in use")
        mdev.opened = True

        def close() -> None:
            with self._lock:
                mdev.opened = False
                if mdev.late_hold and self._mdevs.get(mdev.uuid) is mdev:
                    mdev.late_hold, mdev.held = False, True
                self._cond.notify_all()

        return Handle(self, node, path, on_close=close)

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

    def close(self) -> None:
        """Wake every blocked remove (they complete) and stalled read; used
        when the front stops."""
        self.release_all()
        self.unstall_reads()


class _MdevParentBinding:
    """An mdev parent's types live on its driver binding: unbinding the PCI
    function's own driver unregisters the parent (its mdevs vanish, as with
    mdev_unregister_parent() in the driver's remove), binding it back
    registers it.  A held mdev refuses the unbind with EBUSY (a choice: the
    kernel would block until the VM lets go)."""

    def __init__(self, host: SimulatedHost) -> None:
        self._host = host

    def _parent(self, fn: PciFunction) -> _Parent | None:
        parent = self._host._parents.get(fn.address)
        if parent is None or fn.driver != parent.spec.driver:
            return None
        return parent

    def check_unbind(self, fn: PciFunction) -> None:
        parent = self._parent(fn)
        if parent is not None and any(m.busy for m in parent.mdevs.values()):
            raise oserror(errno.EBUSY, f"{fn.address}: an mdev of it is in use")

    def bound(self, fn: PciFunction) -> None:
        parent = self._parent(fn)
        if parent is not None and not parent.registered:
            self._host._register(parent)

    def unbound(self, fn: PciFunction) -> None:
        parent = self._parent(fn)
        if parent is not None and parent.registered:
            self._host.unregister_parent(parent.spec.name)


def _addr(dev: ParentSpec | PciDeviceSpec) -> str:
    return dev.address if isinstance(dev, PciDeviceSpec) else dev.name
