"""Standing layouts: ``[mdev_<type>] standing = N`` (issue 23).

Each physical GPU whose configured type has a standing layout carries N
devices of that type at all times, whether an instance holds them or not:
consumers that pick devices themselves (Nova's PCI passthrough of vGPU VFs,
KubeVirt's device plugins, Nova 34's Cyborg path) find them ready.

The layout's devices are the agent's own.  One that no instance holds is
assigned in the ledger to the owner ``layout`` of kind ``standing``: never
free, so nothing else takes it.  An allocate or attach of the type takes
them first and never adds beyond them (planning.py); a release gives them
back to the layout, even with ``--remove`` (allocations.py).

:func:`converge`, under the operation's lock, per GPU of a standing type:

1. the free devices of the type there join the layout, while it has fewer
   than N (a crash between a take and an assign leaves one free: it comes
   back here);
2. still short: devices are made, as many as the GPU has room for; free
   devices of another type there go first, to make that room (a GPU moved
   to another type, one device at a time); what cannot fit is reported;
3. more than N (a lower N): the layout's extras are removed, those an
   instance holds *drain*: they go when released.

And everywhere: a device the layout holds that its GPU's configuration no
longer wants (another type, ``standing = 0``) is removed.  A removal never
touches a device in use: the privileged write probes its VFIO group first
(privileged/inuse.py) and refuses; such a device stays the layout's and is
listed as draining until a later converge (each rescan, reload and release)
finds it free.

The start-up runs it after recovery and before READY, so a consumer ordered
after the agent never sees a GPU without its layout (a reboot or a driver
reload resets every VF's type: recovery re-creates the recorded ones, this
fills the rest).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import planning, protocol
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind

if TYPE_CHECKING:
    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)

# The ledger owner of a standing layout's devices that no instance holds.
LAYOUT_OWNER = "layout"


@dataclass
class LayoutReport:
    """What one converge did and what is left to do."""

    adopted: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # Devices the layout no longer wants that are still in use (or held by
    # an instance): removed once free.
    draining: list[str] = field(default_factory=list)
    # GPU -> (type, wanted, have) where the layout is not complete.
    short: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    # GPU -> why its converge failed (the others went on: one wedged GPU
    # must not keep every GPU after it without its layout).
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        return not self.draining and not self.short and not self.failed

    def summary(self) -> str:
        parts = [
            f"{len(items)} {what}"
            for what, items in (
                ("made", self.created), ("taken back", self.adopted),
                ("removed", self.removed), ("draining", self.draining),
            )
            if items
        ]
        parts += [
            f"{gpu} has {have} of {wanted} {mdev_type}"
            for gpu, (mdev_type, wanted, have) in sorted(self.short.items())
        ]
        parts += [f"{gpu} failed: {why}" for gpu, why in sorted(self.failed.items())]
        return ", ".join(parts) or "in place"


def has_layouts(m: DeviceManager) -> bool:
    """Any standing layout configured, or any device a former one holds."""
    return any(t.standing > 0 for t in m.policy.types) or bool(
        m.ledger.by_owner(LAYOUT_OWNER, OwnerKind.STANDING)
    )


def converge(m: DeviceManager) -> LayoutReport:
    """Bring every GPU to its standing layout (module docstring)."""
    report = LayoutReport()
    if not has_layouts(m):
        return report
    with protocol.operation(m):
        snapshot = m.scan()
        providers, wanted_on = _wanted(m, snapshot)
        dropped = _drop_unwanted(m, snapshot, wanted_on, report)
        if _clear_the_way(m, snapshot, providers, report) or dropped:
            # What went makes room: a GPU that offered nothing of its type
            # while they stood may offer it now.
            snapshot = m.scan()
            providers, _ = _wanted(m, snapshot)
        # One snapshot for every GPU: a GPU's converge writes only its own
        # VFs and mdevs, so the others' part of it stays true (a scan reads
        # every VF's type, the most of a start's time with 64 VFs).
        for provider in providers:
            config = m.policy.config_of(provider.mdev_type)
            if config is None or config.standing <= 0:
                continue
            failure: exception.AccelAgentException | None = None
            try:
                _converge_gpu(m, snapshot, provider, config.standing, report)
            except exception.PrivilegedHelperUnavailable:
                raise  # every GPU would fail alike: recovery settles what is left
            except exception.AccelAgentException as exc:
                failure = exc
            if failure is not None:  # outside the except clause: said once
                LOG.warning("standing layout: GPU %s: %s", provider.physical_gpu,
                            failure.message)
                report.failed[provider.physical_gpu] = failure.message
    if report.created or report.removed or report.adopted:
        LOG.info("standing layout: %s", report.summary())
    elif not report.converged:
        LOG.debug("standing layout: %s", report.summary())
    return report


def _wanted(
    m: DeviceManager, snapshot: HostSnapshot
) -> tuple[tuple[inventory_mod.Provider, ...], dict[str, tuple[str, int]]]:
    """The providers, and parent -> (type, N) of those a layout wants."""
    providers = m.inventory(snapshot).providers
    wanted_on: dict[str, tuple[str, int]] = {}
    for provider in providers:
        config = m.policy.config_of(provider.mdev_type)
        if config is not None and config.standing > 0:
            for parent in provider.parent_devices:
                wanted_on[parent] = (provider.mdev_type, config.standing)
    return providers, wanted_on


def _clear_the_way(
    m: DeviceManager,
    snapshot: HostSnapshot,
    providers: tuple[inventory_mod.Provider, ...],
    report: LayoutReport,
) -> bool:
    """Free devices of another type on a GPU whose standing type it offers
    nothing of while they stand: removed, so its layout can be made.

    A vGPU 17+ GPU takes one vGPU size at a time (once a VF is typed, its
    siblings offer only that size), so a GPU moved to another type has no
    provider for the new one until the last device of the old one is gone:
    :func:`_converge_gpu`, which clears a GPU's way as far as it needs room,
    never sees it.  True when one was removed."""
    served = {p.physical_gpu for p in providers}
    removed = False
    for record in _present(m, snapshot):
        parent = snapshot.parents.get(record.parent)
        if not record.free or parent is None or parent.physical_gpu in served:
            continue
        wanted = m.policy.standing_for(parent)
        if wanted is None or wanted[0] == record.mdev_type:
            continue
        if protocol.remove_owned(m, record.uuid):
            report.removed.append(record.uuid)
            removed = True
    return removed


def _present(m: DeviceManager, snapshot: HostSnapshot) -> list[DeviceRecord]:
    return [
        r for r in m.ledger.all()
        if r.state is DeviceState.PRESENT and r.uuid in snapshot.mdevs
    ]


def _drop_unwanted(
    m: DeviceManager,
    snapshot: HostSnapshot,
    wanted_on: dict[str, tuple[str, int]],
    report: LayoutReport,
) -> bool:
    """The layout's devices whose GPU no longer wants their type: removed
    unless in use (then draining, still the layout's).  True when one was
    removed (the snapshot is stale)."""
    removed = False
    for record in m.ledger.by_owner(LAYOUT_OWNER, OwnerKind.STANDING):
        wanted = wanted_on.get(record.parent)
        if wanted is not None and wanted[0] == record.mdev_type:
            continue
        if record.state is not DeviceState.PRESENT or record.intent_id is not None:
            continue  # an operation is on it: recovery settles it first
        removed |= _remove_from_layout(m, record, report)
    return removed


def _remove_from_layout(m: DeviceManager, record: DeviceRecord, report: LayoutReport) -> bool:
    with m.ledger.transaction():
        m.ledger.release(record.uuid)
    protocol.step(m, "layout.released")
    try:
        gone = protocol.remove_owned(m, record.uuid)
    except exception.AccelAgentException:
        gone = False
        LOG.warning("standing layout: cannot remove %s now; retried at the next converge",
                    record.uuid, exc_info=True)
    if gone:
        report.removed.append(record.uuid)
        return True
    # In use (a VM holds it): the layout keeps it until it is free.
    with m.ledger.transaction():
        current = m.ledger.get(record.uuid)
        if current is not None and current.free:
            m.ledger.assign(record.uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
    report.draining.append(record.uuid)
    return False


def _converge_gpu(
    m: DeviceManager,
    snapshot: HostSnapshot,
    provider: inventory_mod.Provider,
    standing: int,
    report: LayoutReport,
) -> None:
    mdev_type = provider.mdev_type
    parents = set(provider.parent_devices)
    removed_before = len(report.removed)
    records = [r for r in _present(m, snapshot) if r.parent in parents]
    of_type = [r for r in records if r.mdev_type == mdev_type]
    held = [r for r in of_type if r.assigned]
    free = [r for r in of_type if r.free]
    # 1. free devices of the type join the layout; extras beyond N go.
    joining = free[: max(0, standing - len(held))]
    if joining:
        with m.ledger.transaction():
            for record in joining:
                m.ledger.assign(record.uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
                m.ledger.set_layout(record.uuid)
        report.adopted += [r.uuid for r in joining]
    for record in free[len(joining):]:
        if protocol.remove_owned(m, record.uuid):
            report.removed.append(record.uuid)
    have = len(held) + len(joining)
    # 3. more than N: the layout's own extras go; an instance's drain.
    if have > standing:
        extra = have - standing
        layouts = [r for r in held if r.owner_kind is OwnerKind.STANDING]
        kept: list[str] = []
        for record in layouts:
            if extra == 0:
                break
            # One a VM holds stays (the write refuses it): the next one goes
            # instead, so the GPU keeps N and no more whenever it can.
            if _remove_from_layout(m, record, report):
                extra -= 1
            else:
                kept.append(record.uuid)
        report.draining = [u for u in report.draining if u not in kept]
        if extra:
            report.draining += kept[:extra]
            instances = [r.uuid for r in held if r.owner_kind is not OwnerKind.STANDING]
            report.draining += instances[: max(0, extra - len(kept))]
        return
    if have == standing:
        return
    # 2. short: make room (free devices of other types here), then make.
    in_the_way = [r for r in records if r.free and r.mdev_type != mdev_type]
    report.removed += [r.uuid for r in in_the_way if protocol.remove_owned(m, r.uuid)]
    if len(report.removed) > removed_before:
        snapshot = m.scan()  # what went makes room: the slots come from a new scan
    made = _make(m, snapshot, provider, standing - have)
    report.created += made
    if have + len(made) < standing:
        report.short[provider.physical_gpu] = (mdev_type, standing, have + len(made))


def _make(
    m: DeviceManager, snapshot: HostSnapshot, provider: inventory_mod.Provider, count: int
) -> list[str]:
    """Up to ``count`` new devices of the provider's type on its GPU, owned
    by the layout: as many as it has room for, all made or none per try."""
    fresh = next(
        (p for p in m.inventory(snapshot).providers if p.name == provider.name), None
    )
    if fresh is None:
        return []
    slots = planning.creatable_slots(m, snapshot, fresh, Counter())[:count]
    if not slots:
        return []
    return protocol.make_and_assign(
        m, snapshot, LAYOUT_OWNER,
        [(slot, fresh.mdev_type, None) for slot in slots],
        owner_kind=OwnerKind.STANDING,
        on_settle=lambda made: [m.ledger.set_layout(uuid) for uuid in made],
    )


def split_release(
    m: DeviceManager, records: list[DeviceRecord]
) -> tuple[list[str], list[str]]:
    """Of devices an owner releases: (those the standing layout takes back,
    those beyond its N, to remove).  Devices of no standing layout are in
    neither.  Counted per GPU: the layout takes back while the GPU has
    fewer than N devices of the type besides those it took."""
    if not any(t.standing > 0 for t in m.policy.types) and not any(r.layout for r in records):
        return [], []
    snapshot = m.scan()
    releasing = {r.uuid for r in records}
    present = _present(m, snapshot)
    back: list[str] = []
    surplus: list[str] = []
    kept_on: Counter[tuple[str, str]] = Counter()
    for record in records:
        parent = snapshot.parents.get(record.parent)
        found = m.policy.standing_for(parent) if parent is not None else None
        if parent is None or found is None or found[0] != record.mdev_type:
            if record.layout:
                surplus.append(record.uuid)  # a layout's device it no longer wants
            continue
        gpu = parent.physical_gpu
        staying = sum(
            1 for r in present
            if r.uuid not in releasing and r.mdev_type == record.mdev_type
            and (p := snapshot.parents.get(r.parent)) is not None and p.physical_gpu == gpu
        )
        if staying + kept_on[(gpu, record.mdev_type)] < found[1]:
            kept_on[(gpu, record.mdev_type)] += 1
            back.append(record.uuid)
        else:
            surplus.append(record.uuid)
    return back, surplus


def take_back(m: DeviceManager, uuids: list[str]) -> None:
    """Released devices the layout keeps (or that a VM kept from removal):
    the layout's again, in one commit."""
    if not uuids:
        return
    with m.ledger.transaction():
        for uuid in uuids:
            record = m.ledger.get(uuid)
            if record is not None and record.free:
                m.ledger.assign(uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
                m.ledger.set_layout(uuid)
    LOG.info("standing layout: %d released device(s) back in the layout: %s",
             len(uuids), ", ".join(uuids))


def standing_of(m: DeviceManager, snapshot: HostSnapshot, record: DeviceRecord) -> bool:
    """A device of its GPU's standing layout (held by the layout or an instance)."""
    parent = snapshot.parents.get(record.parent)
    found = m.policy.standing_for(parent) if parent is not None else None
    return found is not None and found[0] == record.mdev_type
