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

A layout with ``mig = <profile>:<count>, ...`` (issue 37) is MIG-backed: its
``vgpus`` are MIG-backed types, one per GPU instance it names; the agent
turns MIG mode on, creates the GPU instances at planned placements
(devices/mig_plan.py) and types the VFs on them
(devices/gpu_layout_mig.py).  ``mig`` is required for such a layout, never
derived from the types: which GPU instances a GPU is cut into is the
operator's decision, stated once and checked against the types, not a
guess the agent could make differently after an upgrade.
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
    # (profile name, count) of ``mig = <profile>:<count>, ...``: the GPU
    # instances a MIG-backed layout (issue 37) asks; None for a time-sliced
    # mixed-size layout (no ``mig``).
    mig: tuple[tuple[str, int], ...] | None = None

    @property
    def section(self) -> str:
        return SECTION_PREFIX + self.name

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.vgpus)

    def count_of(self, device_type: str) -> int:
        return sum(n for t, n in self.vgpus if t == device_type)

    @property
    def is_mig(self) -> bool:
        """A MIG-backed layout: its vGPUs live on GPU instances it names."""
        return self.mig is not None

    @property
    def nova_reports(self) -> bool:
        return self.reported_by == "nova"
