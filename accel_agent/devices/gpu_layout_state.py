"""What a mixed-size GPU layout (``[gpu_layout_<name>]``, issue 36) wants of
the host now: which GPUs carry one, which are short of it and why, which
are missing.  Pure functions of the ledger, the scan and the configuration,
so the converge, the listings and health agree.

A GPU of a mixed layout carries ``count`` vGPUs of each ``(type, count)``
it names.  What drains follows the one rule of every layout
(devices/layout_members.py).  A device in use is never retyped, moved or
removed: it keeps its placement (the planner's ``fixed``) until it is free.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel_agent.devices import layout_members

if TYPE_CHECKING:
    from accel_agent.devices.gpu_layouts import GpuLayout
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.sysfs.model import HostSnapshot, Parent

# Why a GPU is short of its mixed layout (the reason's first words; the
# converge adds what it found, docs/operations.md lists each).
NOT_CAPABLE = "not capable of mixed sizes"
MODE_IN_USE = "in use, so mixed-size mode cannot be set"
MODE_NOT_SET = "mixed-size mode reads back off"
DOES_NOT_FIT = "does not fit"
READ_BACK = "placement read back differs"
NVML_UNAVAILABLE = "NVML unavailable"
NO_FREE_VF = "no free VF"
MAKE_FAILED = "a vGPU could not be made"
# A MIG-backed layout's GPU (issue 37, devices/gpu_layout_mig.py).
NEEDS_RESET = "needs a GPU reset"
MIG_IN_USE = "in use, so MIG mode cannot be set"
GI_READ_BACK = "GPU instance read back differs"


@dataclass(frozen=True, slots=True)
class MixedShort:
    """A GPU short of its mixed layout: the layout, what it wants and has."""

    layout: str  # the section, gpu_layout_<name>
    wanted: int  # vGPUs the layout names
    present: int  # of them on the GPU now
    reason: str


def layout_gpus(snapshot: HostSnapshot, policy: DevicePolicy) -> dict[str, GpuLayout]:
    """The GPUs on the host (a VF of theirs is) with a mixed layout: GPU -> layout."""
    found: dict[str, GpuLayout] = {}
    if not policy.gpu_layouts:
        return found
    for parent in snapshot.parents.values():
        if parent.physfn is None or parent.physical_gpu in found:
            continue
        layout = policy.gpu_layout_for(parent)
        if layout is not None:
            found[parent.physical_gpu] = layout
    return found


def on_mixed_gpu(policy: DevicePolicy, parent: Parent | str | None) -> bool:
    """The parent is a VF of a GPU a mixed layout names (the standing
    layouts' rules leave it to this module)."""
    return parent is not None and bool(policy.gpu_layouts) and (
        policy.gpu_layout_for(parent) is not None)


def short(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    holders: Mapping[str, str | None],
    members: Set[str],
    reasons: Mapping[str, str],
    made: Mapping[str, tuple[str, str]] | None = None,
    gone: Set[str] = frozenset(),
) -> dict[str, MixedShort]:
    """The GPUs on the host short of their mixed layout: fewer vGPUs of a
    type than it names, or a reason the last converge left (the mode not
    set, a placement that did not read back, ...)."""
    found, _ = layout_members.groups(
        snapshot, policy, {u: h for u, h in holders.items() if u not in gone}, members, made)
    out: dict[str, MixedShort] = {}
    for gpu, layout in sorted(layout_gpus(snapshot, policy).items()):
        present = sum(
            min(layout.count_of(t), found[(gpu, t)].present if (gpu, t) in found else 0)
            for t in layout.types
        )
        wanted = sum(n for _, n in layout.vgpus)
        reason = reasons.get(gpu)
        if present < wanted or reason:
            out[gpu] = MixedShort(layout.section, wanted, present, reason or DOES_NOT_FIT)
    return out


def missing_gpus(snapshot: HostSnapshot, policy: DevicePolicy) -> tuple[str, ...]:
    """The GPUs a mixed layout names that have no VF on the host."""
    present = {p.physfn for p in snapshot.parents.values() if p.physfn}
    return tuple(gpu for layout in policy.gpu_layouts for gpu in layout.gpus
                 if gpu not in present)
