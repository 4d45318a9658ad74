"""Where each vGPU of a mixed-size layout goes on its GPU (issue 36).

In mixed-size ("heterogeneous") mode every time-sliced vGPU occupies a
*placement*: an offset on the GPU (its placement id) and a size, both in the
GPU's placement units.  NVML gives, per vGPU type, the placement size and the
*supported* placement ids (``nvmlDeviceGetVgpuTypeSupportedPlacements``);
"the number of supported placement IDs is the maximum number of vGPUs of the
type allowed on the GPU in mixed-size mode" (NVIDIA vGPU 17 User Guide §2.12;
its example: L4-6Q, size 6, ids 0 6 12 18).  Two vGPUs whose ranges
``[id, id + size)`` overlap cannot both run: the driver accepts the write and
the guest fails to boot (docs/design.md §16).  How NVIDIA itself chooses a
placement on the vendor-VFIO route is not published, so the agent chooses.

:func:`plan` is the one planner, a pure function: the daemon's converge,
``check-config`` and a migration's destination claim all call it, so what
``check-config`` says fits is what the start makes.

The rule, deterministic: devices already placed (``fixed``: a vGPU in use
keeps its placement; a layout change never moves one) stay where they are;
the rest are placed largest size first (ties: the order the layout names its
types), each on the lowest supported id whose range overlaps nothing placed
so far.  Largest first because the supported ids of a large type are the
sparse, aligned ones: placed after the small ones, a large vGPU would find
every aligned slot broken.  Where that greedy pass fails a bounded
depth-first search (same order) looks for any arrangement before the
planner says it does not fit; a GPU carries at most a few dozen vGPUs, and
the bound keeps a hostile profile from costing more than a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accel_agent import exception

# Placement tries the search may spend before it gives up (a GPU's layout
# has at most a few dozen vGPUs; the greedy pass alone decides nearly all).
SEARCH_BUDGET = 20_000


@dataclass(frozen=True, slots=True)
class TypePlacements:
    """One vGPU type's placements on one GPU (NVML's ``VgpuPlacements``)."""

    device_type: str  # the agent's name, ``nvidia-<id>``
    size: int  # placement size, in the GPU's placement units
    supported: tuple[int, ...]  # supported placement ids (offsets), any order

    def span(self, placement_id: int) -> range:
        return range(placement_id, placement_id + self.size)


@dataclass(frozen=True, slots=True)
class Placed:
    """One vGPU of a plan: its type and placement id."""

    device_type: str
    placement_id: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Every vGPU of a layout on one GPU, the fixed ones first, then the new
    ones in the order they were placed (largest first)."""

    fixed: tuple[Placed, ...]
    new: tuple[Placed, ...]

    @property
    def placed(self) -> tuple[Placed, ...]:
        return self.fixed + self.new


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _order(asks: Sequence[tuple[str, int]], types: Mapping[str, TypePlacements]) -> list[str]:
    """The vGPUs to place, one entry per vGPU: largest size first, ties in
    the layout's order."""
    rank = {t: i for i, (t, _) in enumerate(asks)}
    wanted = [t for t, count in asks for _ in range(count)]
    return sorted(wanted, key=lambda t: (-types[t].size, rank[t]))


def _search(
    order: list[str], types: Mapping[str, TypePlacements], taken: list[range]
) -> list[Placed] | None:
    """Placements for ``order`` around ``taken``; the first found in the
    documented order (so the greedy answer where there is one), or None."""
    budget = [SEARCH_BUDGET]
    chosen: list[Placed] = []

    def place(i: int) -> bool:
        if i == len(order):
            return True
        tp = types[order[i]]
        # Two vGPUs of one type are interchangeable: the next one goes after
        # the previous one, which keeps the search from trying permutations.
        after = chosen[-1].placement_id if i and order[i - 1] == order[i] else -1
        for pid in sorted(p for p in tp.supported if p > after):
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            span = tp.span(pid)
            if any(_overlaps(span, t) for t in taken):
                continue
            chosen.append(Placed(tp.device_type, pid))
            taken.append(span)
            if place(i + 1):
                return True
            chosen.pop()
            taken.pop()
        return False

    return chosen if place(0) else None


def plan(
    gpu: str,
    asks: Sequence[tuple[str, int]],
    types: Mapping[str, TypePlacements],
    fixed: Sequence[Placed] = (),
) -> Plan:
    """Placements for the vGPUs ``asks`` names (``(type, count)`` in the
    layout's order) beyond ``fixed`` (vGPUs that stay where they are, counted
    in ``asks``: a layout of 3 with one fixed places 2).

    Raises ``exception.PlacementsDoNotFit`` naming the GPU, the sizes asked,
    the placements they need and what would fit.  A type missing from
    ``types`` raises KeyError: the caller checks first that the GPU supports
    every type of the layout."""
    found = _fit(asks, types, fixed)
    if found is not None:
        return found
    raise exception.PlacementsDoNotFit(
        gpu=gpu,
        asked=", ".join(f"{t}:{n}" for t, n in asks),
        needs=_needs(asks, types, fixed),
        fits=_what_fits(asks, types, fixed),
    )


def _fit(
    asks: Sequence[tuple[str, int]], types: Mapping[str, TypePlacements], fixed: Sequence[Placed]
) -> Plan | None:
    left = dict(asks)
    for placed in fixed:
        if left.get(placed.device_type, 0) > 0:
            left[placed.device_type] -= 1
    remaining = [(t, left.get(t, 0)) for t, _ in asks]
    taken = [types[p.device_type].span(p.placement_id) for p in fixed]
    found = _search(_order(remaining, types), types, taken)
    return None if found is None else Plan(tuple(fixed), tuple(found))


def _needs(
    asks: Sequence[tuple[str, int]], types: Mapping[str, TypePlacements], fixed: Sequence[Placed]
) -> str:
    parts = [
        f"{n} x {t} of size {types[t].size} (supported ids "
        f"{' '.join(map(str, sorted(types[t].supported))) or 'none'})"
        for t, n in asks if n
    ]
    said = "needs " + ", ".join(parts)
    if fixed:
        said += "; kept where they are: " + ", ".join(
            f"{p.device_type}@{p.placement_id}" for p in fixed)
    return said


def _what_fits(
    asks: Sequence[tuple[str, int]],
    types: Mapping[str, TypePlacements],
    fixed: Sequence[Placed],
) -> str:
    """The layout with the smallest-size type cut down until it fits, then
    the next: a suggestion an operator can paste, not the only answer."""
    counts = dict(asks)
    for device_type in sorted(counts, key=lambda t: types[t].size):
        floor = sum(1 for p in fixed if p.device_type == device_type)
        while counts[device_type] > floor:
            counts[device_type] -= 1
            trial = [(t, counts[t]) for t, _ in asks]
            if _fit(trial, types, fixed) is None:
                continue
            return "what would fit: " + ", ".join(f"{t}:{n}" for t, n in trial if n)
    return "nothing of it fits beside the vGPUs kept" if fixed else "nothing of it fits"
