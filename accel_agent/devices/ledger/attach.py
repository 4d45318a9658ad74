"""Attach requests (docs/design.md §11): what an instance's attach call asked for
and which device answers which request, so a repeated call is recognised
after a restart and gets the same handles.  Written in the transaction that
assigns the devices; ``release_owner`` drops it with them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from accel_agent.devices.ledger.connection import LedgerConnection
from accel_agent.devices.ledger.validation import validate_instance_id


class AttachRequestStore(LedgerConnection):
    """The ``attach_requests`` table."""

    def record_attach_request(self, owner: str, document: Mapping[str, Any]) -> None:
        """What ``owner``'s attach call asked for (see the v4 migration)."""
        validate_instance_id(owner)
        with self.transaction():
            self._execute(
                "INSERT OR REPLACE INTO attach_requests (owner, document, created_at) "
                "VALUES (?, ?, ?)",
                (owner, json.dumps(dict(document), sort_keys=True), self._clock()),
            )

    def attach_request(self, owner: str) -> dict[str, Any] | None:
        with self._lock:
            rows = self._rows("SELECT document FROM attach_requests WHERE owner = ?", (owner,))
        return json.loads(rows[0][0]) if rows else None
