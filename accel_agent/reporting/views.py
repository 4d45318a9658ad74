"""JSON documents of the host's state (docs/design.md §6).

One builder per listing, shared by ``accelctl --json`` and the API so both
always give the same shape.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the listings that need no inventory do not import it
    from accel_agent.devices.inventory import Inventory
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.sysfs.model import HostSnapshot, Parent


def types_document(snapshot: HostSnapshot, policy: DevicePolicy, host: str) -> dict[str, Any]:
    # Counted once: a host has thousands of (parent, type) pairs.
    counts = Counter((m.parent, m.mdev_type) for m in snapshot.mdevs.values())
    parents = []
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        types = []
        for type_id in sorted(parent.types):
            mdev_type = parent.types[type_id]
            types.append(
                {
                    "type_id": type_id,
                    "name": mdev_type.name,
                    "description": mdev_type.description,
                    "device_api": mdev_type.device_api,
                    "available_instances": mdev_type.available_instances,
                    "mdevs": counts[parent.name, type_id],
                }
            )
        parents.append(
            {
                "name": parent.name,
                "pci_address": parent.pci_address,
                "physical_gpu": parent.physical_gpu,
                "numa_node": parent.numa_node,
                "driver": parent.driver,
                "configured_type": policy.type_for(parent),
                # Every type the configuration gives it: several on a GPU of
                # a mixed-size layout, where configured_type is null.
                "configured_types": list(policy.types_on(parent)),
                "types": types,
                "backend": parent.backend,
            }
        )
    return {"host": host, "parents": parents}


def mdevs_document(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    host: str,
    owners: Mapping[str, str | None] | None = None,
    owned: Iterable[str] = (),
    libvirt: Mapping[str, tuple[bool, bool]] | None = None,
    layout_members: Iterable[str] = (),
    held_groups: frozenset[str] | None = None,
    *,
    libvirt_error: str | None = None,
) -> dict[str, Any]:
    """Every mdev on the host.  ``owned``: UUIDs the agent created or adopted;
    ``owners``: uuid -> instance.  Foreign mdevs are listed too: they use
    capacity even though the agent never touches them.  ``libvirt``: uuid ->
    (defined, autostart) of every mdev libvirt defines; None when that is
    not known (no [libvirt] uri, libvirt unreachable or not answering
    within its deadline): each mdev's ``libvirt`` is then null, and
    ``libvirt_error`` says why.  ``held_groups``: the VFIO groups processes
    hold open (sysfs/vfio_holders.py), None when not looked at."""
    owned_set = set(owned)
    owners = owners or {}
    standing, draining = _layout_marks(snapshot, policy, owned_set, set(layout_members), owners)
    mdevs = []
    for mdev in sorted(snapshot.mdevs.values(), key=lambda m: (m.parent, m.uuid)):
        parent = snapshot.parents.get(mdev.parent)
        mdevs.append(
            {
                "uuid": mdev.uuid,
                "parent": mdev.parent,
                "mdev_type": mdev.mdev_type,
                "iommu_group": mdev.iommu_group,
                "physical_gpu": parent.physical_gpu if parent else None,
                "configured": parent is not None and mdev.mdev_type in policy.types_on(parent),
                "owned": mdev.uuid in owned_set,
                "instance": owners.get(mdev.uuid),
                "backend": mdev.backend,
                "address": mdev.address,
                "type_name": _type_name(parent, mdev.mdev_type),
                "libvirt": _libvirt(libvirt, mdev.uuid),
                "standing": mdev.uuid in standing,
                "draining": mdev.uuid in draining,
                # A process holds its VFIO group (a VM uses it); null: not known
                # (no standing layout to watch, or /proc not readable).
                "in_use": None if held_groups is None or mdev.iommu_group is None
                else str(mdev.iommu_group) in held_groups,
            }
        )
    return {
        "host": host,
        "mdevs": mdevs,
        # Why every "libvirt" above is null; null when libvirt answered.
        "libvirt_error": libvirt_error if libvirt is None else None,
    }


def _layout_marks(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    owned: set[str],
    members: set[str],
    owners: Mapping[str, str | None],
) -> tuple[set[str], frozenset[str]]:
    """(the agent's devices that belong to their GPU's standing layout, those
    it no longer wants and removes once free).  Draining is
    devices/layout.py's one definition, the one health and the converge
    use: a layout's device of another type than its GPU's standing one (or
    on a GPU with none now), and a GPU's devices beyond the N of a lowered
    layout (those instances hold first)."""
    standing: set[str] = set()
    for mdev in snapshot.mdevs.values():
        if mdev.uuid not in owned:
            continue
        parent = snapshot.parents.get(mdev.parent)
        # Its GPU's standing type, or a type its mixed-size layout names.
        wanted = dict(policy.wanted_on(parent)) if parent is not None else {}
        if mdev.mdev_type in wanted:
            standing.add(mdev.uuid)
    if not members and not standing:
        return standing, frozenset()  # no layout: nothing of it to import
    from accel_agent.devices import layout

    holders = {uuid: owners.get(uuid) for uuid in owned}
    return standing, layout.draining_of(snapshot, policy, holders, members)


def _libvirt(
    libvirt: Mapping[str, tuple[bool, bool]] | None, uuid: str
) -> dict[str, bool] | None:
    if libvirt is None:
        return None
    defined, autostart = libvirt.get(uuid, (False, False))
    return {"defined": defined, "autostart": autostart}


def _type_name(parent: Parent | None, mdev_type: str | None) -> str | None:
    if parent is None or mdev_type is None or mdev_type not in parent.types:
        return None
    return parent.types[mdev_type].name


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    return inventory.to_dict()


def encode(document: dict[str, Any]) -> bytes:
    """A listing as the API sends it and accelctl prints it into a pipe:
    compact JSON (the C encoder; the documents are trees, no cycle check)."""
    return json.dumps(document, separators=(",", ":"), check_circular=False).encode("utf-8")
