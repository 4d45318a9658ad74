"""NVML over a simulated host: the agent's NVML interface answered from the
same state the simulated sysfs shows.

:class:`SimulatedNvml` implements :class:`accel_agent.nvml.base.Nvml` over a
:class:`~.model.SimulatedHost` in process (unit tests use it directly); the
control socket serves the same object to the agent's daemon
(:mod:`accel_agent.nvml.simulated` is its client, ``control.py`` op ``nvml``).
So a mixed-size mode set through NVML changes what the VFs' files list, a
GPU instance created through NVML makes a MIG-backed type creatable there,
and a vGPU typed through sysfs is an active vGPU to NVML: one state.

The GPUs are the host's NVIDIA vGPU 17+ GPUs (SR-IOV PFs with vGPU types);
the older mdev-based profiles (``nvidia-pf``, ``nvidia-sriov``) are not
NVML GPUs here.  Every rule is :mod:`.nvidia_gpu`'s, with its source; this
module only reads and calls it under the host's lock.  The driver version it
reports is :data:`DRIVER_VERSION` (a simulated host has no other).
"""

from __future__ import annotations

from typing import Any

from accel_agent import exception
from accel_agent.nvml.base import Nvml
from accel_agent.nvml.types import (
    GpuInstance,
    GpuInstanceProfile,
    MigMode,
    MigModeChange,
    NvmlStatus,
    Placement,
    VgpuInstance,
    VgpuPlacements,
    VgpuType,
    check_flag,
    check_gpu,
    check_int,
)
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvidia_gpu import INVALID_ARGUMENT, NOT_SUPPORTED, nvml_error
from accel_agent.simulator.spec_sriov import VgpuTypeSpec

# A vGPU 17.x host driver's version (the R550 branch, which first had the
# heterogeneous-mode and placement calls); the simulated vGPU manager's.
DRIVER_VERSION = "550.54.16"

# What the control socket may call, and how each argument is read.
CALLS = ("status", "gpus", "virtualization_mode", "heterogeneous_capable",
         "heterogeneous_mode", "set_heterogeneous_mode", "vgpu_types", "vgpu_placements",
         "vgpu_instances", "mig_mode", "set_mig_mode", "gpu_instance_profiles",
         "gpu_instances", "create_gpu_instance", "destroy_gpu_instance")


