"""Whether a mixed-size layout fits its GPUs, asked of NVML (issue 36).

:func:`type_placements` is the one translation of NVML's answer
(``nvmlDeviceGetVgpuTypeSupportedPlacements``: a type's placement size and
supported ids) into what the planner takes (devices/placements.py), for
``check-config`` and for the start's placement of a layout alike, so that
what the check says fits is what the start plans.  :func:`gpu_fit` is one
GPU's verdict: mixed-size capable, every type supported, and a plan that
holds every vGPU (``placements.plan``, whose refusal names the GPU, the
sizes asked, the placements they need and what would fit).
:func:`layout_fit_problems` is ``check-config``'s (and the start's check's)
walk over every GPU of every layout present on the host.

A MIG-backed layout (``mig``, issue 37) is checked from the GPU's own
profile table (:func:`mig_fit`: mig_plan.instances_needed, then
mig_plan.plan), the same functions the converge plans with.

Where NVML cannot be asked (no driver, no binding, a static tree) the fit is
not known: a warning says so and why, never a refusal; the start reports a
GPU it cannot lay out as short (health).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import mig_plan, placements

if TYPE_CHECKING:
    from accel_agent.devices.gpu_layouts import GpuLayout
    from accel_agent.nvml.base import Nvml
    from accel_agent.nvml.types import VgpuType

TYPE_PREFIX = "nvidia-"
# Why a MIG-backed layout's GPU cannot hold it at all (health's and check-config's words).
MIG_NOT_SUPPORTED = "MIG not supported"


def type_id(device_type: str) -> int:
    """``nvidia-1186`` -> 1186: the id NVML and ``current_vgpu_type`` use."""
    return int(device_type.removeprefix(TYPE_PREFIX))


def type_placements(nvml: Nvml, gpu: str, device_type: str) -> placements.TypePlacements:
    """NVML's placements of ``device_type`` on ``gpu``, as the planner takes
    them.  Raises what NVML raises (``NvmlNotSupported`` for a type without
    placements: a MIG-backed one)."""
    found = nvml.vgpu_placements(gpu, type_id(device_type))
    return placements.TypePlacements(device_type, found.placement_size, tuple(found.supported))


def layout_types(
    nvml: Nvml, gpu: str, layout: GpuLayout
) -> dict[str, placements.TypePlacements]:
    """Every type of ``layout`` on ``gpu``, as the planner takes them.

    Raises ``LayoutCannotFit`` when the GPU cannot hold vGPUs of several
    sizes (NVML's heterogeneous time-slice capability) or does not support
    one of the types; NvmlError when NVML cannot answer."""
    where = f"[{layout.section}] GPU {gpu}"
    if not nvml.heterogeneous_capable(gpu):
        raise exception.LayoutCannotFit(
            where=where,
            reason="it cannot hold vGPUs of different sizes: NVML says it has no "
            "heterogeneous time-slice capability (mixed-size mode)")
    supported = {t.type_id: t for t in nvml.vgpu_types(gpu)}
    missing = [t for t in layout.types if type_id(t) not in supported]
    if missing:
        raise exception.LayoutCannotFit(
            where=where,
            reason=f"it does not support {', '.join(missing)} (its vGPU types: "
            f"{_type_list(supported.values())})")
    return {t: type_placements(nvml, gpu, t) for t in layout.types}


def gpu_fit(nvml: Nvml, gpu: str, layout: GpuLayout) -> placements.Plan | mig_plan.MigPlan:
    """The plan of ``layout`` on an empty ``gpu``.  Raises LayoutCannotFit
    (capability, types) or PlacementsDoNotFit (the placements), or an
    NvmlError; for a MIG-backed layout :func:`mig_fit`'s."""
    if layout.is_mig:
        return mig_fit(nvml, gpu, layout)
    return placements.plan(gpu, layout.vgpus, layout_types(nvml, gpu, layout))


def mig_needed(nvml: Nvml, gpu: str, layout: GpuLayout) -> tuple[mig_plan.Needed, ...]:
    """The GPU instances a MIG-backed ``layout`` needs on ``gpu``, from the
    GPU's own vGPU types and profile table (NVML): the one check that its
    types and ``mig`` agree (mig_plan.instances_needed), for check-config
    and the converge alike.  Raises LayoutCannotFit where the GPU has no
    MIG, MigLayoutInvalid where types and instances disagree (a time-sliced
    type among them too), or an NvmlError."""
    try:
        profiles = nvml.gpu_instance_profiles(gpu)
    except exception.NvmlNotSupported:
        raise exception.LayoutCannotFit(
            where=f"[{layout.section}] GPU {gpu}",
            reason=f"{MIG_NOT_SUPPORTED}: NVML says the GPU has no MIG") from None
    types = {f"{TYPE_PREFIX}{t.type_id}": t for t in nvml.vgpu_types(gpu)}
    return mig_plan.instances_needed(gpu, layout.vgpus, types, profiles, layout.mig)


def mig_fit(nvml: Nvml, gpu: str, layout: GpuLayout) -> mig_plan.MigPlan:
    """The GPU instances of a MIG-backed ``layout`` planned on an empty
    ``gpu``.  Raises what :func:`mig_needed` raises, or
    MigPlacementsDoNotFit naming each profile, the placements it needs and
    what is free."""
    return mig_plan.plan(gpu, mig_needed(nvml, gpu, layout))


def _mig_backed_in_time_sliced(nvml: Nvml, gpu: str, layout: GpuLayout) -> None:
    """A layout without ``mig`` is time-sliced: a MIG-backed type in it is
    refused naming the option it needs (it would never be creatable in
    mixed-size mode)."""
    supported = {f"{TYPE_PREFIX}{t.type_id}": t for t in nvml.vgpu_types(gpu)}
    backed = [f"{t} ({supported[t].name})" for t in layout.types
              if t in supported and supported[t].gpu_instance_profile_id is not None]
    if backed:
        raise exception.LayoutCannotFit(
            where=f"[{layout.section}] GPU {gpu}",
            reason=f"{', '.join(backed)} MIG-backed, and the layout names no mig: a layout "
            "is either time-sliced (no mig) or MIG-backed (mig = <profile>:<count>, ... "
            "and only MIG-backed types)")


def layout_fit_problems(
    sysfs_root: str, layouts: Iterable[GpuLayout], nvml: Nvml
) -> tuple[list[str], list[str]]:
    """(errors, warnings) of every layout on every GPU of it present on the
    host (its PF in ``bus/pci/devices``): a GPU that cannot hold its layout
    is an error; a GPU NVML cannot answer for, or NVML missing, a warning
    (the fit was not checked)."""
    layouts = list(layouts)
    errors: list[str] = []
    warnings: list[str] = []
    present = [(layout, gpu) for layout in layouts for gpu in layout.gpus
               if os.path.exists(os.path.join(sysfs_root, "bus", "pci", "devices", gpu))]
    if not present:
        return errors, warnings
    status = nvml.status()
    if not status.available:
        gpus = ", ".join(gpu for _layout, gpu in present)
        warnings.append(
            f"could not check whether the mixed-size layouts fit GPUs {gpus}: NVML is not "
            f"available ({status.reason}); the start lists a GPU it cannot lay out as short "
            "in health")
        return errors, warnings
    for layout, gpu in present:
        try:
            if not layout.is_mig:
                _mig_backed_in_time_sliced(nvml, gpu, layout)
            gpu_fit(nvml, gpu, layout)
        except (exception.PlacementsDoNotFit, exception.MigLayoutInvalid,
                exception.MigPlacementsDoNotFit) as exc:
            errors.append(f"[{layout.section}] {exc.message}")
        except exception.LayoutCannotFit as exc:
            errors.append(exc.message)
        except exception.NvmlError as exc:
            warnings.append(f"could not check whether [{layout.section}] fits GPU {gpu}: "
                            f"{exc.message}")
    return errors, warnings


def _type_list(types: Iterable[VgpuType]) -> str:
    shown = [f"{TYPE_PREFIX}{t.type_id} ({t.name})" for t in sorted(types, key=lambda t: t.type_id)
             if t.gpu_instance_profile_id is None]
    return ", ".join(shown) or "none time-sliced"
