"""The PCI side of the simulated host: functions, driver binding, SR-IOV VFs.

:class:`PciBus` owns every PCI function of the model and the files the PCI
core and the driver core give them; :class:`~.model.SimulatedHost` delegates
here and wires the mdev side (:mod:`.mdev`) on top.  Like the rest of the model it is not
thread-safe on its own: the host calls it under its lock.

Layout it adds (beside the model module's)::

  <function>/driver_override              rw  "(null)" while unset
  <function>/driver -> bus/pci/drivers/<drv>    only while bound
  <function>/uevent                       DRIVER= only while bound
  <PF>/sriov_totalvfs sriov_numvfs sriov_offset sriov_stride sriov_vf_device
  <PF>/sriov_drivers_autoprobe
  <PF>/virtfn<i> -> ../<VF>, <VF>/physfn -> ../<PF>
  <PF>/net/<ifname>/{address,device}, class/net/<ifname> -> ...  while the PF
                                          driver is bound (igb registers it)
  bus/pci/drivers/<drv>/{bind,unbind,<addr> -> device}
  bus/pci/drivers/vfio-pci/               always present
  bus/pci/drivers_probe
  vfio/<group>                            stand-in for /dev/vfio/<group>

Semantics, each either a kernel fact (source named) or a documented choice:

======================================  ======  =====================================
write                                   errno   source
======================================  ======  =====================================
sriov_numvfs: not a u16 number          EINVAL  iov.c sriov_numvfs_store(): kstrtou16
                                                failure returns -EINVAL (6.x)
sriov_numvfs: N > sriov_totalvfs        ERANGE  iov.c (not EINVAL)
sriov_numvfs: N == current              ok      iov.c: nothing happens
sriov_numvfs: PF has no driver          ENOENT  iov.c "no driver bound to device"
sriov_numvfs: PF on a driver that is    ENOENT  iov.c "driver does not support
  not its own (vfio-pci, ...)                   SR-IOV configuration" (vfio-pci
                                                without enable_sriov; choice: only
                                                the PF's own driver configures)
sriov_numvfs: M after N, both > 0       EBUSY   iov.c "Disable before enabling"
sriov_numvfs: 0 while a VF's group      EBUSY   choice; the kernel blocks in
  node is open / held                           vfio_unregister_group_dev() until
                                                the VM lets go
unbind of a busy (group open/held)      EBUSY   choice, same reason
  function, or of a PF with a busy VF
bind/unbind/drivers_probe: no such      ENODEV  drivers/base/bus.c
  device (name compared by sysfs_streq)
bind: driver does not match             ENODEV  bus.c bind_store(); pci_match_device():
  (driver_override set to another               with driver_override set only that
  driver, or not the device's own)              driver matches, and it always does
bind: device already bound              EBUSY   dd.c __driver_probe_device()
bind: VF while the PF's                 ENODEV  pci-driver.c pci_device_can_probe()
  sriov_drivers_autoprobe is 0 and no
  driver_override
bind of another vendor's driver through ENODEV  choice: its probe rejects the device;
  driver_override                               only vfio-pci takes any device
unbind: device not bound to this driver ENODEV  bus.c unbind_store()
driver_override: 4095 bytes or more     EINVAL  drivers/base/driver.c
                                                driver_set_override()
driver_override: "\\n" clears, text is  ok      driver_set_override(): cut at the
  cut at the first newline or NUL               first newline; kstrndup stops at NUL
drivers_probe: bound device             ok      bus.c: only unbound devices probe
drivers_probe: nothing matches          ok      nothing is bound, the write succeeds
sriov_drivers_autoprobe: not a bool     EINVAL  iov.c kstrtobool()
open vfio/<N> not bound to a VFIO       ENODEV  vfio/group.c vfio_group_fops_open()
  driver                                        with no driver (the node itself
                                                exists regardless: a choice)
open vfio/<N> already open / held       EBUSY   vfio_group_fops_open()
======================================  ======  =====================================

New VFs bind to the VF driver at once (``sriov_drivers_autoprobe`` 1, the
kernel's default), each in its own IOMMU group (lowest free number, like
``ida_alloc``).  ``vfio/<group>`` exists for every function; it can be opened
(by a VM, or the agent's in-use probe) only while the function is bound to a
VFIO driver: ``vfio-pci``, or ``nvidia`` for the VFs of a vendor-specific-VFIO
GPU (NVIDIA's driver registers them with VFIO itself).  Unbinding a PF's own
driver disables SR-IOV first (igb_remove() does), so its VFs vanish; rebinding
does not enable them again (igb's ``max_vfs`` defaults to 0).

Simplifications: the VFs of the older ``nvidia-sriov`` profile (mdev parents
declared one by one) are static, their PF's ``sriov_numvfs`` is read-only; VFs
get no netdev of their own; ``new_id``, ``remove_id`` and ``rescan`` are absent.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import kstrtoul, sysfs_streq
from accel_agent.simulator.spec import ParentSpec, PciDeviceSpec, SriovPfSpec
from accel_agent.simulator.tree import Attr, Path, oserror

VFIO_PCI = "vfio-pci"
# drivers/base/driver.c: "len >= (PAGE_SIZE - 1)" is refused.
DRIVER_OVERRIDE_MAX = 4096 - 1
_U16_MAX = 0xFFFF


@dataclass(eq=False)
class PciFunction:
    """One PCI function and its binding state."""

    address: str
    path: Path
    native_driver: str  # the driver whose id table matches the device
    vendor_id: int
    device_id: int
    class_code: int
    numa_node: int
    group: int
    driver: str | None = None  # bound driver
    override: str | None = None  # driver_override; None reads "(null)"
    physfn: PciFunction | None = None
    index: int = -1  # virtfn<index> of a dynamic VF
    pf_spec: SriovPfSpec | None = None  # set on a dynamic SR-IOV PF
    vfs: list[PciFunction] = field(default_factory=list)  # its current VFs, by index
    vfio_drivers: frozenset[str] = frozenset({VFIO_PCI})
    autoprobe: bool = True  # sriov_drivers_autoprobe (PFs)
    held: bool = False  # a VM holds the device (control ``hold``)
    opened: bool = False  # its vfio/<group> node is open
    late_hold: bool = False  # ``hold --after-probe``: held after the next close
    alive: bool = True

    @property
    def busy(self) -> bool:
        return self.held or self.opened

    @property
    def vfio_bound(self) -> bool:
        return self.driver in self.vfio_drivers

    @property
    def sriov_pf(self) -> SriovPfSpec | None:
        """The spec of the dynamic PF this VF belongs to."""
        return self.physfn.pf_spec if self.physfn is not None else None


class DriverListener(Protocol):
    """Something that lives on a driver binding (mdev types, nvidia/ files)."""

    def check_unbind(self, fn: PciFunction) -> None:
        """Raise OSError to refuse detaching ``fn``'s driver; change nothing."""

    def bound(self, fn: PciFunction) -> None:
        """``fn.driver`` was just attached."""

    def unbound(self, fn: PciFunction) -> None:
        """``fn.driver`` is about to go (still set while this runs)."""