class SimulatedNvml(Nvml):
    """NVML of one simulated host (module docstring)."""

    def __init__(self, host: SimulatedHost) -> None:
        self._host = host
        self._gpus = host.nvidia

    def _type(self, gpu: str, type_id: int, operation: str) -> VgpuTypeSpec:
        found = self._gpus.gpu(gpu).spec.vgpu_type(check_int(type_id, "vGPU type id", 1,
                                                             999_999))
        if found is None:
            raise nvml_error(INVALID_ARGUMENT, operation, gpu, f"no vGPU type {type_id}")
        return found

    # ----------------------------------------------------------------- the host

    def status(self) -> NvmlStatus:
        return NvmlStatus(available=True, source="simulator", driver_version=DRIVER_VERSION)

    def gpus(self) -> tuple[str, ...]:
        with self._host.lock:
            return tuple(self._gpus.gpu_addresses())

    def virtualization_mode(self, gpu: str) -> str:
        with self._host.lock:
            self._gpus.gpu(check_gpu(gpu))
            return "host_vgpu"

    # ----------------------------------------------------------------- mixed-size vGPU

    def heterogeneous_capable(self, gpu: str) -> bool:
        with self._host.lock:
            return self._gpus.gpu(check_gpu(gpu)).spec.heterogeneous

    def heterogeneous_mode(self, gpu: str) -> bool:
        with self._host.lock:
            return self._gpus.gpu(check_gpu(gpu)).heterogeneous

    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        enabled = check_flag(enabled, "mode")
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            done = state.set_heterogeneous(enabled, self._gpus.placed(gpu))
            self._host._changed()
            return done

    def vgpu_types(self, gpu: str, creatable: bool = False) -> tuple[VgpuType, ...]:
        check_flag(creatable, "creatable")
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            if creatable:
                # nvmlDeviceGetCreatableVgpus: what one more vGPU could be now.
                free = self._gpus.free_vf(gpu)
                types = [] if free is None else state.creatable(self._gpus.placed(gpu))
            else:
                types = [t for t in state.spec.vgpu_types
                         if not t.mig_backed or state.spec.mig is not None]
            return tuple(VgpuType(t.type_id, t.name, t.framebuffer_mib, t.max_instances,
                                  t.gpu_instance_profile) for t in types)

    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        operation = "get vGPU type placements"
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            found = self._type(gpu, type_id, operation)
            if found.mig_backed or found.placement_size is None:
                raise nvml_error(NOT_SUPPORTED, operation, gpu,
                                 f"{found.name} has no placements (a MIG-backed type, or "
                                 "none known for it)")
            placed = self._gpus.placed(gpu)
            creatable = (state.creatable_placements(found, placed)
                         if found in state.creatable(placed) else [])
            return VgpuPlacements(found.type_id, found.placement_size, found.placements,
                                  tuple(creatable))

    def vgpu_instances(self, gpu: str) -> tuple[VgpuInstance, ...]:
        with self._host.lock:
            self._gpus.gpu(check_gpu(gpu))
            return tuple(
                VgpuInstance(p.vgpu_type.type_id,
                             None if p.vgpu_type.mig_backed else p.placement_id,
                             p.gpu_instance_id, vf=p.vf)
                for p in self._gpus.placed(gpu))

    # ----------------------------------------------------------------- MIG

    def _mig(self, gpu: str, operation: str) -> Any:
        state = self._gpus.gpu(check_gpu(gpu))
        if state.spec.mig is None:
            raise nvml_error(NOT_SUPPORTED, operation, gpu, "the GPU has no MIG")
        return state

    def mig_mode(self, gpu: str) -> MigMode:
        with self._host.lock:
            state = self._mig(gpu, "get MIG mode")
            return MigMode(state.mig_current, state.mig_pending)

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeChange:
        enabled = check_flag(enabled, "MIG mode")
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            activation = state.set_mig(enabled, self._gpus.busy(gpu))
            self._host._changed()
            return MigModeChange(MigMode(state.mig_current, state.mig_pending), activation)

    def gpu_instance_profiles(self, gpu: str) -> tuple[GpuInstanceProfile, ...]:
        with self._host.lock:
            state = self._mig(gpu, "list GPU instance profiles")
            return tuple(
                GpuInstanceProfile(p.profile_id, p.name, p.slice_count, p.instance_count,
                                   p.memory_mib, tuple(Placement(s, n) for s, n in p.placements))
                for p in sorted(state.spec.mig.profiles, key=lambda p: p.profile_id))

    def gpu_instances(self, gpu: str) -> tuple[GpuInstance, ...]:
        with self._host.lock:
            state = self._mig(gpu, "list GPU instances")
            return tuple(GpuInstance(g.gpu_instance_id, g.profile.profile_id,
                                     Placement(g.start, g.size))
                         for g in sorted(state.gpu_instances.values(),
                                         key=lambda g: g.gpu_instance_id))

    def create_gpu_instance(self, gpu: str, profile_id: int, placement: Placement) -> GpuInstance:
        check_int(profile_id, "GPU instance profile id", 0, 255)
        if not isinstance(placement, Placement):
            raise exception.NvmlInvalidArgument(
                f"refused before asking NVML: placement {placement!r} is not start:size")
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            made = state.create_gpu_instance(profile_id, placement.start, placement.size)
            self._host._changed()
            return GpuInstance(made.gpu_instance_id, profile_id, Placement(made.start, made.size))

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        check_int(gpu_instance_id, "GPU instance id", 0, 4096)
        with self._host.lock:
            state = self._gpus.gpu(check_gpu(gpu))
            state.destroy_gpu_instance(gpu_instance_id, self._gpus.placed(gpu))
            self._host._changed()

    # ----------------------------------------------------------------- the control socket

    def serve(self, call: str, args: dict[str, Any]) -> Any:
        """One call of the control socket's ``nvml`` op, its answer as JSON types."""
        if call not in CALLS:
            raise ValueError(f"unknown NVML call {call!r}")
        args = dict(args)
        gpu = args.pop("gpu", None)
        if "placement" in args:
            place = args["placement"]
            if not isinstance(place, dict):
                raise ValueError("placement must be {start, size}")
            args["placement"] = Placement.from_dict(place)
        if call in ("status", "gpus"):
            answer = getattr(self, call)()
        else:
            answer = getattr(self, call)(gpu, **args)
        return _json(answer)


def _json(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    return value
