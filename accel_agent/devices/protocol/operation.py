"""Make and assign: the operation of allocate, claim, attach and a standing
layout's new devices, as an object that knows what it chose, what it made,
its intent, and how it rolls back (Nova's claims: a claim that knows how
to ``abort()``).

A use case plans (:class:`PlanItem`: where each device goes, its type, the
source device a migration claim stands in for) and names the owner
(:class:`Owner`); :func:`make_and_assign` runs the :class:`Operation`:

1. one commit, not synced, with the intent, every reservation of a free
   device and every create intent (crash point ``allocate.intent``);
2. the devices made by their backends (``allocate.created`` after each),
   defined in libvirt with ``[libvirt] define_mdevs``;
3. one durable commit that settles and assigns them all, with what goes
   with the assignment (an attach's request, a layout's membership), and
   ends the intent (``allocate.assigned``).

Two commits whatever the count, one fsync.  A reuse-only plan writes no
sysfs: a single transaction with no intent.  A failure after the intent
rolls back (:meth:`Operation.abort`); a privileged helper that fails
stops the run where it is, its intent left for recovery as after a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.backends.base import DeviceBackend
from accel_agent.devices.ledger import DeviceState, IntentKind, OwnerKind
from accel_agent.devices.protocol.libvirt_defs import define_made
from accel_agent.devices.protocol.remove import remove_owned, unmake_quietly
from accel_agent.devices.protocol.runs import LOG, step

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one device of a plan goes."""

    parent: str
    reuse: str | None  # uuid of a free owned device, or None: make one
    # A pool VF (not in the snapshot): its backend and network settings.
    backend: str | None = None
    settings: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One device a plan wants: its slot, its type, and (a migration claim)
    the source device it stands in for."""

    slot: Slot
    device_type: str
    source: str | None = None
    # A vGPU of a mixed-size layout: its planned placement (devices/placements.py),
    # recorded with the create intent, written and read back after the type.
    placement_id: int | None = None


@dataclass(frozen=True, slots=True)
class Owner:
    """Who an operation's devices go to: an instance, a migration claim
    (with its expiry) or a standing layout (whose devices are marked its)."""

    name: str
    kind: OwnerKind = OwnerKind.INSTANCE
    expires_at: float | None = None

    @property
    def intent_kind(self) -> IntentKind:
        return IntentKind.CLAIM if self.kind is OwnerKind.CLAIM else IntentKind.ALLOCATE


@dataclass(frozen=True, slots=True)
class AttachRecord:
    """What an attach call asked for, recorded with the devices that answer
    it (devices/attach.py): the requests as the ledger keeps them, and which
    request each plan item answers."""

    requests: Sequence[Mapping[str, Any]]
    request_of: tuple[int, ...]

    def document(self, uuids: Sequence[str]) -> dict[str, Any]:
        devices = [[uuid, index] for uuid, index in zip(uuids, self.request_of, strict=True)]
        return {"requests": list(self.requests), "devices": devices}


@dataclass(frozen=True, slots=True)
class Chosen:
    """A device the operation gives its owner, in the plan's order: a free
    one it reserved, or one it makes."""

    uuid: str
    source: str | None


@dataclass(frozen=True, slots=True)
class ToMake:
    """A device the operation makes, as its create intent records it."""

    uuid: str
    parent: str
    device_type: str
    backend: DeviceBackend
    settings: Mapping[str, Any] | None
    placement_id: int | None = None


class Operation:
    """One make-and-assign (module docstring)."""

    def __init__(
        self,
        m: DeviceManager,
        snapshot: HostSnapshot,
        owner: Owner,
        items: Sequence[PlanItem],
        attach: AttachRecord | None = None,
    ) -> None:
        self.m = m
        self.snapshot = snapshot
        self.owner = owner
        self.items = tuple(items)
        self.attach = attach
        # Set by the intent's commit; None until then (and for a reuse-only plan).
        self.intent: int | None = None
        self.chosen: list[Chosen] = []
        self.to_make: list[ToMake] = []
        # What it made so far, in order: what a rollback removes.
        self.made: list[str] = []

    @property
    def uuids(self) -> list[str]:
        """The owner's devices, in the plan's order."""
        return [c.uuid for c in self.chosen]

    def run(self) -> list[str]:
        """Reserve or make every item, then assign them all, or undo what
        this run did.  Returns :attr:`uuids`."""
        m = self.m
        if all(item.slot.reuse for item in self.items):
            return self._reuse_only()
        mark = m.mutations
        self._record_intent()
        step(m, "allocate.intent")
        try:
            self._make()
            define_made(m, self.made)
            self._settle()
            step(m, "allocate.assigned")
        except exception.PrivilegedHelperUnavailable:
            # The write in flight may or may not have happened: leave the intent
            # as a crash would, for recovery to settle from sysfs (the daemon
            # runs it once a new helper answers).  Nothing is assigned.
            LOG.error("operation %d for %s interrupted: the privileged helper failed; "
                      "recovery settles it", self.intent, self.owner.name)
            raise
        except BaseException:
            if self.abort():
                # Everything as it was (the write was refused, what it made is
                # gone): nothing changed, no rescan asked for (a layout whose
                # GPU refuses a write would otherwise converge for ever).
                m.forget_changes_since(mark)
            raise
        self._log_assigned()
        return self.uuids

    def _reuse_only(self) -> list[str]:
        m = self.m
        self.chosen = [Chosen(i.slot.reuse, i.source) for i in self.items if i.slot.reuse]
        with m.ledger.transaction():
            for chosen in self.chosen:
                take_from_layout(m, chosen.uuid)
                self._assign(chosen.uuid, chosen.source)
            self._with_assignment()
        step(m, "allocate.assigned")
        self._log_assigned()
        return self.uuids

    def _record_intent(self) -> None:
        """One commit before any sysfs write: the intent, every reservation of
        a free device and every create intent.  It needs no fsync: the
        settlement's covers it (Ledger.transaction)."""
        m = self.m
        chosen: list[Chosen] = []
        to_make: list[ToMake] = []
        with m.ledger.transaction(durable=False):
            intent = m.ledger.begin_intent(self.owner.intent_kind, self.owner.name)
            for item in self.items:
                slot = item.slot
                if slot.reuse:
                    take_from_layout(m, slot.reuse)
                    m.ledger.reserve(slot.reuse, intent)
                    chosen.append(Chosen(slot.reuse, item.source))
                    continue
                if slot.backend is not None:
                    # A pool's parent: its backend fixes the device's UUID.
                    backend = m.backend(slot.backend)
                    new = backend.device_uuid_of(slot.parent)
                else:
                    parent = self.snapshot.parents[slot.parent]
                    backend = m.backend(parent.backend)
                    new = backend.new_device_uuid(parent)
                m.ledger.record_create_intent(
                    new, slot.parent, item.device_type, intent_id=intent, backend=backend.name,
                    settings=slot.settings, placement_id=item.placement_id,
                )
                to_make.append(ToMake(new, slot.parent, item.device_type, backend, slot.settings,
                                      item.placement_id))
                chosen.append(Chosen(new, item.source))
        self.intent, self.chosen, self.to_make = intent, chosen, to_make

    def _make(self) -> None:
        for each in self.to_make:
            each.backend.make(self.m.writer, each.parent, each.device_type, each.uuid,
                              each.settings)
            self.made.append(each.uuid)
            if each.placement_id is not None:
                # Right after its type: the next vGPU's type write must find
                # this one where the plan put it (the driver placed it anywhere).
                step(self.m, "allocate.typed")
                each.backend.place(self.m.writer, each.parent, each.placement_id)
            step(self.m, "allocate.created")

    def _settle(self) -> None:
        m = self.m
        with m.ledger.transaction():
            for uuid in self.made:
                m.ledger.settle_created(uuid)
            for chosen in self.chosen:
                self._assign(chosen.uuid, chosen.source)
            self._with_assignment()
            if self.intent is not None:
                m.ledger.finish_intent(self.intent)

    def _assign(self, uuid: str, source: str | None) -> None:
        self.m.ledger.assign(
            uuid,
            self.owner.name,
            owner_kind=self.owner.kind,
            claim_expires_at=self.owner.expires_at,
            intent_id=self.intent,
            source_uuid=source,
        )

    def _with_assignment(self) -> None:
        """What the transaction that assigns the devices records with them."""
        if self.owner.kind is OwnerKind.STANDING:
            for uuid in self.uuids:
                self.m.ledger.set_layout(uuid)
        if self.attach is not None:
            self.m.ledger.record_attach_request(
                self.owner.name, self.attach.document(self.uuids)
            )

    def _backends(self) -> list[str]:
        """The backend of each device the owner got: what its log line
        calls them (mdevs, VFs)."""
        made = {each.uuid: each.backend.name for each in self.to_make}
        return [
            made[uuid] if uuid in made else getattr(self.m.ledger.get(uuid), "backend", "")
            for uuid in self.uuids
        ]

    def _log_assigned(self) -> None:
        LOG.info(
            "%s %d %s for %s: %s",
            "claimed" if self.owner.kind is OwnerKind.CLAIM else "allocated",
            len(self.chosen),
            self.m.device_kinds(self._backends()),
            self.owner.name,
            ", ".join(self.uuids),
        )

    # --- the rollback ---------------------------------------------------------------

    def abort(self) -> bool:
        """Undo a failed make: remove what it made, free what it reserved, end
        the intent.  True when everything is as it was before the run.

        A privileged helper that fails meanwhile stops the rollback where it
        is: the intent stays with the rows left, for recovery."""
        try:
            return self._undo()
        except exception.PrivilegedHelperUnavailable as exc:
            failure = exc.message
        # Logged outside the except clause (as every warning or error of the
        # protocol that quotes its exception): oslo.log appends the exception
        # being handled to such a line, which would say it twice.
        LOG.error("rollback of operation %d interrupted (%s); recovery settles the rest",
                  self.intent, failure)
        return False

    def _undo(self) -> bool:
        m = self.m
        if self.intent is None:
            return True  # nothing recorded, nothing made
        undone = True
        for record in m.ledger.all():
            if record.intent_id != self.intent:
                continue
            if record.state is DeviceState.CREATING and record.uuid not in self.made:
                if m.backend(record.backend).outside_snapshot:
                    # Its make failed part-way (a VF's settings set, the
                    # hand-over refused): undo whatever step it reached.
                    unmake_quietly(m, record.uuid)
                    undone = False  # what it reached may stay (logged): a rescan looks
                m.ledger.forget(record.uuid)  # the create write never succeeded
        for uuid in self.made:
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
                record = m.ledger.get(uuid)
                LOG.error("rollback could not remove %s %s: %s",
                          m.device_kind(record.backend) if record else "device", uuid, failure)
                if record is not None and record.state is DeviceState.REMOVING:
                    m.ledger.cancel_remove(uuid)
                elif record is not None and record.state is DeviceState.CREATING:
                    m.ledger.settle_created(uuid)
        m.ledger.finish_intent(self.intent)
        return undone


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


def make_and_assign(
    m: DeviceManager,
    snapshot: HostSnapshot,
    owner: Owner,
    items: Sequence[PlanItem],
    attach: AttachRecord | None = None,
) -> Operation:
    """Run the :class:`Operation` for ``owner``'s ``items`` (and an attach's
    request, recorded with the devices); returns it done: its
    :attr:`~Operation.uuids` are the devices, in the items' order."""
    op = Operation(m, snapshot, owner, items, attach)
    op.run()
    return op
