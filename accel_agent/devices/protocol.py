"""The one operation protocol every mutating use case goes through.

DESIGN.md §5: a change to the host is **intent, then make, then settle, or
roll back**.  The intent is in the ledger before the first sysfs write, so a
crash at any instant leaves rows that recovery settles by comparing them with
sysfs.  This module is the only place that takes the manager's lock, opens
the ledger's transactions for an operation, writes and settles intents, and
names the crash points (``step``) the crash tests kill at; the use cases
(allocations, attach, claims, takeover, recovery) decide *what* to change and
ask this module to run it.  tests/unit/test_house.py keeps it so.

The runs:

* :func:`make_and_assign`: reserve free devices or record create intents,
  make the new devices, then assign them all in one transaction (allocate,
  claim, attach).  Two commits whatever the count, one fsync.
* :func:`release_and_remove`: drop an owner's assignments and record the
  remove intents in one commit, remove, settle (release, abort).
* :func:`remove_owned`: remove one owned, unassigned device (rollback,
  recovery).
* :func:`apply`: a change that writes no sysfs (commit a claim, a takeover,
  an adoption): one durable transaction.
* :func:`settle_interrupted`: recovery's half, what a crash left half-done.

libvirt's definitions (DESIGN.md §14) go with the devices: a remove
undefines the mdev in libvirt after its sysfs remove and before the
settlement (a failure there leaves the remove intent, which recovery
settles, undefining what is left); with ``[libvirt] define_mdevs`` a make
defines what it created (best effort: recovery defines what is missing).

A privileged helper that fails in the middle (PrivilegedHelperUnavailable:
the write may or may not have happened) stops a run where it is: the intent
stays, exactly as after a crash, and recovery settles it.  So does a libvirt
that does not answer within ``[libvirt] call_timeout`` (LibvirtStalled): a
remove's sysfs writes are done, the undefine is left to recovery.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.backends.base import DeviceBackend, DeviceRef
from accel_agent.devices.ledger import DeviceRecord, DeviceState, IntentKind, OwnerKind
from accel_agent.devices.lock_file import private_lock_dir

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.results import RecoveryReport
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)

LOCK_NAME = "accel-agent-mdevs"


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one device of a plan goes."""

    parent: str
    reuse: str | None  # uuid of a free owned device, or None: make one
    # A pool VF (not in the snapshot): its backend and network settings.
    backend: str | None = None
    settings: Mapping[str, Any] | None = None


# (slot, type, the source device a migration claim stands in for)
PlanItem = tuple[Slot, str, str | None]


def device_ref(record: DeviceRecord) -> DeviceRef:
    return DeviceRef(
        record.uuid, record.parent, record.mdev_type, record.backend, record.settings
    )


# --- the lock and the crash points ----------------------------------------------------


@contextlib.contextmanager
def operation(m: DeviceManager) -> Iterator[None]:
    """The manager's lock: a thread lock plus a file lock in ``state_dir``, so
    that an offline ``accelctl`` and the daemon never interleave.

    ``m.on_changed`` (the daemon: a rescan) is told after an operation that
    changed something, whatever its outcome: a ledger write it committed or
    a privileged write it attempted (``m.mutations`` moved, read under the
    lock).  One that changed nothing (a converge with the layout in place,
    a remove refused because the device is in use, a refused request) asks
    for nothing: a rescan that converges would otherwise ask for the next,
    for ever."""
    from oslo_concurrency import lockutils

    changed = False
    try:
        with (
            m.thread_lock,
            lockutils.lock(
                LOCK_NAME, external=True, do_log=False,
                lock_path=private_lock_dir(str(m.ledger.path.parent), LOCK_NAME),
            ),
        ):
            before = m.mutations
            try:
                yield
            finally:
                changed = m.mutations != before
    finally:
        m.operations += 1
        if changed:
            m.on_changed()


def step(m: DeviceManager, name: str) -> None:
    """A crash point: the crash tests kill the process here (``on_step``)."""
    m.on_step(name)


