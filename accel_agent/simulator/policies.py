"""``available_instances`` and create refusals for each count policy.

The kernel leaves both to the vendor driver (``get_available`` and the probe's
errno) except for the mdev core's own per-parent counter.  Each policy here
mirrors one real driver family (docs/design.md §4.2, §8.1):

==================  ===============================================  ==========
policy              available_instances                              refusal
==================  ===============================================  ==========
independent         max - mdevs of this type on this parent          ENOSPC
shared (i915)       (capacity - used weight on parent) // weight     ENOSPC
global (mtty)       (capacity - used weight in pool) // weight       ENOSPC
core (mdpy/ccw/ap)  capacity - mdevs on parent (all types)           EUSERS
nvidia-equal-size   max - same-type mdevs; 0 once another type holds EINVAL
nvidia-vf           0/1 per VF; per-physfn budget of max_instance;   EINVAL
                    0 when a sibling VF holds another type
==================  ===============================================  ==========

A create is refused exactly when the count reads 0 (the model does not invent
the i915 "reads 1, create gives ENOSPC" fragmentation case; tests that need a
refusal despite a positive count use ``SimulatedHost.fail_next_create``).
NVIDIA users report EINVAL for every refusal by the vendor driver (mdevctl#115),
so both NVIDIA policies refuse with EINVAL, whether the type is locked out or the
budget is spent.
"""

from __future__ import annotations

import errno
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Protocol

from accel_agent.simulator.spec import ParentSpec

REFUSAL_ERRNO = {
    "independent": errno.ENOSPC,
    "shared": errno.ENOSPC,
    "global": errno.ENOSPC,
    "core": errno.EUSERS,
    "nvidia-equal-size": errno.EINVAL,
    "nvidia-vf": errno.EINVAL,
}


class MdevLike(Protocol):
    type_id: str


class ParentLike(Protocol):
    spec: ParentSpec
    mdevs: Mapping[str, MdevLike]


class Counters:
    """Reads the live mdev population of a host and answers for every policy.

    Counts are computed on each read rather than kept as counters, so they can
    never drift from the device set (the kernel's vendor counters are exactly
    that: derived from the driver's own device list).
    """

    def __init__(self, parents: Mapping[str, ParentLike]) -> None:
        self._parents = parents
        # nvidia-vf siblings share a budget per physical GPU; a VF without physfn is
        # its own group.
        self._vf_groups: dict[str, list[str]] = defaultdict(list)
        self._vf_group_of: dict[str, str] = {}
        # global pools are module-wide: every parent naming the same pool shares it.
        self._pools: dict[str, list[str]] = defaultdict(list)
        for name, parent in parents.items():
            spec = parent.spec
            if spec.policy == "nvidia-vf":
                key = spec.physfn or spec.name
                self._vf_groups[key].append(name)
                self._vf_group_of[name] = key
            elif spec.policy == "global":
                self._pools[spec.pool_name].append(name)

    def _types(self, names: Iterable[str]) -> list[str]:
        return [m.type_id for n in names for m in self._parents[n].mdevs.values()]

    def _weight_used(self, names: Iterable[str]) -> int:
        total = 0
        for n in names:
            spec = self._parents[n].spec
            for m in self._parents[n].mdevs.values():
                t = spec.type(m.type_id)
                total += t.weight if t else 1
        return total

    def available(self, parent_name: str, type_id: str) -> int:
        parent = self._parents[parent_name]
        spec = parent.spec
        tspec = spec.type(type_id)
        if tspec is None:
            return 0
        policy = spec.policy
        here = [m.type_id for m in parent.mdevs.values()]
        if policy == "independent":
            return max(0, (tspec.limit or 0) - here.count(type_id))
        if policy == "nvidia-equal-size":
            if any(t != type_id for t in here):
                return 0
            return max(0, (tspec.limit or 0) - here.count(type_id))
        if policy == "shared":
            return max(0, (spec.capacity or 0) - self._weight_used([parent_name])) // tspec.weight
        if policy == "global":
            members = self._pools[spec.pool_name]
            return max(0, (spec.capacity or 0) - self._weight_used(members)) // tspec.weight
        if policy == "core":
            return max(0, (spec.capacity or 0) - len(here))
        if policy == "nvidia-vf":
            if here:
                return 0  # a VF hosts at most one vGPU
            group = self._types(self._vf_groups[self._vf_group_of[parent_name]])
            if any(t != type_id for t in group):
                return 0  # equal-size on the physical GPU: another type owns it
            return 1 if (tspec.limit or 0) - group.count(type_id) > 0 else 0
        raise AssertionError(f"unknown policy {policy}")  # the spec validated it

    def refusal(self, parent_name: str, type_id: str) -> int | None:
        """The errno a create would get from the vendor (or core), or None."""
        if self.available(parent_name, type_id) > 0:
            return None
        return REFUSAL_ERRNO[self._parents[parent_name].spec.policy]

    def is_core(self, parent_name: str) -> bool:
        return self._parents[parent_name].spec.policy == "core"