class PciGroupNode(Attr):
    """``vfio/<N>`` of a PCI function (see the module docstring)."""

    __slots__ = ("address",)

    def __init__(self, address: str) -> None:
        super().__init__(mode=0o600)
        self.address = address


Emit = Callable[..., None]


class PciBus:
    """Every PCI function of a host, driver binding and SR-IOV (module docstring)."""

    def __init__(self, tree: t.Tree, emit: Emit, changed: Callable[[], None],
                 alloc_group: Callable[[], int], free_group: Callable[[int], None]) -> None:
        self._tree = tree
        self._emit = emit  # emit(action, path, subsystem, **env)
        self._changed = changed
        self._alloc_group = alloc_group
        self._free_group = free_group
        self._functions: dict[str, PciFunction] = {}
        self._listeners: list[DriverListener] = []
        self._drivers: set[str] = set()
        tree.attr(("bus", "pci", "drivers_probe"), store=self._drivers_probe_store,
                  mode=t.WO_MODE)
        self._ensure_driver(VFIO_PCI)

    def add_listener(self, listener: DriverListener) -> None:
        self._listeners.append(listener)

    # ---------------------------------------------------------------- construction

    def add_static(self, dev: ParentSpec | PciDeviceSpec, path: Path, physfn: str | None,
                   vfs: list[str]) -> PciFunction:
        """A function that exists from boot to shutdown (mdev parents, bare devices,
        the static VFs of the nvidia-sriov profile), bound to its own driver."""
        addr = dev.address if isinstance(dev, PciDeviceSpec) else dev.name
        fn = PciFunction(addr, path, dev.driver, dev.vendor_id, dev.device_id, dev.class_code,
                         dev.numa_node, self._alloc_group(),
                         physfn=self._functions[physfn] if physfn else None)
        self._add_files(fn)
        if vfs:
            # Static SR-IOV: the VFs are declared one by one, so the count is fixed.
            self._tree.attr((*path, "sriov_totalvfs"), f"{len(vfs)}\n")
            self._tree.attr((*path, "sriov_numvfs"), f"{len(vfs)}\n")
            for i, vf in enumerate(vfs):
                self._tree.symlink((*path, f"virtfn{i}"), (*path[:-1], vf))
        self._attach(fn, dev.driver, announce=False)
        return fn

    def add_sriov_pf(self, spec: SriovPfSpec, path: Path) -> PciFunction:
        """A PF whose VFs come and go with ``sriov_numvfs`` (none yet: see boot())."""
        fn = PciFunction(spec.address, path, spec.driver, spec.vendor_id, spec.device_id,
                         spec.class_code, spec.numa_node, self._alloc_group(), pf_spec=spec)
        self._add_files(fn)
        tr = self._tree
        tr.attr((*path, "sriov_totalvfs"), f"{spec.total_vfs}\n")
        tr.attr((*path, "sriov_numvfs"), lambda: f"{len(fn.vfs)}\n".encode(),
                store=lambda data: self._numvfs_store(fn, data))
        tr.attr((*path, "sriov_offset"), f"{spec.vf_offset}\n")
        tr.attr((*path, "sriov_stride"), f"{spec.vf_stride}\n")
        tr.attr((*path, "sriov_vf_device"), f"{spec.vf_device_id:x}\n")
        tr.attr((*path, "sriov_drivers_autoprobe"), lambda: f"{int(fn.autoprobe)}\n".encode(),
                store=lambda data: self._autoprobe_store(fn, data))
        self._ensure_driver(spec.vf_driver)
        self._attach(fn, spec.driver, announce=False)
        return fn

    def boot(self) -> None:
        """Enable the VFs the spec says exist at boot (what a boot script did)."""
        for fn in self._dynamic_pfs():
            assert fn.pf_spec is not None
            if fn.driver == fn.native_driver and not fn.vfs and fn.pf_spec.num_vfs:
                self._enable_vfs(fn, fn.pf_spec.num_vfs)

    def _add_files(self, fn: PciFunction) -> None:
        tr, path, addr = self._tree, fn.path, fn.address
        tr.attr((*path, "vendor"), f"{fn.vendor_id:#06x}\n")
        tr.attr((*path, "device"), f"{fn.device_id:#06x}\n")
        tr.attr((*path, "class"), f"{fn.class_code:#08x}\n")
        tr.attr((*path, "numa_node"), f"{fn.numa_node}\n")
        tr.attr((*path, "uevent"), lambda: self._uevent(fn), store=len)
        tr.attr((*path, "driver_override"), lambda: self._override_show(fn),
                store=lambda data: self._override_store(fn, data))
        tr.symlink((*path, "subsystem"), ("bus", "pci"))
        tr.symlink(("bus", "pci", "devices", addr), path)
        group = ("kernel", "iommu_groups", str(fn.group))
        tr.symlink((*path, "iommu_group"), group)
        tr.symlink((*group, "devices", addr), path)
        tr.add(("vfio", str(fn.group)), PciGroupNode(addr))
        if fn.physfn is not None:
            tr.symlink((*path, "physfn"), fn.physfn.path)
        self._ensure_driver(fn.native_driver)
        self._functions[addr] = fn

    def _uevent(self, fn: PciFunction) -> bytes:
        # pci_uevent() plus the driver core's DRIVER= line while bound.
        drv = f"DRIVER={fn.driver}\n" if fn.driver else ""
        return (f"{drv}PCI_CLASS={fn.class_code:X}\nPCI_ID={fn.vendor_id:04X}:"
                f"{fn.device_id:04X}\nPCI_SLOT_NAME={fn.address}\n").encode()

    def _ensure_driver(self, name: str) -> None:
        if name in self._drivers:
            return
        self._drivers.add(name)
        drv = ("bus", "pci", "drivers", name)
        self._tree.mkdir(drv)
        self._tree.attr((*drv, "bind"), store=lambda data: self._bind_store(name, data),
                        mode=t.WO_MODE)
        self._tree.attr((*drv, "unbind"), store=lambda data: self._unbind_store(name, data),
                        mode=t.WO_MODE)

    def _dynamic_pfs(self) -> list[PciFunction]:
        return sorted((f for f in self._functions.values() if f.pf_spec is not None),
                      key=lambda f: f.address)

    # ---------------------------------------------------------------- binding

    def _attach(self, fn: PciFunction, drv: str, announce: bool = True) -> None:
        fn.driver = drv
        path = ("bus", "pci", "drivers", drv)
        self._tree.symlink((*fn.path, "driver"), path)
        self._tree.symlink((*path, fn.address), fn.path)
        self._netdev_add(fn)
        for listener in self._listeners:
            listener.bound(fn)
        if announce:
            self._emit("bind", fn.path, "pci", DRIVER=drv)
            self._changed()

    def _check_detach(self, fn: PciFunction) -> None:
        """Everything that would refuse a detach of ``fn``'s driver, before any change."""
        if fn.busy:
            raise oserror(errno.EBUSY, f"{fn.address}: its VFIO group {fn.group} is in use")
        for listener in self._listeners:
            listener.check_unbind(fn)
        if fn.pf_spec is not None and fn.driver == fn.native_driver:
            for vf in fn.vfs:
                self._check_remove_vf(vf)

    def _detach(self, fn: PciFunction) -> None:
        drv = fn.driver
        if drv is None:
            return
        if fn.pf_spec is not None and drv == fn.native_driver:
            self._disable_vfs(fn)  # the PF driver's remove() disables SR-IOV
        for listener in self._listeners:
            listener.unbound(fn)
        self._netdev_remove(fn)
        self._tree.remove((*fn.path, "driver"))
        self._tree.remove(("bus", "pci", "drivers", drv, fn.address))
        fn.driver = None
        fn.held = fn.opened = fn.late_hold = False
        self._emit("unbind", fn.path, "pci")
        self._changed()

    def _matches(self, drv: str, fn: PciFunction) -> bool:
        """pci_match_device(): with driver_override set, only (and always) the
        driver of that name; otherwise the id table, i.e. the device's own driver
        (vfio-pci's table matches nothing by id)."""
        if fn.override is not None:
            return fn.override == drv
        return drv == fn.native_driver

    def _can_probe(self, fn: PciFunction) -> bool:
        """pci_device_can_probe(): a VF probes only when its PF autoprobes or it
        has a driver_override."""
        return fn.physfn is None or fn.physfn.autoprobe or fn.override is not None

    def _probe(self, fn: PciFunction) -> bool:
        """device_attach(): bind the first matching driver that accepts it."""
        if not self._can_probe(fn):
            return False
        for drv in sorted(self._drivers):
            if self._matches(drv, fn) and self._accepts(drv, fn):
                self._attach(fn, drv)
                return True
        return False

    @staticmethod
    def _accepts(drv: str, fn: PciFunction) -> bool:
        # A vendor driver's probe() rejects devices it does not know; vfio-pci
        # takes whatever driver_override hands it.
        return drv in (fn.native_driver, VFIO_PCI)

    def _find(self, data: bytes) -> PciFunction:
        """bus_find_device_by_name(): the device whose name sysfs_streq()s the write."""
        text = data[:-1] if data.endswith(b"\n") else data
        try:
            fn = self._functions.get(text.decode("ascii"))
        except UnicodeDecodeError:
            fn = None
        if fn is None or not fn.alive or not sysfs_streq(data, fn.address):
            raise oserror(errno.ENODEV, f"no PCI device {data!r}")
        return fn

    def _bind_store(self, drv: str, data: bytes) -> int:
        fn = self._find(data)
        if not self._matches(drv, fn):
            raise oserror(errno.ENODEV, f"{drv} does not match {fn.address}")
        if fn.driver is not None:
            raise oserror(errno.EBUSY, f"{fn.address} is bound to {fn.driver}")
        if not self._can_probe(fn) or not self._accepts(drv, fn):
            raise oserror(errno.ENODEV, f"{drv} refuses {fn.address}")
        self._attach(fn, drv)
        return len(data)

    def _unbind_store(self, drv: str, data: bytes) -> int:
        fn = self._find(data)
        if fn.driver != drv:
            raise oserror(errno.ENODEV, f"{fn.address} is not bound to {drv}")
        self._check_detach(fn)
        self._detach(fn)
        return len(data)

    def _drivers_probe_store(self, data: bytes) -> int:
        fn = self._find(data)
        if fn.driver is None:
            self._probe(fn)
        return len(data)

    def _override_show(self, fn: PciFunction) -> bytes:
        # sysfs_emit("%s\n", NULL) prints "(null)".
        return f"{'(null)' if fn.override is None else fn.override}\n".encode()

    def _override_store(self, fn: PciFunction, data: bytes) -> int:
        """driver_set_override(); kernfs never calls store for an empty write."""
        if len(data) >= DRIVER_OVERRIDE_MAX:
            raise oserror(errno.EINVAL, "driver_override too long")
        cut = data.find(b"\n")
        if cut == 0:
            fn.override = None  # "\n" clears
        else:
            text = data if cut < 0 else data[:cut]
            fn.override = text.split(b"\0", 1)[0].decode("utf-8", "replace")  # kstrndup
        self._changed()
        return len(data)

    # ---------------------------------------------------------------- SR-IOV

    def _numvfs_store(self, pf: PciFunction, data: bytes) -> int:
        """sriov_numvfs_store() in the kernel's order of checks."""
        spec = pf.pf_spec
        assert spec is not None
        try:
            want = kstrtoul(data)
        except OSError:
            want = _U16_MAX + 1
        if want > _U16_MAX:
            raise oserror(errno.EINVAL, "not a number of VFs")
        if want > spec.total_vfs:
            raise oserror(errno.ERANGE, f"{want} > sriov_totalvfs {spec.total_vfs}")
        if want == len(pf.vfs):
            return len(data)
        if pf.driver != pf.native_driver:
            raise oserror(errno.ENOENT, f"{pf.address}: no driver that configures SR-IOV")
        if want == 0:
            for vf in pf.vfs:
                self._check_remove_vf(vf)
            self._disable_vfs(pf)
        elif pf.vfs:
            raise oserror(errno.EBUSY, f"{len(pf.vfs)} VFs already enabled; disable first")
        else:
            self._enable_vfs(pf, want)
        return len(data)

    def _autoprobe_store(self, pf: PciFunction, data: bytes) -> int:
        # kstrtobool(): 1/y/Y/t/T/on and 0/n/N/f/F/off (first characters decide).
        text = data.lower()
        if text[:1] in (b"1", b"y", b"t") or text[:2] == b"on":
            pf.autoprobe = True
        elif text[:1] in (b"0", b"n", b"f") or text[:3] == b"off":
            pf.autoprobe = False
        else:
            raise oserror(errno.EINVAL, "not a boolean")
        return len(data)

    def _enable_vfs(self, pf: PciFunction, count: int) -> None:
        spec = pf.pf_spec
        assert spec is not None
        vfio = frozenset({VFIO_PCI, spec.vf_driver}) if spec.is_vgpu else frozenset({VFIO_PCI})
        for i in range(count):
            addr = spec.vf_address(i)
            vf = PciFunction(addr, (*pf.path[:-1], addr), spec.vf_driver, spec.vendor_id,
                             spec.vf_device_id, spec.class_code, spec.numa_node,
                             self._alloc_group(), physfn=pf, index=i, vfio_drivers=vfio)
            self._add_files(vf)
            self._tree.symlink((*pf.path, f"virtfn{i}"), vf.path)
            pf.vfs.append(vf)
            self._emit("add", vf.path, "pci", PCI_SLOT_NAME=addr,
                       PCI_ID=f"{vf.vendor_id:04X}:{vf.device_id:04X}")
            self._probe(vf)
        self._changed()

    def _check_remove_vf(self, vf: PciFunction) -> None:
        if vf.driver is not None:
            self._check_detach(vf)
        elif vf.busy:
            raise oserror(errno.EBUSY, f"{vf.address} is in use")

    def _disable_vfs(self, pf: PciFunction) -> None:
        for vf in pf.vfs:
            self._remove_vf(vf)
        pf.vfs.clear()
        self._changed()

    def _remove_vf(self, vf: PciFunction) -> None:
        self._detach(vf)
        assert vf.physfn is not None
        tr = self._tree
        for path in ((*vf.physfn.path, f"virtfn{vf.index}"), ("vfio", str(vf.group)),
                     ("kernel", "iommu_groups", str(vf.group)),
                     ("bus", "pci", "devices", vf.address), vf.path):
            tr.remove(path)
        self._free_group(vf.group)
        del self._functions[vf.address]
        vf.alive = False
        vf.held = vf.opened = vf.late_hold = False
        self._emit("remove", vf.path, "pci", PCI_SLOT_NAME=vf.address)

    # ---------------------------------------------------------------- netdev

    def _netdev_add(self, fn: PciFunction) -> None:
        """The PF driver registers its network interface (igb: register_netdev)."""
        spec = fn.pf_spec
        if spec is None or spec.netdev is None or fn.driver != fn.native_driver:
            return
        net = (*fn.path, "net", spec.netdev)
        self._tree.attr((*net, "address"), f"{_mac(fn.address)}\n")
        self._tree.symlink((*net, "device"), fn.path)
        self._tree.symlink(("class", "net", spec.netdev), net)

    def _netdev_remove(self, fn: PciFunction) -> None:
        spec = fn.pf_spec
        if spec is None or spec.netdev is None or fn.driver != fn.native_driver:
            return
        self._tree.remove(("class", "net", spec.netdev))
        self._tree.remove((*fn.path, "net"))

    # ---------------------------------------------------------------- VFIO group nodes

    def open_group(self, node: PciGroupNode, path: str) -> Callable[[], None]:
        """vfio_group_fops_open(): ENODEV without a VFIO driver, EBUSY while
        open or held; returns what closing it does."""
        fn = self._functions.get(node.address)
        if fn is None or not node.alive or not fn.vfio_bound:
            raise oserror(errno.ENODEV, f"{path}: no VFIO driver bound")
        if fn.busy:
            raise oserror(errno.EBUSY, f"group {fn.group} of {fn.address} is in use")
        fn.opened = True

        def close() -> None:
            fn.opened = False
            if fn.late_hold and fn.alive:
                fn.late_hold, fn.held = False, True

        return close

    # ---------------------------------------------------------------- host operations

    def function(self, address: str) -> PciFunction:
        fn = self._functions.get(address)
        if fn is None:
            raise exception.SimulatorError(reason=f"no PCI device {address} on the simulated host")
        return fn

    def functions(self) -> Iterator[PciFunction]:
        return iter(sorted(self._functions.values(), key=lambda f: f.address))

    def hold(self, address: str, after_probe: bool = False) -> None:
        fn = self.function(address)
        if not fn.vfio_bound:
            raise exception.SimulatorError(
                reason=f"{address} is bound to {fn.driver or 'no driver'}, not to a VFIO "
                       "driver: no VM can hold it")
        if after_probe:
            fn.late_hold = True
        else:
            fn.held = True

    def release(self, address: str) -> None:
        fn = self.function(address)
        fn.held = fn.late_hold = False

    def release_all(self) -> None:
        for fn in self._functions.values():
            fn.held = fn.late_hold = False

    def reboot(self) -> None:
        """Back to the boot state: VFs gone and enabled again as the spec says,
        every function on its own driver, overrides and holds forgotten."""
        for pf in self._dynamic_pfs():
            for vf in pf.vfs:
                vf.held = vf.opened = vf.late_hold = False
                self._remove_vf(vf)
            pf.vfs.clear()
        for fn in self.functions():
            fn.held = fn.opened = fn.late_hold = False
            fn.override = None
            fn.autoprobe = True
            if fn.driver != fn.native_driver:
                self._detach(fn)
                self._attach(fn, fn.native_driver)
        self.boot()
        self._changed()

    def status(self) -> dict[str, Any]:
        pfs, vfs, rebound = [], [], []
        for fn in self.functions():
            if fn.pf_spec is not None:
                pfs.append({"address": fn.address, "driver": fn.driver,
                            "total_vfs": fn.pf_spec.total_vfs, "num_vfs": len(fn.vfs),
                            "netdev": fn.pf_spec.netdev if fn.driver == fn.native_driver
                            else None})
            if fn.index >= 0:
                vfs.append(_function_status(fn))
            elif fn.driver != fn.native_driver or fn.override is not None or fn.busy:
                rebound.append(_function_status(fn))
        return {"sriov_pfs": pfs, "vfs": vfs, "pci_functions": rebound}


def _function_status(fn: PciFunction) -> dict[str, Any]:
    return {"address": fn.address, "physfn": fn.physfn.address if fn.physfn else None,
            "driver": fn.driver, "default_driver": fn.native_driver,
            "driver_override": fn.override, "iommu_group": fn.group, "held": fn.busy}


def _mac(address: str) -> str:
    """A stable locally administered MAC per PCI address (the device's own is
    in its EEPROM; any unicast address will do for the model)."""
    dom, bus, rest = address.split(":")
    slot, fn = rest.split(".")
    return f"02:00:{int(dom, 16) & 0xFF:02x}:{int(bus, 16):02x}:{int(slot, 16):02x}:{int(fn):02x}"
