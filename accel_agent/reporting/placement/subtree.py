"""What Placement holds under the host's root provider, read with a generation cache.

Generations make a cache safe: Placement bumps a provider's generation on
every change of its inventory or traits and on every allocation written
against it, so when the tree listing shows the generation we last saw, our
copy of inventories and traits is still exact and is not fetched again.
Usages are the exception: ``DELETE /allocations/{consumer}`` frees usage
*without* bumping the generation (verified on Placement 16.0.0), so a copy
of non-zero usage may be too high; usage that was zero cannot grow without a
generation bump.

Usages are read only when asked for (``usages=True``, :meth:`with_usages`):
the reporter asks before it plans a write, and for a provider that waits on
its allocations (:func:`~.plan.pending`); a plan without writes does not
depend on them.  So reading a tree that nobody changed costs one GET (the
listing), whatever its allocations, and each provider someone changed
(an allocation made against it, an operator's write) two more
(inventories, traits).
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

    def carry_from(self, other: SubtreeReader) -> None:
        """``other``'s cache (a reload's new reporter for the same Placement)."""
        self._cache = other._cache

    def tree(
        self, client: PlacementClient, root_uuid: str, root_name: str
    ) -> dict[str, ProviderState] | None:
        """Direct children of the root, by name (ours and anyone else's);
        None when the listing of ``root_uuid``'s tree no longer shows that
        root named ``root_name`` (deleted, replaced or renamed): the caller
        looks the root up by name again."""
        query = urllib.parse.urlencode({"in_tree": root_uuid})
        tree = client.get(f"/resource_providers?{query}", answers.provider_list)
        if not any(rp.uuid == root_uuid and rp.name == root_name for rp in tree):
            return None
        return {
            rp.name: self._state(client, rp, usages=False)
            for rp in tree
            if rp.uuid != root_uuid and rp.parent_uuid == root_uuid
        }

    def with_usages(self, client: PlacementClient, state: ProviderState) -> ProviderState:
        """``state`` with its usages read now."""
        base = f"/resource_providers/{state.uuid}"
        return replace(state, usages=_usages(client, base), usages_fresh=True)

    def refetch(self, client: PlacementClient, uuid: str) -> ProviderState | None:
        """One provider read afresh, usages included (after a conflict); None
        once it is gone."""
        rp = client.get_if_present(f"/resource_providers/{uuid}", answers.provider)
        if rp is None:
            return None
        self._cache.pop(uuid, None)
        return self._state(client, rp, usages=True)

    def _state(
        self, client: PlacementClient, rp: answers.ProviderRef, *, usages: bool
    ) -> ProviderState:
        base = f"/resource_providers/{rp.uuid}"
        cached = self._cache.get(rp.uuid)
        if cached is not None and cached.generation == rp.generation:
            if not cached.in_use:
                return cached  # zero usage cannot grow without a generation bump
            if not usages:
                return replace(cached, usages_fresh=False)
            # Freed allocations do not bump the generation (module docstring).
            return self.with_usages(client, cached)
        # Tagged with the generation read *before* the contents, so the tag is
        # never newer than the data: a later change always shows as a miss.
        inventories = client.get(f"{base}/inventories", answers.inventories)
        traits = client.get(f"{base}/traits", answers.traits)
        state = ProviderState(
            uuid=rp.uuid,
            name=rp.name,
            generation=rp.generation,
            parent_uuid=rp.parent_uuid,
            inventories=inventories.records,
            traits=frozenset(traits.names),
            usages=cached.usages if cached is not None else {},
            usages_fresh=False,
        )
        return self.with_usages(client, state) if usages else state


def _usages(client: PlacementClient, base: str) -> dict[str, int]:
    usages = client.get(f"{base}/usages", answers.usages)
    return {rc: n for rc, n in usages.items() if n}
