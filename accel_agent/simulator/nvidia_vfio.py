"""NVIDIA vGPU 17+ on vendor-specific VFIO: the ``nvidia/`` files of a GPU's VFs.

Since vGPU 17 (Ada, Hopper, Blackwell) the ``nvidia`` driver registers no mdev
parent: a vGPU is an SR-IOV VF that stays bound to ``nvidia`` and is typed
through files under the VF (docs/design.md §10.3).  The VFs
themselves (``sriov_numvfs``, ``virtfn``/``physfn``, IOMMU groups, binding)
are :mod:`.pci`'s; this module adds, while a VF of a GPU whose spec lists
``vgpu_types`` is bound to its VF driver, ``<VF>/nvidia/``:

========================  ====  ===============================================
file                      mode  behaviour
========================  ====  ===============================================
creatable_vgpu_types      0444  ``ID    : vGPU Name`` then ``<id>  : <name>`` per
                                type creatable on this VF *now* (the real
                                driver's layout: id left-justified in 6 columns)
current_vgpu_type         0644  decimal id, ``0`` = none; writing an id creates
                                the vGPU, writing ``0`` destroys it
gpu_instance_id           0644  a MIG-backed vGPU's GPU instance, ``0`` for a
                                time-sliced one; ENXIO while untyped (docs/design.md
                                §10.3: it fails until a type is set)
placement_id              0644  the vGPU's placement id (``0`` for a MIG-backed
                                one or a type without placements: a choice);
                                ENXIO while untyped
vgpu_params               0644  reads empty (docs/design.md §10.3); takes
                                ``vgpu-placement-id=<id>`` on a typed VF
========================  ====  ===============================================

What is creatable is the GPU's business (:mod:`.nvidia_gpu`: the equal-size
rule below, mixed-size mode's placements, MIG-backed types on free GPU
instances); nothing is creatable on a typed VF (it lists the header only).
The equal-size rule, while mixed-size mode is off: on a free VF every type
while the card holds no vGPU; once it holds
vGPUs of framebuffer size S, only the types of size S, each while fewer than
its ``max_instances`` vGPUs of that size exist on the card.  A card whose VFs
are all typed therefore shows the header only everywhere.  Sources: docs/design.md
§10.3 (the list holds what is creatable *now*, nothing on a typed VF, the
header only on a full card; without mixed-size mode before the first type
write only types of the first-placed size stay creatable; capacity per PF
``min(free VFs, max_instances(T) - used(T))``; ``creatable_vgpu_types``
narrows as siblings are typed, one size per GPU) and its Sources V1-V3
(among them KubeVirt user-guide PR 518: "a single type per card will be
configured").

Writes to ``current_vgpu_type`` (parsed like the kernel's ``kstrtoul``, so a
trailing newline is optional; the driver's own parser is not published):

=====================================  =======  ===================================
write                                  errno    source
=====================================  =======  ===================================
not a number                           EINVAL   kstrtoul (ERANGE beyond 64 bits)
an id not creatable on this VF now     EINVAL   choice: docs/design.md §10.3 says it fails
  (unknown, another size, type full)            and leaves 0; the errno is unpublished
an id on a VF already typed            EINVAL   choice: nothing is creatable there
``0`` on a free VF                     ok       no-op (docs/design.md §10.3: "already 0
                                                counts as done")
``0`` while the VF's ``vfio/<group>``  EBUSY    choice (below)
  is open or held (a VM uses it)
                                       ok       after accept-held-vgpu-destroy: a
                                                driver that does not refuse (the vGPU
                                                is destroyed under the VM)
a MIG-backed id without a free GPU     EIO      cubecos config_gpu.cpp (PR #1338):
  instance of its profile                       "NVRM: Failed to add vgpu create
                                                request: 0x38" (:mod:`.nvidia_gpu`)
fail-next-vgpu-write (control hook)    chosen   e.g. EIO as with a MIG-backed type
                                                whose GPU instance is missing (§3)
=====================================  =======  ===================================

Writes to ``vgpu_params`` (NVIDIA vGPU 17 User Guide §2.12 places an mdev's
vGPU with ``echo "vgpu-placement-id=<id>" > .../nvidia/vgpu_params`` after it
is created; how a VF's vGPU is placed is not published, so the simulator takes
the same line on a VF: a choice):

=====================================  =======  ===================================
write                                  errno    source
=====================================  =======  ===================================
on an untyped VF                       ENXIO    like the other files of a vGPU
while the VF's group is open or held   EBUSY    choice (the VM runs on the placement)
not ``vgpu-placement-id=<decimal>``,   EINVAL   choice (other parameters are
  or on a MIG-backed vGPU                       unpublished)
any placement id, valid or not         ok       User Guide §2.12: an invalid or taken
                                                placement is found only when the VM
                                                starts, which then fails to boot
=====================================  =======  ===================================

The VM's open (a read-write open of the VF's ``vfio/<group>``, as QEMU opens
it, or ``hold``) fails with EIO (a choice) when the vGPU's placement is not
one its type supports or overlaps another vGPU's (:meth:`NvidiaGpu.boot_failure
<.nvidia_gpu.NvidiaGpu.boot_failure>`): the guest does not boot.  A read-only
open (libvirt's and the agent's in-use probe) is the VFIO group core's alone
and succeeds.  Each failed boot is recorded (``status``: ``vgpu_boot_failures``).

A ``0`` written to a VF in use is refused and the vGPU stays (docs/design.md
§8.1: third-party logs show
the refusal, reported as EPERM; NVIDIA documents no errno).  The simulator
answers EBUSY, a choice: it is the kernel's own answer for this device being
in use (a second open of its VFIO group, vfio/group.c, docs/design.md
§4.6; an unbind or ``sriov_numvfs`` 0 here too), so
one errno means "in use" across the simulated host, and EPERM would read as
a permission problem.  Nothing may depend on the number: the agent must take
any errno as a refusal that destroyed nothing (``fail-next-vgpu-write EPERM
--type-id 0`` plays the EPERM driver).

Every write to ``current_vgpu_type`` that reaches the driver is recorded
(:meth:`NvidiaVgpus.writes`, the simulator's ``status``: ``vgpu_writes``), with
whether the VF's group was held at that instant and the outcome, so a test
can prove that no write reached a VF a VM holds, whatever the driver answers.
The record is kept across reboots (like ``blocked_removes``), numbered by
``seq``; ``accept-held-vgpu-destroy`` is forgotten at a reboot, like the
injected faults.

Writes to ``gpu_instance_id`` and ``placement_id`` are refused with EINVAL
(their semantics on this route are unpublished).  Unbinding a VF from
``nvidia`` destroys its vGPU and the directory (the driver's remove); a
reboot starts every VF at ``0`` ("each VF's ``current_vgpu_type`` resets on
PCI re-enumeration", docs/design.md
§10.3).  ``reboot --vfs-disabled`` and
``driver-reload`` leave the GPU with no VF at all until ``enable-vfs`` (the
``sriov-manage -e`` of :mod:`.pci_sriov`) adds them again, untyped.
"""

