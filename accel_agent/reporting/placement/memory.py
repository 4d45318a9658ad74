"""What the last sync that left Placement exact knew: when a sync may send nothing at all.

A periodic sync that reads the whole subtree to find it unchanged costs
Placement a request or two per host and period: at 10,000 hosts and the
default ``sync_interval`` of 60 s, 167 to 333 requests a second for
nothing.  Nova's resource tracker does not read its provider tree every
period either: it keeps it, writes only what changed, and reads it again
every ``[compute] resource_provider_association_refresh`` (300 s).

So after a sync that left every provider exact and nothing pending
(:func:`~.plan.pending`: no provider waiting on its allocations), the
reporter remembers the inventory it was exact for (:func:`signature`: what
Placement is told, not ``used``), and the next syncs send nothing while the
inventory is the same and ``[placement] refresh_interval`` (jittered, as
every wait of the reporter: :func:`~.health.jittered`) has not passed.  A
change of the inventory, a failure, an operator's forced sync or the
refresh's time ends it: the next sync reads Placement (one GET when nobody
changed the subtree, :mod:`.subtree`).

What this gives up: a change someone else makes to the agent's providers
(an operator's PUT, a Placement database restored from a backup) is seen at
the next refresh, not at the next period; until then the scheduler sees
that change.  Writes carry the generation, so nothing the agent writes is
based on a stale copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_agent.devices.inventory import Inventory


def signature(inventory: Inventory) -> tuple[Any, ...]:
    """What Placement is told of ``inventory`` (``used`` is Nova's business)."""
    return (
        inventory.host,
        tuple(
            sorted(
                (p.name, p.parent_provider, p.resource_class, p.total, tuple(sorted(p.traits)))
                for p in inventory.providers
            )
        ),
    )


@dataclass(frozen=True)
class Verified:
    """Placement was exact for the inventory of ``signature`` when a sync
    ended; nothing to send until ``refresh_at`` unless it changes."""

    signature: tuple[Any, ...]
    refresh_at: float

    def covers(self, inventory: Inventory, now: float) -> bool:
        return now < self.refresh_at and signature(inventory) == self.signature
