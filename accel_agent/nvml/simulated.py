"""The interface over a simulated host: a client of the simulator's control socket.

The simulator (accel_agent/simulator/nvml.py) serves the same NVML-shaped
calls over the state its FUSE tree shows, so the agent's daemon (which reads
the tree) and NVML answer from one state: a heterogeneous mode set here
changes the VFs' ``creatable_vgpu_types`` there, a GPU instance created here
makes a MIG-backed type creatable there.

Protocol: the simulator's JSON lines (accel_agent/simulator/control.py), op
``nvml`` with ``call`` (a method name of :class:`~.base.Nvml`) and ``args``;
an NVML error comes back with its class name and kwargs (``nvml_error``)
and is raised again here as that class, so IN_USE stays NvmlInUse.  One
connection per call (usable from any thread, across simulator restarts),
with the socket's own timeout as the call's deadline.  Written here rather
than imported from the simulator: the agent never loads the simulator.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from accel_agent import exception
from accel_agent.nvml.base import Nvml
from accel_agent.nvml.types import (
    DEFAULT_CALL_TIMEOUT,
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

_MAX_REPLY = 1 << 24


class SimulatedNvmlClient(Nvml):
    """NVML of the simulated host whose control socket is ``socket_path``."""

    def __init__(self, socket_path: str, call_timeout: float = DEFAULT_CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self._timeout = float(call_timeout)

    def _call(self, call: str, gpu: str, **args: Any) -> Any:
        request = json.dumps({"op": "nvml", "call": call, "args": {"gpu": gpu, **args}})
        data = b""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self._timeout)
                sock.connect(self.socket_path)
                sock.sendall(request.encode() + b"\n")
                while not data.endswith(b"\n") and len(data) < _MAX_REPLY:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
        except TimeoutError:
            raise exception.NvmlCallTimeout(operation=call, gpu=gpu,
                                            timeout=self._timeout) from None
        except OSError as exc:
            raise exception.NvmlNotAvailable(
                operation=call, gpu=gpu, nvml="",
                reason=f"the simulator's control socket {self.socket_path} does not answer: "
                       f"{exc.strerror or exc}") from None
        try:
            reply = json.loads(data)
        except json.JSONDecodeError:
            raise exception.NvmlError(operation=call, gpu=gpu, nvml="bad reply",
                                      reason=repr(data[:200])) from None
        if reply.get("ok"):
            return reply.get("result")
        raise _rebuilt(reply, call, gpu)

    # ----------------------------------------------------------------- the host

    def status(self) -> NvmlStatus:
        try:
            return NvmlStatus.from_dict(self._call("status", "this host"))
        except exception.NvmlError as exc:
            return NvmlStatus(available=False, source=None, reason=exc.message)

    def gpus(self) -> tuple[str, ...]:
        return tuple(self._call("gpus", "this host"))

    def virtualization_mode(self, gpu: str) -> str:
        return str(self._call("virtualization_mode", check_gpu(gpu)))

    # ----------------------------------------------------------------- mixed-size vGPU

    def heterogeneous_capable(self, gpu: str) -> bool:
        return bool(self._call("heterogeneous_capable", check_gpu(gpu)))

    def heterogeneous_mode(self, gpu: str) -> bool:
        return bool(self._call("heterogeneous_mode", check_gpu(gpu)))

    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        return bool(self._call("set_heterogeneous_mode", check_gpu(gpu),
                               enabled=check_flag(enabled, "mode")))

    def vgpu_types(self, gpu: str, creatable: bool = False) -> tuple[VgpuType, ...]:
        found = self._call("vgpu_types", check_gpu(gpu),
                           creatable=check_flag(creatable, "creatable"))
        return tuple(VgpuType.from_dict(t) for t in found)

    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        return VgpuPlacements.from_dict(self._call(
            "vgpu_placements", check_gpu(gpu), type_id=check_int(type_id, "vGPU type id", 1,
                                                                  999_999)))

    def vgpu_instances(self, gpu: str) -> tuple[VgpuInstance, ...]:
        return tuple(VgpuInstance.from_dict(v)
                     for v in self._call("vgpu_instances", check_gpu(gpu)))

    # ----------------------------------------------------------------- MIG

    def mig_mode(self, gpu: str) -> MigMode:
        return MigMode.from_dict(self._call("mig_mode", check_gpu(gpu)))

    def set_mig_mode(self, gpu: str, enabled: bool) -> MigModeChange:
        return MigModeChange.from_dict(self._call(
            "set_mig_mode", check_gpu(gpu), enabled=check_flag(enabled, "MIG mode")))

    def gpu_instance_profiles(self, gpu: str) -> tuple[GpuInstanceProfile, ...]:
        return tuple(GpuInstanceProfile.from_dict(p)
                     for p in self._call("gpu_instance_profiles", check_gpu(gpu)))

    def gpu_instances(self, gpu: str) -> tuple[GpuInstance, ...]:
        return tuple(GpuInstance.from_dict(g) for g in self._call("gpu_instances",
                                                                   check_gpu(gpu)))

    def create_gpu_instance(self, gpu: str, profile_id: int, placement: Placement) -> GpuInstance:
        return GpuInstance.from_dict(self._call(
            "create_gpu_instance", check_gpu(gpu),
            profile_id=check_int(profile_id, "GPU instance profile id", 0, 255),
            placement=placement.to_dict()))

    def destroy_gpu_instance(self, gpu: str, gpu_instance_id: int) -> None:
        self._call("destroy_gpu_instance", check_gpu(gpu),
                   gpu_instance_id=check_int(gpu_instance_id, "GPU instance id", 0, 4096))


def _rebuilt(reply: dict[str, Any], call: str, gpu: str) -> exception.AccelAgentException:
    """The NVML error the simulator raised, as its own class; any other
    failure of the request as NvmlError with the simulator's message."""
    carried = reply.get("nvml_error")
    if isinstance(carried, dict):
        cls = getattr(exception, str(carried.get("class")), None)
        kwargs = carried.get("kwargs")
        if (isinstance(cls, type) and issubclass(cls, exception.NvmlError)
                and isinstance(kwargs, dict)):
            return cls(str(reply.get("error", "")), **kwargs)
    return exception.NvmlError(operation=call, gpu=gpu, nvml="simulator",
                               reason=str(reply.get("error", "unknown error")))
