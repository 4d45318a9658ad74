"""The real-driver tier's code: every read of the agent's NVML interface,
recorded, and the checks of what it answered.

Read-only by construction: :func:`read_host` gets the NVML wrapped in
:class:`ReadOnly`, which refuses every write of the interface before it
reaches NVML (never a mode set, a GPU instance made or destroyed, never a
reset).  The same code runs against a real driver (tests/nvml/test_real_driver.py)
and, in CI, against the simulator's NVML (tests/unit/test_nvml_tier.py).

Imports nothing but the standard library and ``accel_agent.nvml`` (which
imports NVIDIA's binding only when first asked): a machine with an NVIDIA
GPU needs the repository, pytest and nvidia-ml-py (README.md).
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
from collections.abc import Callable
from typing import Any

from accel_agent import exception
from accel_agent.nvml import Nvml

# The interface's writes: never called by this tier.
WRITES = frozenset({"set_heterogeneous_mode", "set_mig_mode", "create_gpu_instance",
                    "destroy_gpu_instance"})
# Every read of the interface, each recorded per GPU (host-wide: status, gpus).
READS = ("status", "gpus", "virtualization_mode", "heterogeneous_capable",
         "heterogeneous_mode", "vgpu_types", "vgpu_placements", "vgpu_instances", "mig_mode",
         "gpu_instance_profiles", "gpu_instances")
VIRTUALIZATION_MODES = {"none", "passthrough", "vgpu", "host_vgpu", "host_vsga"}
RECORD_ENV = "ACCEL_NVML_RECORD"


def interface_methods() -> tuple[set[str], set[str]]:
    """The interface's reads and writes, from :class:`Nvml` itself (so a
    method added there and not here fails the unit test)."""
    names = {n for n, f in inspect.getmembers(Nvml, inspect.isfunction)
             if not n.startswith("_") and n != "close"}
    return names - WRITES, names & WRITES


class ReadOnly:
    """An NVML whose writes raise before anything is asked."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in WRITES:
            raise AssertionError(f"the NVML tier is read-only: {name} refused")
        method = getattr(self._nvml, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return recorded


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def answer(read: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One read's answer as recorded: ``{"value": ...}`` or, when NVML
    refused it (NOT_SUPPORTED is an answer too), ``{"error": class, "message"}``."""
    try:
        return {"value": _plain(read(*args, **kwargs))}
    except exception.NvmlError as exc:
        return {"error": type(exc).__name__, "message": exc.message}


def read_gpu(nvml: ReadOnly, gpu: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("virtualization_mode", "heterogeneous_capable", "heterogeneous_mode",
                 "vgpu_instances", "mig_mode", "gpu_instance_profiles", "gpu_instances"):
        out[name] = answer(getattr(nvml, name), gpu)
    out["vgpu_types"] = answer(nvml.vgpu_types, gpu)
    out["vgpu_types_creatable"] = answer(nvml.vgpu_types, gpu, creatable=True)
    out["vgpu_placements"] = {}
    for vgpu_type in out["vgpu_types"].get("value", []):
        out["vgpu_placements"][str(vgpu_type["type_id"])] = answer(
            nvml.vgpu_placements, gpu, vgpu_type["type_id"])
    return out


def read_host(nvml: ReadOnly) -> dict[str, Any]:
    """Every read of the interface on every GPU NVML sees."""
    status = nvml.status()
    record: dict[str, Any] = {"status": status.to_dict(), "gpus": {}}
    if not status.available:
        return record
    gpus = answer(nvml.gpus)
    record["gpu_list"] = gpus
    for gpu in gpus.get("value", []):
        record["gpus"][gpu] = read_gpu(nvml, gpu)
    return record


def write_record(record: dict[str, Any], path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return path


def record_path(default_dir: str) -> str:
    """Where the record goes: ``$ACCEL_NVML_RECORD``, else ``$OUT/nvml-record.json``,
    else ``default_dir/nvml-record.json``."""
    explicit = os.environ.get(RECORD_ENV)
    if explicit:
        return explicit
    return os.path.join(os.environ.get("OUT") or default_dir, "nvml-record.json")


# ---------------------------------------------------------------------- checks


def _placement_problems(gpu: str, types: dict[int, dict[str, Any]],
                        placements: dict[str, dict[str, Any]]) -> list[str]:
    found = []
    for type_id, got in placements.items():
        value = got.get("value")
        if value is None:
            continue
        where = f"{gpu} type {type_id}"
        supported, creatable = value["supported"], value["creatable"]
        if value["placement_size"] < 1:
            found.append(f"{where}: placement size {value['placement_size']}")
        if len(set(supported)) != len(supported):
            found.append(f"{where}: a supported placement listed twice: {supported}")
        if not set(creatable) <= set(supported):
            found.append(f"{where}: creatable {creatable} not within supported {supported}")
        most = types.get(int(type_id), {}).get("max_instances")
        if most is not None and len(supported) > most:
            found.append(f"{where}: {len(supported)} placements for at most {most} vGPUs")
    return found


def _mig_problems(gpu: str, data: dict[str, Any]) -> list[str]:
    found = []
    profiles = {p["profile_id"]: p for p in data["gpu_instance_profiles"].get("value", [])}
    for profile in profiles.values():
        where = f"{gpu} GPU instance profile {profile['profile_id']} ({profile['name']})"
        places = [(p["start"], p["size"]) for p in profile["placements"]]
        if len(set(places)) != len(places):
            found.append(f"{where}: a placement listed twice")
        if len({size for _, size in places}) > 1:
            found.append(f"{where}: placements of different sizes {places}")
        if profile["instance_count"] < 1 or profile["memory_mib"] < 1:
            found.append(f"{where}: {profile['instance_count']} instances, "
                         f"{profile['memory_mib']} MiB")
    instances = data["gpu_instances"].get("value", [])
    for gi in instances:
        profile = profiles.get(gi["profile_id"])
        place = (gi["placement"]["start"], gi["placement"]["size"])
        if profile is None:
            found.append(f"{gpu} GPU instance {gi['gpu_instance_id']}: unknown profile "
                         f"{gi['profile_id']}")
        elif list(place) not in [[p["start"], p["size"]] for p in profile["placements"]]:
            found.append(f"{gpu} GPU instance {gi['gpu_instance_id']}: placement {place} "
                         f"not one of its profile's")
    spans = sorted((g["placement"]["start"], g["placement"]["start"] + g["placement"]["size"])
                   for g in instances)
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            found.append(f"{gpu}: GPU instances overlap: {spans}")
            break
    mig = data["mig_mode"].get("value")
    if mig is not None and instances and not mig["current"]:
        found.append(f"{gpu}: GPU instances exist with MIG mode off")
    return found


def problems(record: dict[str, Any]) -> list[str]:
    """What in ``record`` contradicts NVML's documented shapes (empty: none)."""
    found = []
    for gpu, data in record["gpus"].items():
        mode = data["virtualization_mode"].get("value")
        if mode is not None and mode not in VIRTUALIZATION_MODES:
            found.append(f"{gpu}: virtualization mode {mode!r}")
        for flag in ("heterogeneous_capable", "heterogeneous_mode"):
            value = data[flag].get("value")
            if value is not None and not isinstance(value, bool):
                found.append(f"{gpu}: {flag} {value!r} is not a boolean")
        if (data["heterogeneous_mode"].get("value") is True
                and data["heterogeneous_capable"].get("value") is False):
            found.append(f"{gpu}: mixed-size mode on a GPU without the capability")
        types = {t["type_id"]: t for t in data["vgpu_types"].get("value", [])}
        creatable = {t["type_id"] for t in data["vgpu_types_creatable"].get("value", [])}
        if not creatable <= set(types):
            found.append(f"{gpu}: creatable types {sorted(creatable - set(types))} unsupported")
        found += _placement_problems(gpu, types, data["vgpu_placements"])
        profiles = {p["profile_id"] for p in data["gpu_instance_profiles"].get("value", [])}
        for vgpu_type in types.values():
            profile = vgpu_type["gpu_instance_profile_id"]
            if profile is not None and profiles and profile not in profiles:
                found.append(f"{gpu} type {vgpu_type['type_id']}: GPU instance profile "
                             f"{profile} not among {sorted(profiles)}")
        for vgpu in data["vgpu_instances"].get("value", []):
            if types and vgpu["type_id"] not in types:
                found.append(f"{gpu}: an active vGPU of unsupported type {vgpu['type_id']}")
        found += _mig_problems(gpu, data)
    return found
