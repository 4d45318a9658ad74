"""Allocate and release: an instance's devices by count (the mdev-only
shortcut of attach), all or nothing, idempotent.

* allocate: reuse free owned devices of the configured type, else create
  (planning.py says where); a repeat of what the instance holds answers it
  again, a different request while it holds devices is refused.
* release: free the instance's devices (kept for reuse) or remove them,
  except one that a libvirt domain still references or a VM holds (kept,
  free, and the call says so); a pool VF always goes back to its driver.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import layout, planning, protocol
from accel_agent.devices import requests as requests_mod
from accel_agent.devices.ledger import DeviceRecord, OwnerKind, validate_instance_id
from accel_agent.devices.results import Allocation
from accel_agent.sysfs import address

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager

LOG = logging.getLogger(__name__)

MAX_COUNT = requests_mod.MAX_COUNT


def check_request_names(parent: str | None, device_type: str | None) -> None:
    """A parent and a type as a caller may name them: no control character
    (``"mtty\\n"`` must not quietly become ``mtty``), a PCI address or parent
    name, a type id as sysfs spells them (fullmatch: ``$`` would take a
    trailing newline)."""
    if parent is not None and not (
        isinstance(parent, str)
        and parent.isprintable()
        and (address.is_pci_address(parent) or address.is_virtual_parent_name(parent.strip()))
    ):
        raise exception.InvalidAllocationRequest(
            reason=f"parent {parent!r} is neither a PCI address nor an mdev parent name"
        )
    if device_type is not None and not requests_mod.is_type_name(device_type):
        raise exception.InvalidAllocationRequest(
            reason=f"mdev type {device_type!r} must match {requests_mod.TYPE_NAME_RULE}"
        )


def allocation(m: DeviceManager, instance: str) -> Allocation:
    validate_instance_id(instance)
    return Allocation(instance, tuple(m.ledger.by_owner(instance, OwnerKind.INSTANCE)))


def allocate(
    m: DeviceManager,
    instance: str,
    count: int,
    parent: str | None = None,
    device_type: str | None = None,
) -> Allocation:
    """Give ``instance`` ``count`` devices, all or nothing.

    Idempotent: asking again for what the instance already holds returns
    it; asking for something different while it holds devices is refused.
    """
    validate_instance_id(instance)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise exception.InvalidAllocationRequest(
            reason=f"count must be an integer from 1 to {MAX_COUNT}, not {count!r}"
        )
    check_request_names(parent, device_type)
    wanted_parent = address.normalise_parent(parent) if parent else None
    with protocol.operation(m):
        held = m.ledger.by_owner(instance, OwnerKind.INSTANCE)
        if held:
            if _holds(m, held, count, wanted_parent, device_type):
                return Allocation(instance, tuple(held))
            raise exception.InstanceAlreadyAllocated(instance=instance, count=len(held))
        snapshot = m.scan()
        chosen_type, slots = planning.plan(m, snapshot, count, wanted_parent, device_type)
        protocol.make_and_assign(
            m, snapshot, protocol.Owner(instance),
            [protocol.PlanItem(slot, chosen_type) for slot in slots],
        )
        return allocation(m, instance)


def _holds(
    m: DeviceManager,
    held: list[DeviceRecord],
    count: int,
    wanted_parent: str | None,
    device_type: str | None,
) -> bool:
    """Whether ``held`` is what this request asks for (a repeat: idempotent),
    as opposed to a different request (refused, never answered with the old
    allocation).  The parent may name the devices' parent or their GPU."""
    if len(held) != count:
        return False
    if device_type is not None and any(r.device_type != device_type for r in held):
        return False
    if wanted_parent is None or all(r.parent == wanted_parent for r in held):
        return True
    parents = m.scan().parents
    return all(
        r.parent in parents and parents[r.parent].physical_gpu == wanted_parent for r in held
    )


