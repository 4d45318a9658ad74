"""Intents: an operation that began and has not finished (docs/design.md §5.2).

``begin_intent`` records it before the operation's first sysfs write; the
rows it reserves or creates point at it (``mdevs.intent_id``) until
``finish_intent`` drops it in the transaction that settles them.  What a
crash leaves here, ``pending_intents`` hands to recovery.
"""

from __future__ import annotations

from accel_agent import exception
from accel_agent.devices.ledger.connection import LedgerConnection
from accel_agent.devices.ledger.records import Intent, IntentKind
from accel_agent.devices.ledger.validation import validate_instance_id


class IntentStore(LedgerConnection):
    """The ``intents`` table."""

    def pending_intents(self) -> list[Intent]:
        """Operations that began and never finished (a crash, or in flight)."""
        with self._lock:
            intents = self._rows(
                "SELECT id, kind, owner, created_at FROM intents ORDER BY id"
            )
            members = self._rows(
                "SELECT intent_id, uuid FROM mdevs WHERE intent_id IS NOT NULL ORDER BY uuid"
            )
        by_intent: dict[int, list[str]] = {}
        for intent_id, uuid in members:
            by_intent.setdefault(intent_id, []).append(uuid)
        return [
            Intent(i, IntentKind(kind), owner, created, tuple(by_intent.get(i, ())))
            for i, kind, owner, created in intents
        ]

    def begin_intent(self, kind: IntentKind, owner: str | None = None) -> int:
        if owner is not None:
            validate_instance_id(owner)
        with self.transaction():
            cur = self._execute(
                "INSERT INTO intents (kind, owner, created_at) VALUES (?, ?, ?)",
                (IntentKind(kind).value, owner, self._clock()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def finish_intent(self, intent_id: int) -> None:
        """Drop the intent; its rows stay, no longer reserved (FK ON DELETE SET NULL)."""
        with self.transaction():
            self._execute("DELETE FROM intents WHERE id = ?", (intent_id,))

    def _require_intent(self, intent_id: int | None) -> None:
        if intent_id is None:
            return
        rows = self._rows("SELECT 1 FROM intents WHERE id = ?", (intent_id,))
        if not rows:
            raise exception.LedgerError(reason=f"no pending intent {intent_id}")
