"""The NVML writer: a GPU's mixed-size mode, MIG mode and GPU instances,
through NVIDIA's management library, in ``nvml_admin``.

``nvml_admin`` (context.py) is a privsep context of its own holding
**CAP_SYS_ADMIN only** (docs/security.md, "The NVML writer", says why in
full).  NVML is closed source, so which driver controls each NVML call
issues is not published; what NVIDIA's open kernel modules show
(github.com/NVIDIA/open-gpu-kernel-modules):

* the driver's administrator test is ``os_is_administrator()``
  (``kernel-open/nvidia/os-interface.c``) = ``NV_IS_SUSER()`` =
  ``capable(CAP_SYS_ADMIN)`` (``kernel-open/common/inc/nv-linux.h``): uid 0
  alone is not an administrator; ``escape.c`` gives a caller that passes it
  ``RS_PRIV_LEVEL_USER_ROOT``;
* a control flagged ``PRIVILEGED`` needs that level
  (``src/nvidia/src/kernel/rmapi/control.c``
  ``rmControlValidateClientPrivilegeAccess()``); the MIG partitioning-mode
  control ``NV2080_CTRL_CMD_GPU_SET_PARTITIONING_MODE`` is one (flags
  ``0x4`` in ``src/nvidia/generated/g_subdevice_nvoc.c``), and NVIDIA's MIG
  guide says a MIG mode change needs root;
* creating or destroying a GPU instance (``NV2080_CTRL_CMD_GPU_SET_PARTITIONS``,
  ``kernel_mig_manager.c`` ``subdeviceCtrlCmdGpuSetPartitions_IMPL``) takes
  the ``mig-config`` nvidia-capability (``/dev/nvidia-caps/nvidia-cap1``,
  root 0400: the owner bit lets uid 0 open it without a capability) **or**
  an administrator (``rmclientIsCapableOrAdmin(NV_RM_CAP_SYS_SMC_CONFIG)``);
* the vGPU heterogeneous-mode get/set controls
  (``NV0080_CTRL_CMD_GPU_SET_VGPU_HETEROGENEOUS_MODE``) are
  ``NON_PRIVILEGED`` in the driver; whether NVML itself asks more is not
  published.

So CAP_SYS_ADMIN is the least one context needs for all four writes (the
MIG mode's); the sysfs and net helpers do not get it.  Nothing else runs in
this helper, and it never executes anything (NVML would run
``nvidia-modprobe`` only to create missing device nodes, which the host's
udev rules and NVIDIA's packages have made long before).

Every input is checked before NVML is loaded (validate.py: a canonical PCI
address, a boolean, a profile id, a placement, a GPU instance id); each
call opens NVML, acts, reads back, and closes it (``nvmlInit`` /
``nvmlShutdown``: a helper that lives for weeks holds no NVML state across
a driver reload).  Errors are ``exception.NvmlError.for_code`` of NVML's
return code, so IN_USE, NOT_SUPPORTED, RESET_REQUIRED, NO_PERMISSION keep
their meaning across the channel (wire.py).  Results are plain dicts
(what msgpack carries); ``accel_agent.nvml.real`` turns them into records.
Reads are not here: they need no capability and run in the agent
(``accel_agent.nvml.real``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from typing import Any

from accel_agent import exception
from accel_agent.privileged.context import nvml_admin
from accel_agent.privileged.lifecycle import call
from accel_agent.privileged.validate import (
    validate_flag,
    validate_gpu_instance_id,
    validate_pci,
    validate_profile_id,
    validate_slice,
)
from accel_agent.privileged.wire import daemon_side

LOG = logging.getLogger(__name__)

# nvmlDeviceSetMigMode "may unbind or reset the device to activate the
# requested mode" (NVML API reference): far longer than a sysfs write.  The
# guard's deadline is [DEFAULT] privileged_call_timeout plus this.
MIG_MODE_WAIT = 120.0


def _pynvml(operation: str, gpu: str) -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise exception.NvmlNotAvailable(
            operation=operation, gpu=gpu, nvml="",
            reason=f"NVIDIA's Python binding (nvidia-ml-py, module pynvml) is missing: {exc}",
        ) from None
    return pynvml


def _mapped(nv: Any, err: Exception, operation: str, gpu: str) -> exception.NvmlError:
    code = getattr(err, "value", None)
    if isinstance(err, nv.NVMLError) and isinstance(code, int):
        return exception.NvmlError.for_code(code, operation=operation, gpu=gpu)
    return exception.NvmlError(operation=operation, gpu=gpu, nvml=type(err).__name__,
                               reason=str(err))


@contextlib.contextmanager
def _device(operation: str, gpu: str) -> Iterator[tuple[Any, Any]]:
    """NVML opened for one call and the GPU's handle; NVML's errors mapped."""
    nv = _pynvml(operation, gpu)
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        code = getattr(err, "value", None)
        name = exception.NVML_RETURN_NAMES.get(code, code) if isinstance(code, int) else err
        raise exception.NvmlNotAvailable(
            operation=operation, gpu=gpu, nvml="",
            reason=f"nvmlInit failed: NVML_ERROR_{name} (is NVIDIA's driver loaded, is "
                   "libnvidia-ml.so.1 installed?)") from None
    try:
        handle = nv.nvmlDeviceGetHandleByPciBusId(gpu.encode("ascii"))
        yield nv, handle
    except nv.NVMLError as err:
        raise _mapped(nv, err, operation, gpu) from None
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def set_heterogeneous_mode_local(gpu: str, enabled: bool) -> bool:
    """:func:`nvml_set_heterogeneous_mode` in this process; the mode read back."""
    gpu = validate_pci(gpu)
    enabled = validate_flag(enabled, "mixed-size mode")
    with _device("set vGPU heterogeneous mode", gpu) as (nv, handle):
        nv.nvmlDeviceSetVgpuHeterogeneousMode(handle, int(enabled))
        found = bool(nv.nvmlDeviceGetVgpuHeterogeneousMode(handle))
    LOG.info("vGPU heterogeneous (mixed-size) mode of %s set to %s, reads %s",
             gpu, enabled, found)
    return found


def set_mig_mode_local(gpu: str, enabled: bool) -> dict[str, Any]:
    """:func:`nvml_set_mig_mode` in this process: ``{"mode": {"current",
    "pending"}, "activation": NVML's name of the activation status}``."""
    gpu = validate_pci(gpu)
    enabled = validate_flag(enabled, "MIG mode")
    with _device("set MIG mode", gpu) as (nv, handle):
        status = int(nv.nvmlDeviceSetMigMode(handle, int(enabled)))
        current, pending = nv.nvmlDeviceGetMigMode(handle)
    activation = "SUCCESS" if status == 0 else exception.NVML_RETURN_NAMES.get(
        status, f"RETURN_{status}")
    LOG.info("MIG mode of %s set to %s: current %s, pending %s, activation %s",
             gpu, enabled, bool(current), bool(pending), activation)
    return {"mode": {"current": bool(current), "pending": bool(pending)},
            "activation": activation}


def create_gpu_instance_local(gpu: str, profile_id: int, start: int, size: int) -> dict[str, Any]:
    """:func:`nvml_create_gpu_instance` in this process: the instance read back
    (``{"gpu_instance_id", "profile_id", "placement": {"start", "size"}}``)."""
    gpu = validate_pci(gpu)
    profile_id = validate_profile_id(profile_id)
    start, size = validate_slice(start, "placement start", 0), validate_slice(size, "size", 1)
    with _device("create GPU instance", gpu) as (nv, handle):
        placement = nv.c_nvmlGpuInstancePlacement_t(start, size)
        instance = nv.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, profile_id, ctypes.byref(placement))
        info = nv.nvmlGpuInstanceGetInfo(instance)
    found = {"gpu_instance_id": int(info.id), "profile_id": int(info.profileId),
             "placement": {"start": int(info.placement.start),
                           "size": int(info.placement.size)}}
    LOG.info("GPU instance %s of profile %s created on %s at %s:%s",
             found["gpu_instance_id"], profile_id, gpu, start, size)
    return found


