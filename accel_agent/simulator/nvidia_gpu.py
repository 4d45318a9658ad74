"""What an NVIDIA vGPU 17+ GPU keeps in its driver rather than in sysfs:
mixed-size ("heterogeneous") mode, vGPU placements, MIG mode and GPU instances.

:class:`NvidiaGpu` is one GPU's state and the rules that read and change it;
:mod:`.nvidia_vfio` asks it what a VF may be typed with and where a vGPU
goes, :mod:`.nvml` serves it as NVML calls.  Each rule names its source;
where no source says, the rule says "choice" or "unknown" and nothing in the
agent may depend on it.

Sources (primary; the agent's docs/design.md §16 lists them too):

* [UG] NVIDIA Virtual GPU Software User Guide, release 17, Linux with KVM
  (docs.nvidia.com/vgpu/17.0/grid-vgpu-user-guide): §2.11 "Putting a GPU
  Into Mixed-Size Mode", §2.12 "Placing a vGPU on a GPU in mixed-size mode",
  §2.10.8.2 the VF's ``nvidia/`` files;
* [NVML] NVML API reference (docs.nvidia.com/deploy/nvml-api) and the NVML
  header of the vGPU 17 branch (R550): ``nvmlDeviceSetVgpuHeterogeneousMode``,
  ``nvmlVgpuPlacementList_t``, ``nvmlDeviceSetMigMode``,
  ``nvmlDeviceCreateGpuInstanceWithPlacement``, ``nvmlGpuInstanceDestroy``;
* [OGKM] NVIDIA open-gpu-kernel-modules, ``src/nvidia/src/kernel/gpu/mig_mgr/
  kernel_mig_manager.c``: ``subdeviceCtrlCmdGpuSetPartitions_IMPL`` refuses a
  GPU instance with ``NV_ERR_NOT_SUPPORTED`` unless MIG is enabled;
* [AIE] NVIDIA AI Enterprise User Guide, "Configuring a GPU for MIG-Backed
  vGPUs" (docs.nvidia.com/ai-enterprise): ``nvidia-smi -mig 1`` stays pending
  while another process uses the GPU; GPU instances, then MIG-backed types;
* [CUBE] bigstack-oss/cubecos ``core/modules/config_gpu.cpp`` (PR #1338, issue
  #1316): ``sriov-manage -e`` clears mixed-size mode set before it; a wrong
  order leaves ``creatable_vgpu_types`` empty and the type write fails with
  EIO (``NVRM: Failed to add vgpu create request: 0x38``);
* [HPC] StackHPC ``roles/vgpu/README.md``: enabling the VFs wipes the GPU
  instances (systemd order sriov-manage, then mig-manager, then the vGPUs);
* [K8S] NVIDIA k8s-device-plugin issue #225: on an A100 the MIG mode survives
  a reboot, the GPU instances do not;
* [GAT] NVIDIA gpu-admin-tools issue #2: on an H100 everything MIG is "all
  gone by the time the VM is gone and GPU resets".

=====================================================  =========================  ======
rule                                                   answer                     source
=====================================================  =========================  ======
set mixed-size mode on a GPU without the capability    NVML_ERROR_NOT_SUPPORTED   [NVML]
set it while MIG is enabled                            NVML_ERROR_NOT_SUPPORTED   [UG]
set it while any vGPU exists on the GPU                NVML_ERROR_IN_USE          [UG]
set it while the GPU has no VF                         allowed (then lost when    [CUBE]
                                                       the VFs are enabled)
mixed-size mode after a reboot, driver reload, GPU     off                        [UG]
  reset
mixed-size mode after ``sriov-manage -e`` enables VFs  off (silently)             [CUBE]
creatable time-sliced types, mixed-size mode           each type with a free      [UG]
                                                       supported placement: its
                                                       range overlaps no vGPU's
creatable time-sliced types, equal-size mode           nvidia_vfio's rule (the    [UG]
                                                       first size locks the GPU)
a type without placements, mixed-size mode             not creatable              choice
time-sliced types while MIG is enabled                 none                       [AIE]
placement given at the type write                      the lowest creatable id    choice
                                                                                  (unknown)
MIG-backed type, MIG enabled                           creatable while a GPU      [AIE],
                                                       instance of its profile    [CUBE]
                                                       holds no vGPU; one vGPU
                                                       per instance
MIG-backed type write without a free instance          EIO                        [CUBE]
MIG-backed vGPU's instance                             the lowest-id free one     choice
MIG mode set while the GPU is in use (a vGPU, a held   pending; activation        [AIE],
  VF)                                                  IN_USE                     [NVML]
MIG mode set on an idle GPU                            current at once            [NVML]
MIG mode disabled while GPU instances exist            NVML_ERROR_IN_USE          choice
MIG mode after a reboot                                pending applied; kept      [K8S],
                                                       only where                 [GAT]
                                                       ``mode_persists`` (A100)
MIG mode after a GPU reset or driver reload            pending applied            [AIE];
                                                                                  reload:
                                                                                  choice
GPU instance without MIG enabled                       NVML_ERROR_NOT_SUPPORTED   [OGKM]
GPU instance of an unknown profile or a placement      NVML_ERROR_INVALID_        [NVML]
  the profile does not list                            ARGUMENT
GPU instance overlapping one, or past the profile's    NVML_ERROR_INSUFFICIENT_   [NVML]
  instance count                                       RESOURCES
GPU instance ids                                       lowest free, from 1        choice
destroy an unknown GPU instance                        NVML_ERROR_NOT_FOUND       [NVML]
destroy one that holds a vGPU                          NVML_ERROR_IN_USE          [NVML]
GPU instances after ``sriov-manage -e``, a reboot, a   gone                       [HPC],
  driver reload, a GPU reset                                                      [K8S],
                                                                                  [GAT]
a vGPU whose placement its type does not support, or   accepted at the write;     [UG]
  that overlaps another vGPU's                         the VM's open of the VF
                                                       fails (EIO: choice)
=====================================================  =========================  ======

A GPU reset (``accelctl simulate gpu-reset``) is refused while the GPU is in
use (a vGPU or a held VF): NVIDIA's reset refuses a GPU with clients, the
simulator does not model more (choice).  Its VFs stay (unknown whether a real
reset keeps SR-IOV: choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from accel_agent import exception
from accel_agent.simulator.spec_nvidia import GpuInstanceProfileSpec
from accel_agent.simulator.spec_sriov import SriovPfSpec, VgpuTypeSpec

# NVML's return codes the model answers with (nvml.h nvmlReturn_t).
INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND = 2, 3, 6
IN_USE, INSUFFICIENT_RESOURCES = 19, 23


def nvml_error(code: int, operation: str, gpu: str, reason: str) -> exception.NvmlError:
    return exception.NvmlError.for_code(code, operation=operation, gpu=gpu, reason=reason)


@dataclass(frozen=True)
class Placed:
    """A vGPU on the GPU, as the rules see it."""

    vf: str
    vgpu_type: VgpuTypeSpec
    placement_id: int | None
    gpu_instance_id: int | None

    def span(self) -> tuple[int, int] | None:
        """The placement's range [start, end), None without one."""
        size = self.vgpu_type.placement_size
        if self.placement_id is None or size is None:
            return None
        return self.placement_id, self.placement_id + size


