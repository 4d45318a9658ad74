"""Device rows and their owners: the ``mdevs`` and ``assignments`` tables.

A row's life follows the manager's protocol (the package docstring):
``record_create_intent`` -> ``settle_created`` -> ``assign`` ->
``release`` -> ``record_remove_intent`` -> ``forget``, with ``adopt`` for a
device found, ``reserve`` for one reused by an operation and
``cancel_remove`` for a remove that will not happen.  Every check runs
inside the write transaction that makes the change, so what it saw is what
it changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from accel_agent import exception
from accel_agent.devices.ledger.intents import IntentStore
from accel_agent.devices.ledger.records import (
    RECORD_ORDER,
    RECORD_SELECT,
    DeviceRecord,
    DeviceState,
    OwnerKind,
    decode_record,
)
from accel_agent.devices.ledger.validation import (
    validate_instance_id,
    validate_name,
    validate_placement_id,
    validate_uuid,
)


class DeviceStore(IntentStore):
    """Device rows and assignments; over the intents, which reserve rows and
    under which rows are created and removed."""

    # --- reading ------------------------------------------------------------------

    def _select(self, where: str = "", params: Sequence[Any] = ()) -> list[DeviceRecord]:
        sql = RECORD_SELECT + (f" WHERE {where}" if where else "") + RECORD_ORDER
        with self._lock:
            return [decode_record(r) for r in self._rows(sql, params)]

    def get(self, uuid: str) -> DeviceRecord | None:
        rows = self._select("m.uuid = ?", (validate_uuid(uuid),))
        return rows[0] if rows else None

    def _require(self, uuid: str) -> DeviceRecord:
        record = self.get(uuid)
        if record is None:
            raise exception.MdevNotFound(uuid=uuid)
        return record

    def all(self) -> list[DeviceRecord]:
        return self._select()

    def in_state(self, state: DeviceState) -> list[DeviceRecord]:
        return self._select("m.state = ?", (DeviceState(state).value,))

    def unsettled(self) -> list[DeviceRecord]:
        """Rows whose sysfs write may or may not have happened (creating/removing)."""
        return self._select("m.state IN ('creating', 'removing')")

    def assigned(self) -> list[DeviceRecord]:
        return self._select("a.owner IS NOT NULL")

    def by_owner(self, owner: str, owner_kind: OwnerKind | None = None) -> list[DeviceRecord]:
        validate_instance_id(owner)
        if owner_kind is None:
            return self._select("a.owner = ?", (owner,))
        return self._select("a.owner = ? AND a.owner_kind = ?", (owner, OwnerKind(owner_kind)))

    def free_of_type(self, parent: str, device_type: str) -> list[DeviceRecord]:
        """Present, unassigned, unreserved devices of ``device_type`` on ``parent``."""
        return self._select(
            "m.parent = ? AND m.mdev_type = ? AND m.state = 'present' "
            "AND a.uuid IS NULL AND m.intent_id IS NULL",
            (parent, device_type),
        )

    # --- operations (mdev rows) ----------------------------------------------------

    def record_create_intent(
        self,
        uuid: str,
        parent: str,
        device_type: str,
        *,
        intent_id: int | None = None,
        backend: str = "mdev",
        settings: Mapping[str, Any] | None = None,
        placement_id: int | None = None,
    ) -> DeviceRecord:
        """Before the sysfs create write: a ``creating`` row (with the
        device's per-instance ``settings``, when it has any, and a vGPU's
        planned ``placement_id``)."""
        return self._insert(uuid, parent, device_type, DeviceState.CREATING, False, intent_id,
                            action="record a create intent for", backend=backend,
                            settings=settings, placement_id=placement_id)

    def adopt(
        self, uuid: str, parent: str, device_type: str, backend: str = "mdev"
    ) -> DeviceRecord:
        """Take ownership of an existing (foreign) device: it may then be reused or removed."""
        return self._insert(uuid, parent, device_type, DeviceState.PRESENT, True, None,
                            action="adopt", backend=backend)

    def _insert(
        self,
        uuid: str,
        parent: str,
        device_type: str,
        state: DeviceState,
        adopted: bool,
        intent_id: int | None,
        *,
        action: str,
        backend: str = "mdev",
        settings: Mapping[str, Any] | None = None,
        placement_id: int | None = None,
    ) -> DeviceRecord:
        validate_uuid(uuid)
        validate_placement_id(placement_id)
        encoded = None if settings is None else json.dumps(dict(settings), sort_keys=True)
        validate_name("parent", parent)
        validate_name("device type", device_type)
        validate_name("backend", backend)
        with self.transaction():
            existing = self.get(uuid)
            if existing is not None:
                raise exception.LedgerConflict(
                    action=action, uuid=uuid, reason=f"already recorded ({existing.state})"
                )
            self._require_intent(intent_id)
            now = self._clock()
            self._execute(
                "INSERT INTO mdevs (uuid, parent, mdev_type, state, intent_id, adopted, "
                "created_at, updated_at, backend, settings, placement_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (uuid, parent, device_type, state.value, intent_id, int(adopted), now, now,
                 backend, encoded, placement_id),
            )
            return self._require(uuid)

    def _set_state(self, uuid: str, state: DeviceState, **extra: Any) -> None:
        sets = ", ".join(["state = ?", "updated_at = ?", *(f"{k} = ?" for k in extra)])
        self._execute(
            f"UPDATE mdevs SET {sets} WHERE uuid = ?",
            (state.value, self._clock(), *extra.values(), uuid),
        )

    def _move(
        self, uuid: str, expected: DeviceState, new: DeviceState, action: str, **extra: Any
    ) -> DeviceRecord:
        """One state transition, refused (LedgerConflict naming ``action``)
        unless the row is in ``expected``: checked and written in one transaction."""
        with self.transaction():
            record = self._require(uuid)
            if record.state is not expected:
                raise exception.LedgerConflict(
                    action=action, uuid=uuid, reason=f"it is {record.state}"
                )
            self._set_state(uuid, new, **extra)
            return self._require(uuid)

    def settle_created(self, uuid: str) -> DeviceRecord:
        """After the sysfs create succeeded (or recovery found the mdev): ``present``."""
        return self._move(uuid, DeviceState.CREATING, DeviceState.PRESENT,
                          "settle the creation of")

    def reserve(self, uuid: str, intent_id: int) -> DeviceRecord:
        """Hold a free mdev for an operation (allocate reusing it), so no one else takes it."""
        with self.transaction():
            record = self._require(uuid)
            self._require_intent(intent_id)
            if not record.free:
                raise exception.LedgerConflict(
                    action="reserve", uuid=uuid, reason="it is not free"
                )
            self._execute(
                "UPDATE mdevs SET intent_id = ?, updated_at = ? WHERE uuid = ?",
                (intent_id, self._clock(), uuid),
            )
            return self._require(uuid)

    def assign(
        self,
        uuid: str,
        owner: str,
        *,
        owner_kind: OwnerKind = OwnerKind.INSTANCE,
        claim_expires_at: float | None = None,
        intent_id: int | None = None,
        source_uuid: str | None = None,
    ) -> DeviceRecord:
        """Give a present mdev to an instance (or a migration claim, with an expiry).

        ``intent_id``: the operation that reserved it; a row reserved by
        another operation is refused.
        """
        validate_instance_id(owner)
        owner_kind = OwnerKind(owner_kind)
        if source_uuid is not None:
            validate_uuid(source_uuid)
        if (owner_kind is OwnerKind.CLAIM) != (claim_expires_at is not None):
            raise exception.LedgerError(reason="a claim needs an expiry, an instance none")
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                raise exception.MdevAlreadyAssigned(
                    uuid=uuid, owner=record.owner, owner_kind=record.owner_kind
                )
            if record.state is not DeviceState.PRESENT:
                raise exception.LedgerConflict(
                    action="assign", uuid=uuid, reason=f"it is {record.state}"
                )
            if record.intent_id is not None and record.intent_id != intent_id:
                raise exception.LedgerConflict(
                    action="assign", uuid=uuid,
                    reason=f"it is reserved by operation {record.intent_id}",
                )
            now = self._clock()
            # The checks above ran under the write lock, so the PRIMARY KEY
            # and the trigger cannot fire here; they guard everything else.
            self._execute(
                "INSERT INTO assignments (uuid, owner, owner_kind, claim_expires_at, "
                "assigned_at, source_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                (uuid, owner, owner_kind.value, claim_expires_at, now, source_uuid),
            )
            self._execute("UPDATE mdevs SET updated_at = ? WHERE uuid = ?", (now, uuid))
            return self._require(uuid)

    def set_layout(self, uuid: str, member: bool = True) -> DeviceRecord:
        """Mark a device as a standing layout's (or no longer)."""
        with self.transaction():
            self._require(uuid)
            self._execute(
                "UPDATE mdevs SET layout = ?, updated_at = ? WHERE uuid = ?",
                (int(member), self._clock(), uuid),
            )
            return self._require(uuid)

    def set_placement(self, uuid: str, placement_id: int | None) -> DeviceRecord:
        """Record a vGPU's placement (one the agent wrote and read back, or
        one a device in use already has: it is never moved)."""
        validate_placement_id(placement_id)
        with self.transaction():
            self._require(uuid)
            self._execute(
                "UPDATE mdevs SET placement_id = ?, updated_at = ? WHERE uuid = ?",
                (placement_id, self._clock(), uuid),
            )
            return self._require(uuid)

    def release(self, uuid: str) -> DeviceRecord:
        """Drop the mdev's owner, keeping the mdev (free for reuse).  Idempotent."""
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                self._execute("DELETE FROM assignments WHERE uuid = ?", (uuid,))
                self._execute(
                    "UPDATE mdevs SET updated_at = ? WHERE uuid = ?", (self._clock(), uuid)
                )
            return self._require(uuid)

    def release_owner(self, owner: str, owner_kind: OwnerKind | None = None) -> list[DeviceRecord]:
        """Release everything ``owner`` holds; returns the released rows.  An
        instance's attach request goes with its devices."""
        with self.transaction():
            if owner_kind is not OwnerKind.CLAIM:
                self._execute("DELETE FROM attach_requests WHERE owner = ?", (owner,))
            return [self.release(r.uuid) for r in self.by_owner(owner, owner_kind)]

    def record_remove_intent(self, uuid: str, *, intent_id: int | None = None) -> DeviceRecord:
        """Before the sysfs remove write: ``removing``.  The mdev must be released first."""
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                raise exception.LedgerConflict(
                    action="remove", uuid=uuid,
                    reason=f"it is assigned to {record.owner_kind} {record.owner}",
                )
            if record.state is DeviceState.REMOVING:
                return record  # a retried remove: the intent is already there
            self._require_intent(intent_id)
            self._set_state(uuid, DeviceState.REMOVING, intent_id=intent_id)
            return self._require(uuid)

    def cancel_remove(self, uuid: str) -> DeviceRecord:
        """The remove did not happen and will not be retried: back to ``present``."""
        return self._move(uuid, DeviceState.REMOVING, DeviceState.PRESENT,
                          "cancel the removal of", intent_id=None)

    def forget(self, uuid: str) -> bool:
        """Delete the row (after a remove, or a create that did not happen).

        Refused for an assigned mdev.  Returns False when there was no row.
        """
        with self.transaction():
            record = self.get(uuid)
            if record is None:
                return False
            if record.owner is not None:
                raise exception.LedgerConflict(
                    action="forget", uuid=uuid,
                    reason=f"it is assigned to {record.owner_kind} {record.owner}",
                )
            self._execute("DELETE FROM mdevs WHERE uuid = ?", (uuid,))
            return True
