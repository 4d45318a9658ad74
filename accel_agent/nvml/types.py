"""What the NVML interface answers, as plain frozen records, and the checks of
what it is asked.

Every record converts to and from a dict of JSON types (``to_dict`` /
``from_dict``): the simulator's control socket and the privileged helper's
channel carry them as such.  The names follow NVML's where NVML has one
(docs.nvidia.com/deploy/nvml-api: ``nvmlVgpuPlacementList_t``,
``nvmlGpuInstanceProfileInfo_v2_t``, ``nvmlGpuInstanceInfo_t``,
``nvmlGpuInstancePlacement_t``), in the agent's spelling.

Units and ids, as NVML gives them:

* a GPU is named by its canonical PCI address (``0000:c1:00.0``), the PF's;
* a vGPU type by its decimal id (what ``current_vgpu_type`` takes);
* a GPU instance profile by NVML's profile *id* (``nvmlGpuInstanceProfileInfo_v2_t.id``:
  19 for ``1g.18gb`` on an H200, what ``nvidia-smi mig -lgip`` shows as ID and
  ``-cgi`` takes), never by NVML's profile *index*
  (``NVML_GPU_INSTANCE_PROFILE_1_SLICE``..., which only the real implementation
  uses, to enumerate);
* a GPU instance placement is ``start:size`` in memory slices, as
  ``nvidia-smi mig -lgipp`` prints it;
* a vGPU placement is an id and the type's placement size, in the units NVML
  reports (``nvidia-smi vgpu -c -v``: "Placement Size", "Creatable Placement IDs").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from accel_agent import exception
from accel_agent.sysfs import address

# How long one NVML call may take ([nvml] call_timeout's default, opts.py).
DEFAULT_CALL_TIMEOUT = 30.0
# NVML's nvmlGpuVirtualizationMode_t, by value (nvml.h NVML_GPU_VIRTUALIZATION_MODE_*).
VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
# NVML_GPU_INSTANCE_PROFILE_* and placements are small numbers; a bound keeps
# a bad caller's value from reaching the library (nvml.h has fewer than 32
# profile indexes, the ids NVML returns are below 64, a GPU has 8 slices).
MAX_PROFILE_ID = 255
MAX_SLICE = 255
MAX_GPU_INSTANCE_ID = 4096
MAX_PLACEMENT_ID = 1 << 16
MAX_VGPU_TYPE_ID = 999_999


def _invalid(what: str, value: Any, rule: str) -> exception.NvmlInvalidArgument:
    # Refused before NVML is asked: the message names what and why.
    return exception.NvmlInvalidArgument(
        f"refused before asking NVML: {what} {value!r} {rule}", what=what, value=repr(value))


def check_gpu(value: Any) -> str:
    """A GPU is its canonical PCI address (the kernel's spelling, lower case)."""
    if (not isinstance(value, str) or not address.is_pci_address(value)
            or address.parse_pci_address(value) != value):
        raise _invalid("GPU", value, "is not a canonical PCI address (DDDD:BB:SS.F)")
    return value


def check_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(what, value, f"must be an integer in {low}..{high}")
    return value


def check_flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(what, value, "must be true or false")
    return value


class _Record:
    """to_dict / from_dict of a flat frozen dataclass of JSON types."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return cls(**dict(data))


@dataclass(frozen=True)
class Placement(_Record):
    """A GPU instance's place: ``start`` and ``size`` in memory slices
    (``nvmlGpuInstancePlacement_t``)."""

    start: int
    size: int

    def __post_init__(self) -> None:
        check_int(self.start, "placement start", 0, MAX_SLICE)
        check_int(self.size, "placement size", 1, MAX_SLICE)

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class NvmlStatus(_Record):
    """Whether NVML serves this host, and from what: ``source`` is ``nvml``
    (NVIDIA's library over the driver), ``simulator`` or None (not available,
    ``reason`` says why)."""

    available: bool
    source: str | None
    reason: str | None = None
    driver_version: str | None = None


@dataclass(frozen=True)
class VgpuType(_Record):
    """One vGPU type a GPU supports.  ``gpu_instance_profile_id``: the GPU
    instance profile a MIG-backed type needs (``nvmlVgpuTypeGetGpuInstanceProfileId``),
    None for a time-sliced type."""

    type_id: int
    name: str
    framebuffer_mib: int
    max_instances: int
    gpu_instance_profile_id: int | None = None


@dataclass(frozen=True)
class VgpuPlacements(_Record):
    """A type's placements on one GPU (``nvmlVgpuPlacementList_t``): its size,
    the ids it supports (how many vGPUs of it the GPU takes in mixed-size
    mode) and those creatable now."""

    type_id: int
    placement_size: int
    supported: tuple[int, ...]
    creatable: tuple[int, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VgpuPlacements:
        return cls(int(data["type_id"]), int(data["placement_size"]),
                   tuple(data["supported"]), tuple(data["creatable"]))

    def to_dict(self) -> dict[str, Any]:
        return {"type_id": self.type_id, "placement_size": self.placement_size,
                "supported": list(self.supported), "creatable": list(self.creatable)}


@dataclass(frozen=True)
class VgpuInstance(_Record):
    """A vGPU that exists on a GPU.  ``placement_id`` and ``gpu_instance_id``
    are None where NVML has none (a time-sliced vGPU has no GPU instance);
    ``vf`` is the VF holding it where the implementation knows it (NVML does
    not say which VF a vendor-VFIO vGPU sits on: the real one leaves it None)."""

    type_id: int
    placement_id: int | None
    gpu_instance_id: int | None
    vf: str | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class MigMode(_Record):
    """``nvmlDeviceGetMigMode``: the mode now and the one after the next GPU reset."""

    current: bool
    pending: bool


@dataclass(frozen=True)
class MigModeChange(_Record):
    """What ``nvmlDeviceSetMigMode`` did: the mode read back after it, and its
    ``activationStatus`` as NVML names it (``SUCCESS``, ``IN_USE``: the GPU is
    busy, the mode stays pending; ``RESET_REQUIRED``: a reset must apply it)."""

    mode: MigMode
    activation: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MigModeChange:
        return cls(MigMode.from_dict(data["mode"]), str(data["activation"]))


@dataclass(frozen=True)
class GpuInstanceProfile(_Record):
    """A GPU instance profile (``nvmlGpuInstanceProfileInfo_v2_t`` and
    ``nvmlDeviceGetGpuInstancePossiblePlacements``): its id, its name as
    NVIDIA writes it (``1g.18gb``), memory slices, how many instances of it
    the GPU holds, its memory, and where it may be placed."""

    profile_id: int
    name: str
    slice_count: int
    instance_count: int
    memory_mib: int
    placements: tuple[Placement, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInstanceProfile:
        return cls(int(data["profile_id"]), str(data["name"]), int(data["slice_count"]),
                   int(data["instance_count"]), int(data["memory_mib"]),
                   tuple(Placement.from_dict(p) for p in data["placements"]))

    def to_dict(self) -> dict[str, Any]:
        return {"profile_id": self.profile_id, "name": self.name,
                "slice_count": self.slice_count, "instance_count": self.instance_count,
                "memory_mib": self.memory_mib,
                "placements": [p.to_dict() for p in self.placements]}


@dataclass(frozen=True)
class GpuInstance(_Record):
    """A GPU instance that exists (``nvmlGpuInstanceInfo_t``)."""

    gpu_instance_id: int
    profile_id: int
    placement: Placement

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInstance:
        return cls(int(data["gpu_instance_id"]), int(data["profile_id"]),
                   Placement.from_dict(data["placement"]))

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_instance_id": self.gpu_instance_id, "profile_id": self.profile_id,
                "placement": self.placement.to_dict()}