@dataclass(frozen=True)
class GpuInstanceState:
    gpu_instance_id: int
    profile: GpuInstanceProfileSpec
    start: int
    size: int

    def overlaps(self, start: int, size: int) -> bool:
        return self.start < start + size and start < self.start + self.size


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class NvidiaGpu:
    """One GPU's driver-side state (module docstring); not thread-safe on
    its own, the host calls it under its lock."""

    def __init__(self, spec: SriovPfSpec) -> None:
        self.spec = spec
        self.heterogeneous = False
        self.mig_current = False
        self.mig_pending = False
        self.gpu_instances: dict[int, GpuInstanceState] = {}

    @property
    def address(self) -> str:
        return self.spec.address

    def _fail(self, code: int, operation: str, reason: str) -> exception.NvmlError:
        return nvml_error(code, operation, self.address, reason)

    # ----------------------------------------------------------------- what is creatable

    def creatable(self, placed: list[Placed]) -> list[VgpuTypeSpec]:
        """The types a free VF of this GPU may be typed with now."""
        types = self.spec.vgpu_types
        if self.mig_current:
            return [t for t in types if t.mig_backed
                    and self.free_gpu_instance(t.gpu_instance_profile, placed) is not None]
        sliced = [t for t in types if not t.mig_backed]
        if self.heterogeneous:
            return [t for t in sliced if self.creatable_placements(t, placed)]
        sizes = {p.vgpu_type.framebuffer_mib for p in placed}
        return [t for t in sliced
                if (not sizes or sizes == {t.framebuffer_mib}) and len(placed) < t.max_instances]

    def creatable_placements(self, vgpu_type: VgpuTypeSpec, placed: list[Placed]) -> list[int]:
        """The supported placement ids of ``vgpu_type`` whose range overlaps no vGPU's."""
        size = vgpu_type.placement_size
        if size is None:
            return []
        taken = [s for s in (p.span() for p in placed) if s is not None]
        return [pid for pid in vgpu_type.placements
                if not any(_overlap((pid, pid + size), s) for s in taken)]

    def placement_for(self, vgpu_type: VgpuTypeSpec, placed: list[Placed]) -> int | None:
        """Where the driver puts a new time-sliced vGPU (choice: the lowest free id)."""
        free = self.creatable_placements(vgpu_type, placed)
        return free[0] if free else None

    def free_gpu_instance(self, profile_id: int | None,
                          placed: list[Placed]) -> GpuInstanceState | None:
        """The lowest-id GPU instance of ``profile_id`` that holds no vGPU."""
        used = {p.gpu_instance_id for p in placed}
        for gi_id in sorted(self.gpu_instances):
            gi = self.gpu_instances[gi_id]
            if gi.profile.profile_id == profile_id and gi_id not in used:
                return gi
        return None

    def boot_failure(self, vgpu: Placed, placed: list[Placed]) -> str | None:
        """Why a VM cannot start on ``vgpu`` (its placement unsupported for
        its type, or overlapping another vGPU's), or None."""
        span = vgpu.span()
        if span is None:
            return None
        if vgpu.placement_id not in vgpu.vgpu_type.placements:
            return (f"placement {vgpu.placement_id} is not supported by {vgpu.vgpu_type.name} "
                    f"(supported: {' '.join(map(str, vgpu.vgpu_type.placements))})")
        for other in placed:
            theirs = other.span()
            if other.vf != vgpu.vf and theirs is not None and _overlap(span, theirs):
                return (f"placement {span[0]}:{span[1] - span[0]} overlaps the vGPU of "
                        f"{other.vf} at {theirs[0]}:{theirs[1] - theirs[0]}")
        return None

    # ----------------------------------------------------------------- NVML's writes

    def set_heterogeneous(self, enabled: bool, placed: list[Placed]) -> bool:
        operation = "set vGPU heterogeneous mode"
        if not self.spec.heterogeneous:
            raise self._fail(NOT_SUPPORTED, operation, "the GPU cannot mix vGPU sizes")
        if self.mig_current:
            raise self._fail(NOT_SUPPORTED, operation, "MIG mode is enabled")
        if placed:
            raise self._fail(IN_USE, operation, f"{len(placed)} vGPU(s) exist on the GPU")
        self.heterogeneous = enabled
        return self.heterogeneous

    def set_mig(self, enabled: bool, busy: bool) -> str:
        """Returns the activation status as NVML names it."""
        operation = "set MIG mode"
        if self.spec.mig is None:
            raise self._fail(NOT_SUPPORTED, operation, "the GPU has no MIG")
        if not enabled and self.gpu_instances:
            raise self._fail(IN_USE, operation,
                             f"{len(self.gpu_instances)} GPU instance(s) exist")
        self.mig_pending = enabled
        if busy:
            return "IN_USE"  # stays pending until the GPU is idle and reset
        self.mig_current = enabled
        return "SUCCESS"

    def create_gpu_instance(self, profile_id: int, start: int, size: int) -> GpuInstanceState:
        operation = "create GPU instance"
        mig = self.spec.mig
        if mig is None or not self.mig_current:
            raise self._fail(NOT_SUPPORTED, operation, "MIG mode is not enabled")
        profile = mig.profile(profile_id)
        if profile is None:
            raise self._fail(INVALID_ARGUMENT, operation, f"no GPU instance profile {profile_id}")
        if (start, size) not in profile.placements:
            raise self._fail(INVALID_ARGUMENT, operation,
                             f"profile {profile.name} has no placement {start}:{size}")
        same = [g for g in self.gpu_instances.values() if g.profile.profile_id == profile_id]
        if len(same) >= profile.instance_count:
            raise self._fail(INSUFFICIENT_RESOURCES, operation,
                             f"{profile.name} has {profile.instance_count} instance(s) already")
        clash = next((g for g in self.gpu_instances.values() if g.overlaps(start, size)), None)
        if clash is not None:
            raise self._fail(INSUFFICIENT_RESOURCES, operation,
                             f"{start}:{size} overlaps GPU instance {clash.gpu_instance_id} "
                             f"at {clash.start}:{clash.size}")
        gi_id = next(i for i in range(1, len(self.gpu_instances) + 2)
                     if i not in self.gpu_instances)
        self.gpu_instances[gi_id] = GpuInstanceState(gi_id, profile, start, size)
        return self.gpu_instances[gi_id]

    def destroy_gpu_instance(self, gi_id: int, placed: list[Placed]) -> None:
        operation = "destroy GPU instance"
        if gi_id not in self.gpu_instances:
            raise self._fail(NOT_FOUND, operation, f"no GPU instance {gi_id}")
        holder = next((p.vf for p in placed if p.gpu_instance_id == gi_id), None)
        if holder is not None:
            raise self._fail(IN_USE, operation, f"the vGPU of {holder} uses it")
        del self.gpu_instances[gi_id]

    # ----------------------------------------------------------------- host events

    def _volatile_lost(self) -> None:
        self.heterogeneous = False
        self.gpu_instances.clear()

    def vfs_enabled(self) -> None:
        """``sriov-manage -e`` gave the GPU its VFs."""
        self._volatile_lost()

    def reset(self) -> None:
        """A GPU reset (and, by choice, a driver reload): the pending MIG mode applies."""
        self.mig_current = self.mig_pending
        self._volatile_lost()

    def reboot(self) -> None:
        mig = self.spec.mig
        if mig is not None and mig.mode_persists:
            self.mig_current = self.mig_pending
        else:
            self.mig_current = self.mig_pending = False
        self._volatile_lost()
