"""What Placement holds under the host's root provider, read with a generation cache.

Generations make a cache safe: Placement bumps a provider's generation on
every change of its inventory or traits and on every allocation written
against it, so when the tree listing shows the generation we last saw, our
copy of inventories and traits is still exact and is not fetched again.
Usages are the exception: ``DELETE /allocations/{consumer}`` frees usage
*without* bumping the generation (verified on Placement 16.0.0), so usage
that was non-zero is always read again; usage that was zero cannot grow
without a generation bump.  A steady state so costs two GETs (the root, the
tree) plus one per provider holding allocations.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import replace

from accel_agent.reporting.placement import answers
from accel_agent.reporting.placement.client import PlacementClient
from accel_agent.reporting.placement.plan import ProviderState


class SubtreeReader:
    """Reads the root's children as :class:`ProviderState`; keeps the last
    sync's states, by UUID, to skip what has not changed since."""

    def __init__(self) -> None:
        self._cache: dict[str, ProviderState] = {}

    def remember(self, states: Iterable[ProviderState]) -> None:
        """The providers as a sync left them: the next sync's cache."""
        self._cache = {s.uuid: s for s in states}

    def children(self, client: PlacementClient, root_uuid: str) -> dict[str, ProviderState]:
        """Direct children of the root, by name (ours and anyone else's)."""
        query = urllib.parse.urlencode({"in_tree": root_uuid})
        tree = client.get(f"/resource_providers?{query}", answers.provider_list)
        children = {}
        for rp in tree:
            if rp.uuid != root_uuid and rp.parent_uuid == root_uuid:
                children[rp.name] = self._state(client, rp)
        return children

    def refetch(self, client: PlacementClient, uuid: str) -> ProviderState | None:
        """One provider read afresh (after a conflict); None once it is gone."""
        rp = client.get_if_present(f"/resource_providers/{uuid}", answers.provider)
        if rp is None:
            return None
        self._cache.pop(uuid, None)
        return self._state(client, rp)

    def _state(self, client: PlacementClient, rp: answers.ProviderRef) -> ProviderState:
        base = f"/resource_providers/{rp.uuid}"
        cached = self._cache.get(rp.uuid)
        if cached is not None and cached.generation == rp.generation:
            if not cached.in_use:
                return cached
            # Freed allocations do not bump the generation (module docstring).
            return replace(cached, usages=_usages(client, base))
        # Tagged with the generation read *before* the contents, so the tag is
        # never newer than the data: a later change always shows as a miss.
        inventories = client.get(f"{base}/inventories", answers.inventories)
        traits = client.get(f"{base}/traits", answers.traits)
        return ProviderState(
            uuid=rp.uuid,
            name=rp.name,
            generation=rp.generation,
            parent_uuid=rp.parent_uuid,
            inventories=inventories.records,
            traits=frozenset(traits.names),
            usages=_usages(client, base),
        )


def _usages(client: PlacementClient, base: str) -> dict[str, int]:
    usages = client.get(f"{base}/usages", answers.usages)
    return {rc: n for rc, n in usages.items() if n}