def release(m: DeviceManager, instance: str, remove: bool = False) -> list[str]:
    """Free (or remove) the instance's devices; returns their UUIDs.  Idempotent.

    With ``remove``: one commit drops the assignments and records every
    remove intent, the sysfs writes follow, one commit settles them.
    """
    validate_instance_id(instance)
    return release_owner(m, instance, OwnerKind.INSTANCE, remove)


def _what_became(
    records: Sequence[DeviceRecord], remove: bool, unmade: set[str], kept: list[str]
) -> str:
    """What a release did to each device, for its log line: ``1 removed, 1 kept
    (in use, not removed): UUID``.  Only what happened: a device kept because
    a VM holds it is never said to be removed."""
    gone = [r.uuid for r in records if r.uuid not in set(kept)]
    returned = sum(1 for uuid in gone if uuid in unmade)
    removed = sum(1 for uuid in gone if uuid not in unmade and remove)
    free = sum(1 for uuid in gone if uuid not in unmade and not remove)
    parts = []
    if removed:
        parts.append(f"{removed} removed")
    if returned:
        parts.append(f"{returned} VF(s) given back to their driver")
    if free:
        parts.append(f"{free} left free for reuse")
    if kept:
        parts.append(f"{len(kept)} kept (in use, not removed): {', '.join(kept)}")
    return ", ".join(parts)


def release_owner(m: DeviceManager, owner: str, kind: OwnerKind, remove: bool) -> list[str]:
    """``release`` for an instance's devices or a migration claim's."""
    with protocol.operation(m):
        records = m.ledger.by_owner(owner, kind)
        if not records:
            return []
        kept: list[str] = []
        # A pool VF always goes back to its driver, its settings reset: it
        # is never kept as a free device (its MAC belonged to a tenant).
        unmade = {r.uuid for r in records if m.backend(r.backend).unmade_on_release}
        removable = [r.uuid for r in records if r.uuid in unmade]
        # A standing layout's devices go back to it, even with --remove; those
        # beyond its N (it was lowered) drain: removed now that they are free.
        back, surplus = layout.split_release(m, [r for r in records if r.uuid not in unmade])
        removable += [uuid for uuid in surplus if uuid not in removable]
        if remove:
            referenced = m.domains.referenced_uuids()
            if referenced is None:
                LOG.warning("cannot ask libvirt which mdevs domains use; removing anyway")
                referenced = set()
            for record in records:
                if record.uuid in unmade or record.uuid in back or record.uuid in surplus:
                    continue
                if record.uuid in referenced:
                    LOG.warning(
                        "not removing %s %s: a libvirt domain still references it",
                        m.device_kind(record.backend), record.uuid,
                    )
                    kept.append(record.uuid)
                    m.on_kept_in_use(record.uuid)
                else:
                    removable.append(record.uuid)
        kept += protocol.release_and_remove(m, owner, kind, removable)
        layout.take_back(m, back + [uuid for uuid in kept if uuid in surplus])
        LOG.info("released %d %s of %s %s: %s", len(records),
                 m.device_kinds(r.backend for r in records),
                 "instance" if kind is OwnerKind.INSTANCE else "the migration claim of",
                 owner, _what_became(records, remove, unmade, kept))
        if kept and (remove or unmade & set(kept)):
            by_uuid = {r.uuid: r for r in records}
            raise kept_in_use(m, [by_uuid[uuid] for uuid in kept])
        return [r.uuid for r in records]


def kept_in_use(m: DeviceManager, held: Sequence[DeviceRecord]) -> exception.DeviceInUse:
    """The error of a release that kept ``held`` because something holds
    them: their backend's class (MdevInUse, VfInUse), so the code says what
    is held; the common DeviceInUse when they are of several backends."""
    reason = "released but not removed: a domain or a VM still holds it"
    backends = sorted({r.backend for r in held})
    if len(backends) == 1:
        return m.backend(backends[0]).in_use([protocol.device_ref(r) for r in held], reason)
    kinds = ", ".join(sorted({m.device_kind(name) for name in backends}))
    return exception.DeviceInUse(
        uuid=", ".join(r.uuid for r in held), reason=f"{reason} ({kinds})"
    )
