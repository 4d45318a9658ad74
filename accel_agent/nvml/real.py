"""The interface over NVIDIA's own Python binding, ``nvidia-ml-py`` (module
``pynvml``), on a host with NVIDIA's driver.

Reads run in the agent's process (they need no capability: uid 0 opens
``/dev/nvidiactl``, ``/dev/nvidia<N>`` and the root-owned 0400 MIG
capability files of ``/dev/nvidia-caps`` by their owner bits); writes go to
the privileged helper ``nvml_admin`` (accel_agent/privileged/nvml.py, which
says why it holds CAP_SYS_ADMIN).

Nothing is imported or loaded before the first call: ``pynvml`` is imported
then, ``libnvidia-ml.so.1`` loaded and ``nvmlInit`` called; a host without
the binding, the library or the driver gets ``NvmlNotAvailable`` naming
which, never a traceback (accelctl's fast paths and hosts without NVIDIA
pay nothing).  The driver's version falls back to ``/proc/driver/nvidia/version``
when NVML cannot be loaded.

Every read has a deadline (``[nvml] call_timeout``): it runs on one worker
thread and the caller waits that long.  A driver that does not answer holds
the worker; the call fails with NvmlCallTimeout, and so does every later
read at once until the stuck one returns (a second thread would only queue
behind it in the driver).  Handles are asked for by PCI address on every
call (``nvmlDeviceGetHandleByPciBusId``), so a driver reload or a GPU reset
never leaves a stale one; after NVML reports itself gone (uninitialized,
GPU lost, driver not loaded) the next call initialises it again.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from accel_agent import exception
from accel_agent.nvml.base import Nvml
from accel_agent.nvml.types import (
    DEFAULT_CALL_TIMEOUT,
    VIRTUALIZATION_MODES,
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
from accel_agent.sysfs import address

LOG = logging.getLogger(__name__)

PROC_VERSION = "/proc/driver/nvidia/version"
# nvml.h: NVML_INVALID_GPU_INSTANCE_PROFILE_ID / an id a time-sliced vGPU has not.
_INVALID_ID = 0xFFFFFFFF
# NVML return codes after which NVML is initialised again on the next call.
_REINIT = (1, 9, 15)  # UNINITIALIZED, DRIVER_NOT_LOADED, GPU_IS_LOST
# Possible placements asked per profile: more than any GPU has (8 slices).
_MAX_PLACEMENTS = 32
_VERSION_RE = re.compile(r"\s(\d+\.\d+(?:\.\d+)?)\s")

_T = TypeVar("_T")


def proc_driver_version(path: str = PROC_VERSION) -> str | None:
    """The driver's version from ``/proc/driver/nvidia/version``
    (``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
    Release Build ...``), or None without a driver."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return None
    match = _VERSION_RE.search(first + " ")
    return match.group(1) if match else None


def nvml_bus_id(text: str) -> str:
    """NVML's ``busId`` (``00000000:C1:00.0``) as the kernel spells it."""
    domain, rest = text.split(":", 1)
    return address.parse_pci_address(f"{int(domain, 16):04x}:{rest}")


def _profile_name(raw: bytes | str) -> str:
    name = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return name.removeprefix("MIG ").strip()


