"""Live-migration claims (accel_agent.devices.claims): assignments of owner
kind ``claim``, with an expiry, each remembering the source device it
stands in for; committed into the instance's allocation in one statement."""

from __future__ import annotations

from accel_agent.devices.ledger.devices import DeviceStore
from accel_agent.devices.ledger.records import DeviceRecord, OwnerKind
from accel_agent.devices.ledger.validation import validate_instance_id


class ClaimStore(DeviceStore):
    """The claims among the assignments; over the device rows they assign."""

    def claims(self) -> list[DeviceRecord]:
        return self._select("a.owner_kind = 'claim'")

    def expired_claims(self, now: float | None = None) -> list[DeviceRecord]:
        now = self._clock() if now is None else now
        return self._select("a.owner_kind = 'claim' AND a.claim_expires_at <= ?", (now,))

    def commit_claim(self, owner: str) -> list[DeviceRecord]:
        """A migration claim becomes the instance's allocation (no expiry)."""
        validate_instance_id(owner)
        with self.transaction():
            self._execute(
                "UPDATE assignments SET owner_kind = 'instance', claim_expires_at = NULL "
                "WHERE owner = ? AND owner_kind = 'claim'",
                (owner,),
            )
            return self.by_owner(owner, OwnerKind.INSTANCE)
