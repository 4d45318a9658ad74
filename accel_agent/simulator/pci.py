"""The PCI side of the simulated host: functions and driver binding.

:class:`PciBus` owns every PCI function of the model and the files the PCI
core and the driver core give them; :class:`~.model.SimulatedHost` delegates
here, :mod:`.pci_sriov` adds and removes VFs through it, and what lives on a
driver binding (SR-IOV and the netdev of a PF driver, mdev types, ``nvidia/``
files) listens to it (:class:`DriverListener`).  Like the rest of the model it
is not thread-safe on its own: the host calls it under its lock.

Layout it adds (beside the model module's)::

  <function>/driver_override              rw  "(null)" while unset
  <function>/driver -> bus/pci/drivers/<drv>    only while bound
  <function>/uevent                       DRIVER= only while bound
  <VF>/physfn -> ../<PF>
  <PF>/sriov_totalvfs sriov_numvfs virtfn<i>   static VFs only (nvidia-sriov profile),
                                          read-only; a dynamic PF's: pci_sriov
  bus/pci/drivers/<drv>/{bind,unbind,<addr> -> device}
  bus/pci/drivers/vfio-pci/               always present
  bus/pci/drivers_probe
  vfio/<group>                            stand-in for /dev/vfio/<group>

Semantics, each either a kernel fact (source named) or a documented choice:

======================================  ======  =====================================
write                                   errno   source
======================================  ======  =====================================
unbind of a busy (group open/held)      EBUSY   choice; the kernel blocks in
  function                                      vfio_unregister_group_dev() until
                                                the VM lets go (a PF with a busy
                                                VF: see pci_sriov)
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
open vfio/<N> not bound to a VFIO       ENODEV  vfio/group.c vfio_group_fops_open()
  driver                                        with no driver (the node itself
                                                exists regardless: a choice)
open vfio/<N> already open / held       EBUSY   vfio_group_fops_open()
======================================  ======  =====================================

Each function has its own IOMMU group (lowest free number, like
``ida_alloc``).  ``vfio/<group>`` exists for every function; it can be opened
(by a VM, or the agent's in-use probe) only while the function is bound to a
VFIO driver: ``vfio-pci``, or ``nvidia`` for the VFs of a vendor-specific-VFIO
GPU (NVIDIA's driver registers them with VFIO itself).

Simplifications: the VFs of the older ``nvidia-sriov`` profile (mdev parents
declared one by one) are static, their PF's ``sriov_numvfs`` is read-only;
``new_id``, ``remove_id`` and ``rescan`` are absent.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import sysfs_streq
from accel_agent.simulator.spec import ParentSpec, PciDeviceSpec, SriovPfSpec
from accel_agent.simulator.tree import Attr, Path, oserror

VFIO_PCI = "vfio-pci"
# drivers/base/driver.c: "len >= (PAGE_SIZE - 1)" is refused.
DRIVER_OVERRIDE_MAX = 4096 - 1


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
        self.ensure_driver(VFIO_PCI)

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
        self.add_function(fn)
        if vfs:
            # Static SR-IOV: the VFs are declared one by one, so the count is fixed.
            self._tree.attr((*path, "sriov_totalvfs"), f"{len(vfs)}\n")
            self._tree.attr((*path, "sriov_numvfs"), f"{len(vfs)}\n")
            for i, vf in enumerate(vfs):
                self._tree.symlink((*path, f"virtfn{i}"), (*path[:-1], vf))
        self.attach(fn, dev.driver, announce=False)
        return fn

    def add_function(self, fn: PciFunction) -> None:
        """pci_device_add(): the function's files, links and group node."""
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
        self.ensure_driver(fn.native_driver)
        self._functions[addr] = fn

    def remove_function(self, fn: PciFunction) -> None:
        """pci_stop_and_remove_bus_device() of an unbound function (a VF going
        away): its files, links and group node, its group number freed."""
        tr = self._tree
        for path in (("vfio", str(fn.group)), ("kernel", "iommu_groups", str(fn.group)),
                     ("bus", "pci", "devices", fn.address), fn.path):
            tr.remove(path)
        self._free_group(fn.group)
        del self._functions[fn.address]
        fn.alive = False
        fn.held = fn.opened = fn.late_hold = False
        self._emit("remove", fn.path, "pci", PCI_SLOT_NAME=fn.address)

    def _uevent(self, fn: PciFunction) -> bytes:
        # pci_uevent() plus the driver core's DRIVER= line while bound.
        drv = f"DRIVER={fn.driver}\n" if fn.driver else ""
        return (f"{drv}PCI_CLASS={fn.class_code:X}\nPCI_ID={fn.vendor_id:04X}:"
                f"{fn.device_id:04X}\nPCI_SLOT_NAME={fn.address}\n").encode()

    def ensure_driver(self, name: str) -> None:
        if name in self._drivers:
            return
        self._drivers.add(name)
        drv = ("bus", "pci", "drivers", name)
        self._tree.mkdir(drv)
        self._tree.attr((*drv, "bind"), store=lambda data: self._bind_store(name, data),
                        mode=t.WO_MODE)
        self._tree.attr((*drv, "unbind"), store=lambda data: self._unbind_store(name, data),
                        mode=t.WO_MODE)

    # ---------------------------------------------------------------- binding

    def attach(self, fn: PciFunction, drv: str, announce: bool = True) -> None:
        fn.driver = drv
        path = ("bus", "pci", "drivers", drv)
        self._tree.symlink((*fn.path, "driver"), path)
        self._tree.symlink((*path, fn.address), fn.path)
        for listener in self._listeners:
            listener.bound(fn)
        if announce:
            self._emit("bind", fn.path, "pci", DRIVER=drv)
            self._changed()

    def check_detach(self, fn: PciFunction) -> None:
        """Everything that would refuse a detach of ``fn``'s driver, before any change."""
        if fn.busy:
            raise oserror(errno.EBUSY, f"{fn.address}: its VFIO group {fn.group} is in use")
        for listener in self._listeners:
            listener.check_unbind(fn)

    def detach(self, fn: PciFunction) -> None:
        drv = fn.driver
        if drv is None:
            return
        for listener in self._listeners:
            listener.unbound(fn)
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

    def probe(self, fn: PciFunction) -> bool:
        """device_attach(): bind the first matching driver that accepts it."""
        if not self._can_probe(fn):
            return False
        for drv in sorted(self._drivers):
            if self._matches(drv, fn) and self._accepts(drv, fn):
                self.attach(fn, drv)
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
        self.attach(fn, drv)
        return len(data)

    def _unbind_store(self, drv: str, data: bytes) -> int:
        fn = self._find(data)
        if fn.driver != drv:
            raise oserror(errno.ENODEV, f"{fn.address} is not bound to {drv}")
        self.check_detach(fn)
        self.detach(fn)
        return len(data)

    def _drivers_probe_store(self, data: bytes) -> int:
        fn = self._find(data)
        if fn.driver is None:
            self.probe(fn)
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

    # ---------------------------------------------------------------- VFIO group nodes

    def open_group(self, node: PciGroupNode, path: str, vm: bool = False) -> Callable[[], None]:
        """vfio_group_fops_open(): ENODEV without a VFIO driver, EBUSY while
        open or held; returns what closing it does.  ``vm``: a read-write
        open, as QEMU opens the group to run a guest on the device; a
        listener may refuse that (:meth:`check_vm`)."""
        fn = self._functions.get(node.address)
        if fn is None or not node.alive or not fn.vfio_bound:
            raise oserror(errno.ENODEV, f"{path}: no VFIO driver bound")
        if fn.busy:
            raise oserror(errno.EBUSY, f"group {fn.group} of {fn.address} is in use")
        if vm:
            self.check_vm(fn)
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

    def check_vm(self, fn: PciFunction) -> None:
        """A VM is about to use ``fn``: a listener with a ``check_vm_open``
        hook (the vGPU files, whose guest may fail to start) may refuse it
        with an OSError."""
        for listener in self._listeners:
            check = getattr(listener, "check_vm_open", None)
            if check is not None:
                check(fn)

    def hold(self, address: str, after_probe: bool = False) -> None:
        fn = self.function(address)
        if not fn.vfio_bound:
            raise exception.SimulatorError(
                reason=f"{address} is bound to {fn.driver or 'no driver'}, not to a VFIO "
                       "driver: no VM can hold it")
        try:
            self.check_vm(fn)
        except OSError as err:
            raise exception.SimulatorError(reason=f"the VM cannot start: {err.strerror}") from None
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
        """Back to the boot state (the VFs already gone, see :mod:`.pci_sriov`):
        every function on its own driver, overrides and holds forgotten."""
        for fn in self.functions():
            fn.held = fn.opened = fn.late_hold = False
            fn.override = None
            fn.autoprobe = True
            if fn.driver != fn.native_driver:
                self.detach(fn)
                self.attach(fn, fn.native_driver)
        self._changed()

    def reload_driver(self, name: str) -> list[str]:
        """``rmmod NAME; modprobe NAME``: every function bound to ``name`` is
        detached (a PF's remove() disables its SR-IOV, so its VFs vanish), then
        the driver's registration probes every unbound function it matches
        (driver_register() -> driver_attach()).  Refused, changing nothing,
        while any of them is in use: an open VFIO device holds a reference on
        its driver's module, and ``rmmod`` answers "Module ... is in use".
        The static VFs of the ``nvidia-sriov`` profile stay (they are probed
        again); a real reload would cycle them too.
        Returns the addresses bound to ``name`` afterwards."""
        bound = [fn for fn in self.functions() if fn.driver == name]
        if not bound:
            raise exception.SimulatorError(reason=f"no PCI device is bound to {name}")
        for fn in bound:
            try:
                self.check_detach(fn)
            except OSError as err:
                raise exception.SimulatorError(
                    reason=f"rmmod {name}: module in use ({err.strerror}); nothing changed"
                ) from None
        for fn in bound:
            if fn.alive and fn.driver == name:  # a VF may have gone with its PF
                self.detach(fn)
        for fn in self.functions():
            if (fn.driver is None and self._matches(name, fn) and self._can_probe(fn)
                    and self._accepts(name, fn)):
                self.attach(fn, name)
        return [fn.address for fn in self.functions() if fn.driver == name]

    def status(self) -> dict[str, Any]:
        pfs, vfs, rebound = [], [], []
        for fn in self.functions():
            if fn.pf_spec is not None:
                # vfs_enabled: what NVIDIA's sriov-manage -e changes (a reboot or a
                # driver reload leaves a vGPU 17+ GPU without VFs until it runs).
                pfs.append({"address": fn.address, "driver": fn.driver,
                            "total_vfs": fn.pf_spec.total_vfs, "num_vfs": len(fn.vfs),
                            "vfs_enabled": bool(fn.vfs), "vgpu": fn.pf_spec.is_vgpu,
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