class RealNvml(Nvml):
    """NVML of this host (module docstring)."""

    def __init__(self, call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 proc_version: str = PROC_VERSION) -> None:
        self._timeout = float(call_timeout)
        self._proc_version = proc_version
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._stuck: Future[Any] | None = None
        self._nv: Any = None  # pynvml, once nvmlInit succeeded

    # ----------------------------------------------------------------- calls

    def _call(self, operation: str, gpu: str, body: Callable[[Any], _T]) -> _T:
        """``body(pynvml)`` on the worker within the deadline; NVML's errors
        as the agent's."""
        with self._lock:
            if self._stuck is not None and not self._stuck.done():
                raise exception.NvmlCallTimeout(
                    operation=operation, gpu=gpu, timeout=self._timeout,
                    reason="an earlier call has not returned yet")
            self._stuck = None
            future = self._worker.submit(self._in_worker, operation, gpu, body)
        try:
            return future.result(timeout=self._timeout)
        except FutureTimeout:
            with self._lock:
                self._stuck = future
            LOG.error("NVML %s on %s did not answer within %g s", operation, gpu, self._timeout)
            raise exception.NvmlCallTimeout(operation=operation, gpu=gpu,
                                            timeout=self._timeout) from None

    def _in_worker(self, operation: str, gpu: str, body: Callable[[Any], _T]) -> _T:
        nv = self._init(operation, gpu)
        try:
            return body(nv)
        except nv.NVMLError as err:
            code = int(getattr(err, "value", 999))
            if code in _REINIT:
                self._shutdown()
            raise exception.NvmlError.for_code(code, operation=operation, gpu=gpu) from None

    def _init(self, operation: str, gpu: str) -> Any:
        if self._nv is not None:
            return self._nv
        try:
            import pynvml
        except ImportError as exc:
            raise exception.NvmlNotAvailable(
                operation=operation, gpu=gpu, nvml="",
                reason=f"NVIDIA's Python binding (nvidia-ml-py, module pynvml) is not "
                       f"installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            code = int(getattr(err, "value", 999))
            raise exception.NvmlNotAvailable(
                operation=operation, gpu=gpu, nvml="",
                reason=f"nvmlInit failed: NVML_ERROR_"
                       f"{exception.NVML_RETURN_NAMES.get(code, code)} (is NVIDIA's driver "
                       "loaded, is libnvidia-ml.so.1 installed?)") from None
        self._nv = pynvml
        return pynvml

    def _shutdown(self) -> None:
        nv, self._nv = self._nv, None
        if nv is not None:
            with contextlib.suppress(Exception):  # it is gone either way
                nv.nvmlShutdown()

    def close(self) -> None:
        if self._stuck is None or self._stuck.done():
            self._worker.submit(self._shutdown)
        self._worker.shutdown(wait=False)

    @staticmethod
    def _handle(nv: Any, gpu: str) -> Any:
        return nv.nvmlDeviceGetHandleByPciBusId(check_gpu(gpu).encode("ascii"))

    def _on(self, operation: str, gpu: str, body: Callable[[Any, Any], _T]) -> _T:
        check_gpu(gpu)
        return self._call(operation, gpu, lambda nv: body(nv, self._handle(nv, gpu)))

    # ----------------------------------------------------------------- the host

    def status(self) -> NvmlStatus:
        try:
            version = self._call("get driver version", "this host",
                                 lambda nv: nv.nvmlSystemGetDriverVersion())
        except exception.NvmlError as exc:
            return NvmlStatus(available=False, source=None, reason=exc.message,
                              driver_version=proc_driver_version(self._proc_version))
        return NvmlStatus(available=True, source="nvml", driver_version=str(version))

    def gpus(self) -> tuple[str, ...]:
        def body(nv: Any) -> tuple[str, ...]:
            found = []
            for index in range(nv.nvmlDeviceGetCount()):
                info = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(index))
                bus = info.busId
                found.append(nvml_bus_id(bus.decode() if isinstance(bus, bytes) else bus))
            return tuple(sorted(found))

        return self._call("list GPUs", "this host", body)

    def virtualization_mode(self, gpu: str) -> str:
        mode = self._on("get virtualization mode", gpu,
                        lambda nv, h: int(nv.nvmlDeviceGetVirtualizationMode(h)))
        return VIRTUALIZATION_MODES.get(mode, f"unknown ({mode})")

    # ----------------------------------------------------------------- mixed-size vGPU

    def heterogeneous_capable(self, gpu: str) -> bool:
        return self._on("get heterogeneous time-slice capability", gpu, lambda nv, h: bool(
            nv.nvmlDeviceGetVgpuCapabilities(
                h, nv.NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_SIZES)))

    def heterogeneous_mode(self, gpu: str) -> bool:
        return self._on("get vGPU heterogeneous mode", gpu,
                        lambda nv, h: bool(nv.nvmlDeviceGetVgpuHeterogeneousMode(h)))

    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        from accel_agent import privileged

        return privileged.nvml_set_heterogeneous_mode(check_gpu(gpu),
                                                      check_flag(enabled, "mode"))

    def vgpu_types(self, gpu: str, creatable: bool = False) -> tuple[VgpuType, ...]:
        def body(nv: Any, h: Any) -> tuple[VgpuType, ...]:
            ids = nv.nvmlDeviceGetCreatableVgpus(h) if creatable else \
                nv.nvmlDeviceGetSupportedVgpus(h)
            out = []
            for type_id in ids:
                try:
                    profile = int(nv.nvmlVgpuTypeGetGpuInstanceProfileId(type_id))
                except nv.NVMLError_NotSupported:
                    profile = _INVALID_ID
                out.append(VgpuType(
                    type_id=int(type_id), name=str(nv.nvmlVgpuTypeGetName(type_id)),
                    framebuffer_mib=int(nv.nvmlVgpuTypeGetFramebufferSize(type_id)) >> 20,
                    max_instances=int(nv.nvmlVgpuTypeGetMaxInstances(h, type_id)),
                    gpu_instance_profile_id=None if profile == _INVALID_ID else profile))
            return tuple(out)

        return self._on("list vGPU types", gpu, body)

    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        check_int(type_id, "vGPU type id", 1, 999_999)

        def ids(listing: Any) -> tuple[int, ...]:
            return tuple(int(listing.placementIds[i]) for i in range(int(listing.count)))

        def body(nv: Any, h: Any) -> VgpuPlacements:
            try:
                supported = nv.nvmlDeviceGetVgpuTypeSupportedPlacements(
                    h, type_id, mode=nv.NVML_VGPU_PGPU_HETEROGENEOUS_MODE, version=2)
                creatable = nv.nvmlDeviceGetVgpuTypeCreatablePlacements(h, type_id, version=2)
            except nv.NVMLError_ArgumentVersionMismatch:  # a driver before the v2 list
                supported = nv.nvmlDeviceGetVgpuTypeSupportedPlacements(h, type_id, version=1)
                creatable = nv.nvmlDeviceGetVgpuTypeCreatablePlacements(h, type_id, version=1)
            return VgpuPlacements(type_id, int(supported.placementSize), ids(supported),
                                  ids(creatable))

        return self._on("get vGPU type placements", gpu, body)

    def vgpu_instances(self, gpu: str) -> tuple[VgpuInstance, ...]:
        def optional(nv: Any, read: Callable[[], Any]) -> int | None:
            try:
                value = int(read())
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                return None
            return None if value == _INVALID_ID else value

        def body(nv: Any, h: Any) -> tuple[VgpuInstance, ...]:
            out = []
            for vgpu in nv.nvmlDeviceGetActiveVgpus(h):
                out.append(VgpuInstance(
                    type_id=int(nv.nvmlVgpuInstanceGetType(vgpu)),
                    placement_id=optional(nv, lambda v=vgpu: nv.nvmlVgpuInstanceGetPlacementId(v)),
                    gpu_instance_id=optional(
                        nv, lambda v=vgpu: nv.nvmlVgpuInstanceGetGpuInstanceId(v)),
                    vf=None, uuid=str(nv.nvmlVgpuInstanceGetUUID(vgpu))))
            return tuple(out)

        return self._on("list active vGPUs", gpu, body)

    # ----------------------------------------------------------------- MIG

    def mig_mode(self, gpu: str) -> MigMode:
        def body(nv: Any, h: Any) -> MigMode:
            current, pending = nv.nvmlDeviceGetMigMode(h)
            return MigMode(bool(current), bool(pending))

        return self._on("get MIG mode", gpu, body)

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeChange:
        from accel_agent import privileged

        done = privileged.nvml_set_mig_mode(check_gpu(gpu), check_flag(enabled, "MIG mode"))
        return MigModeChange.from_dict(done)

    def _profiles(self, nv: Any, h: Any) -> list[Any]:
        """Every profile info the GPU has, by NVML profile index, one per id."""
        seen: dict[int, Any] = {}
        for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue  # a profile this GPU has not
            seen.setdefault(int(info.id), info)
        return [seen[k] for k in sorted(seen)]

    def gpu_instance_profiles(self, gpu: str) -> tuple[GpuInstanceProfile, ...]:
        def body(nv: Any, h: Any) -> tuple[GpuInstanceProfile, ...]:
            out = []
            for info in self._profiles(nv, h):
                array = (nv.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
                count = ctypes.c_uint(_MAX_PLACEMENTS)
                nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, array,
                                                              ctypes.byref(count))
                out.append(GpuInstanceProfile(
                    profile_id=int(info.id), name=_profile_name(info.name),
                    slice_count=int(info.sliceCount), instance_count=int(info.instanceCount),
                    memory_mib=int(info.memorySizeMB),
                    placements=tuple(Placement(int(array[i].start), int(array[i].size))
                                     for i in range(count.value))))
            return tuple(out)

        return self._on("list GPU instance profiles", gpu, body)

    def gpu_instances(self, gpu: str) -> tuple[GpuInstance, ...]:
        def body(nv: Any, h: Any) -> tuple[GpuInstance, ...]:
            current, _ = nv.nvmlDeviceGetMigMode(h)
            if not current:
                return ()  # no GPU instance can exist; NVML answers NOT_SUPPORTED
            out = []
            for info in self._profiles(nv, h):
                size = max(int(info.instanceCount), 1)
                array = (nv.c_nvmlGpuInstance_t * size)()
                count = ctypes.c_uint(size)
                nv.nvmlDeviceGetGpuInstances(h, info.id, array, ctypes.byref(count))
                for i in range(count.value):
                    gi = nv.nvmlGpuInstanceGetInfo(array[i])
                    out.append(GpuInstance(int(gi.id), int(gi.profileId), Placement(
                        int(gi.placement.start), int(gi.placement.size))))
            return tuple(sorted(out, key=lambda g: g.gpu_instance_id))

        return self._on("list GPU instances", gpu, body)

    def create_gpu_instance(self, gpu: str, profile_id: int, placement: Placement) -> GpuInstance:
        from accel_agent import privileged

        check_int(profile_id, "GPU instance profile id", 0, 255)
        done = privileged.nvml_create_gpu_instance(check_gpu(gpu), profile_id,
                                                   placement.start, placement.size)
        return GpuInstance.from_dict(done)

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        from accel_agent import privileged

        privileged.nvml_destroy_gpu_instance(
            check_gpu(gpu), check_int(gpu_instance_id, "GPU instance id", 0, 4096))