@contextlib.contextmanager
def apply(m: DeviceManager) -> Iterator[None]:
    """A change that writes no sysfs, in one durable transaction."""
    with m.ledger.transaction():
        yield


# --- make and assign ------------------------------------------------------------------


def make_and_assign(
    m: DeviceManager,
    snapshot: HostSnapshot,
    owner: str,
    items: list[PlanItem],
    owner_kind: OwnerKind = OwnerKind.INSTANCE,
    expires_at: float | None = None,
    on_settle: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Reserve or create every slot, then assign them all, or undo what this
    call did.  Returns the devices' UUIDs in the items' order; ``on_settle``
    is told them inside the transaction that assigns them.

    Two ledger commits whatever the count, one fsync: the intent with every
    reservation and create intent before the first sysfs write, then the
    settlement with every assignment after the last.  A reuse-only plan
    writes nothing to sysfs, so it is a single transaction with no intent.
    """
    if all(slot.reuse for slot, _, _ in items):
        reused = [slot.reuse for slot, _, _ in items]
        with m.ledger.transaction():
            for slot, _type, source in items:
                assert slot.reuse is not None
                take_from_layout(m, slot.reuse)
                _assign(m, slot.reuse, owner, owner_kind, expires_at, None, source)
            if on_settle is not None:
                on_settle(reused)  # type: ignore[arg-type]
        step(m, "allocate.assigned")
        _log_assigned(owner, owner_kind, reused)  # type: ignore[arg-type]
        return reused  # type: ignore[return-value]
    kind = IntentKind.CLAIM if owner_kind is OwnerKind.CLAIM else IntentKind.ALLOCATE
    mark = m.mutations
    intent, chosen, to_create = _record_intent(m, snapshot, owner, items, kind)
    step(m, "allocate.intent")
    created: list[str] = []
    try:
        for new, parent_name, mdev_type, backend, settings in to_create:
            backend.make(m.writer, parent_name, mdev_type, new, settings)
            created.append(new)
            step(m, "allocate.created")
        define_made(m, created)
        with m.ledger.transaction():
            for new in created:
                m.ledger.settle_created(new)
            for uuid, source in chosen:
                _assign(m, uuid, owner, owner_kind, expires_at, intent, source)
            if on_settle is not None:
                on_settle([uuid for uuid, _ in chosen])
            m.ledger.finish_intent(intent)
        step(m, "allocate.assigned")
    except exception.PrivilegedHelperUnavailable:
        # The write in flight may or may not have happened: leave the intent
        # as a crash would, for recovery to settle from sysfs (the daemon
        # runs it once a new helper answers).  Nothing is assigned.
        LOG.error("operation %d for %s interrupted: the privileged helper failed; "
                  "recovery settles it", intent, owner)
        raise
    except BaseException:
        if roll_back(m, intent, created):
            # Everything as it was (the write was refused, what it made is
            # gone): nothing changed, no rescan asked for (a layout whose
            # GPU refuses a write would otherwise converge for ever).
            m.forget_changes_since(mark)
        raise
    _log_assigned(owner, owner_kind, [uuid for uuid, _ in chosen])
    return [uuid for uuid, _ in chosen]


def _record_intent(
    m: DeviceManager,
    snapshot: HostSnapshot,
    owner: str,
    items: list[PlanItem],
    kind: IntentKind,
) -> tuple[int, list[tuple[str, str | None]], list[tuple[str, str, str, DeviceBackend, Any]]]:
    """One commit before any sysfs write: the intent, every reservation of a
    free device and every create intent.  It needs no fsync: the
    settlement's covers it (Ledger.transaction)."""
    chosen: list[tuple[str, str | None]] = []
    to_create: list[tuple[str, str, str, DeviceBackend, Any]] = []
    with m.ledger.transaction(durable=False):
        intent = m.ledger.begin_intent(kind, owner)
        for slot, mdev_type, source in items:
            if slot.reuse:
                take_from_layout(m, slot.reuse)
                m.ledger.reserve(slot.reuse, intent)
                chosen.append((slot.reuse, source))
                continue
            if slot.backend is not None:
                # A pool's parent: its backend fixes the device's UUID.
                backend = m.backend(slot.backend)
                new = backend.device_uuid_of(slot.parent)
            else:
                parent = snapshot.parents[slot.parent]
                backend = m.backend(parent.backend)
                new = backend.new_device_uuid(parent)
            m.ledger.record_create_intent(
                new, slot.parent, mdev_type, intent_id=intent, backend=backend.name,
                settings=slot.settings,
            )
            to_create.append((new, slot.parent, mdev_type, backend, slot.settings))
            chosen.append((new, source))
    return intent, chosen, to_create


def take_from_layout(m: DeviceManager, uuid: str) -> None:
    """A standing layout's device the plan gives an instance: the layout lets
    it go in the transaction that assigns or reserves it.  A crash after
    leaves it free at worst, and the layout takes it back (devices/layout.py)."""
    record = m.ledger.get(uuid)
    if record is not None and record.owner_kind is OwnerKind.STANDING:
        m.ledger.set_layout(uuid)  # still the layout's: its release gives it back
        m.ledger.release(uuid)
    # A new holder: a later refusal to remove it is news again.
    m.refused_removes.pop(uuid, None)


def _assign(
    m: DeviceManager,
    uuid: str,
    owner: str,
    owner_kind: OwnerKind,
    expires_at: float | None,
    intent: int | None,
    source: str | None,
) -> None:
    m.ledger.assign(
        uuid,
        owner,
        owner_kind=owner_kind,
        claim_expires_at=expires_at,
        intent_id=intent,
        source_uuid=source,
    )


def _log_assigned(owner: str, owner_kind: OwnerKind, uuids: list[str | None]) -> None:
    LOG.info(
        "%s %d mdev(s) for %s: %s",
        "claimed" if owner_kind is OwnerKind.CLAIM else "allocated",
        len(uuids),
        owner,
        ", ".join(str(u) for u in uuids),
    )


def roll_back(m: DeviceManager, intent: int, created: list[str]) -> bool:
    """Undo a failed make: remove what it created, free what it reserved.
    True when everything is as it was before the make.

    A privileged helper that fails meanwhile stops the rollback where it is:
    the intent stays with the rows left, for recovery."""
    try:
        return _undo(m, intent, created)
    except exception.PrivilegedHelperUnavailable as exc:
        failure = exc.message
    # Logged outside the except clause (as every warning or error of this
    # module that quotes its exception): oslo.log appends the exception
    # being handled to such a line, which would say it twice.
    LOG.error("rollback of operation %d interrupted (%s); recovery settles the rest",
              intent, failure)
    return False


def _undo(m: DeviceManager, intent: int, created: list[str]) -> bool:
    undone = True
    for record in m.ledger.all():
        if record.intent_id != intent:
            continue
        if record.state is DeviceState.CREATING and record.uuid not in created:
            if m.backend(record.backend).outside_snapshot:
                # Its make failed part-way (a VF's settings set, the
                # hand-over refused): undo whatever step it reached.
                _unmake_quietly(m, record.uuid)
                undone = False  # what it reached may stay (logged): a rescan looks
            m.ledger.forget(record.uuid)  # the create write never succeeded
    for uuid in created:
        failure: exception.AccelAgentException | None = None
        try:
            gone = remove_owned(m, uuid)
        except exception.PrivilegedHelperUnavailable:
            raise
        except exception.AccelAgentException as exc:
            failure = exc
        else:
            undone &= gone and m.ledger.get(uuid) is None
        if failure is not None:
            undone = False
            # It stays recorded (free, owned): reusable, never leaked.
            LOG.error("rollback could not remove mdev %s: %s", uuid, failure)
            record = m.ledger.get(uuid)
            if record is not None and record.state is DeviceState.REMOVING:
                m.ledger.cancel_remove(uuid)
            elif record is not None and record.state is DeviceState.CREATING:
                m.ledger.settle_created(uuid)
    m.ledger.finish_intent(intent)
    return undone


# --- unmake -------------------------------------------------------------------------------


def destroy(m: DeviceManager, uuid: str) -> None:
    """Unmake one recorded device through the backend that made it."""
    record = m.ledger.get(uuid)
    if record is None:
        raise exception.MdevNotFound(uuid=uuid)
    m.backend(record.backend).destroy(m.writer, device_ref(record), m.remove_timeout)


def _unmake_quietly(m: DeviceManager, uuid: str) -> None:
    try:
        with contextlib.suppress(exception.MdevNotFound):
            destroy(m, uuid)
    except exception.PrivilegedHelperUnavailable:
        raise  # not undone: its record must stay for recovery
    except exception.AccelAgentException as exc:
        failure = exc
    else:
        return
    LOG.error("device %s: undoing a failed make failed: %s", uuid, failure)


def remove_owned(m: DeviceManager, uuid: str) -> bool:
    """Remove one owned, unassigned device (rollback and recovery paths),
    and libvirt's definition of it.

    False when it is in use (its VFIO group is held, or the remove timed
    out): it stays recorded as a free, owned device, never leaked, and
    nothing changed (``m.mutations`` is taken back to where it was, so
    the operation asks for no rescan)."""
    mark = m.mutations
    before = m.ledger.get(uuid)
    m.ledger.record_remove_intent(uuid)
    try:
        with contextlib.suppress(exception.MdevNotFound):
            destroy(m, uuid)
    except (exception.MdevInUse, exception.MdevRemoveTimeout) as exc:
        held = exc
    else:
        m.refused_removes.pop(uuid, None)
        if undefine_or_keep(m, uuid):
            m.ledger.forget(uuid)
        return True
    m.ledger.cancel_remove(uuid)
    if before is not None and before.state is DeviceState.PRESENT:
        # Back as it was (a row recovery found ``removing`` did change).
        m.forget_changes_since(mark)
    _kept_in_use(m, uuid, held)
    return False


def _kept_in_use(m: DeviceManager, uuid: str, exc: exception.AccelAgentException) -> None:
    """Said (and counted) once per device and reason: a device a VM holds
    is tried again at every converge until it is free, and one line per
    try would fill the journal."""
    if m.refused_removes.get(uuid) == exc.message:
        LOG.debug("mdev %s still kept instead of removed: %s", uuid, exc.message)
        return
    m.refused_removes[uuid] = exc.message
    LOG.warning("mdev %s kept as a free mdev instead of removed: %s", uuid, exc.message)
    m.on_kept_in_use(uuid)


def release_and_remove(
    m: DeviceManager, owner: str, kind: OwnerKind, removable: Sequence[str]
) -> list[str]:
    """Drop every assignment of ``owner`` (of ``kind``) and remove
    ``removable`` among its devices: one commit with the release and every
    remove intent, the sysfs removes, one commit settling them.  Returns the
    devices kept because they were in use (recorded free)."""
    # libvirt's definitions, read before anything changes: a removed mdev
    # that libvirt defines would come back at the next boot (autostart).
    defined: Mapping[str, Any] | None = None
    stalled: exception.LibvirtStalled | None = None
    if any(_is_mdev(m, u) for u in removable):
        try:
            defined = definitions(m)
        except exception.LibvirtStalled as exc:
            stalled = exc  # the removes go ahead; their undefine is recovery's
    # With removes to follow, the closing commit is the durable one.
    with m.ledger.transaction(durable=not removable):
        intent = m.ledger.begin_intent(IntentKind.RELEASE, owner)
        m.ledger.release_owner(owner, kind)
        for uuid in removable:
            m.ledger.record_remove_intent(uuid, intent_id=intent)
        if not removable:
            m.ledger.finish_intent(intent)
    step(m, "release.released")
    if not removable:
        return []
    gone, held = _remove_all(m, list(removable))
    if stalled is not None and any(_is_mdev(m, u) for u in gone):
        # libvirt is there but does not answer within [libvirt] call_timeout:
        # whether it defines them is not known.  As a failed helper does, the
        # run stops here with the intent kept; recovery undefines and forgets.
        raise stalled
    # A failure here leaves the intent with every row removing, as a crash
    # would: recovery undefines what is left and forgets the rows.
    undefine_removed(m, gone, defined)
    with m.ledger.transaction():
        for uuid in gone:
            m.ledger.forget(uuid)
        for uuid in held:
            m.ledger.cancel_remove(uuid)
        m.ledger.finish_intent(intent)
    step(m, "release.forgotten")
    return held


def _remove_all(m: DeviceManager, uuids: list[str]) -> tuple[list[str], list[str]]:
    """The sysfs removes of recorded remove intents: (gone, still held)."""
    gone: list[str] = []
    held: list[str] = []
    for uuid in uuids:
        in_use: exception.AccelAgentException | None = None
        try:
            # Already gone (ENOENT) reaches the goal too.
            with contextlib.suppress(exception.MdevNotFound):
                destroy(m, uuid)
            gone.append(uuid)
            m.refused_removes.pop(uuid, None)
        except (exception.MdevInUse, exception.MdevRemoveTimeout) as exc:
            in_use = exc
        if in_use is not None:
            _kept_in_use(m, uuid, in_use)
            held.append(uuid)
        step(m, "release.removed")
    return gone, held


def undefine_removed(
    m: DeviceManager, uuids: Sequence[str], defined: Mapping[str, Any] | None
) -> None:
    """Undefine in libvirt each removed device it defines (``defined``: what
    libvirt defines; None: unknown, libvirt unreachable, nothing done).
    Called with owned devices only: the agent never undefines another's.
    Raises NodeDeviceWriteFailed / NodeDevicesUnavailable with the remove
    intents still recorded, for recovery."""
    if defined is None:
        return
    for uuid in uuids:
        found = defined.get(uuid)
        if found is not None and found.defined:
            m.nodedevs.undefine(uuid)
            LOG.info("undefined removed mdev %s in libvirt (it would come back at boot)", uuid)
            step(m, "release.undefined")


def definitions(m: DeviceManager) -> Mapping[str, Any] | None:
    """libvirt's mdev definitions; None when libvirt cannot be reached
    (nothing known: nothing is undefined, as always).  Raises LibvirtStalled
    when libvirt is there but did not answer within its deadline: a removed
    device's definition is then left to recovery, its remove intent kept."""
    try:
        return m.nodedevs.require()
    except exception.LibvirtStalled:
        raise
    except exception.NodeDevicesUnavailable as exc:
        failure = exc
    LOG.warning("%s; libvirt's mdev definitions are not known", failure.message)
    return None


def _is_mdev(m: DeviceManager, uuid: str) -> bool:
    """Only mediated devices have libvirt definitions (mdevctl's)."""
    record = m.ledger.get(uuid)
    return record is None or record.backend == "mdev"


def undefine_or_keep(m: DeviceManager, uuid: str) -> bool:
    """After its sysfs remove: undefine ``uuid`` in libvirt if it defines
    it.  False when libvirt refused: the row stays ``removing`` (its remove
    intent), and the next recovery undefines it and forgets the row."""
    if not _is_mdev(m, uuid):
        return True  # a VF: libvirt keeps no definition of it
    failure: exception.AccelAgentException | None = None
    try:
        undefine_removed(m, [uuid], definitions(m))
    except exception.AccelAgentException as exc:  # LibvirtStalled included
        failure = exc
    if failure is None:
        return True
    LOG.warning("mdev %s is removed but libvirt may still define it (%s); the next "
                "recovery undefines it", uuid, failure)
    return False


def define_made(m: DeviceManager, uuids: Sequence[str]) -> None:
    """``[libvirt] define_mdevs``: define each device the agent made in
    libvirt, autostart off (the agent re-creates its devices at boot, not
    libvirt).  Best effort: a failure is logged and recovery defines it."""
    if not m.define_mdevs or not uuids:
        return
    failure: exception.AccelAgentException | None = None
    try:
        defined = m.nodedevs.require()
        for uuid in uuids:
            record = m.ledger.get(uuid)
            if record is None or record.backend != "mdev":
                continue
            found = defined.get(uuid)
            if found is not None and found.defined:
                if found.autostart:
                    m.nodedevs.set_autostart(uuid, False)
                continue
            m.nodedevs.define(uuid, record.parent, record.mdev_type, autostart=False)
            LOG.info("defined mdev %s in libvirt, autostart off", uuid)
    except exception.AccelAgentException as exc:
        failure = exc
    if failure is not None:  # outside the except clause: said once
        LOG.warning("defining mdevs in libvirt failed (%s); the next recovery defines them",
                    failure)


def release_quietly(m: DeviceManager, records: Sequence[DeviceRecord]) -> None:
    """Drop the assignments of ``records`` (expired claims), keeping the
    devices: one durable transaction."""
    with apply(m):
        for record in records:
            m.ledger.release(record.uuid)


# --- recovery's half: what a crash left ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Existing:
    """What exists now, for recovery: the snapshot's mdevs and parents, and
    the parents of each backend outside the snapshot (pool VFs),
    {backend: {parent: (pool, holds a device)}}."""

    snapshot: HostSnapshot
    outside: Mapping[str, Mapping[str, tuple[str, bool]]]

    def exists(self, record: DeviceRecord) -> bool:
        if record.backend in self.outside:
            found = self.outside[record.backend].get(record.parent)
            return bool(found and found[1])
        return record.uuid in self.snapshot.mdevs

    def has_parent(self, record: DeviceRecord) -> bool:
        if record.backend in self.outside:
            return record.parent in self.outside[record.backend]
        return record.parent in self.snapshot.parents


def settle_interrupted(m: DeviceManager, devices: Existing, report: RecoveryReport) -> None:
    """Finish or undo every row an operation left half-done, from what sysfs
    shows, and end every intent (assignments and an intent's end commit
    together, so an intent still here never assigned anything)."""
    for record in m.ledger.unsettled():
        exists = devices.exists(record)
        if m.backend(record.backend).unmade_on_release:
            # A pool VF is never kept free: whatever step its prepare or
            # unprepare reached (settings set, on vfio-pci or not), it goes
            # back to its driver with its settings reset (idempotent).
            if remove_owned(m, record.uuid):
                (report.removed if exists else report.forgotten).append(record.uuid)
            else:
                report.kept_in_use.append(record.uuid)
            continue
        if record.state is DeviceState.CREATING:
            if exists:
                # The write happened, the process died before recording it:
                # ours, free, reusable.
                m.ledger.settle_created(record.uuid)
                report.settled.append(record.uuid)
            else:
                m.ledger.forget(record.uuid)
                report.forgotten.append(record.uuid)
        elif record.state is DeviceState.REMOVING:
            if exists:
                if remove_owned(m, record.uuid):
                    report.removed.append(record.uuid)
                else:
                    report.kept_in_use.append(record.uuid)
            else:
                # Removed from sysfs, maybe not from libvirt yet (idempotent).
                if undefine_or_keep(m, record.uuid):
                    m.ledger.forget(record.uuid)
                    report.forgotten.append(record.uuid)
    for intent in m.ledger.pending_intents():
        m.ledger.finish_intent(intent.id)


def remake(m: DeviceManager, record: DeviceRecord) -> None:
    """Make a recorded device missing from sysfs again: same UUID, same
    parent, same type (a VF: same settings), by the backend that made it.  No
    new intent: the row is one (recorded present, missing), and a crash here
    leaves it for the next recovery."""
    m.backend(record.backend).make(
        m.writer, record.parent, record.mdev_type, record.uuid, record.settings
    )


def forget_gone(m: DeviceManager, record: DeviceRecord) -> None:
    """A free device (or a standing layout's) gone from sysfs that nobody
    needs back (its type was dropped): forgotten."""
    with m.ledger.transaction():
        if record.owner_kind is OwnerKind.STANDING:
            m.ledger.release(record.uuid)
        m.ledger.forget(record.uuid)
