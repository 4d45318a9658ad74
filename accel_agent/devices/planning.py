"""Where the devices of a request go: the placement half of allocate, claim
and attach, reading the host and the ledger, changing nothing.

Providers (physical GPUs) in a deterministic order, least used first, then
by name; free owned devices of the wanted type before new ones; one GPU when
one can hold the whole request (guest locality), else spread (unlike Nova
bug 1874664); the first configured type that can hold it.  A free device of
a type the config no longer gives its parent is never handed out as another
type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import requests as requests_mod
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.devices.protocol import PlanItem, Slot

if TYPE_CHECKING:
    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot


def plan(
    m: DeviceManager,
    snapshot: HostSnapshot,
    count: int,
    wanted_parent: str | None,
    wanted_type: str | None,
    wanted_class: str | None = None,
    planned: Counter[str] | None = None,
) -> tuple[str, list[Slot]]:
    """Where ``count`` devices go.  ``planned``: what earlier requests of
    the same call took (reused UUIDs, creates per parent), left alone."""
    planned = planned if planned is not None else Counter()
    inventory = m.inventory(snapshot)
    # By parent and type: a free device of a type the config no longer gives
    # its parent is never handed out as the type asked for.
    free_by_parent: dict[tuple[str, str], list[str]] = {}
    recorded: set[str] = set()
    if wanted_type and m.policy.reported_by_nova(wanted_type):
        raise exception.ReportedByNova(mdev_type=wanted_type)
    for record in m.ledger.all():
        recorded.add(record.uuid)
        if record.uuid in snapshot.mdevs and not planned[record.uuid] and (
            record.free or _standing_and_unused(record)
        ):
            free_by_parent.setdefault((record.parent, record.device_type), []).append(record.uuid)
    candidates = []
    nova_types: set[str] = set()
    for provider in inventory.providers:
        if wanted_type and provider.device_type != wanted_type:
            continue
        if wanted_class and provider.resource_class != wanted_class:
            continue
        if m.policy.reported_by_nova(provider.device_type):
            nova_types.add(provider.device_type)
            continue  # Nova assigns these (ReportedByNova when asked by name)
        members = list(provider.parent_devices)
        if wanted_parent:
            if wanted_parent in members:
                members = [wanted_parent]
            elif wanted_parent != provider.physical_gpu:
                continue
        candidates.append((provider, members))
    if not candidates and nova_types:
        # Every type that would serve the request is Nova's to hand out: say
        # that, not "no capacity for any configured type".
        raise exception.OnlyNovaTypes(
            types=", ".join(sorted(nova_types)),
            asked=f"class {wanted_class}" if wanted_class else "any type",
        )
    if not candidates:
        raise exception.InsufficientCapacity(
            mdev_type=wanted_type
            or (f"any type of class {wanted_class}" if wanted_class else "any configured type"),
            parents=wanted_parent or "any configured parent",
            reason="no configured parent offers it",
        )
    order = [t.mdev_type for t in m.policy.types]
    best_short: tuple[str, int, list[str]] | None = None
    for device_type in sorted({p.device_type for p, _ in candidates}, key=order.index):
        ranked = sorted(
            (c for c in candidates if c[0].device_type == device_type),
            key=lambda c: (c[0].used, c[0].name),
        )
        per_provider = [
            _provider_slots(
                m, snapshot, provider, members, device_type, free_by_parent, recorded, planned
            )
            for provider, members in ranked
        ]
        # One GPU when one can hold it all (guest locality), else spread.
        whole = next((s for s in per_provider if len(s) >= count), None)
        if whole is not None:
            return device_type, whole[:count]
        spread = [slot for slots in per_provider for slot in slots]
        if len(spread) >= count:
            return device_type, spread[:count]
        if best_short is None:
            best_short = (device_type, len(spread), [p.name for p, _ in ranked])
    assert best_short is not None
    device_type, available, providers = best_short
    raise exception.InsufficientCapacity(
        mdev_type=device_type,
        parents=", ".join(
            sorted({name for p, ms in candidates if p.name in providers for name in ms})
        ),
        reason=f"{count} requested, {available} available",
    )


def _provider_slots(
    m: DeviceManager,
    snapshot: HostSnapshot,
    provider: inventory_mod.Provider,
    members: list[str],
    device_type: str,
    free_by_parent: dict[tuple[str, str], list[str]],
    recorded: set[str],
    planned: Counter[str],
) -> list[Slot]:
    slots = [Slot(p, u) for p in members for u in sorted(free_by_parent.get((p, device_type), []))]
    config = m.policy.config_of(device_type)
    if config is not None and config.standing > 0:
        # A standing layout's devices are all this type gets on its GPUs:
        # allocations take them and never add beyond them.
        return slots
    if members and m.policy.gpu_layout_for(snapshot.parents[members[0]]) is not None:
        # So are a mixed-size layout's: a vGPU made here would sit where the
        # driver put it, outside the plan (devices/gpu_layout_converge.py).
        return slots
    return slots + creatable_slots(m, snapshot, provider, planned, members, recorded)


def creatable_slots(
    m: DeviceManager,
    snapshot: HostSnapshot,
    provider: inventory_mod.Provider,
    planned: Counter[str],
    members: list[str] | None = None,
    recorded: set[str] | None = None,
) -> list[Slot]:
    """A new device's slot for each one the provider's GPU has room for, on
    ``members`` (default: all its parents), around what ``planned`` took."""
    device_type = provider.device_type
    members = list(provider.parent_devices) if members is None else members
    if recorded is None:
        recorded = {r.uuid for r in m.ledger.all()}
    slots: list[Slot] = []
    existing = sum(
        len(snapshot.mdevs_on(p, device_type)) + planned[p] for p in provider.parent_devices
    )
    # ``total`` already holds the per-GPU caps (max_instances, VF budget).
    creatable = provider.total - existing
    for parent_name in members:
        parent = snapshot.parents[parent_name]
        offered = parent.types[device_type].available_instances - planned[parent_name]
        backend = m.backend(parent.backend)
        if backend.device_uuid_is_fixed and backend.new_device_uuid(parent) in recorded:
            # Its one device is recorded but missing (a VF untyped behind
            # our back): it waits for recovery, never for a new owner.
            offered = 0
        take = max(0, min(offered, creatable))
        slots += [Slot(parent_name, None)] * take
        creatable -= take
    return slots


def _standing_and_unused(record: DeviceRecord) -> bool:
    """Held by a standing layout and by no instance: taken first.  Only the
    agent's own layouts get here (Nova's types are refused above)."""
    return (
        record.owner_kind is OwnerKind.STANDING
        and record.state is DeviceState.PRESENT
        and record.intent_id is None
    )


def plan_attach(
    m: DeviceManager, snapshot: HostSnapshot, requests: Sequence[requests_mod.AttachRequest]
) -> tuple[list[PlanItem], list[int]]:
    """Every request's slots, each request planned around the ones before
    it; and which request each item answers."""
    items: list[PlanItem] = []
    request_of: list[int] = []
    planned: Counter[str] = Counter()
    # A pool's parents the ledger records, whatever their state, are taken.
    taken = {r.parent for r in m.ledger.all() if m.backend(r.backend).outside_snapshot}
    for index, request in enumerate(requests):
        if isinstance(request, requests_mod.DeviceRequest):
            device_type, slots = plan(
                m, snapshot, request.count, request.parent, request.device_type,
                request.resource_class, planned,
            )
            for slot in slots:
                planned[slot.reuse or slot.parent] += 1
            items += [PlanItem(slot, device_type) for slot in slots]
            request_of += [index] * len(slots)
            continue
        parent = m.backend(request.backend).pick(request.pool, request.where, taken)
        taken.add(parent)
        slot = Slot(parent, None, backend=request.backend, settings=request.settings)
        items.append(PlanItem(slot, request.pool))
        request_of.append(index)
    return items, request_of
