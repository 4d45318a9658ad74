"""Inventory per physical GPU: the numbers Placement and orchestrators see.

docs/design.md §5.1.  For each physical GPU and the type configured for its
parents: ``total = existing mdevs of that type + available_instances``,
summed over the parents on that GPU (one parent for a PF or a virtual
parent, every VF for NVIDIA SR-IOV), then capped by the per-GPU limit:
``[mdev_<type>] max_instances`` and, for VFs, the type's own
``max_instance=`` from ``description``.  Each VF reads 0 or 1, so summing
the VFs' 1s would promise 16 where the card holds 4 (Nova bug 2041519).
The cap never goes below the mdevs that already exist: a GPU that hosts
in-use mdevs is never zeroed (Nova zeroes it, which deletes the provider
under running guests).

A GPU of a mixed-size layout (``[gpu_layout_<name>]``, devices/gpu_layouts.py)
has one provider per type of the layout, its total the layout's count of
that type (never below the devices of it that exist): the layout's devices
are made at start, each on its planned placement, so that count is exactly
what can be handed out, and what the VFs' ``available_instances`` say (a
count of what one more vGPU of the type could be, which shrinks as the other
types take placements) is not used.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.devices.policy import DevicePolicy
from accel_agent.sysfs import address
from accel_agent.sysfs.model import HostSnapshot, Parent

LOG = logging.getLogger(__name__)

# Custom because os-traits has no standard trait for this agent; the
# OWNER_NOVA / OWNER_CYBORG pattern tells other services whose providers these are.
OWNER_TRAIT = "CUSTOM_OWNER_ACCEL_AGENT"


def type_trait(device_type: str) -> str:
    """``nvidia-35`` -> ``CUSTOM_MDEV_NVIDIA_35`` (Placement trait syntax)."""
    return "CUSTOM_MDEV_" + re.sub(r"[^A-Z0-9]", "_", device_type.upper())


def nodedev_name(physical_gpu: str, member: Parent) -> str:
    """libvirt's node-device name of a provider's device, which Nova puts
    after ``<host>_`` in its provider names: keeping them means a host taken
    over from Nova keeps its providers and the allocations against them.

    PCI: ``pci_0000_84_00_0``.  Anything else: libvirt's ``<subsystem>_<sysname>``.
    A parent with no bus is a class device under ``devices/virtual/<class>/``
    (mtty: ``devices/virtual/mtty/mtty`` -> ``mtty_mtty``), so the directory
    above it names its subsystem; the path is in the snapshot already, no
    read needed.
    """
    if address.is_pci_address(physical_gpu):
        return address.provider_suffix(physical_gpu)
    components = member.device_path.rstrip("/").split("/")
    subsystem = components[-2] if len(components) >= 2 else member.name
    return address.provider_suffix(f"{subsystem}_{member.name}")


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    parent_provider: str
    # The device the provider stands for: the mdev parent itself, or the
    # physical function for a group of SR-IOV VF parents.
    parent_device: str
    parent_devices: tuple[str, ...]
    pci_address: str | None
    physical_gpu: str
    numa_node: int | None
    # The type it offers: an mdev or vGPU type, a VF pool's name (the
    # inventory's ``mdev_type`` field, as the API and Placement's sync say it).
    device_type: str
    resource_class: str
    total: int
    used: int
    traits: tuple[str, ...]

    def inventory_record(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "reserved": 0,
            "min_unit": 1,
            "max_unit": self.total,
            "step_size": 1,
            "allocation_ratio": 1.0,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "parent_provider": self.parent_provider,
            "parent_device": self.parent_device,
            "parent_devices": list(self.parent_devices),
            "pci_address": self.pci_address,
            "physical_gpu": self.physical_gpu,
            "numa_node": self.numa_node,
            "mdev_type": self.device_type,
            "resource_class": self.resource_class,
            "inventory": self.inventory_record(),
            "used": self.used,
            "traits": list(self.traits),
        }


@dataclass(frozen=True, slots=True)
class Inventory:
    host: str
    providers: tuple[Provider, ...]
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "providers": [p.to_dict() for p in self.providers]}

    def provider(self, name: str) -> Provider | None:
        return next((p for p in self.providers if p.name == name), None)


def _group_limit(members: list[Parent], device_type: str, configured: int | None) -> int | None:
    limits = [configured] if configured is not None else []
    if any(p.physfn for p in members):
        # Per-VF counters say nothing of the card: trust the type's own limit.
        limits += [
            m for p in members if (m := p.types[device_type].max_instance) is not None
        ]
    return min(limits) if limits else None


def compute_inventory(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    host: str,
    free_uuids: Iterable[str] = (),
) -> Inventory:
    """Providers for every physical GPU whose parents offer their configured type.

    ``free_uuids``: mdevs the agent owns and has not assigned; they are
    capacity in ``total`` but not ``used``.  Every other existing mdev of the
    type (assigned, or foreign) is used.
    """
    free = set(free_uuids)
    warnings: list[str] = []
    groups: dict[tuple[str, str], list[Parent]] = defaultdict(list)
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        device_type = policy.type_for(parent)
        if device_type is None:
            continue
        if device_type not in parent.types:
            # The default type simply does not apply to parents that lack it;
            # an explicitly listed parent that lacks its type is a mistake.
            offers = ", ".join(sorted(parent.types)) or "nothing"
            if (parent.pci_address or parent.name) in policy.parent_types:
                warnings.append(
                    f"parent {parent.name} is configured for type {device_type} which it does "
                    f"not offer (it offers: {offers}); no provider"
                )
            elif parent.backend != "mdev" and parent.physfn in policy.parent_types:
                # Configured through its GPU: one line per GPU, not per VF.
                warnings.append(
                    f"GPU {parent.physfn} is configured for type {device_type} which its VFs "
                    f"do not offer (they offer: {offers}); no provider"
                )
            continue
        groups[(parent.physical_gpu, device_type)].append(parent)

    types_per_gpu: dict[str, int] = defaultdict(int)
    for gpu, _type in groups:
        types_per_gpu[gpu] += 1

    providers: list[Provider] = []
    for (gpu, device_type), members in groups.items():
        type_config = policy.config_of(device_type)
        assert type_config is not None  # type_for only returns configured types
        existing = [m for p in members for m in snapshot.mdevs_on(p.name, device_type)]
        available = sum(p.types[device_type].available_instances for p in members)
        limit = _group_limit(members, device_type, type_config.max_instances)
        extra = available if limit is None else min(available, max(limit - len(existing), 0))
        total = len(existing) + extra
        if total == 0:
            LOG.debug("no capacity for %s on %s: no provider", device_type, gpu)
            continue
        suffix = nodedev_name(gpu, members[0])
        if types_per_gpu[gpu] > 1:
            # Two types on one card (VFs configured apart): keep names unique.
            suffix += "_" + re.sub(r"[^A-Za-z0-9_-]", "_", device_type)
        single = members[0] if len(members) == 1 and members[0].name == gpu else None
        providers.append(
            Provider(
                name=f"{host}_{suffix}",
                parent_provider=host,
                parent_device=single.name if single else gpu,
                parent_devices=tuple(p.name for p in members),
                pci_address=gpu if address.is_pci_address(gpu) else None,
                physical_gpu=gpu,
                numa_node=members[0].numa_node,
                device_type=device_type,
                resource_class=type_config.mdev_class,
                total=total,
                used=sum(1 for m in existing if m.uuid not in free),
                traits=tuple(sorted({type_trait(device_type), OWNER_TRAIT})),
            )
        )
    for layout in policy.gpu_layouts:
        providers += _layout_providers(snapshot, policy, layout, host, free)
    providers.sort(key=lambda p: p.name)
    return Inventory(host=host, providers=tuple(providers), warnings=tuple(warnings))


def _layout_providers(
    snapshot: HostSnapshot, policy: DevicePolicy, layout: GpuLayout, host: str,
    free: set[str],
) -> list[Provider]:
    """One provider per GPU of ``layout`` on the host and per type of it:
    total the layout's count of the type (or the devices of it that exist,
    when more do: a layout lowered drains, it never zeroes a GPU under its
    guests), used the existing ones no instance left free."""
    members_of: dict[str, list[Parent]] = defaultdict(list)
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        gpu = parent.physfn or parent.pci_address
        if parent.backend != "mdev" and gpu in layout.gpus:
            members_of[gpu].append(parent)
    providers = []
    for gpu, members in members_of.items():
        for device_type, count in layout.vgpus:
            type_config = policy.config_of(device_type)
            if type_config is None:  # pragma: no cover - the policy keeps every layout type
                continue
            existing = [m for p in members for m in snapshot.mdevs_on(p.name, device_type)]
            holding = sorted({m.parent for m in existing})
            suffix = nodedev_name(gpu, members[0])
            if len(layout.vgpus) > 1:
                suffix += "_" + re.sub(r"[^A-Za-z0-9_-]", "_", device_type)
            providers.append(Provider(
                name=f"{host}_{suffix}",
                parent_provider=host,
                parent_device=gpu,
                # The VFs holding the type's vGPUs; all the GPU's VFs until
                # the start made them.
                parent_devices=tuple(holding) or tuple(p.name for p in members),
                pci_address=gpu,
                physical_gpu=gpu,
                numa_node=members[0].numa_node,
                device_type=device_type,
                resource_class=type_config.mdev_class,
                total=max(count, len(existing)),
                used=sum(1 for m in existing if m.uuid not in free),
                traits=tuple(sorted({type_trait(device_type), OWNER_TRAIT})),
            ))
    return providers


def reported(inventory: Inventory, policy: DevicePolicy) -> Inventory:
    """The providers of ``inventory`` the agent reports: not those of a type
    ``[mdev_<type>] reported_by = nova`` gives Nova, nor any of a mixed-size
    layout's GPU with ``[gpu_layout_<name>] reported_by = nova``: Nova's PCI
    tracker reports those devices itself (a provider of ours too would count
    them twice).  The daemon (DeviceManager.reported_inventory), the offline
    listing and check-config's summary all count through it."""
    if not policy.any_nova_reports:
        return inventory
    return dataclasses.replace(inventory, providers=tuple(
        p for p in inventory.providers
        if not policy.nova_reports_on(p.physical_gpu, p.device_type)
    ))
