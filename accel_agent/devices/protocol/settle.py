"""Recovery's half of the protocol (devices/recovery.py decides the order):
the host's preparation under an intent, what a crash left half-done
settled from what sysfs shows, a recorded device made again, a gone one
forgotten."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices.ledger import (
    DeviceRecord,
    DeviceState,
    GpuInstanceRecord,
    IntentKind,
    OwnerKind,
)
from accel_agent.devices.protocol.libvirt_defs import undefine_or_keep
from accel_agent.devices.protocol.remove import remove_owned
from accel_agent.devices.protocol.runs import LOG, step

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.results import RecoveryReport
    from accel_agent.nvml.types import GpuInstance, MigMode, Placement
    from accel_agent.sysfs.model import HostSnapshot


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


def prepare_hosts(m: DeviceManager) -> None:
    """What each backend needs first (a pool's VFs enabled after a reboot:
    ``sriov_numvfs``, a privileged write), under an intent like every write
    of the protocol: crash point ``prepare.intent`` before the first
    backend's, ``prepare.prepared`` after each.

    The intent is of kind ``recover``: the ledger's ``intents`` table allows
    four kinds (a CHECK constraint) and a fifth would need a migration of
    the table, and host preparation is recovery's first step.  It records no
    device row: a preparation is idempotent, so what a crash leaves is
    settled by doing it again, which the next recovery does before it ends
    every intent (:func:`settle_interrupted`).  A backend that cannot
    prepare the host is logged and the recovery goes on, as always.

    The intent's two commits leave the ledger as it was: they are no change
    (``m.mutations`` is taken back), so a recovery that changed nothing asks
    for no rescan."""
    mark = m.mutations
    with m.ledger.transaction(durable=False):
        intent = m.ledger.begin_intent(IntentKind.RECOVER)
    m.forget_changes_since(mark)
    step(m, "prepare.intent")
    for backend in m.backends.values():
        failure: exception.AccelAgentException | None = None
        try:
            backend.prepare_host()
        except exception.AccelAgentException as exc:
            failure = exc
        if failure is not None:  # outside the except clause: said once
            LOG.warning("backend %s cannot prepare the host: %s", backend.name, failure)
        step(m, "prepare.prepared")
    mark = m.mutations
    with m.ledger.transaction(durable=False):
        m.ledger.finish_intent(intent)
    m.forget_changes_since(mark)


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
    backend = m.backend(record.backend)
    backend.make(m.writer, record.parent, record.device_type, record.uuid, record.settings)
    if record.placement_id is not None:
        # A mixed-size layout's vGPU: back on its recorded placement before
        # any other vGPU of its GPU is typed (the driver placed it anywhere).
        step(m, "recover.typed")
        backend.place(m.writer, record.parent, record.placement_id)


def place_again(m: DeviceManager, record: DeviceRecord, placement_id: int) -> None:
    """Put an existing vGPU (no guest holds it) at ``placement_id`` and
    record it: recorded first, so a crash between leaves a record the next
    converge compares with the read-back and writes again."""
    if record.placement_id != placement_id:
        m.ledger.set_placement(record.uuid, placement_id)
    m.backend(record.backend).place(m.writer, record.parent, placement_id)


def record_placement(m: DeviceManager, uuid: str, placement_id: int | None) -> None:
    """A placement the host shows and the agent keeps (a device in use is
    never moved: what it runs on is the truth)."""
    m.ledger.set_placement(uuid, placement_id)


def forget_gone(m: DeviceManager, record: DeviceRecord) -> None:
    """A free device (or a standing layout's) gone from sysfs that nobody
    needs back (its type was dropped): forgotten."""
    with m.ledger.transaction():
        if record.owner_kind is OwnerKind.STANDING:
            m.ledger.release(record.uuid)
        m.ledger.forget(record.uuid)


def set_mig_mode(m: DeviceManager, gpu: str) -> MigMode:
    """NVML's MIG mode on for ``gpu`` (its write in the ``nvml_admin`` helper
    on a real host); the mode asked again afterwards rather than trusted
    from the write's answer (a busy GPU leaves it pending).  Only for a GPU
    nothing is in use on (the caller's check, devices/gpu_layout_mig.py).
    A privileged write: counted as a change."""
    m.note_write()
    m.nvml.set_mig_mode(gpu, True)
    step(m, "mig.mode_set")
    return m.nvml.mig_mode(gpu)


def create_gpu_instance(m: DeviceManager, gpu: str, profile_id: int,
                        placement: Placement, owner: str) -> GpuInstance | None:
    """A GPU instance of ``profile_id`` at ``placement`` on ``gpu``, then the
    GPU's instances read back: the one found there with that profile,
    recorded in the ledger as ``owner``'s (a layout's section), or None (the
    caller says the GPU is short).  A crash between the two leaves an
    instance the next converge finds and records.  A privileged write."""
    m.note_write()
    m.nvml.create_gpu_instance(gpu, profile_id, placement)
    step(m, "mig.instance_created")
    made = next((g for g in m.nvml.gpu_instances(gpu)
                 if g.profile_id == profile_id and g.placement == placement), None)
    if made is not None:
        record_gpu_instance(m, gpu, made, owner)
        step(m, "mig.instance_recorded")  # made and recorded, no type written on it yet
    return made


def record_gpu_instance(m: DeviceManager, gpu: str, instance: GpuInstance, owner: str) -> None:
    """An existing GPU instance recorded as ``owner``'s (a layout's section)."""
    m.ledger.record_gpu_instance(GpuInstanceRecord(
        gpu, instance.placement.start, instance.placement.size, instance.profile_id, owner))


def forget_gpu_instance(m: DeviceManager, gpu: str, start: int) -> None:
    """A recorded GPU instance the layouts no longer rebuild."""
    m.ledger.forget_gpu_instance(gpu, start)


def destroy_gpu_instance(m: DeviceManager, gpu: str, instance: GpuInstance) -> None:
    """A GPU instance no vGPU uses (the caller's check; NVML refuses one in
    use with IN_USE, raised as NvmlInUse), then its record.  A privileged
    write."""
    m.note_write()
    m.nvml.destroy_gpu_instance(gpu, instance.gpu_instance_id)
    step(m, "mig.instance_destroyed")
    m.ledger.forget_gpu_instance(gpu, instance.placement.start)


def set_mixed_size_mode(m: DeviceManager, gpu: str) -> bool:
    """NVML's mixed-size ("heterogeneous") mode on for ``gpu``, through the
    manager's NVML (its write in the ``nvml_admin`` helper on a real host);
    what NVML reads back afterwards, asked again rather than trusted from
    the write's answer.  A privileged write: counted as a change."""
    m.note_write()
    m.nvml.set_heterogeneous_mode(gpu, True)
    step(m, "layout.mode_set")
    return bool(m.nvml.heterogeneous_mode(gpu))
