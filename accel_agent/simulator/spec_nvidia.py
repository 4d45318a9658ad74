"""The spec of an NVIDIA vGPU 17+ GPU's management side: its MIG profile
table, and the JSON of it (:class:`GpuInstanceProfileSpec`, :class:`MigSpec`).

A GPU (a :class:`~.spec_sriov.SriovPfSpec` with vGPU types) may carry a
:class:`MigSpec`: the GPU instance profiles it has, as NVML reports them
(``nvmlGpuInstanceProfileInfo_v2_t``: id, name, slices, instance count,
memory; ``nvmlDeviceGetGpuInstancePossiblePlacements``: ``start:size``), and
whether its MIG *mode* survives a host reboot (GPU instances never do).  The
model of it lives in :mod:`.nvidia_gpu`; the profiles' values in
:mod:`.profiles_nvidia`, each with its source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel_agent.simulator.spec_fields import integer, invalid, json_fields

_PROFILE_NAME_RE = re.compile(r"^[0-9]+g\.[0-9]+gb(\+[a-z]+)?$")
MAX_SLICES = 8  # a MIG-capable GPU's memory slices (A100, H100, H200: 8)


@dataclass(frozen=True)
class GpuInstanceProfileSpec:
    """One GPU instance profile: NVML's ``id`` (what ``nvidia-smi mig -cgi``
    takes), NVIDIA's name without the ``MIG`` prefix (``1g.18gb``), memory
    slices, how many instances of it the GPU holds, memory in MiB, and the
    placements (``start``, ``size``) it may take."""

    profile_id: int
    name: str
    slice_count: int
    instance_count: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        where = f"GPU instance profile {self.profile_id!r}"
        integer(self.profile_id, "GPU instance profile id", 0)
        if not isinstance(self.name, str) or not _PROFILE_NAME_RE.match(self.name):
            raise invalid(f"{where}: name {self.name!r} is not like 1g.18gb or 1g.18gb+me")
        integer(self.slice_count, f"{where}: slice_count", 1)
        integer(self.instance_count, f"{where}: instance_count", 1)
        integer(self.memory_mib, f"{where}: memory_mib", 1)
        places = tuple(tuple(p) for p in self.placements)
        object.__setattr__(self, "placements", places)
        if not places:
            raise invalid(f"{where}: no placement")
        for place in places:
            if len(place) != 2:
                raise invalid(f"{where}: placement {place!r} is not (start, size)")
            start, size = place
            integer(start, f"{where}: placement start", 0)
            integer(size, f"{where}: placement size", 1)
            if start + size > MAX_SLICES:
                raise invalid(f"{where}: placement {start}:{size} ends past slice {MAX_SLICES}")
        if len(set(places)) != len(places):
            raise invalid(f"{where}: a placement listed twice")

    def to_dict(self) -> dict[str, Any]:
        return {"profile_id": self.profile_id, "name": self.name,
                "slice_count": self.slice_count, "instance_count": self.instance_count,
                "memory_mib": self.memory_mib,
                "placements": [list(p) for p in self.placements]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> GpuInstanceProfileSpec:
        kwargs = json_fields(data, where, required=(
            "profile_id", "name", "slice_count", "instance_count", "memory_mib", "placements"),
            optional=())
        if not isinstance(kwargs["placements"], list):
            raise invalid(f"{where}.placements must be a list of [start, size]")
        kwargs["placements"] = tuple(tuple(p) if isinstance(p, list) else p
                                     for p in kwargs["placements"])
        return cls(**kwargs)


@dataclass(frozen=True)
class MigSpec:
    """A GPU's MIG side: its profiles, and whether the MIG mode survives a
    host reboot (``mode_persists``; GPU instances never do, see
    :mod:`.nvidia_gpu`)."""

    profiles: tuple[GpuInstanceProfileSpec, ...]
    mode_persists: bool = False

    def __post_init__(self) -> None:
        profiles = tuple(self.profiles)
        object.__setattr__(self, "profiles", profiles)
        if not profiles:
            raise invalid("MIG spec: no GPU instance profile")
        ids = [p.profile_id for p in profiles]
        if any(not isinstance(p, GpuInstanceProfileSpec) for p in profiles):
            raise invalid("MIG spec: profiles must be GpuInstanceProfileSpec")
        if len(set(ids)) != len(ids):
            raise invalid(f"MIG spec: a profile id listed twice in {ids}")
        if not isinstance(self.mode_persists, bool):
            raise invalid("MIG spec: mode_persists must be true or false")

    def profile(self, profile_id: int) -> GpuInstanceProfileSpec | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {"profiles": [p.to_dict() for p in self.profiles],
                "mode_persists": self.mode_persists}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "mig") -> MigSpec:
        kwargs = json_fields(data, where, required=("profiles",), optional=("mode_persists",))
        if not isinstance(kwargs["profiles"], list):
            raise invalid(f"{where}.profiles must be a list")
        kwargs["profiles"] = tuple(GpuInstanceProfileSpec.from_dict(p, f"{where}.profiles[{i}]")
                                   for i, p in enumerate(kwargs["profiles"]))
        return cls(**kwargs)
