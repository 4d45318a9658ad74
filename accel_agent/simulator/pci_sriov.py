"""SR-IOV of the simulated host: PFs whose VFs come and go with ``sriov_numvfs``.

:class:`SriovPfs` owns every dynamic PF (:class:`~.spec_sriov.SriovPfSpec`)
and plays drivers/pci/iov.c on top of the PCI and driver cores of
:mod:`.pci`: enabling VFs adds PCI functions to the bus and probes drivers
for them, disabling them detaches and removes them.  It is also what the PF's
own driver does on its binding (a :class:`~.pci.DriverListener` of the bus,
the first one): register the network interface when bound, disable SR-IOV
and unregister it before unbinding (igb_probe()/igb_remove()).  Like the rest
of the model it is not thread-safe on its own: the host calls it under its
lock.

Layout it adds (beside the pci module's)::

  <PF>/sriov_totalvfs sriov_numvfs sriov_offset sriov_stride sriov_vf_device
  <PF>/sriov_drivers_autoprobe
  <PF>/virtfn<i> -> ../<VF>, <VF>/physfn -> ../<PF>
  <PF>/net/<ifname>/{address,device}, class/net/<ifname> -> ...  while the PF
                                          driver is bound (igb registers it)

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
unbind of a PF with a busy VF           EBUSY   choice, same reason
sriov_drivers_autoprobe: not a bool     EINVAL  iov.c kstrtobool()
======================================  ======  =====================================

New VFs bind to the VF driver at once (``sriov_drivers_autoprobe`` 1, the
kernel's default), each in its own IOMMU group (lowest free number, like
``ida_alloc``).  Unbinding a PF's own driver disables SR-IOV first
(igb_remove() does), so its VFs vanish; rebinding does not enable them again
(igb's ``max_vfs`` defaults to 0).

Simplifications: the VFs of the older ``nvidia-sriov`` profile (mdev parents
declared one by one) are static (:meth:`~.pci.PciBus.add_static`), their
PF's ``sriov_numvfs`` is read-only; VFs get no netdev of their own.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import kstrtoul
from accel_agent.simulator.pci import VFIO_PCI, Emit, PciBus, PciFunction
from accel_agent.simulator.spec_sriov import SriovPfSpec
from accel_agent.simulator.tree import Path, oserror

_U16_MAX = 0xFFFF


class SriovPfs:
    """Every dynamic SR-IOV PF of a host and its VFs (module docstring)."""

    def __init__(self, tree: t.Tree, bus: PciBus, emit: Emit, changed: Callable[[], None],
                 alloc_group: Callable[[], int]) -> None:
        self._tree = tree
        self._bus = bus
        self._emit = emit  # emit(action, path, subsystem, **env)
        self._changed = changed
        self._alloc_group = alloc_group
        self._pfs: dict[str, PciFunction] = {}

    # ---------------------------------------------------------------- construction

    def add_pf(self, spec: SriovPfSpec, path: Path) -> PciFunction:
        """A PF whose VFs come and go with ``sriov_numvfs`` (none yet: see boot())."""
        fn = PciFunction(spec.address, path, spec.driver, spec.vendor_id, spec.device_id,
                         spec.class_code, spec.numa_node, self._alloc_group(), pf_spec=spec)
        self._bus.add_function(fn)
        tr = self._tree
        tr.attr((*path, "sriov_totalvfs"), f"{spec.total_vfs}\n")
        tr.attr((*path, "sriov_numvfs"), lambda: f"{len(fn.vfs)}\n".encode(),
                store=lambda data: self._numvfs_store(fn, data))
        tr.attr((*path, "sriov_offset"), f"{spec.vf_offset}\n")
        tr.attr((*path, "sriov_stride"), f"{spec.vf_stride}\n")
        tr.attr((*path, "sriov_vf_device"), f"{spec.vf_device_id:x}\n")
        tr.attr((*path, "sriov_drivers_autoprobe"), lambda: f"{int(fn.autoprobe)}\n".encode(),
                store=lambda data: self._autoprobe_store(fn, data))
        self._bus.ensure_driver(spec.vf_driver)
        self._pfs[fn.address] = fn
        self._bus.attach(fn, spec.driver, announce=False)
        return fn

    def _sorted_pfs(self) -> list[PciFunction]:
        return [self._pfs[a] for a in sorted(self._pfs)]

    def boot(self, vgpu_vfs: bool = True) -> None:
        """Enable the VFs the spec says exist at boot (what a boot script did).
        ``vgpu_vfs`` False: the vGPU 17+ GPUs' boot script has not run yet, so
        they come up without VFs (NVIDIA: "the virtual functions ... are
        disabled after the hypervisor host is rebooted"; docs/design.md
        §10.3, Sources V1); other PFs
        (NICs) still get theirs."""
        for fn in self._sorted_pfs():
            assert fn.pf_spec is not None
            if fn.pf_spec.is_vgpu and not vgpu_vfs:
                continue
            if fn.driver == fn.native_driver and not fn.vfs and fn.pf_spec.num_vfs:
                self._enable_vfs(fn, fn.pf_spec.num_vfs)

    def sriov_manage_enable(self, target: str | None) -> dict[str, list[str]]:
        """NVIDIA's ``sriov-manage -e PF|ALL`` (None: ALL), the way its script
        does it (docs/design.md §10.3; the script ships with the
        vGPU host driver as /usr/lib/nvidia/sriov-manage and runs at boot from
        nvidia-sriov.service): a GPU that has VFs already is left alone ("already
        has VFs enabled"), any other gets ``sriov_totalvfs`` VFs, each probed
        like any new VF (bound to ``nvidia``, ``current_vgpu_type`` 0, a udev
        ``add`` then ``bind`` event).  ALL means every vGPU 17+ GPU.

        Simplifications, each a choice: the script writes ``sriov_numvfs``
        while the PF sits on ``pci-pf-stub`` and binds it back to ``nvidia``
        after, which is not replayed (no PF unbind/bind events); a PF that is
        not on ``nvidia`` is refused here (the script would rebind it) and so
        is a PF that is no vGPU 17+ GPU (the script ignores non-NVIDIA ones).
        Everything is checked before anything changes.  Returns the PFs
        ``enabled`` now and those ``already_enabled``."""
        if target is None:
            pfs = [fn for fn in self._sorted_pfs() if fn.pf_spec and fn.pf_spec.is_vgpu]
            if not pfs:
                raise exception.SimulatorError(reason="no NVIDIA vGPU 17+ GPU on this host")
        else:
            fn = self._pfs.get(target)
            if fn is None or fn.pf_spec is None or not fn.pf_spec.is_vgpu:
                raise exception.SimulatorError(
                    reason=f"{target} is not an NVIDIA vGPU 17+ GPU of this host (its VFs "
                           "are enabled by a sriov_numvfs write instead)")
            pfs = [fn]
        for fn in pfs:
            if fn.driver != fn.native_driver:
                raise exception.SimulatorError(
                    reason=f"{fn.address} is bound to {fn.driver or 'no driver'}, not "
                           f"{fn.native_driver}; nothing changed")
        out: dict[str, list[str]] = {"enabled": [], "already_enabled": []}
        for fn in pfs:
            assert fn.pf_spec is not None
            if fn.vfs:
                out["already_enabled"].append(fn.address)
            else:
                self._enable_vfs(fn, fn.pf_spec.total_vfs)
                out["enabled"].append(fn.address)
        return out

    def shutdown(self) -> None:
        """The host goes down: every VF is gone, holds on them forgotten."""
        for pf in self._sorted_pfs():
            for vf in pf.vfs:
                vf.held = vf.opened = vf.late_hold = False
                self._remove_vf(vf)
            pf.vfs.clear()

    # ---------------------------------------------------------------- the PF driver's binding

    def check_unbind(self, fn: PciFunction) -> None:
        if fn.pf_spec is not None and fn.driver == fn.native_driver:
            for vf in fn.vfs:
                self._check_remove_vf(vf)

    def bound(self, fn: PciFunction) -> None:
        self._netdev_add(fn)

    def unbound(self, fn: PciFunction) -> None:
        if fn.pf_spec is not None and fn.driver == fn.native_driver:
            self._disable_vfs(fn)  # the PF driver's remove() disables SR-IOV
        self._netdev_remove(fn)

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
            self._bus.add_function(vf)
            self._tree.symlink((*pf.path, f"virtfn{i}"), vf.path)
            pf.vfs.append(vf)
            self._emit("add", vf.path, "pci", PCI_SLOT_NAME=addr,
                       PCI_ID=f"{vf.vendor_id:04X}:{vf.device_id:04X}")
            self._bus.probe(vf)
        self._changed()

    def _check_remove_vf(self, vf: PciFunction) -> None:
        if vf.driver is not None:
            self._bus.check_detach(vf)
        elif vf.busy:
            raise oserror(errno.EBUSY, f"{vf.address} is in use")

    def _disable_vfs(self, pf: PciFunction) -> None:
        for vf in pf.vfs:
            self._remove_vf(vf)
        pf.vfs.clear()
        self._changed()

    def _remove_vf(self, vf: PciFunction) -> None:
        self._bus.detach(vf)
        assert vf.physfn is not None
        self._tree.remove((*vf.physfn.path, f"virtfn{vf.index}"))
        self._bus.remove_function(vf)

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


def _mac(address: str) -> str:
    """A stable locally administered MAC per PCI address (the device's own is
    in its EEPROM; any unicast address will do for the model)."""
    dom, bus, rest = address.split(":")
    slot, fn = rest.split(".")
    return f"02:00:{int(dom, 16) & 0xFF:02x}:{int(bus, 16):02x}:{int(slot, 16):02x}:{int(fn):02x}"
