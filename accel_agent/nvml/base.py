"""The one small interface the agent needs of NVIDIA's management library.

Per GPU (its PF's PCI address), for mixed-size vGPU layouts and MIG-backed
vGPUs (docs/design.md §16).  Each method names the NVML call(s) it stands
for (NVML API reference, docs.nvidia.com/deploy/nvml-api, and the NVML
header of the vGPU 17 branch, R550, where the heterogeneous-mode and
placement calls first appear); failures are the agent's exceptions that
keep NVML's meaning (``exception.NvmlInUse``, ``NvmlNotSupported``,
``NvmlResetRequired``, ``NvmlNoPermission``, ... from
``NvmlError.for_code``), never a binding's own.

Two implementations: :mod:`.real` over NVIDIA's ``pynvml`` (nvidia-ml-py),
its writes through the privileged helper, and :mod:`.simulated`, a client
of the simulator's control socket that serves the same calls over the
simulated host's own state.  :class:`Unavailable` answers every call with
``NvmlNotAvailable`` and its reason.  Which one serves a sysfs root:
:func:`accel_agent.nvml.for_sysfs_root`.

Writes (the four ``set_``/``create_``/``destroy_`` methods) return what
they read back where NVML has a read for it, so a caller compares instead
of trusting.
"""

from __future__ import annotations

import abc

from accel_agent import exception
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
)


class Nvml(abc.ABC):
    """NVML for one host.  Thread-safe; every call may raise an
    ``exception.NvmlError`` (``NvmlNotAvailable`` when there is no NVML)."""

    # ----------------------------------------------------------------- the host

    @abc.abstractmethod
    def status(self) -> NvmlStatus:
        """Whether NVML answers here and the vGPU manager's (driver's)
        version (``nvmlSystemGetDriverVersion``); never raises."""

    @abc.abstractmethod
    def gpus(self) -> tuple[str, ...]:
        """The GPUs NVML sees, by PCI address (``nvmlDeviceGetCount``,
        ``nvmlDeviceGetPciInfo``), sorted."""

    @abc.abstractmethod
    def virtualization_mode(self, gpu: str) -> str:
        """``nvmlDeviceGetVirtualizationMode``: ``none``, ``passthrough``,
        ``vgpu`` (a guest), ``host_vgpu`` (a vGPU manager), ``host_vsga``."""

    # ----------------------------------------------------------------- mixed-size vGPU

    @abc.abstractmethod
    def heterogeneous_capable(self, gpu: str) -> bool:
        """``nvmlDeviceGetVgpuCapabilities(NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_SIZES)``:
        can this GPU hold time-sliced vGPUs of different framebuffer sizes."""

    @abc.abstractmethod
    def heterogeneous_mode(self, gpu: str) -> bool:
        """``nvmlDeviceGetVgpuHeterogeneousMode``: is mixed-size mode on."""

    @abc.abstractmethod
    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        """``nvmlDeviceSetVgpuHeterogeneousMode``; the mode read back.
        NvmlInUse while a vGPU exists on the GPU, NvmlNotSupported with MIG on."""

    @abc.abstractmethod
    def vgpu_types(self, gpu: str, creatable: bool = False) -> tuple[VgpuType, ...]:
        """The types the GPU supports (``nvmlDeviceGetSupportedVgpus``), or
        those creatable on it now (``nvmlDeviceGetCreatableVgpus``), with
        name, framebuffer, per-GPU maximum and, for a MIG-backed type, its
        GPU instance profile (``nvmlVgpuTypeGetGpuInstanceProfileId``)."""

    @abc.abstractmethod
    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        """``nvmlDeviceGetVgpuTypeSupportedPlacements`` and
        ``...CreatablePlacements`` of one type, in mixed-size mode's terms."""

    @abc.abstractmethod
    def vgpu_instances(self, gpu: str) -> tuple[VgpuInstance, ...]:
        """The vGPUs on the GPU (``nvmlDeviceGetActiveVgpus``) with their type,
        placement (``nvmlVgpuInstanceGetPlacementId``) and GPU instance
        (``nvmlVgpuInstanceGetGpuInstanceId``)."""

    # ----------------------------------------------------------------- MIG

    @abc.abstractmethod
    def mig_mode(self, gpu: str) -> MigMode:
        """``nvmlDeviceGetMigMode``: current and pending.  NvmlNotSupported on
        a GPU without MIG."""

    @abc.abstractmethod
    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeChange:
        """``nvmlDeviceSetMigMode``; the mode read back and the activation
        status (``IN_USE``, ``RESET_REQUIRED``: the change is pending)."""

    @abc.abstractmethod
    def gpu_instance_profiles(self, gpu: str) -> tuple[GpuInstanceProfile, ...]:
        """Every GPU instance profile of the GPU
        (``nvmlDeviceGetGpuInstanceProfileInfoV`` for each profile index,
        ``nvmlDeviceGetGpuInstancePossiblePlacements``), by profile id."""

    @abc.abstractmethod
    def gpu_instances(self, gpu: str) -> tuple[GpuInstance, ...]:
        """The GPU instances that exist (``nvmlDeviceGetGpuInstances`` per
        profile, ``nvmlGpuInstanceGetInfo``), by id."""

    @abc.abstractmethod
    def create_gpu_instance(self, gpu: str, profile_id: int, placement: Placement) -> GpuInstance:
        """``nvmlDeviceCreateGpuInstanceWithPlacement``; the instance read back."""

    @abc.abstractmethod
    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``.  NvmlInUse while a vGPU uses it."""

    def close(self) -> None:
        """Let go of what the implementation holds (NVML's handle, a socket)."""
        return None


class Unavailable(Nvml):
    """No NVML for this sysfs root: every call raises NvmlNotAvailable with
    ``reason``; :meth:`status` says it without raising."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason

    def status(self) -> NvmlStatus:
        return NvmlStatus(available=False, source=None, reason=self.reason)

    def _fail(self, *_: object, **__: object) -> None:
        raise exception.NvmlNotAvailable(gpu=self.where, reason=self.reason,
                                         operation="any call", nvml="")

    def gpus(self) -> tuple[str, ...]:
        self._fail()
        return ()

    def virtualization_mode(self, gpu: str) -> str:
        self._fail()
        return ""

    def heterogeneous_capable(self, gpu: str) -> bool:
        self._fail()
        return False

    def heterogeneous_mode(self, gpu: str) -> bool:
        self._fail()
        return False

    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        self._fail()
        return False

    def vgpu_types(self, gpu: str, creatable: bool = False) -> tuple[VgpuType, ...]:
        self._fail()
        return ()

    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        self._fail()
        raise AssertionError

    def vgpu_instances(self, gpu: str) -> tuple[VgpuInstance, ...]:
        self._fail()
        return ()

    def mig_mode(self, gpu: str) -> MigMode:
        self._fail()
        raise AssertionError

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeChange:
        self._fail()
        raise AssertionError

    def gpu_instance_profiles(self, gpu: str) -> tuple[GpuInstanceProfile, ...]:
        self._fail()
        return ()

    def gpu_instances(self, gpu: str) -> tuple[GpuInstance, ...]:
        self._fail()
        return ()

    def create_gpu_instance(self, gpu: str, profile_id: int, placement: Placement) -> GpuInstance:
        self._fail()
        raise AssertionError

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        self._fail()
