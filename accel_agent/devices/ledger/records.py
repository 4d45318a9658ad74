"""What the ledger stores, as the rest of the agent sees it: a device's row
with its owner (:class:`DeviceRecord`), an operation in flight
(:class:`Intent`), their states and kinds, and the one query that reads a
record with the decoding of its row (the two are written against each
other's column order, so they live together)."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class DeviceState(enum.StrEnum):
    CREATING = "creating"  # intent: the sysfs create may or may not have happened
    PRESENT = "present"  # settled: exists (free unless assigned)
    REMOVING = "removing"  # intent: the sysfs remove may or may not have happened


class OwnerKind(enum.StrEnum):
    INSTANCE = "instance"
    CLAIM = "claim"  # a live-migration destination claim, expires
    # Held by a standing layout ([mdev_<type>] standing) while no instance
    # holds it: never free, so nothing else takes it (Nova may use it).
    STANDING = "standing"


class IntentKind(enum.StrEnum):
    ALLOCATE = "allocate"
    RELEASE = "release"
    CLAIM = "claim"
    RECOVER = "recover"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    uuid: str
    parent: str
    # Its type: an mdev type, a vGPU type, a VF pool's name (the ledger's
    # column is ``mdev_type``, as it was when mdevs were all it held).
    device_type: str
    state: DeviceState
    owner: str | None
    owner_kind: OwnerKind | None
    claim_expires_at: float | None
    intent_id: int | None
    adopted: bool
    created_at: float
    updated_at: float
    # For a migration claim: the source host's mdev this one replaces.
    source_uuid: str | None = None
    # The backend that made it (accel_agent.backends): mdev, nvidia_vfio, ...
    backend: str = "mdev"
    # What the device was prepared with for its instance (an SR-IOV VF's MAC,
    # VLAN, ...): recovery prepares it again the same way, and the guest XML
    # repeats it.  None for a device that has no such settings (an mdev).
    settings: dict[str, Any] | None = None
    # A standing layout's device (devices/layout.py), whoever holds it now.
    layout: bool = False
    # A vGPU's planned placement on its GPU (a mixed-size layout's,
    # devices/placements.py); None for a device without one.
    placement_id: int | None = None

    @property
    def assigned(self) -> bool:
        return self.owner is not None

    @property
    def free(self) -> bool:
        """Reusable now: present, unowned, not reserved by an operation."""
        return self.state is DeviceState.PRESENT and self.owner is None and self.intent_id is None

    @property
    def in_layout(self) -> bool:
        """A standing layout's device: held by the layout, or flagged as one
        of its devices while an instance holds it (listings' ``standing``)."""
        return self.layout or self.owner_kind is OwnerKind.STANDING


@dataclass(frozen=True, slots=True)
class Intent:
    id: int
    kind: IntentKind
    owner: str | None
    created_at: float
    uuids: tuple[str, ...]  # the rows this operation reserved or is creating/removing


# Every record query: a device's row with its assignment, if any.
RECORD_SELECT = """
    SELECT m.uuid, m.parent, m.mdev_type, m.state, a.owner, a.owner_kind,
           a.claim_expires_at, m.intent_id, m.adopted, m.created_at, m.updated_at,
           a.source_uuid, m.backend, m.settings, m.layout, m.placement_id
    FROM mdevs m LEFT JOIN assignments a ON a.uuid = m.uuid
"""
RECORD_ORDER = " ORDER BY m.created_at, m.uuid"


def decode_record(row: Sequence[Any]) -> DeviceRecord:
    """One row of :data:`RECORD_SELECT` as a :class:`DeviceRecord`."""
    return DeviceRecord(
        uuid=row[0],
        parent=row[1],
        device_type=row[2],
        state=DeviceState(row[3]),
        owner=row[4],
        owner_kind=OwnerKind(row[5]) if row[5] is not None else None,
        claim_expires_at=row[6],
        intent_id=row[7],
        adopted=bool(row[8]),
        created_at=row[9],
        updated_at=row[10],
        source_uuid=row[11],
        backend=row[12],
        settings=json.loads(row[13]) if row[13] is not None else None,
        layout=bool(row[14]),
        placement_id=row[15],
    )
