"""Recovery: make sysfs and the ledger agree again (start-up, a host reboot, a
parent coming back, work a failed privileged helper left).

In order, under the operation's lock: each backend prepares the host (a
pool's VFs enabled again after a reboot; under an intent, as every write
of the protocol); refuse, changing nothing, when an
assigned device would get another owner (its parent another type, or its type
reported by Nova: :func:`owner_refusals`, the rule check-config and a reload
share); settle what a crash left half-done (the protocol's half);
free expired migration claims; give free pool VFs back to their driver;
re-create every recorded device missing from sysfs with the **same UUID on
the same parent and type** (a VF: the same settings), by the backend that
made it (an mdev libvirt's autostart started first is the agent's: see
backends/mdev.py); with ``[libvirt] define_mdevs``, define in libvirt
(autostart off) every owned mdev it does not define; forget a free device
of a type the config dropped (gone with the reboot, nobody needs it back);
report foreign devices, never touched.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import claims, gpu_layout_converge, protocol
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.devices.protocol import Existing
from accel_agent.devices.results import RecoveryReport

if TYPE_CHECKING:
    from collections.abc import Iterable

    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)


def unrecorded_warning(ledger_path: str, uuids: list[str]) -> str:
    return (
        f"the mdev ledger {ledger_path} was missing, yet {len(uuids)} device(s) of the type "
        f"configured for their parent exist that no record names ({', '.join(uuids)}): if "
        "the agent made them, their assignments are lost. They are treated as foreign "
        "(counted, never touched); adopt each one that is the agent's (accelctl adopt UUID)"
    )


def recover(m: DeviceManager, full_check: bool = False) -> RecoveryReport:
    """Make sysfs and the ledger agree again.

    Refuses, changing nothing, when an assigned device would have to be
    re-created with a type the config no longer gives its parent, or
    (``full_check``: SQLite's integrity_check first) when the ledger is
    corrupt.
    """
    report = RecoveryReport()
    if full_check:
        m.ledger.verify(full=True)
    with protocol.operation(m):
        protocol.prepare_hosts(m)
        snapshot = m.scan()
        devices = Existing(
            snapshot,
            {n: b.outside_devices() for n, b in m.backends.items() if b.outside_snapshot},
        )
        _check_recreatable(m, devices)
        protocol.settle_interrupted(m, devices, report)
        report.released_claims += claims.release_expired(m)
        _return_free_vfs(m, report)
        _recreate_missing(m, devices, report)
        # [libvirt] define_mdevs: what a crash (or libvirt down) left undefined.
        protocol.define_made(
            m, [r.uuid for r in m.ledger.all() if r.state is DeviceState.PRESENT]
        )
        owned = {r.uuid for r in m.ledger.all()}
        # What this recovery removed is in the snapshot it started from, and
        # recorded nowhere now: gone, not foreign.
        gone = set(report.removed)
        report.foreign = sorted(u for u in snapshot.mdevs if u not in owned and u not in gone)
        report.unrecorded = unrecorded(m, snapshot, report.foreign)
    for uuid in report.foreign:
        LOG.info("foreign %s %s: reported and counted, never touched",
                 m.device_kind(snapshot.mdevs[uuid].backend), uuid)
    if report.unrecorded:
        LOG.warning("%s", unrecorded_warning(str(m.ledger.path), report.unrecorded))
    return report


def unrecorded(m: DeviceManager, snapshot: HostSnapshot, foreign: list[str]) -> list[str]:
    """The foreign devices that look like the agent's own, when its ledger was
    lost (the state directory shows the agent ran here, but this process had
    to create the ledger): of the type the config gives their parent, so the
    agent could have made them.

    The agent cannot know more: its UUIDs are random (uuid4) and sysfs
    records no creator, so its lost mdevs and hand-made ones of the
    configured type look the same; and a state directory wiped whole looks
    like a first start (no warning).  They stay foreign (never touched) until
    an operator adopts them; the warning says so."""
    if not m.ledger.lost:
        return []
    found = []
    for uuid in foreign:
        mdev = snapshot.mdevs[uuid]
        parent = snapshot.parents.get(mdev.parent)
        if parent is not None and mdev.mdev_type and mdev.mdev_type in m.policy.types_on(
            parent
        ):
            found.append(uuid)
    return found


def configured_type(policy: DevicePolicy, record: DeviceRecord, devices: Existing) -> str | None:
    """What ``policy`` gives the record's parent now: its type (a VF finds its
    GPU's; on a GPU of a mixed-size layout, the record's own type while the
    layout names it), or for a pool VF its pool."""
    if record.backend in devices.outside:
        found = devices.outside[record.backend].get(record.parent)
        return found[0] if found else None
    parent = devices.snapshot.parents.get(record.parent, record.parent)
    if record.device_type in policy.types_on(parent):
        return record.device_type  # one of its GPU's mixed-size layout's types, or its type
    return policy.type_for(parent)


def owner_refusals(
    records: Iterable[DeviceRecord], policy: DevicePolicy, devices: Existing
) -> list[exception.AccelAgentException]:
    """Why ``policy`` would hand a device an instance (or a migration claim)
    holds to another owner: its parent gets another type, another layout's
    or none (RecoveryTypeNotConfigured when the device is gone and would have
    to be re-created, AssignedDeviceRetyped when it exists), or its type is
    ``reported_by = nova``, so Nova would list it for its own guests too
    (AssignedDeviceToNova).

    The one rule of the start (recovery refuses, changing nothing), of a
    reload (refused, the running configuration kept) and of
    ``check-config`` (over the ledger read read-only): what one refuses, the
    others refuse with the same words.  A standing layout's device no
    instance holds is never a reason (it drains, devices/layout.py); nor is
    a VF whose parent is gone (SR-IOV disabled: its type cannot be told; it
    waits for its parent and is judged when that comes back)."""
    errors: list[exception.AccelAgentException] = []
    for record in records:
        if not record.assigned or record.owner_kind is OwnerKind.STANDING:
            continue
        if record.state is not DeviceState.PRESENT:
            continue  # an operation's half: settled by recovery, assigned by nobody yet
        if record.backend != "mdev" and not devices.has_parent(record):
            continue
        kind = str(record.owner_kind or "owner")
        configured = configured_type(policy, record, devices)
        if configured != record.device_type:
            if not devices.exists(record):
                errors.append(exception.RecoveryTypeNotConfigured(
                    uuid=record.uuid, instance=record.owner, mdev_type=record.device_type,
                    parent=record.parent,
                ))
                continue
            errors.append(exception.AssignedDeviceRetyped(
                uuid=record.uuid, kind=kind, owner=record.owner, mdev_type=record.device_type,
                parent=record.parent,
                becomes=f"type {configured}" if configured else "no type",
            ))
        elif policy.nova_reports_on(
            devices.snapshot.parents.get(record.parent, record.parent), configured
        ):
            errors.append(exception.AssignedDeviceToNova(
                uuid=record.uuid, kind=kind, owner=record.owner, mdev_type=record.device_type,
                parent=record.parent,
            ))
    return errors


def _check_recreatable(m: DeviceManager, devices: Existing) -> None:
    errors = owner_refusals(m.ledger.assigned(), m.policy, devices)
    if errors:
        raise exception.ConfigErrors(errors)


def _return_free_vfs(m: DeviceManager, report: RecoveryReport) -> None:
    """Pool VFs recorded free (a release that found one in use): back to
    their driver now if nothing holds them any more."""
    for record in m.ledger.all():
        if record.free and m.backend(record.backend).unmade_on_release:
            if protocol.remove_owned(m, record.uuid):
                report.removed.append(record.uuid)
            else:
                report.kept_in_use.append(record.uuid)


def _recreate_missing(m: DeviceManager, devices: Existing, report: RecoveryReport) -> None:
    missing = [r for r in m.ledger.all()
               if not devices.exists(r) and r.state is DeviceState.PRESENT
               and devices.has_parent(r)]
    # A GPU of a mixed-size layout takes its mode before any type is written
    # on it (gpu_layout_converge.py): its vGPUs wait while it cannot.
    not_ready = gpu_layout_converge.prepare_for_recovery(m, devices.snapshot, missing)
    for record in m.ledger.all():
        if devices.exists(record) or record.state is not DeviceState.PRESENT:
            continue
        parent = devices.snapshot.parents.get(record.parent)
        if parent is not None and parent.physfn in not_ready:
            LOG.warning("%s %s waits for GPU %s to take its layout's mode (health says why)",
                        m.device_kind(record.backend), record.uuid, parent.physfn)
            report.waiting_for_parent.append(record.uuid)
            continue
        if not devices.has_parent(record):
            LOG.warning("%s %s waits for parent %s to come back",
                        m.device_kind(record.backend), record.uuid, record.parent)
            report.waiting_for_parent.append(record.uuid)
            continue
        unheld = not record.assigned or record.owner_kind is OwnerKind.STANDING
        if unheld and configured_type(m.policy, record, devices) != record.device_type:
            # A free device (or a layout's) of a type the config dropped:
            # nobody needs it back, and it is gone from sysfs already (a
            # reboot): nothing leaks.
            protocol.forget_gone(m, record)
            report.forgotten.append(record.uuid)
            LOG.info(
                "forgot free %s %s: gone from sysfs, and the config no longer gives "
                "%s type %s", m.device_kind(record.backend), record.uuid, record.parent,
                record.device_type,
            )
            continue
        protocol.remake(m, record)
        report.recreated.append(record.uuid)
        LOG.info(
            "re-created %s %s (%s on %s) for %s",
            m.device_kind(record.backend),
            record.uuid,
            record.device_type,
            record.parent,
            record.owner or "reuse",
        )
