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
3. more than N (a lower N): the devices :func:`draining_of` names drain:
   those the layout holds are removed, those an instance holds go when
   released.

And everywhere: a device the layout holds that its GPU's configuration no
longer wants (another type, ``standing = 0``) is removed.  A removal never
touches a device in use: the privileged write probes its VFIO group first
(privileged/inuse.py) and refuses; such a device stays the layout's and is
listed as draining until a later converge (each rescan, reload and release)
finds it free.

**Draining** has one definition, :func:`draining_of`, which the listings
(``draining``), health (``layout.draining``, the gauge), the converge (what
it removes) and a release (what goes back to the layout, what is removed)
all use: a device named draining stays named until it is free, then it is
removed, and no other device of the layout is.  Whatever is short of a
layout (no room, devices of another type in the way, the GPU missing) is
:func:`state_of`'s too, for health and the metrics.

The start-up runs it after recovery and before READY, so a consumer ordered
after the agent never sees a GPU without its layout (a reboot or a driver
reload resets every VF's type: recovery re-creates the recorded ones, this
fills the rest).

This module decides; what it changes runs in the operation protocol: the
joins, take-backs and removals (protocol/standing.py), the new devices (an
Operation of the owner ``protocol.LAYOUT``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import (
    gpu_layout_converge,
    gpu_layout_state,
    layout_members,
    planning,
    protocol,
)
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind

if TYPE_CHECKING:
    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.sysfs.model import HostSnapshot, Parent

LOG = logging.getLogger(__name__)

# The ledger owner of a standing layout's devices that no instance holds.
LAYOUT_OWNER = protocol.LAYOUT_OWNER


# Why a GPU is short of its layout (Short.reason).
NO_ROOM = "no room"  # the GPU offers no more of the type
BLOCKED = "blocked"  # devices of another type on it stand in the way


@dataclass(frozen=True, slots=True)
class Short:
    """A GPU with fewer devices than its layout's N."""

    device_type: str
    standing: int
    present: int
    reason: str  # NO_ROOM or BLOCKED
    # BLOCKED: the devices of another type on the GPU (draining, foreign, ...).
    blocked_by: tuple[str, ...] = ()

    def text(self, gpu: str) -> str:
        said = f"{gpu} has {self.present} of {self.standing} {self.device_type}"
        if self.reason == BLOCKED:
            return (f"{said} (blocked by {len(self.blocked_by)} device(s) of another type: "
                    f"{', '.join(self.blocked_by)})")
        return f"{said} ({self.reason})"


@dataclass(frozen=True)
class LayoutState:
    """The standing layouts on the host now (:func:`state_of`)."""

    draining: frozenset[str] = frozenset()
    # GPU -> what it lacks, for the GPUs on the host short of their layout.
    short: Mapping[str, Short] = field(default_factory=dict)
    # Configured GPUs of a standing type that are not on the host (their
    # VFs not enabled, or no such card).
    missing: tuple[str, ...] = ()


@dataclass
class LayoutReport:
    """What one converge did and what is left to do (the layouts' state
    after it: :func:`state_of`)."""

    adopted: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # Devices the layout no longer wants that are still in use (or held by
    # an instance): removed once free.
    draining: list[str] = field(default_factory=list)
    # GPU -> what it lacks, where the layout is not complete.
    short: dict[str, Short] = field(default_factory=dict)
    # Configured GPUs not on the host.
    missing: tuple[str, ...] = ()
    # GPU -> why its converge failed (the others went on: one wedged GPU
    # must not keep every GPU after it without its layout).
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        return not self.draining and not self.short and not self.failed and not self.missing

    def summary(self) -> str:
        parts = [
            f"{len(items)} {what}"
            for what, items in (
                ("made", self.created), ("taken back", self.adopted),
                ("removed", self.removed), ("draining", self.draining),
            )
            if items
        ]
        parts += [short.text(gpu) for gpu, short in sorted(self.short.items())]
        parts += [f"{gpu} missing" for gpu in self.missing]
        parts += [f"{gpu} failed: {why}" for gpu, why in sorted(self.failed.items())]
        return ", ".join(parts) or "in place"


# --- the one definition of draining, and what a layout lacks ------------------------------


def holders_of(records: Iterable[DeviceRecord]) -> tuple[dict[str, str | None], frozenset[str]]:
    """:func:`draining_of`'s inputs from ledger records: uuid -> the instance
    or claim holding it (None: the layout, or nobody), of the settled
    devices; and the layout's members (``DeviceRecord.in_layout``)."""
    records = list(records)
    holders = {
        r.uuid: None if r.owner_kind is OwnerKind.STANDING else r.owner
        for r in records if r.state is DeviceState.PRESENT
    }
    return holders, frozenset(r.uuid for r in records if r.in_layout)


def draining_of(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    holders: Mapping[str, str | None],
    members: Set[str],
) -> frozenset[str]:
    """The devices the layouts (standing, mixed-size, MIG-backed) no longer
    want, removed once free: devices/layout_members.py's one rule.
    ``holders``/``members``: :func:`holders_of` the ledger."""
    return layout_members.draining(snapshot, policy, holders, members)


def missing_gpus(snapshot: HostSnapshot, policy: DevicePolicy) -> tuple[str, ...]:
    """The configured addresses of standing types that are neither an mdev
    parent nor the PF of one (their VFs are not there)."""
    present = set(snapshot.parents)
    present |= {p.pci_address for p in snapshot.parents.values() if p.pci_address}
    present |= {p.physfn for p in snapshot.parents.values() if p.physfn}
    return tuple(
        address
        for config in policy.types
        if config.standing > 0
        for address in config.device_addresses
        if address not in present
    ) + gpu_layout_state.missing_gpus(snapshot, policy)


def state_of(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    holders: Mapping[str, str | None],
    members: Set[str],
    made: Mapping[str, tuple[str, str]] | None = None,
    gone: Set[str] = frozenset(),
    reasons: Mapping[str, str] | None = None,
) -> LayoutState:
    """The layouts now: what drains (:func:`draining_of`), which GPUs on the
    host are short of their N and why, which configured GPUs are missing.
    ``made`` and ``gone``: the devices made and removed since ``snapshot``
    was read (the converge says what it did rather than scan again).
    ``reasons``: GPU -> why its mixed-size layout is not in place, as the
    last converge found it (DeviceManager.mixed_reasons)."""
    groups, unwanted = layout_members.groups(snapshot, policy, holders, members, made)
    wanted: dict[str, tuple[str, int]] = {}
    for parent in snapshot.parents.values():
        found = policy.standing_for(parent)
        if found is not None:
            wanted.setdefault(parent.physical_gpu, found)
    short: dict[str, Short] = {}
    for gpu, (device_type, standing) in sorted(wanted.items()):
        kept = groups.get((gpu, device_type))
        present = kept.present if kept is not None else 0
        if present >= standing:
            continue
        others = tuple(sorted(
            m.uuid for m in snapshot.mdevs.values()
            if m.mdev_type != device_type and m.uuid not in gone
            and (p := snapshot.parents.get(m.parent)) is not None and p.physical_gpu == gpu
        ))
        short[gpu] = Short(device_type, standing, present, BLOCKED if others else NO_ROOM, others)
    for gpu, mixed in gpu_layout_state.short(snapshot, policy, holders, members, reasons or {},
                                             made, gone).items():
        short[gpu] = Short(mixed.layout, mixed.wanted, mixed.present, mixed.reason)
    return LayoutState(
        draining=layout_members.drained(groups, unwanted),
        short=short,
        missing=missing_gpus(snapshot, policy),
    )


def state_of_records(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    records: Iterable[DeviceRecord],
    made: Iterable[str] = (),
    gone: Set[str] = frozenset(),
    reasons: Mapping[str, str] | None = None,
) -> LayoutState:
    """:func:`state_of` from ledger records (``made``: UUIDs of devices made
    since ``snapshot``, located by their records)."""
    records = list(records)
    made = set(made)
    located = {r.uuid: (r.parent, r.device_type) for r in records if r.uuid in made}
    return state_of(snapshot, policy, *holders_of(records), made=located, gone=gone,
                    reasons=reasons)


def has_layouts(m: DeviceManager) -> bool:
    """Any standing or mixed-size layout configured, or any device or GPU
    instance a former one left (they go once free: the converge does it)."""
    return any(t.standing > 0 for t in m.policy.types) or bool(m.policy.gpu_layouts) or bool(
        m.ledger.by_owner(LAYOUT_OWNER, OwnerKind.STANDING)
    ) or bool(m.ledger.gpu_instances())


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
            config = m.policy.config_of(provider.device_type)
            if config is None or config.standing <= 0:
                continue
            if gpu_layout_state.on_mixed_gpu(m.policy, provider.physical_gpu):
                continue  # its mixed-size layout's, below
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
        # The mixed-size layouts, each GPU in the order the driver needs
        # (devices/gpu_layout_converge.py); they change only their own GPUs.
        made, gone = list(report.created), set(report.removed)
        if gpu_layout_converge.converge(m, snapshot, report):
            # A VF's device has the VF's UUID: one removed and made again
            # there (another type, a layout placed anew) reads as the old
            # one in the first scan, so what is left comes from a new scan.
            snapshot, made, gone = m.scan(), [], set()
        # What is left, from the first scan and what this converge made and
        # removed (a scan more would cost a start with a large layout seconds).
        left = state_of_records(snapshot, m.policy, m.ledger.all(), made, gone,
                                m.mixed_reasons)
        report.draining = sorted(left.draining)
        report.short = dict(left.short)
        report.missing = left.missing
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
        config = m.policy.config_of(provider.device_type)
        if config is not None and config.standing > 0:
            for parent in provider.parent_devices:
                wanted_on[parent] = (provider.device_type, config.standing)
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
        if wanted is None or wanted[0] == record.device_type:
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
        if wanted is not None and wanted[0] == record.device_type:
            continue
        parent = snapshot.parents.get(record.parent)
        if parent is None and record.backend != "mdev":
            # A VF gone with its GPU's SR-IOV (a driver reload, VFs disabled):
            # nothing to remove; it waits for its parent (recovery re-makes it).
            continue
        if gpu_layout_state.on_mixed_gpu(m.policy, parent):
            continue  # a mixed-size layout's: its own converge decides
        if record.state is not DeviceState.PRESENT or record.intent_id is not None:
            continue  # an operation is on it: recovery settles it first
        removed |= _remove_from_layout(m, record, report)
    return removed


def _remove_from_layout(m: DeviceManager, record: DeviceRecord, report: LayoutReport) -> bool:
    """Remove a device the layout holds; one in use (a VM holds it) stays the
    layout's, draining, and nothing changed (no rescan asked for: it is
    tried again at the next converge)."""
    if protocol.remove_from_layout(m, record.uuid):
        report.removed.append(record.uuid)
        return True
    return False


def _converge_gpu(
    m: DeviceManager,
    snapshot: HostSnapshot,
    provider: inventory_mod.Provider,
    standing: int,
    report: LayoutReport,
) -> None:
    device_type = provider.device_type
    parents = set(provider.parent_devices)
    removed_before = len(report.removed)
    records = [r for r in _present(m, snapshot) if r.parent in parents]
    of_type = [r for r in records if r.device_type == device_type]
    held = [r for r in of_type if r.assigned]
    free = [r for r in of_type if r.free]
    # 1. free devices of the type join the layout; extras beyond N go.
    joining = free[: max(0, standing - len(held))]
    if joining:
        protocol.join_layout(m, [r.uuid for r in joining])
        report.adopted += [r.uuid for r in joining]
    for record in free[len(joining):]:
        if protocol.remove_owned(m, record.uuid):
            report.removed.append(record.uuid)
    have = len(held) + len(joining)
    # 3. more than N: what drains (draining_of) and the layout holds goes;
    # one a VM holds stays, draining, until a later converge finds it free;
    # an instance's go when released (split_release).
    if have > standing:
        drain = draining_of(snapshot, m.policy, *holders_of(m.ledger.all()))
        for record in sorted(held, key=lambda r: r.uuid):
            if record.owner_kind is OwnerKind.STANDING and record.uuid in drain:
                _remove_from_layout(m, record, report)
        return
    if have == standing:
        return
    # 2. short: make room (free devices of other types here), then make.
    in_the_way = [r for r in records if r.free and r.device_type != device_type]
    report.removed += [r.uuid for r in in_the_way if protocol.remove_owned(m, r.uuid)]
    if len(report.removed) > removed_before:
        snapshot = m.scan()  # what went makes room: the slots come from a new scan
    made = _make(m, snapshot, provider, standing - have)
    report.created += made
    if have + len(made) < standing:
        report.short[provider.physical_gpu] = (device_type, standing, have + len(made))


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
    items = [protocol.PlanItem(slot, fresh.device_type) for slot in slots]
    return protocol.make_and_assign(m, snapshot, protocol.LAYOUT, items).uuids


def split_release(
    m: DeviceManager, records: list[DeviceRecord]
) -> tuple[list[str], list[str]]:
    """Of devices an owner releases: (those the standing layout takes back,
    those that drain, to remove).  Devices of no standing layout are in
    neither.  What drains is what the listings and health named draining
    (:func:`draining_of`, before the release): a device named draining is
    removed once free, every other device of the type goes back."""
    if not has_layouts(m) and not any(r.layout for r in records):
        return [], []
    snapshot = m.scan()
    drain = draining_of(snapshot, m.policy, *holders_of(m.ledger.all()))
    back: list[str] = []
    surplus: list[str] = []
    for record in records:
        parent = snapshot.parents.get(record.parent)
        found = _wanted_type(m.policy, parent, record.device_type)
        if parent is None or found is None or found[0] != record.device_type:
            if record.layout:
                surplus.append(record.uuid)  # a layout's device it no longer wants
            continue
        (surplus if record.uuid in drain else back).append(record.uuid)
    return back, surplus


def take_back(m: DeviceManager, uuids: list[str]) -> None:
    """Released devices the layout keeps (or that a VM kept from removal):
    the layout's again, in one commit."""
    if not uuids:
        return
    protocol.take_back(m, uuids)
    LOG.info("standing layout: %d released device(s) back in the layout: %s",
             len(uuids), ", ".join(uuids))


def standing_of(m: DeviceManager, snapshot: HostSnapshot, record: DeviceRecord) -> bool:
    """A device of its GPU's standing layout (held by the layout or an instance)."""
    parent = snapshot.parents.get(record.parent)
    found = _wanted_type(m.policy, parent, record.device_type)
    return found is not None and found[0] == record.device_type


def _wanted_type(
    policy: DevicePolicy, parent: Parent | None, device_type: str
) -> tuple[str, int] | None:
    """(the type, its count) when the parent's GPU carries ``device_type`` at
    all times (its standing layout's type, or one its mixed layout names)."""
    if parent is None:
        return None
    wanted = dict(policy.wanted_on(parent))
    return (device_type, wanted[device_type]) if device_type in wanted else None