from __future__ import annotations

import errno
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accel_agent import exception
from accel_agent.simulator import tree as t
from accel_agent.simulator.kabi import kstrtoul
from accel_agent.simulator.nvidia_gpu import NOT_FOUND, NvidiaGpu, Placed, nvml_error
from accel_agent.simulator.pci import PciFunction
from accel_agent.simulator.spec import SriovPfSpec, VgpuTypeSpec
from accel_agent.simulator.tree import oserror

HEADER = b"ID    : vGPU Name\n"
NVIDIA_DIR = "nvidia"
MAX_WRITES_KEPT = 4096  # a long test run's status stays small; tests compare by seq
_PLACEMENT_RE = re.compile(rb"vgpu-placement-id=(\d{1,6})\n?")


@dataclass(eq=False)
class _VgpuVf:
    fn: PciFunction
    spec: SriovPfSpec  # the GPU's
    type_id: int = 0
    placement_id: int | None = None
    gpu_instance_id: int | None = None

    @property
    def pf(self) -> str:
        assert self.fn.physfn is not None
        return self.fn.physfn.address


class NvidiaVgpus:
    """The vendor files of every bound VF of every vGPU-capable GPU; a
    :class:`~.pci.DriverListener` of the host's PCI bus."""

    def __init__(self, tree: t.Tree, changed: Callable[[], None],
                 gpus: list[SriovPfSpec] | tuple[SriovPfSpec, ...] = ()) -> None:
        self._tree = tree
        self._changed = changed
        # Every vGPU GPU's driver-side state, by PF address (nvidia_gpu.py).
        self._gpus = {g.address: NvidiaGpu(g) for g in gpus if g.is_vgpu}
        self._boot_failures: deque[dict[str, Any]] = deque(maxlen=MAX_WRITES_KEPT)
        self._vfs: dict[str, _VgpuVf] = {}
        self._by_pf: dict[str, list[_VgpuVf]] = {}  # a card's bound VFs: what the rule reads
        self._faults: list[tuple[int, str | None, int | None]] = []
        self._writes: deque[dict[str, Any]] = deque(maxlen=MAX_WRITES_KEPT)
        self._write_seq = 0
        # A driver that destroys a vGPU a VM holds instead of answering EBUSY.
        self.accept_held_destroy = False

    # ---------------------------------------------------------------- driver hooks

    def check_unbind(self, fn: PciFunction) -> None:
        return None  # a busy VF is refused by the PCI bus already

    def bound(self, fn: PciFunction) -> None:
        spec = fn.sriov_pf
        if spec is None or not spec.is_vgpu or fn.driver != spec.vf_driver:
            return
        vf = _VgpuVf(fn, spec)
        self._vfs[fn.address] = vf
        self._by_pf.setdefault(vf.pf, []).append(vf)
        d = (*fn.path, NVIDIA_DIR)
        tr = self._tree
        tr.attr((*d, "creatable_vgpu_types"), lambda: self._creatable_show(vf))
        tr.attr((*d, "current_vgpu_type"), lambda: f"{vf.type_id}\n".encode(),
                store=lambda data: self._current_store(vf, data))
        tr.attr((*d, "gpu_instance_id"), lambda: self._typed_show(vf, vf.gpu_instance_id),
                store=_refuse)
        tr.attr((*d, "placement_id"), lambda: self._typed_show(vf, vf.placement_id),
                store=_refuse)
        tr.attr((*d, "vgpu_params"), b"", store=lambda data: self._params_store(vf, data))

    def unbound(self, fn: PciFunction) -> None:
        vf = self._vfs.pop(fn.address, None)
        if vf is not None:
            self._by_pf[vf.pf].remove(vf)
            self._tree.remove((*fn.path, NVIDIA_DIR))
            self._changed()

    # ---------------------------------------------------------------- the rules

    def _siblings(self, vf: _VgpuVf) -> list[_VgpuVf]:
        return self._by_pf.get(vf.pf, [])

    def _gpu(self, vf: _VgpuVf) -> NvidiaGpu:
        gpu = self._gpus.get(vf.pf)
        if gpu is None:  # a GPU of a spec the host was not built with (never, by design)
            gpu = self._gpus[vf.pf] = NvidiaGpu(vf.spec)
        return gpu

    @staticmethod
    def _as_placed(vf: _VgpuVf) -> Placed | None:
        ts = vf.spec.vgpu_type(vf.type_id) if vf.type_id else None
        return None if ts is None else Placed(vf.fn.address, ts, vf.placement_id,
                                              vf.gpu_instance_id)

    def placed(self, pf: str) -> list[Placed]:
        """Every vGPU on GPU ``pf``, as the GPU's rules see them."""
        return [p for p in (self._as_placed(v) for v in self._by_pf.get(pf, [])) if p]

    def creatable(self, vf: _VgpuVf) -> list[VgpuTypeSpec]:
        """What a write of an id to this VF would create now (module docstring)."""
        if vf.type_id:
            return []
        return self._gpu(vf).creatable(self.placed(vf.pf))

    def _creatable_show(self, vf: _VgpuVf) -> bytes:
        return HEADER + b"".join(f"{ts.type_id:<6}: {ts.name}\n".encode()
                                 for ts in self.creatable(vf))

    @staticmethod
    def _typed_show(vf: _VgpuVf, value: int | None) -> bytes:
        if not vf.type_id:
            raise oserror(errno.ENXIO, f"{vf.fn.address} has no vGPU")
        return f"{value or 0}\n".encode()

    def _params_store(self, vf: _VgpuVf, data: bytes) -> int:
        """``vgpu-placement-id=<id>`` moves a time-sliced vGPU (module docstring)."""
        if not vf.type_id:
            raise oserror(errno.ENXIO, f"{vf.fn.address} has no vGPU")
        if vf.fn.busy:
            raise oserror(errno.EBUSY, f"{vf.fn.address}: the vGPU is in use by a VM")
        match = _PLACEMENT_RE.fullmatch(data)
        ts = vf.spec.vgpu_type(vf.type_id)
        if match is None or ts is None or ts.mig_backed:
            raise oserror(errno.EINVAL, f"{data!r} is not vgpu-placement-id=<id> for "
                                        f"{vf.fn.address}")
        vf.placement_id = int(match.group(1))  # checked only when the VM starts
        self._changed()
        return len(data)

    def _current_store(self, vf: _VgpuVf, data: bytes) -> int:
        # Recorded before anything can refuse it: what matters to a test is
        # that the write reached the driver, whatever the driver answered.
        entry = self._record_write(vf, data)
        try:
            written = self._apply_current(vf, data)
        except OSError as err:
            entry["outcome"] = errno.errorcode.get(err.errno or 0, str(err.errno))
            raise
        entry["outcome"] = "ok"
        return written

    def _record_write(self, vf: _VgpuVf, data: bytes) -> dict[str, Any]:
        self._write_seq += 1
        entry: dict[str, Any] = {"seq": self._write_seq, "vf": vf.fn.address,
                                 "data": data.decode("ascii", "replace"),
                                 "held": vf.fn.busy, "outcome": None}
        self._writes.append(entry)
        return entry

    def _apply_current(self, vf: _VgpuVf, data: bytes) -> int:
        value = kstrtoul(data)
        for i, (code, f_vf, f_type) in enumerate(self._faults):
            if f_vf in (None, vf.fn.address) and f_type in (None, value):
                del self._faults[i]
                raise oserror(code, "injected vGPU write failure")
        if value == 0:
            if vf.type_id == 0:
                return len(data)
            if vf.fn.busy and not self.accept_held_destroy:
                # Refused in use (docs/design.md §8.1); EBUSY is the
                # simulator's choice of errno, the real one is unpublished.
                raise oserror(errno.EBUSY, f"{vf.fn.address}: the vGPU is in use by a VM")
            vf.type_id, vf.placement_id, vf.gpu_instance_id = 0, None, None
        else:
            self._create(vf, value)
        self._changed()
        return len(data)

    def _create(self, vf: _VgpuVf, value: int) -> None:
        ts = vf.spec.vgpu_type(value)
        if ts is None or vf.type_id or ts not in self.creatable(vf):
            if ts is not None and ts.mig_backed and not vf.type_id:
                # cubecos: "NVRM: Failed to add vgpu create request: 0x38"
                raise oserror(errno.EIO, f"no free GPU instance of profile "
                                         f"{ts.gpu_instance_profile} for {ts.name}")
            raise oserror(errno.EINVAL, f"type {value} is not creatable on {vf.fn.address}")
        gpu, placed = self._gpu(vf), self.placed(vf.pf)
        if ts.mig_backed:
            gi = gpu.free_gpu_instance(ts.gpu_instance_profile, placed)
            assert gi is not None  # creatable said so
            vf.placement_id, vf.gpu_instance_id = None, gi.gpu_instance_id
        else:
            vf.placement_id, vf.gpu_instance_id = gpu.placement_for(ts, placed), None
        vf.type_id = value

    # ---------------------------------------------------------------- host operations

    def fail_next_write(self, code: int, vf: str | None = None, type_id: int | None = None) -> None:
        """The next ``current_vgpu_type`` write matching ``vf`` (any when None)
        and the written value ``type_id`` (any when None; 0 for a destroy)
        fails with ``code`` and changes nothing."""
        self._faults.append((code, vf, type_id))

    def reset(self) -> None:
        self._faults.clear()
        self.accept_held_destroy = False

    # ---------------------------------------------------------------- the GPUs' events

    def check_vm_open(self, fn: PciFunction) -> None:
        """A VM opens the VF (QEMU's read-write open of its group, or
        ``hold``): EIO when its vGPU's placement cannot boot."""
        vf = self._vfs.get(fn.address)
        mine = self._as_placed(vf) if vf is not None else None
        if vf is None or mine is None:
            return
        why = self._gpu(vf).boot_failure(mine, self.placed(vf.pf))
        if why is not None:
            self._boot_failures.append({"vf": fn.address, "type_id": vf.type_id,
                                        "placement_id": vf.placement_id, "reason": why})
            raise oserror(errno.EIO, f"{fn.address}: the guest cannot start its vGPU: {why}")

    def gpu(self, pf: str) -> NvidiaGpu:
        gpu = self._gpus.get(pf)
        if gpu is None:
            raise nvml_error(NOT_FOUND, "find GPU", pf, "no NVIDIA vGPU GPU at this address")
        return gpu

    def gpu_addresses(self) -> list[str]:
        return sorted(self._gpus)

    def busy(self, pf: str) -> bool:
        """Something uses the GPU: a vGPU exists, or a VF is held or open."""
        return any(v.type_id or v.fn.busy for v in self._by_pf.get(pf, []))

    def free_vf(self, pf: str) -> _VgpuVf | None:
        return next((v for v in self._by_pf.get(pf, []) if not v.type_id), None)

    def vfs_enabled(self, pf: str) -> None:
        self.gpu(pf).vfs_enabled()

    def rebooted(self) -> None:
        for gpu in self._gpus.values():
            gpu.reboot()

    def driver_reloaded(self, driver: str) -> None:
        """``driver`` was reloaded: its GPUs are reset as it probes them (a choice)."""
        for gpu in self._gpus.values():
            if gpu.spec.driver == driver:
                gpu.reset()

    def gpu_reset(self, pf: str) -> None:
        gpu = self.gpu(pf)
        if self.busy(pf):
            raise exception.SimulatorError(
                reason=f"GPU {pf} is in use (a vGPU or a held VF): a reset is refused; "
                       "nothing changed")
        gpu.reset()
        self._changed()

    def boot_failures(self) -> list[dict[str, Any]]:
        """Every VM open that failed on a vGPU's placement (oldest first)."""
        return [dict(b) for b in self._boot_failures]

    def gpus_status(self) -> list[dict[str, Any]]:
        out = []
        for addr in self.gpu_addresses():
            gpu = self._gpus[addr]
            out.append({
                "address": addr, "heterogeneous_capable": gpu.spec.heterogeneous,
                "heterogeneous": gpu.heterogeneous,
                "mig": None if gpu.spec.mig is None else {
                    "current": gpu.mig_current, "pending": gpu.mig_pending},
                "gpu_instances": [
                    {"gpu_instance_id": g.gpu_instance_id, "profile_id": g.profile.profile_id,
                     "name": g.profile.name, "placement": [g.start, g.size]}
                    for g in sorted(gpu.gpu_instances.values(),
                                    key=lambda g: g.gpu_instance_id)],
                "vgpus": [{"vf": p.vf, "type_id": p.vgpu_type.type_id,
                           "placement_id": p.placement_id,
                           "gpu_instance_id": p.gpu_instance_id} for p in self.placed(addr)],
            })
        return out

    def writes(self) -> list[dict[str, Any]]:
        """The last ``current_vgpu_type`` writes (oldest first): ``seq``, ``vf``,
        ``data`` as written, ``held`` (the VF's group was open or held by a VM
        at that instant) and ``outcome`` (``ok`` or the errno's name)."""
        return [dict(w) for w in self._writes]

    def vgpus(self) -> list[dict[str, Any]]:
        """Every typed VF, by address."""
        out = []
        for addr in sorted(self._vfs):
            vf = self._vfs[addr]
            if vf.type_id:
                ts = vf.spec.vgpu_type(vf.type_id)
                out.append({"address": addr, "physfn": vf.pf, "type_id": vf.type_id,
                            "name": ts.name if ts else None, "iommu_group": vf.fn.group,
                            "held": vf.fn.busy})
        return out

    def type_of(self, address: str) -> int:
        vf = self._vfs.get(address)
        return vf.type_id if vf else 0


def _refuse(data: bytes) -> int:
    raise oserror(errno.EINVAL, "not settable on the simulated GPU")
