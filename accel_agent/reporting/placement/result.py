"""What one sync did: :class:`SyncResult` for the caller, :class:`SyncTally` while it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from accel_agent.reporting.placement.plan import (
    Action,
    CreateProvider,
    DeleteProvider,
    ProviderState,
    SetInventory,
)


@dataclass(frozen=True)
class SyncResult:
    """What one :meth:`PlacementReporter.sync` did.

    ``attempted`` False: nothing was sent (disabled, backing off, or
    ``unchanged``: Placement was exact for this inventory at the last sync and
    it is not time to look again, .memory).  ``ok``: every provider
    converged.  ``failures``: provider name -> why.  ``pending``: providers
    left waiting on their allocations (drained), looked at again at every sync.
    """

    ok: bool
    attempted: bool = True
    error: str | None = None
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    failures: Mapping[str, str] = field(default_factory=dict)
    writes: int = 0
    conflicts: int = 0
    providers: int = 0
    unchanged: bool = False
    pending: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.drained or self.deleted)


@dataclass
class SyncTally:
    """The providers a sync has touched so far, by what happened to them."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    conflicts: int = 0
    present: dict[str, ProviderState] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)

    def note(self, action: Action) -> None:
        name = action.name
        if isinstance(action, CreateProvider):
            self.created.append(name)
        elif isinstance(action, DeleteProvider):
            self.deleted.append(name)
        elif isinstance(action, SetInventory) and action.drain:
            self.drained.append(name)
        elif name not in self.created and name not in self.updated:
            self.updated.append(name)

    def result(self, writes: int) -> SyncResult:
        owned = sum(1 for s in self.present.values() if s.owned)
        return SyncResult(
            ok=not self.failures,
            created=tuple(self.created),
            updated=tuple(self.updated),
            drained=tuple(self.drained),
            deleted=tuple(self.deleted),
            failures=dict(self.failures),
            writes=writes,
            conflicts=self.conflicts,
            providers=owned,
            pending=tuple(self.pending),
        )
