"""Live-migration claims on the destination: one device per source device,
of the same type, held as an expiring claim; committed into the instance's
allocation when the migration landed, aborted (freed, or removed) when it
failed; released when it expires.

A claim has a clear life, like Nova's ``compute/claims.py`` claims: made
(``claim``: idempotent for the same source devices, persisted with the source
device each one stands in for, so the answer survives a restart), then
exactly one of ``commit`` (refused while the instance already holds devices:
no instance ends up holding more than it asked for), ``abort`` or expiry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import allocations, planning, protocol
from accel_agent.devices.ledger import DeviceRecord, OwnerKind, validate_instance_id
from accel_agent.devices.protocol import PlanItem
from accel_agent.devices.results import Allocation

if TYPE_CHECKING:
    from collections.abc import Iterable

    from accel_agent.devices.manager import DeviceManager

LOG = logging.getLogger(__name__)


def claim(
    m: DeviceManager, owner: str, sources: dict[str, str], expires_at: float
) -> dict[str, str]:
    """One device per source device, of the same type, held as an expiring
    claim.  Returns ``{source uuid: our uuid}``."""
    validate_instance_id(owner)
    with protocol.operation(m):
        held = m.ledger.by_owner(owner, OwnerKind.CLAIM)
        if held:
            mapping = _sources(held)
            if set(mapping) == set(sources):
                return mapping
            raise exception.InstanceAlreadyAllocated(instance=owner, count=len(held))
        snapshot = m.scan()
        items: list[PlanItem] = []
        by_type: dict[str, list[str]] = {}
        for source, device_type in sorted(sources.items()):
            by_type.setdefault(device_type, []).append(source)
        for device_type, type_sources in sorted(by_type.items()):
            _, slots = planning.plan(m, snapshot, len(type_sources), None, device_type)
            items += [
                PlanItem(slot, device_type, src)
                for slot, src in zip(slots, type_sources, strict=True)
            ]
        protocol.make_and_assign(
            m, snapshot, protocol.Owner(owner, OwnerKind.CLAIM, expires_at), items
        )
        return _sources(m.ledger.by_owner(owner, OwnerKind.CLAIM))


def _sources(records: Iterable[DeviceRecord]) -> dict[str, str]:
    """``{source uuid: our uuid}`` of a claim's devices (each stands in for
    one source device: a claim's rows always name it)."""
    return {r.source_uuid: r.uuid for r in records if r.source_uuid is not None}


def commit(m: DeviceManager, owner: str) -> Allocation:
    """The migration landed: the claim becomes the instance's allocation."""
    validate_instance_id(owner)
    with protocol.operation(m):
        if not m.ledger.by_owner(owner, OwnerKind.CLAIM):
            raise exception.MigrationClaimNotFound(instance=owner)
        held = m.ledger.by_owner(owner, OwnerKind.INSTANCE)
        if held:
            raise exception.InstanceAlreadyAllocated(instance=owner, count=len(held))
        protocol.commit_claim(m, owner)
        LOG.info("migration claim of %s committed", owner)
        return allocations.allocation(m, owner)


def abort(m: DeviceManager, owner: str, remove: bool = False) -> list[str]:
    """The migration failed or was cancelled: free the claimed devices (kept
    for reuse), or with ``remove`` remove them like ``release`` does.
    Idempotent.

    Why remove: a failed incoming migration can leave the device in the state
    the failed load left it (seen on the real kernel: mtty keeps its RESUMING
    state across close, and the next incoming migration into that mdev
    fails); a new mdev starts clean."""
    validate_instance_id(owner)
    if remove:
        return allocations.release_owner(m, owner, OwnerKind.CLAIM, remove=True)
    with protocol.operation(m):
        released = protocol.free_claim(m, owner)
        if released:
            LOG.info("migration claim of %s aborted, %d %s freed", owner, len(released),
                     m.device_kinds(r.backend for r in released))
        return [r.uuid for r in released]


def release_expired(m: DeviceManager) -> list[str]:
    """Free the expired claims (the caller holds the operation's lock: the
    file lock is not re-entrant)."""
    expired = m.ledger.expired_claims()
    protocol.release_quietly(m, expired)
    for record in expired:
        LOG.warning("migration claim of %s on %s %s expired; freed", record.owner,
                    m.device_kind(record.backend), record.uuid)
    return [r.uuid for r in expired]
