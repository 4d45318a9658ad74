"""Apply one planned action to Placement and say what it did.

Every write carries the provider generation the plan was made from, so a
provider someone else changed in between answers 409 (the client raises
:class:`~accel_agent.exception.PlacementGenerationConflict` and the reporter
redrives that provider).  A custom trait or resource class is created just
before the first write that uses it, once per sync, so a steady state sends
none.  Each applied action is logged, one line (a warning when an operator
should know: a drain, capacity below what is allocated, a class kept).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from accel_agent import exception
from accel_agent.reporting.placement import answers
from accel_agent.reporting.placement.client import PlacementClient
from accel_agent.reporting.placement.plan import (
    Action,
    CreateProvider,
    DeleteProvider,
    ProviderState,
    Refuse,
    SetInventory,
    SetTraits,
)


class ActionWriter:
    """Sends actions; remembers, for one sync, the custom names it created."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._log = log
        self._ensured: set[str] = set()

    def start_sync(self) -> None:
        # Per sync: a Placement rebuilt from scratch recovers.
        self._ensured.clear()

    def apply(
        self, client: PlacementClient, action: Action, state: ProviderState | None
    ) -> ProviderState | None:
        """Send one action; return the provider's state after it."""
        if isinstance(action, Refuse):
            raise exception.PlacementError(reason=action.reason)
        if isinstance(action, CreateProvider):
            created = client.post(
                "/resource_providers",
                {
                    "name": action.name,
                    "uuid": action.uuid,
                    "parent_provider_uuid": action.parent_uuid,
                },
                answers.provider,
            )
            new: ProviderState | None = ProviderState(
                created.uuid, created.name, created.generation, created.parent_uuid
            )
        elif isinstance(action, DeleteProvider):
            client.delete(f"/resource_providers/{action.uuid}")
            new = None
        else:
            assert state is not None  # plan_provider creates before it writes
            new = self._write(client, action, state)
        self._log.log(
            logging.WARNING if isinstance(action, SetInventory) and action.warns else logging.INFO,
            "%s",
            action.describe(),
        )
        return new

    def _write(
        self, client: PlacementClient, action: SetTraits | SetInventory, state: ProviderState
    ) -> ProviderState:
        base = f"/resource_providers/{state.uuid}"
        if isinstance(action, SetTraits):
            self._ensure(client, "traits", action.traits)
            traits = client.put(
                f"{base}/traits",
                {"resource_provider_generation": state.generation, "traits": list(action.traits)},
                functools.partial(answers.traits, written=True),
            )
            assert traits.generation is not None  # written=True checked it
            return replace(state, generation=traits.generation, traits=frozenset(traits.names))
        self._ensure(client, "resource_classes", action.inventories)
        inventories = client.put(
            f"{base}/inventories",
            {
                "resource_provider_generation": state.generation,
                "inventories": {rc: dict(r) for rc, r in action.inventories.items()},
            },
            functools.partial(answers.inventories, written=True),
        )
        assert inventories.generation is not None  # written=True checked it
        return replace(state, generation=inventories.generation, inventories=inventories.records)

    def _ensure(self, client: PlacementClient, kind: str, names: Iterable[str]) -> None:
        """Create custom traits / resource classes: ``PUT`` is idempotent (201/204).

        Only called before a write that uses them, so a steady state sends none.
        """
        for name in names:
            key = f"{kind}/{name}"
            if name.startswith("CUSTOM_") and key not in self._ensured:
                client.put_name(f"/{key}")
                self._ensured.add(key)
