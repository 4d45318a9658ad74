"""Mixed-size GPU layouts: ``[gpu_layout_<name>]`` (issue 36).

A layout puts vGPUs of several types on each GPU it names, in NVIDIA's
mixed-size ("heterogeneous") mode: ``gpus`` (the PFs' PCI addresses),
``vgpus`` (``<type>:<count>, ...``, types as ``enabled_mdev_types`` names
them: ``nvidia-<id>``) and ``reported_by`` (``agent`` or ``nova``, as for a
standing layout, docs/operations.md).  Each GPU of the layout carries every
vGPU it asks for at all times, each on a placement the agent plans
(devices/placements.py), records in the ledger, writes and reads back.

This module holds what the configuration says (:class:`GpuLayout`, built by
``devices/policy.py`` from the sections); what the host must do for it is
``devices/layout.py``'s and the start-up's.
"""

from __future__ import annotations

from dataclasses import dataclass

# The section prefix: [gpu_layout_<name>].
SECTION_PREFIX = "gpu_layout_"


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """One ``[gpu_layout_<name>]`` section, validated and normalised."""

    name: str  # <name> of the section
    gpus: tuple[str, ...]  # PF addresses, normalised (0000:bb:dd.f), sorted
    vgpus: tuple[tuple[str, int], ...]  # (type, count), in the section's order
    reported_by: str = "agent"  # "agent" or "nova"

    @property
    def section(self) -> str:
        return SECTION_PREFIX + self.name

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.vgpus)

    def count_of(self, device_type: str) -> int:
        return sum(n for t, n in self.vgpus if t == device_type)

    @property
    def nova_reports(self) -> bool:
        return self.reported_by == "nova"