def destroy_gpu_instance_local(gpu: str, gpu_instance_id: int) -> None:
    """:func:`nvml_destroy_gpu_instance` in this process."""
    gpu = validate_pci(gpu)
    gpu_instance_id = validate_gpu_instance_id(gpu_instance_id)
    with _device("destroy GPU instance", gpu) as (nv, handle):
        instance = nv.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        nv.nvmlGpuInstanceDestroy(instance)
    LOG.info("GPU instance %s of %s destroyed", gpu_instance_id, gpu)


# --- through the helper ------------------------------------------------------------


@nvml_admin.entrypoint
def _priv_set_heterogeneous_mode(gpu: str, enabled: bool) -> bool:
    return daemon_side(lambda: set_heterogeneous_mode_local(gpu, enabled))


@nvml_admin.entrypoint
def _priv_set_mig_mode(gpu: str, enabled: bool) -> dict[str, Any]:
    return daemon_side(lambda: set_mig_mode_local(gpu, enabled))


@nvml_admin.entrypoint
def _priv_create_gpu_instance(gpu: str, profile_id: int, start: int, size: int) -> dict[str, Any]:
    return daemon_side(lambda: create_gpu_instance_local(gpu, profile_id, start, size))


@nvml_admin.entrypoint
def _priv_destroy_gpu_instance(gpu: str, gpu_instance_id: int) -> None:
    daemon_side(lambda: destroy_gpu_instance_local(gpu, gpu_instance_id))


def nvml_set_heterogeneous_mode(gpu: str, enabled: bool) -> bool:
    """NVML's vGPU heterogeneous (mixed-size) mode of ``gpu`` on or off in
    the CAP_SYS_ADMIN helper; the mode read back.  NvmlInUse while a vGPU
    exists on the GPU, NvmlNotSupported with MIG on."""
    return bool(call(_priv_set_heterogeneous_mode, gpu, enabled))


def nvml_set_mig_mode(gpu: str, enabled: bool) -> dict[str, Any]:
    """``gpu``'s MIG mode in the helper (:func:`set_mig_mode_local`)."""
    return dict(call(_priv_set_mig_mode, gpu, enabled, wait=MIG_MODE_WAIT))


def nvml_create_gpu_instance(gpu: str, profile_id: int, start: int, size: int) -> dict[str, Any]:
    """A GPU instance of ``profile_id`` at ``start:size`` on ``gpu`` in the helper."""
    return dict(call(_priv_create_gpu_instance, gpu, profile_id, start, size))


def nvml_destroy_gpu_instance(gpu: str, gpu_instance_id: int) -> None:
    """GPU instance ``gpu_instance_id`` of ``gpu`` destroyed in the helper."""
    call(_priv_destroy_gpu_instance, gpu, gpu_instance_id)
