"""Unmaking devices: one owned, unassigned device (:func:`remove_owned`:
rollback, recovery, a layout's removals), or what an owner releases
(:class:`Release`: release and abort with ``remove``), with the in-use
rules (docs/design.md §5.3): a device something holds is kept, free and
owned, never leaked, and said once per device and reason."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices.ledger import DeviceRecord, DeviceState, IntentKind, OwnerKind
from accel_agent.devices.protocol.libvirt_defs import (
    definitions,
    is_mdev,
    undefine_or_keep,
    undefine_removed,
)
from accel_agent.devices.protocol.runs import LOG, apply, device_ref, step

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.nodedevs import MdevNodeDevice


def destroy(m: DeviceManager, uuid: str) -> None:
    """Unmake one recorded device through the backend that made it."""
    record = m.ledger.get(uuid)
    if record is None:
        raise exception.MdevNotFound(uuid=uuid)
    m.backend(record.backend).destroy(m.writer, device_ref(record), m.remove_timeout)


def unmake_quietly(m: DeviceManager, uuid: str) -> None:
    """Undo whatever step a failed make reached; a failure is logged."""
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
    except (exception.DeviceInUse, exception.MdevRemoveTimeout) as exc:
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
    kept_in_use(m, uuid, held)
    return False


def kept_in_use(m: DeviceManager, uuid: str, exc: exception.AccelAgentException) -> None:
    """Said (and counted) once per device and reason: a device a VM holds
    is tried again at every converge until it is free, and one line per
    try would fill the journal."""
    record = m.ledger.get(uuid)
    kind = m.device_kind(record.backend) if record is not None else "device"
    if m.refused_removes.get(uuid) == exc.message:
        LOG.debug("%s %s still kept instead of removed: %s", kind, uuid, exc.message)
        return
    m.refused_removes[uuid] = exc.message
    LOG.warning("%s %s kept as a free %s instead of removed: %s", kind, uuid, kind, exc.message)
    m.on_kept_in_use(uuid)


class Release:
    """Drop every assignment of an owner (of a kind) and remove some of its
    devices: one commit with the release and every remove intent, the
    removes, libvirt's definitions of what went, one commit settling them.

    It has no abort: once the assignments are dropped a release only goes
    forward.  What a failure leaves (a helper that failed, a libvirt that
    does not answer, a crash) is its intent with the rows still
    ``removing``, which recovery settles."""

    def __init__(
        self, m: DeviceManager, owner: str, kind: OwnerKind, removable: Sequence[str]
    ) -> None:
        self.m = m
        self.owner = owner
        self.kind = kind
        self.removable = list(removable)
        self.intent: int | None = None
        # The removes' outcome: the devices gone, and those kept because
        # something holds them (recorded free).
        self.gone: list[str] = []
        self.held: list[str] = []

    def run(self) -> list[str]:
        """Returns the devices kept because they were in use."""
        m = self.m
        # libvirt's definitions, read before anything changes: a removed mdev
        # that libvirt defines would come back at the next boot (autostart).
        defined: Mapping[str, MdevNodeDevice] | None = None
        stalled: exception.LibvirtStalled | None = None
        if any(is_mdev(m, u) for u in self.removable):
            try:
                defined = definitions(m)
            except exception.LibvirtStalled as exc:
                stalled = exc  # the removes go ahead; their undefine is recovery's
        self._release()
        if not self.removable:
            return []
        self._remove_all()
        if stalled is not None and any(is_mdev(m, u) for u in self.gone):
            # libvirt is there but does not answer within [libvirt] call_timeout:
            # whether it defines them is not known.  As a failed helper does, the
            # run stops here with the intent kept; recovery undefines and forgets.
            raise stalled
        # A failure here leaves the intent with every row removing, as a crash
        # would: recovery undefines what is left and forgets the rows.
        undefine_removed(m, self.gone, defined)
        self._settle()
        step(m, "release.forgotten")
        return self.held

    def _release(self) -> None:
        m = self.m
        # With removes to follow, the closing commit is the durable one.
        with m.ledger.transaction(durable=not self.removable):
            intent = m.ledger.begin_intent(IntentKind.RELEASE, self.owner)
            m.ledger.release_owner(self.owner, self.kind)
            for uuid in self.removable:
                m.ledger.record_remove_intent(uuid, intent_id=intent)
            if not self.removable:
                m.ledger.finish_intent(intent)
        self.intent = intent
        step(m, "release.released")

    def _remove_all(self) -> None:
        """The sysfs removes of the recorded remove intents."""
        m = self.m
        for uuid in self.removable:
            in_use: exception.AccelAgentException | None = None
            try:
                # Already gone (ENOENT) reaches the goal too.
                with contextlib.suppress(exception.MdevNotFound):
                    destroy(m, uuid)
                self.gone.append(uuid)
                m.refused_removes.pop(uuid, None)
            except (exception.DeviceInUse, exception.MdevRemoveTimeout) as exc:
                in_use = exc
            if in_use is not None:
                kept_in_use(m, uuid, in_use)
                self.held.append(uuid)
            step(m, "release.removed")

    def _settle(self) -> None:
        m = self.m
        with m.ledger.transaction():
            for uuid in self.gone:
                m.ledger.forget(uuid)
            for uuid in self.held:
                m.ledger.cancel_remove(uuid)
            if self.intent is not None:
                m.ledger.finish_intent(self.intent)


def release_and_remove(
    m: DeviceManager, owner: str, kind: OwnerKind, removable: Sequence[str]
) -> list[str]:
    """Drop every assignment of ``owner`` (of ``kind``) and remove
    ``removable`` among its devices (:class:`Release`).  Returns the devices
    kept because they were in use (recorded free)."""
    return Release(m, owner, kind, removable).run()


def release_quietly(m: DeviceManager, records: Sequence[DeviceRecord]) -> None:
    """Drop the assignments of ``records`` (expired claims), keeping the
    devices: one durable transaction."""
    with apply(m):
        for record in records:
            m.ledger.release(record.uuid)
