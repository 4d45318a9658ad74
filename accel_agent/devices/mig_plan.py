"""The GPU instances a MIG-backed vGPU layout needs, and where each goes on its GPU (issue 37).

A MIG-backed vGPU type (``H200X-1-18C``) lives on a GPU instance of one GPU
instance profile (``1g.18gb``; NVML ``nvmlVgpuTypeGetGpuInstanceProfileId``,
the ``gpu_instance_profile_id`` of :class:`~accel_agent.nvml.VgpuType`), one
vGPU per GPU instance (NVIDIA's vgpu-device-manager maps each MIG-backed vGPU
to one GPU instance of its profile).  A GPU instance occupies a *placement*:
a start and a size in the GPU's memory slices, one of its profile's possible
placements (``nvmlDeviceGetGpuInstancePossiblePlacements``; ``nvidia-smi mig
-lgipp``); two GPU instances never overlap, and a profile holds at most its
``instance_count`` instances.  The H200's table (read on a real H200,
docs/design.md §16): ``3g.71gb`` is 3 compute slices but a placement of size
4 at 0 or 4, so two of them take the whole GPU and leave no room for a
``1g.18gb``.

Two pure functions, for the daemon's converge, ``check-config`` and a
migration's claim alike (so what ``check-config`` says fits is what the
start makes), from the GPU's own tables as NVML answers them (the
simulator's on a simulated host):

* :func:`instances_needed`: the GPU instances a layout's MIG-backed vGPUs
  need, checked against the layout's ``mig = <profile>:<count>, ...`` where
  it names them: a layout whose types and instances disagree is refused,
  naming the profile, the instances asked and the vGPUs that need them;
* :func:`plan`: a placement for every GPU instance, the way
  devices/placements.py places mixed-size vGPUs: instances kept where they
  are (``fixed``: one that holds a vGPU in use is never moved or destroyed),
  the rest largest placement first (ties: the layout's order), each on the
  lowest start whose range ``[start, start + size)`` overlaps nothing placed,
  within its profile's instance count; where that greedy pass fails, a
  bounded depth-first search in the same order (a GPU has 8 slices and at
  most 7 instances).  A layout that cannot fit is refused naming each
  profile, the placements it needs and what is free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accel_agent import exception
from accel_agent.nvml.types import GpuInstance, GpuInstanceProfile, Placement, VgpuType

# Placement tries the search may spend before it gives up (8 slices, at most
# 7 instances: the greedy pass alone decides nearly every layout).
SEARCH_BUDGET = 20_000


@dataclass(frozen=True, slots=True)
class Needed:
    """GPU instances of one profile a layout needs on one GPU."""

    profile: GpuInstanceProfile
    count: int


@dataclass(frozen=True, slots=True)
class PlannedInstance:
    """One GPU instance of a plan: its profile and placement."""

    profile_id: int
    profile_name: str
    placement: Placement

    def __str__(self) -> str:
        return f"{self.profile_name}@{self.placement}"


@dataclass(frozen=True, slots=True)
class MigPlan:
    """Every GPU instance of a layout on one GPU: those kept where they are,
    then the new ones in the order they were placed (largest first)."""

    fixed: tuple[GpuInstance, ...]
    new: tuple[PlannedInstance, ...]


def _refuse(gpu: str, reason: str) -> exception.MigLayoutInvalid:
    return exception.MigLayoutInvalid(gpu=gpu, reason=reason)


def instances_needed(
    gpu: str,
    vgpus: Sequence[tuple[str, int]],
    types: Mapping[str, VgpuType],
    profiles: Sequence[GpuInstanceProfile],
    mig: Sequence[tuple[str, int]] | None = None,
) -> tuple[Needed, ...]:
    """The GPU instances the MIG-backed vGPUs ``vgpus`` (``(type, count)`` in
    the layout's order) need on ``gpu``: one per vGPU, of its type's profile.

    ``types``: the GPU's supported vGPU types by the layout's name for them
    (``nvidia-<id>``: the caller, which knows the backend, names them);
    ``profiles``: the GPU's GPU instance profiles.  ``mig``: the layout's own
    ``(profile name, count)`` asks, or None to derive them from the types.
    In ``mig``'s order when given, else in the order the types first need
    each profile.  Raises ``exception.MigLayoutInvalid`` naming what is wrong:
    a type the GPU does not support or that is not MIG-backed, a profile the
    GPU does not have, a profile asked twice, or asks and types that
    disagree (the profile, the instances asked, the vGPUs that need them)."""
    by_id = {p.profile_id: p for p in profiles}
    by_name = {p.name: p for p in profiles}
    needed: dict[int, int] = {}
    needers: dict[int, list[str]] = {}
    for what, count in [*vgpus, *(mig or ())]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise _refuse(gpu, f"{what}:{count!r} is not a count (0 or more)")
    for device_type, count in vgpus:
        found = types.get(device_type)
        if found is None:
            raise _refuse(gpu, f"the GPU does not support vGPU type {device_type}")
        profile_id = found.gpu_instance_profile_id
        if profile_id is None:
            raise _refuse(gpu, f"{device_type} ({found.name}) is time-sliced, not MIG-backed: "
                               "it needs no GPU instance and cannot be in a MIG layout")
        if profile_id not in by_id:
            raise _refuse(gpu, f"{device_type} ({found.name}) needs GPU instance profile "
                               f"{profile_id}, which the GPU does not have (it has "
                               f"{_profile_names(profiles)})")
        needed[profile_id] = needed.get(profile_id, 0) + count
        needers.setdefault(profile_id, []).append(f"{device_type}:{count}")
    if mig is None:
        return tuple(Needed(by_id[pid], n) for pid, n in needed.items() if n)
    asked: dict[int, int] = {}
    for name, count in mig:
        profile = by_name.get(name)
        if profile is None:
            raise _refuse(gpu, f"mig names GPU instance profile {name!r}, which the GPU does "
                               f"not have (it has {_profile_names(profiles)})")
        if profile.profile_id in asked:
            raise _refuse(gpu, f"mig names GPU instance profile {name} twice")
        asked[profile.profile_id] = count
    for profile_id in [*asked, *(p for p in needed if p not in asked)]:
        have, need = asked.get(profile_id, 0), needed.get(profile_id, 0)
        if have != need:
            name = by_id[profile_id].name
            wanted = ", ".join(needers.get(profile_id, [])) or "no vGPU type"
            raise _refuse(gpu, f"its vGPU types and GPU instances disagree: mig asks "
                               f"{have} x {name}, and the vGPUs on them ({wanted}) need "
                               f"{need}, one GPU instance per vGPU")
    return tuple(Needed(by_id[pid], n) for pid, n in asked.items() if n)


def _profile_names(profiles: Sequence[GpuInstanceProfile]) -> str:
    return ", ".join(p.name for p in profiles) or "none"


def _order(needed: Sequence[Needed]) -> list[GpuInstanceProfile]:
    """One entry per instance to place: largest placement first, ties in the
    layout's order."""
    rank = {n.profile.profile_id: i for i, n in enumerate(needed)}
    wanted = [n.profile for n in needed for _ in range(n.count)]
    return sorted(wanted, key=lambda p: (-_size(p), rank[p.profile_id]))


def _size(profile: GpuInstanceProfile) -> int:
    """A profile's placement size (every possible placement of a profile has
    the same size; 0 for one without placements, which cannot be placed)."""
    return max((p.size for p in profile.placements), default=0)


def _search(
    order: list[GpuInstanceProfile], taken: list[Placement], counts: dict[int, int]
) -> list[PlannedInstance] | None:
    """Placements for ``order`` around ``taken`` within each profile's
    instance count (``counts``: instances of each profile already there);
    the first found in the documented order, or None."""
    budget = [SEARCH_BUDGET]
    chosen: list[PlannedInstance] = []

    def place(i: int) -> bool:
        if i == len(order):
            return True
        profile = order[i]
        if counts.get(profile.profile_id, 0) >= profile.instance_count:
            return False
        # Two instances of one profile are interchangeable: the next one goes
        # after the previous one, which keeps the search from trying permutations.
        after = chosen[-1].placement.start if i and order[i - 1] is profile else -1
        for placement in sorted(profile.placements, key=lambda p: p.start):
            if placement.start <= after:
                continue
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            if any(placement.overlaps(t) for t in taken):
                continue
            chosen.append(PlannedInstance(profile.profile_id, profile.name, placement))
            taken.append(placement)
            counts[profile.profile_id] = counts.get(profile.profile_id, 0) + 1
            if place(i + 1):
                return True
            counts[profile.profile_id] -= 1
            taken.pop()
            chosen.pop()
        return False

    return chosen if place(0) else None


def plan(gpu: str, needed: Sequence[Needed], fixed: Sequence[GpuInstance] = ()) -> MigPlan:
    """Placements for the GPU instances ``needed`` (:func:`instances_needed`)
    beyond ``fixed`` (instances that stay where they are, those that hold a
    vGPU in use: counted in ``needed`` where their profile is, occupying
    their placement either way).

    Raises ``exception.MigPlacementsDoNotFit`` naming the GPU, the instances
    asked, each profile's placements and what is free."""
    found = _fit(needed, fixed)
    if found is not None:
        return found
    raise exception.MigPlacementsDoNotFit(
        gpu=gpu,
        asked=_asked(needed),
        needs=_needs(needed, fixed),
        free=_free(needed, fixed),
    )


def _fit(needed: Sequence[Needed], fixed: Sequence[GpuInstance]) -> MigPlan | None:
    left = {n.profile.profile_id: n.count for n in needed}
    counts: dict[int, int] = {}
    for instance in fixed:
        counts[instance.profile_id] = counts.get(instance.profile_id, 0) + 1
        if left.get(instance.profile_id, 0) > 0:
            left[instance.profile_id] -= 1
    remaining = [Needed(n.profile, left[n.profile.profile_id]) for n in needed]
    found = _search(_order(remaining), [i.placement for i in fixed], counts)
    return None if found is None else MigPlan(tuple(fixed), tuple(found))


def _asked(needed: Sequence[Needed]) -> str:
    return ", ".join(f"{n.profile.name}:{n.count}" for n in needed if n.count) or "nothing"


def _needs(needed: Sequence[Needed], fixed: Sequence[GpuInstance]) -> str:
    parts = []
    for n in needed:
        if not n.count:
            continue
        places = ", ".join(str(p) for p in sorted(n.profile.placements,
                                                  key=lambda p: p.start)) or "none"
        part = (f"{n.count} x {n.profile.name} (profile {n.profile.profile_id}) on "
                f"placements {places}")
        if n.count > n.profile.instance_count:
            part += f", more than the {n.profile.instance_count} the GPU holds"
        parts.append(part)
    said = "needs " + "; ".join(parts)
    if fixed:
        said += "; kept where they are (a vGPU in use): " + ", ".join(
            f"profile {i.profile_id}@{i.placement}" for i in fixed)
    return said


def _free(needed: Sequence[Needed], fixed: Sequence[GpuInstance]) -> str:
    """The slices no kept instance occupies, and the asks cut down until they
    fit (the smallest placement first): a suggestion, not the only answer."""
    slices = max((p.end for n in needed for p in n.profile.placements), default=0)
    taken = {s for i in fixed for s in range(i.placement.start, i.placement.end)}
    free = _ranges([s for s in range(slices) if s not in taken])
    said = f"free slices: {free or 'none'}"
    counts = {n.profile.profile_id: n.count for n in needed}
    for n in sorted(needed, key=lambda n: _size(n.profile)):
        pid = n.profile.profile_id
        floor = sum(1 for i in fixed if i.profile_id == pid)
        while counts[pid] > floor:
            counts[pid] -= 1
            trial = [Needed(m.profile, counts[m.profile.profile_id]) for m in needed]
            if _fit(trial, fixed) is not None:
                return f"{said}; what would fit: {_asked(trial)}"
    return f"{said}; nothing of it fits" + (" beside the instances kept" if fixed else "")


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)
