"""What the last rescan and recovery saw, and the counts and series the
metrics publish from a rescan (accel_agent_mdevs{state}, _mdev_info)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.reporting.metrics import MDEV_STATES, MdevInfo

if TYPE_CHECKING:
    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.sysfs.model import HostSnapshot


def iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC).isoformat()


@dataclass
class RescanView:
    """What the last rescan saw."""

    at: float | None = None
    count: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    providers: int = 0
    missing: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    error: str | None = None
    inventory: inventory_mod.Inventory | None = None
    # Owned-looking mdevs found while the ledger was missing, still unrecorded.
    unrecorded: tuple[str, ...] = ()


@dataclass
class RecoveryView:
    at: float | None = None
    recreated: tuple[str, ...] = ()
    error: str | None = None


def record_state(record: DeviceRecord, present: bool) -> str:
    """The ``state`` label of a recorded mdev (accel_agent_mdevs, _mdev_info)."""
    if record.state is not DeviceState.PRESENT or record.intent_id is not None:
        return "transient"
    if not present:
        return "missing"
    if record.owner_kind is OwnerKind.CLAIM:
        return "claimed"
    if record.owner_kind is OwnerKind.STANDING:
        # A standing layout's, no instance holds it: ready, not in use by one.
        return "standing"
    if record.owner is not None:
        return "assigned"
    return "free"


def count_mdevs(records: Iterable[DeviceRecord], snapshot: HostSnapshot) -> dict[str, int]:
    """The ``accel_agent_mdevs{state}`` gauge: every record and sysfs mdev once."""
    counts = dict.fromkeys(MDEV_STATES, 0)
    recorded = set()
    for record in records:
        recorded.add(record.uuid)
        counts[record_state(record, record.uuid in snapshot.mdevs)] += 1
    counts["foreign"] = sum(1 for uuid in snapshot.mdevs if uuid not in recorded)
    return counts


def mdev_infos(records: Iterable[DeviceRecord], snapshot: HostSnapshot) -> list[MdevInfo]:
    """One accel_agent_mdev_info series per mdev in sysfs (foreign ones too)."""
    by_uuid = {r.uuid: r for r in records}
    rows = []
    for mdev in snapshot.mdevs.values():
        record = by_uuid.get(mdev.uuid)
        parent = snapshot.parents.get(mdev.parent)
        # An instance's or a claim's owner only: a standing layout's device
        # has none (its ledger owner "layout" is no instance to join on).
        holder = record.owner if record and record.owner_kind is not OwnerKind.STANDING else None
        rows.append(
            MdevInfo(
                uuid=mdev.uuid,
                instance=holder or "",
                parent=mdev.parent,
                physical_gpu=parent.physical_gpu if parent else mdev.parent,
                mdev_type=mdev.mdev_type or "",
                state=record_state(record, True) if record else "foreign",
            )
        )
    return rows


def placement_signature(inventory: inventory_mod.Inventory) -> tuple[Any, ...]:
    """What Placement is told: everything but ``used`` (allocations are Nova's)."""
    return tuple(
        (p.name, p.resource_class, p.total, p.traits, p.parent_provider)
        for p in inventory.providers
    )
