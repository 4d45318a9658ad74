"""``SimulatedHost``: a reactive, kernel-faithful model of the mdev sysfs ABI.

The host owns a :class:`~accel_agent.simulator.tree.Tree` laid out like
``/sys`` and mutates it exactly when the kernel would: a write to a type's
``create`` adds the mdev directory and every link before it returns, a write to
an mdev's ``remove`` deletes them and restores the counters, a parent's
unregistration destroys its children.  Failures are ``OSError`` with the
kernel's errno (docs/design.md §4.3, §4.4), so
the FUSE front and in-process callers see the same numbers.

The host is the wiring of five parts, each a model of one kernel piece that
names its sources:

* :mod:`.kernfs` - the tree served as files (open handles, seq_file reads,
  ENODEV on a removed node), its lock and slow reads; the host *is* one;
* :mod:`.mdev` - the mdev core: parents, types and counters, ``create`` and
  ``remove``, mdev group nodes, a parent's types living on its driver binding;
* :mod:`.pci` - the PCI and driver cores: functions, binding,
  ``driver_override``, PCI group nodes;
* :mod:`.pci_sriov` - SR-IOV: VFs that come and go with ``sriov_numvfs``, the
  PF driver's network interface;
* :mod:`.nvidia_vfio` - the ``nvidia/`` files of NVIDIA vGPU 17+ VFs.

It keeps what they share: the IOMMU group numbers, the event log and the
generation counter, and the host operations of tests and the control socket
(reboot, with or without the vGPU 17+ VFs, enable-vfs, driver-reload,
hold/release, register/unregister, fault injection, status).

Threading: one ``RLock`` guards all state; a remove that blocks on a held
device waits on a condition of that lock, so other callers (the FUSE worker
threads, the control socket's ``release``) keep running meanwhile.

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
  (mdevs: see the mdev module; PCI binding, SR-IOV and nvidia/ files: the pci,
  pci_sriov and nvidia_vfio modules)

``vfio/<N>`` is not part of a real /sys: it plays the VFIO group node
(``/dev/vfio/<N>``, root 0600) that the agent probes before a remove.  Like the
kernel's group file, one opener at a time: a second ``open`` gets EBUSY, and
while it is open (or the device is ``hold``-ed, a VM holding it) a ``remove``
write blocks (:mod:`.mdev`); PCI functions have one too (:mod:`.pci`).

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

import os
from collections import deque
from dataclasses import dataclass
from typing import Any

from accel_agent import exception
from accel_agent.nvml import SIMULATOR_MARKER
from accel_agent.simulator.kabi import pci_path
from accel_agent.simulator.kernfs import Handle, Kernfs, TreeEntry
from accel_agent.simulator.mdev import (
    DEFAULT_REMOVE_BLOCK_TIMEOUT,
    BlockedRemove,
    GroupNode,
    MdevBus,
    MdevInfo,
)
from accel_agent.simulator.nvidia_vfio import NvidiaVgpus
from accel_agent.simulator.pci import PciBus, PciGroupNode
from accel_agent.simulator.pci_sriov import SriovPfs
from accel_agent.simulator.spec import HostSpec, ParentSpec, PciDeviceSpec
from accel_agent.simulator.tree import Attr, Path
from accel_agent.sysfs import address

# What callers have always imported from here; each now lives beside its part.
__all__ = ["DEFAULT_REMOVE_BLOCK_TIMEOUT", "BlockedRemove", "Event", "Handle", "MdevInfo",
           "SimulatedHost", "TreeEntry"]


@dataclass(frozen=True)
class Event:
    """A udev-like event: what a pyudev monitor on the real host would see."""

    seq: int
    action: str  # add | remove | change | bind | unbind
    devpath: str
    subsystem: str
    env: dict[str, str]


class SimulatedHost(Kernfs):
    """The live model.  See the module docstring for the layout and semantics."""

    def __init__(self, spec: HostSpec,
                 remove_block_timeout: float = DEFAULT_REMOVE_BLOCK_TIMEOUT) -> None:
        if not isinstance(spec, HostSpec):
            raise exception.SimulatorSpecInvalid(reason=f"expected a HostSpec, got {spec!r}")
        super().__init__()
        self.spec = spec
        self._groups_used: set[int] = set()
        self._events: deque[Event] = deque(maxlen=4096)
        self._seq = 0
        self.generation = 0
        self.boot_count = 1
        for base in (("class", "mdev_bus"), ("bus", "mdev", "devices"), ("bus", "mdev", "drivers"),
                     ("bus", "pci", "devices"), ("bus", "pci", "drivers"),
                     ("kernel", "iommu_groups"), ("devices", "virtual"), ("vfio",)):
            self._tree.mkdir(base)
        self._pci = PciBus(self._tree, self._event, self._changed, self._alloc_group,
                           self._groups_used.discard)
        self._sriov = SriovPfs(self._tree, self._pci, self._event, self._changed,
                               self._alloc_group)
        self._mdev = MdevBus(self._tree, self._cond, self._event, self._changed,
                             self._alloc_group, self._groups_used.discard, remove_block_timeout)
        self._vgpus = NvidiaVgpus(self._tree, self._changed, spec.sriov_pfs)
        # In the order the drivers act: a PF driver's remove() disables SR-IOV
        # before anything else living on a binding hears of the unbind.
        self._pci.add_listener(self._sriov)
        self._pci.add_listener(self._mdev)
        self._pci.add_listener(self._vgpus)
        with self._lock:
            self._build()

    @property
    def remove_block_timeout(self) -> float:
        """How long a ``remove`` of a held mdev blocks before EINTR (:mod:`.mdev`)."""
        return self._mdev.remove_block_timeout

    @remove_block_timeout.setter
    def remove_block_timeout(self, seconds: float) -> None:
        self._mdev.remove_block_timeout = seconds

    @property
    def blocked_removes(self) -> list[BlockedRemove]:
        return self._mdev.blocked_removes

    # ---------------------------------------------------------------- construction

    def _build(self) -> None:
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
            self._sriov.add_pf(pf, pci_path(pf.address))
        self._sriov.boot()
        for p in self.spec.parents:
            self._mdev.add_parent(p, pfs[p.name] if p.kind == "pci" else None)
        self._mdev.boot(self.spec.mdevs)

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

    def _open_attr(self, node: Attr, path: str, flags: int) -> Handle:
        """A VFIO group node is taken while open (:mod:`.mdev`, :mod:`.pci`);
        a read-write open of a PCI function's is a VM's (:mod:`.nvidia_vfio`)."""
        if isinstance(node, GroupNode):
            return Handle(self, node, path, on_close=self._locked(self._mdev.open_group(
                node, path)))
        if isinstance(node, PciGroupNode):
            vm = (flags & os.O_ACCMODE) != os.O_RDONLY
            return Handle(self, node, path, on_close=self._locked(self._pci.open_group(
                node, path, vm=vm)))
        return super()._open_attr(node, path, flags)

    # ---------------------------------------------------------------- host operations

    def register_parent(self, name: str) -> None:
        """The driver registers the parent again (module load, VF enabled): types
        come back, no mdevs (the kernel never restores them)."""
        with self._lock:
            self._mdev.register(name)

    def unregister_parent(self, name: str) -> None:
        """``mdev_unregister_parent()``: every child mdev vanishes without a remove
        write, then the types and the ``class/mdev_bus`` link go.  A stale file
        descriptor on the parent's ``create`` then gets ENODEV."""
        with self._lock:
            self._mdev.unregister(name)

    def reboot(self, vfs_disabled: bool = False) -> None:
        """A host reboot: every mdev is gone (counters restored), the PCI side is
        back to the spec's boot state (VFs enabled again as the spec says, every
        vGPU type 0, every function on its own driver, no driver_override),
        every parent is registered again, holds and injected faults are
        forgotten.  ``vfs_disabled``: the vGPU 17+ GPUs come up without VFs,
        as NVIDIA documents for a reboot, until :meth:`enable_vfs` (their
        ``sriov-manage -e``) runs; other SR-IOV PFs get their VFs as usual."""
        with self._lock:
            self._mdev.destroy_all()
            self._sriov.shutdown()
            self._pci.reboot()
            self._sriov.boot(vgpu_vfs=not vfs_disabled)
            self._vgpus.reset()
            self._vgpus.rebooted()
            self._mdev.rebooted()
            self.boot_count += 1
            self._changed()

    def enable_vfs(self, pf: str) -> dict[str, list[str]]:
        """NVIDIA's ``sriov-manage -e PF|ALL``: every vGPU 17+ GPU named (``ALL``:
        each of them) without VFs gets all it supports (``sriov_totalvfs``),
        bound to ``nvidia`` and untyped (see
        :meth:`.pci_sriov.SriovPfs.sriov_manage_enable`)."""
        with self._lock:
            if pf.lower() == "all":
                done = self._sriov.sriov_manage_enable(None)
            elif not address.is_pci_address(pf):
                raise exception.SimulatorError(reason=f"{pf!r} is neither a PCI address nor ALL")
            else:
                done = self._sriov.sriov_manage_enable(address.parse_pci_address(pf))
            for enabled in done["enabled"]:
                # Enabling the VFs clears mixed-size mode and wipes GPU instances.
                self._vgpus.vfs_enabled(enabled)
            return done

    def driver_reload(self, driver: str = "nvidia") -> list[str]:
        """``rmmod``/``modprobe`` of a PCI driver: what it had bound goes and is
        probed again; a PF's VFs vanish with its remove() (NVIDIA: the VFs "are
        disabled ... if the driver is reloaded"), typed or not, and stay gone
        until :meth:`enable_vfs`; mdev parents on that driver lose their mdevs.
        Other drivers' devices and mdevs are untouched.  Refused, changing
        nothing, while a device of the driver (or a VF or mdev of it) is in
        use.  Returns the addresses bound to ``driver`` afterwards."""
        with self._lock:
            out = self._pci.reload_driver(driver)
            self._vgpus.driver_reloaded(driver)
            self._changed()
            return out

    def gpu_reset(self, pf: str) -> None:
        """A reset of NVIDIA GPU ``pf`` (``nvidia-smi -r``): its pending MIG
        mode applies, mixed-size mode and GPU instances are gone; refused
        while anything uses it (:mod:`.nvidia_gpu`)."""
        with self._lock:
            if not address.is_pci_address(pf):
                raise exception.SimulatorError(reason=f"{pf!r} is not a PCI address")
            try:
                self._vgpus.gpu_reset(address.parse_pci_address(pf))
            except exception.NvmlError as err:
                raise exception.SimulatorError(reason=err.message) from None

    def announce_control_socket(self, path: str) -> None:
        """Serve ``accel-agent-simulator/control_socket`` (0444) in the tree,
        naming the control socket: how the agent finds this host's NVML
        (accel_agent/nvml/__init__.py).  Not part of a real /sys."""
        with self._lock:
            self._tree.attr(SIMULATOR_MARKER, f"{path}\n")

    @property
    def nvidia(self) -> NvidiaVgpus:
        """The NVIDIA vGPU GPUs' files and driver state (for :mod:`.nvml`)."""
        return self._vgpus

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
            self._mdev.hold(uuid, after_probe)

    def release(self, uuid: str) -> None:
        """The VM lets go: a blocked remove completes."""
        with self._lock:
            if address.is_pci_address(uuid):
                self._pci.release(address.parse_pci_address(uuid))
                return
            self._mdev.release(uuid)

    def release_all(self) -> None:
        with self._lock:
            self._mdev.release_all()
            self._pci.release_all()

    def fail_next_create(self, code: int, parent: str | None = None,
                         type_id: str | None = None) -> None:
        """Make the next matching create fail with ``code`` as the vendor probe would
        (e.g. i915's ENOSPC although ``available_instances`` read 1)."""
        with self._lock:
            self._mdev.fail_next_create(code, parent, type_id)

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

    def close(self) -> None:
        """Wake every blocked remove (they complete) and stalled read; used
        when the front stops."""
        self.release_all()
        self.unstall_reads()

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
            return self._mdev.infos()

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
            return self._mdev.names(registered_only)

    def parent_path(self, name: str) -> str:
        with self._lock:
            return "/".join(self._mdev.parent(name).path)

    def events_since(self, seq: int = 0) -> list[Event]:
        with self._lock:
            return [e for e in self._events if e.seq > seq]

    def status(self, with_counters: bool = True) -> dict[str, Any]:
        with self._lock:
            return {
                "generation": self.generation,
                "boot_count": self.boot_count,
                "stalled_reads": self.stalled_reads,
                "stalled_readers": self.stalled_readers,
                "parents": self._mdev.parents_status(with_counters),
                "mdevs": [{"uuid": i.uuid, "parent": i.parent, "type_id": i.type_id,
                           "iommu_group": i.iommu_group, "held": i.held} for i in self.mdevs()],
                "blocked_removes": [vars(b).copy() for b in self.blocked_removes],
                **self._pci_status(),
                "vgpus": self._vgpus.vgpus(),
                "vgpu_writes": self._vgpus.writes(),
                "nvidia_gpus": self._vgpus.gpus_status(),
                "vgpu_boot_failures": self._vgpus.boot_failures(),
            }


def _addr(dev: ParentSpec | PciDeviceSpec) -> str:
    return dev.address if isinstance(dev, PciDeviceSpec) else dev.name
