"""The plan of changes: what the agent wants vs what Placement holds -> the writes, in order.

Pure: no HTTP, no clock, no log; the reporter reads :class:`ProviderState`
from Placement, asks :func:`plan_provider` what to send and sends it.  The
rules it keeps (docs/design.md §5.1):

* never touch a provider the agent did not create: ours carry
  ``CUSTOM_OWNER_ACCEL_AGENT``, or the deterministic UUID the agent gives
  every provider (uuid5 of its name, which also makes restarts idempotent);
  with ``take_over``, one of the name the agent wants becomes the agent's;
* never write ``total: 0`` (Placement rejects it): no capacity means no
  provider;
* never delete a provider, nor drop a resource class, that holds
  allocations: drain it (``reserved = total``) and delete it once freed;
* traits before inventory, so that capacity never appears on a provider the
  scheduler cannot yet filter by type or owner.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accel_agent.devices.inventory import OWNER_TRAIT, Provider
from accel_agent.reporting.placement.answers import INVENTORY_FIELDS

# Fixed forever: provider UUIDs are uuid5(PROVIDER_NAMESPACE, name).
PROVIDER_NAMESPACE = uuidlib.UUID("6b0d1c1e-3f5a-5d8e-9c47-acce1a9e0001")


def provider_uuid(name: str) -> str:
    """The deterministic UUID of the provider called ``name``."""
    return str(uuidlib.uuid5(PROVIDER_NAMESPACE, name))


# --- what Placement holds -------------------------------------------------------------


@dataclass(frozen=True)
class ProviderState:
    """One provider as Placement holds it (at ``generation``)."""

    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    inventories: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    usages: Mapping[str, int] = field(default_factory=dict)
    # False: ``usages`` is as last read, maybe higher than Placement's now
    # (a freed allocation does not bump the generation: .subtree).  The
    # reporter reads them again before it plans a write or while the provider
    # waits on its allocations (:func:`pending`); a plan without writes does
    # not depend on them otherwise.
    usages_fresh: bool = True

    @property
    def owned(self) -> bool:
        # The UUID test covers a provider created just before a crash, before
        # its traits (and so the owner trait) were written.
        return OWNER_TRAIT in self.traits or self.uuid == provider_uuid(self.name)

    @property
    def in_use(self) -> int:
        return sum(self.usages.values())


# --- the actions ----------------------------------------------------------------------


@dataclass(frozen=True)
class CreateProvider:
    name: str
    uuid: str
    parent_uuid: str

    def describe(self) -> str:
        return f"created provider {self.name} ({self.uuid})"


@dataclass(frozen=True)
class SetTraits:
    name: str
    uuid: str
    traits: tuple[str, ...]
    previous: frozenset[str]

    def describe(self) -> str:
        if not self.previous:
            return f"set traits of {self.name}: {', '.join(self.traits)}"
        added = sorted(set(self.traits) - self.previous)
        removed = sorted(self.previous - set(self.traits))
        parts = [f"+{t}" for t in added] + [f"-{t}" for t in removed]
        return f"updated traits of {self.name}: {' '.join(parts)}"


@dataclass(frozen=True)
class SetInventory:
    name: str
    uuid: str
    inventories: Mapping[str, Mapping[str, Any]]
    previous: Mapping[str, Mapping[str, Any]]
    in_use: int = 0
    # True: the provider left the inventory but holds allocations.
    drain: bool = False
    # Something an operator should know (over capacity, a class kept for
    # its allocations); logged as a warning.
    note: str | None = None

    def describe(self) -> str:
        if self.drain:
            return (
                f"drained {self.name}: {self.in_use} allocated, reserved = total until "
                "the allocations are gone, then it is deleted"
            )
        verb = "updated" if self.previous else "set"
        change = describe_inventory_change(self.previous, self.inventories)
        text = f"{verb} inventory of {self.name}: {change}"
        return f"{text} ({self.note})" if self.note else text

    @property
    def warns(self) -> bool:
        return self.drain or self.note is not None


@dataclass(frozen=True)
class DeleteProvider:
    name: str
    uuid: str

    def describe(self) -> str:
        return f"deleted provider {self.name} ({self.uuid})"


@dataclass(frozen=True)
class Refuse:
    """A provider the agent wants but must not write: reported as a failure."""

    name: str
    reason: str

    def describe(self) -> str:
        return self.reason


Action = CreateProvider | SetTraits | SetInventory | DeleteProvider | Refuse


# --- inventories ----------------------------------------------------------------------


def _normal(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(
        float(record.get(f, 0)) if f == "allocation_ratio" else int(record.get(f, 0))
        for f in INVENTORY_FIELDS
    )


def same_inventories(
    a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]
) -> bool:
    return a.keys() == b.keys() and all(_normal(a[rc]) == _normal(b[rc]) for rc in a)


def _drained(record: Mapping[str, Any]) -> dict[str, Any]:
    return {**record, "reserved": record["total"]}


def describe_inventory_change(
    old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
) -> str:
    """``VGPU total 16 -> 8, max_unit 16 -> 8``; new and removed classes named."""
    parts = []
    for rc in sorted(old.keys() | new.keys()):
        if rc not in old:
            parts.append(f"{rc} total {new[rc]['total']}" + (" (new class)" if old else ""))
        elif rc not in new:
            parts.append(f"{rc} removed")
        else:
            changes = [
                f"{f} {old[rc].get(f)} -> {new[rc][f]}"
                for f in INVENTORY_FIELDS
                if _normal({f: old[rc].get(f, 0)}) != _normal({f: new[rc][f]})
            ]
            if changes:
                parts.append(f"{rc} {', '.join(changes)}")
    return "; ".join(parts)


def desired_inventories(desired: Provider, actual: ProviderState | None) -> dict[str, Any]:
    """``{resource_class: record}`` to PUT for ``desired``.

    A class the provider used to have (the configured class changed, e.g.
    VGPU -> CUSTOM_X) is dropped, unless it still holds allocations: a
    full-replace PUT without it would fail with placement.inventory.inuse, so
    it stays, drained, until those allocations are released.
    """
    inventories: dict[str, Any] = {desired.resource_class: desired.inventory_record()}
    if actual is not None:
        for rc, record in actual.inventories.items():
            if rc not in inventories and actual.usages.get(rc, 0) > 0:
                inventories[rc] = _drained(record)
    return inventories


# --- the plan -------------------------------------------------------------------------


def plan_provider(
    name: str,
    desired: Provider | None,
    actual: ProviderState | None,
    root_uuid: str,
    take_over: bool = False,
) -> list[Action]:
    """The writes that make Placement's ``actual`` match ``desired``, in order.

    ``desired`` None: the provider should not exist (GPU gone or unconfigured).
    ``actual`` None: Placement has no provider of that name under the root.
    ``take_over`` (``[placement] take_over_providers``): a provider of the name
    the agent wants that someone else created (Nova, on a host taken over with
    ``accelctl adopt --from-libvirt``) becomes the agent's: its UUID is kept, so
    the allocations against it stay valid, and it gets the owner trait.
    """
    if desired is not None and desired.total <= 0:
        desired = None  # Placement rejects total 0: no capacity, no provider.
    if actual is not None and not actual.owned:
        if desired is None:
            return []  # someone else's provider (Nova's, an operator's)
        if take_over:
            return _plan_present(desired, actual, root_uuid)
        return [
            Refuse(
                name,
                f"provider {name} ({actual.uuid}) exists but was not created by accel-agent "
                f"(no {OWNER_TRAIT} trait); not touching it",
            )
        ]
    if desired is None:
        return [] if actual is None else _plan_removal(actual)
    return _plan_present(desired, actual, root_uuid)


def _plan_present(desired: Provider, actual: ProviderState | None, root_uuid: str) -> list[Action]:
    actions: list[Action] = []
    if actual is None:
        new_uuid = provider_uuid(desired.name)
        actions.append(CreateProvider(desired.name, new_uuid, root_uuid))
        actual = ProviderState(new_uuid, desired.name, 0, root_uuid)
    # Traits before inventory, so that capacity never appears on a provider
    # the scheduler cannot yet filter by type or owner.
    traits = tuple(sorted({*desired.traits, OWNER_TRAIT}))
    if frozenset(traits) != actual.traits:
        actions.append(SetTraits(desired.name, actual.uuid, traits, actual.traits))
    inventories = desired_inventories(desired, actual)
    if not same_inventories(inventories, actual.inventories):
        actions.append(
            SetInventory(
                desired.name,
                actual.uuid,
                inventories,
                actual.inventories,
                in_use=actual.in_use,
                note=_inventory_note(desired, actual, inventories),
            )
        )
    return actions


def _inventory_note(
    desired: Provider, actual: ProviderState, inventories: Mapping[str, Any]
) -> str | None:
    notes = []
    allocated = actual.usages.get(desired.resource_class, 0)
    if allocated > desired.total:
        # Placement accepts it and only warns; the scheduler places nothing more.
        notes.append(f"total below the {allocated} allocated: over capacity until released")
    notes += [
        f"{rc} kept, drained, while {actual.usages[rc]} allocated"
        for rc in sorted(inventories)
        if rc != desired.resource_class
    ]
    return "; ".join(notes) or None


def _plan_removal(actual: ProviderState) -> list[Action]:
    if actual.in_use == 0:
        return [DeleteProvider(actual.name, actual.uuid)]
    drained = {rc: _drained(record) for rc, record in actual.inventories.items()}
    if same_inventories(drained, actual.inventories):
        return []  # already drained; waiting for the allocations to go
    return [
        SetInventory(
            actual.name, actual.uuid, drained, actual.inventories, in_use=actual.in_use, drain=True
        )
    ]


def pending(desired: Provider | None, actual: ProviderState | None) -> bool:
    """True while ``actual``, one of ours, waits on its allocations: a provider
    to delete (drained until they are freed) or a resource class the agent no
    longer wants, kept drained while allocated.  Such a provider is looked at
    again at every sync, with its usages read afresh, until it is done."""
    if actual is None or not actual.owned:
        return False
    if desired is None or desired.total <= 0:
        return True
    return bool(set(actual.inventories) - {desired.resource_class})


def plan(
    desired: Iterable[Provider],
    actual: Mapping[str, ProviderState],
    root_uuid: str,
    take_over: bool = False,
) -> list[Action]:
    """Every action for the whole subtree, provider by provider in name order."""
    wanted = {p.name: p for p in desired}
    actions: list[Action] = []
    for name in sorted(wanted.keys() | actual.keys()):
        actions += plan_provider(
            name, wanted.get(name), actual.get(name), root_uuid, take_over=take_over
        )
    return actions
