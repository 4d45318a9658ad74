"""Bring each GPU of a mixed-size layout (``[gpu_layout_<name>]``, issue 36)
to its layout, in the order NVIDIA's driver needs (docs/design.md §16):

1. **VFs present**: a GPU without VFs is missing (the start waits for it,
   ``[devices] standing_vf_wait``, as for a standing layout);
2. **mixed-size mode set and read back** through NVML, only while the GPU
   holds no vGPU (NVML answers IN_USE otherwise, and equal-size mode would
   have locked the GPU to the first vGPU's size): enabling the VFs
   (``sriov-manage -e``), a reboot, a driver reload and a GPU reset all
   clear it, so every converge reads it again and sets it again where it
   is off (:func:`ensure_mode`; recovery calls it too, before it types a
   recorded vGPU of such a GPU);
3. **types written, then placements written and read back**, one vGPU at a
   time: its type, then its planned placement (devices/placements.py), so
   the next vGPU's type write finds every earlier one where the plan put it
   (the driver places a new vGPU anywhere free).

Before it makes anything the converge takes free devices of the layout's
types into it, removes the layout's devices no longer wanted (never one in
use: it drains, devices/gpu_layout_state.py), and checks each kept
device's placement against the ledger: a layout device that reads back
elsewhere is placed again (and removed when that fails); a device an
instance holds is never moved, its placement is what the planner keeps
(``fixed``).  What cannot be done leaves the GPU short with the reason
(``DeviceManager.mixed_reasons``, health's ``layout.short``): not capable,
in use so the mode cannot be set, does not fit, a placement read back
differs, NVML unavailable.  Every decision and write goes through the
operation protocol, under the operation's lock (the caller's).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import gpu_layout_mig, placements, protocol
from accel_agent.devices import gpu_layout_state as state
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind

if TYPE_CHECKING:
    from accel_agent.devices.gpu_layouts import GpuLayout
    from accel_agent.devices.layout import LayoutReport
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)


class _Short(Exception):
    """This GPU stops here, for ``reason`` (said once per GPU)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _vgpus_on(snapshot: HostSnapshot, gpu: str) -> list[str]:
    return sorted(
        m.parent for m in snapshot.mdevs.values()
        if (p := snapshot.parents.get(m.parent)) is not None and p.physfn == gpu
    )


def ensure_mode(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> str | None:
    """What the vGPUs of ``gpu``'s layout need before a type is written:
    mixed-size mode (:func:`ensure_mixed_mode`), or for a MIG-backed layout
    MIG mode and the GPU instances (a MIG-backed type is creatable only on
    a free instance of its profile; gpu_layout_mig.prepare).  None when
    ready, else why not."""
    layout = m.policy.gpu_layout_for(gpu)
    if layout is not None and layout.is_mig:
        try:
            gpu_layout_mig.prepare(m, snapshot, gpu, layout)
        except gpu_layout_mig.MigShort as short:
            return short.reason
        return None
    return ensure_mixed_mode(m, snapshot, gpu)


def ensure_mixed_mode(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> str | None:
    """Mixed-size mode on for ``gpu`` (set and read back where it is off and
    the GPU holds no vGPU); None when it is on, else why not."""
    nvml = m.nvml
    try:
        if nvml.heterogeneous_mode(gpu):
            return None
        held = _vgpus_on(snapshot, gpu)
        if held:
            return (f"{state.MODE_IN_USE}: {len(held)} vGPU(s) exist on it "
                    f"({', '.join(held)}); remove them, or reboot, and the agent sets it")
        if not nvml.heterogeneous_capable(gpu):
            return (f"{state.NOT_CAPABLE}: NVML says the GPU has no heterogeneous "
                    "time-slice sizes capability")
        if not protocol.set_mixed_size_mode(m, gpu):
            return f"{state.MODE_NOT_SET} after it was set (NVML)"
    except exception.NvmlNotAvailable as exc:
        return f"{state.NVML_UNAVAILABLE}: {exc.message}"
    except exception.NvmlInUse as exc:
        return f"{state.MODE_IN_USE}: {exc.message}"
    except exception.NvmlError as exc:
        return f"mixed-size mode cannot be set: {exc.message}"
    LOG.info("GPU %s: mixed-size (vGPU heterogeneous) mode set and read back on", gpu)
    return None


def prepare_for_recovery(
    m: DeviceManager, snapshot: HostSnapshot, records: Iterable[DeviceRecord]
) -> set[str]:
    """Before recovery types the recorded vGPUs it re-creates: the mode of
    each GPU of a mixed layout they are on (a type written first would lock
    the GPU to one size); for a MIG-backed layout, MIG mode and the GPU
    instances (gpu_layout_mig.prepare), and on a GPU taken out of every MIG
    layout the instances its guests' vGPUs still need
    (gpu_layout_mig.prepare_recorded).  Returns the GPUs whose mode is not on: their
    vGPUs wait (the converge says why in health)."""
    gpus = {
        parent.physfn for r in records
        if (parent := snapshot.parents.get(r.parent)) is not None
        and state.on_mixed_gpu(m.policy, parent)
    }
    # A GPU out of every MIG layout whose instances a guest's vGPU kept
    # recorded (gpu_layout_mig.release_dropped): they are rebuilt too.
    with_instances = {r.gpu for r in m.ledger.gpu_instances()}
    formerly_mig = {
        parent.physfn for r in records
        if (parent := snapshot.parents.get(r.parent)) is not None
        and parent.physfn in with_instances and parent.physfn not in gpus
    }
    not_ready: set[str] = set()
    for gpu in sorted(g for g in formerly_mig if g):
        try:
            gpu_layout_mig.prepare_recorded(m, snapshot, gpu)
        except gpu_layout_mig.MigShort as short:
            not_ready.add(gpu)
            LOG.warning("GPU %s: its recorded vGPUs wait: %s", gpu, short.reason)
    for gpu in sorted(g for g in gpus if g):
        reason = ensure_mode(m, snapshot, gpu)
        if reason is not None:
            m.mixed_reasons[gpu] = reason
            not_ready.add(gpu)
            LOG.warning("GPU %s: its recorded vGPUs wait: %s", gpu, reason)
    return not_ready


def converge(m: DeviceManager, snapshot: HostSnapshot, report: LayoutReport) -> bool:
    """Every GPU of a mixed layout on the host (module docstring).  One GPU
    that fails keeps no other from its layout.  True when a device was made
    or removed on one of them (``snapshot`` is stale there)."""
    before = len(report.created) + len(report.removed)
    gpus = state.layout_gpus(snapshot, m.policy)
    for gpu in list(m.mixed_reasons):
        if gpu not in gpus:
            del m.mixed_reasons[gpu]  # no layout (any more), or not on the host
    for gpu, layout in sorted(gpus.items()):
        try:
            _converge_gpu(m, snapshot, gpu, layout, report)
        except _Short as short:
            if m.mixed_reasons.get(gpu) != short.reason:
                LOG.warning("GPU %s short of its layout %s: %s", gpu, layout.section,
                            short.reason)
            m.mixed_reasons[gpu] = short.reason
        except exception.PrivilegedHelperUnavailable:
            raise
        except exception.AccelAgentException as exc:
            m.mixed_reasons[gpu] = f"{state.MAKE_FAILED}: {exc.message}"
            report.failed[gpu] = exc.message
        else:
            m.mixed_reasons.pop(gpu, None)
    gpu_layout_mig.release_dropped(m, snapshot)
    return len(report.created) + len(report.removed) != before


def records_on(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> list[DeviceRecord]:
    return [
        r for r in m.ledger.all()
        if r.state is DeviceState.PRESENT and r.intent_id is None
        and (p := snapshot.parents.get(r.parent)) is not None and p.physfn == gpu
    ]


def _converge_gpu(
    m: DeviceManager, snapshot: HostSnapshot, gpu: str, layout: GpuLayout, report: LayoutReport
) -> None:
    if layout.is_mig:
        try:
            gpu_layout_mig.converge_gpu(m, snapshot, gpu, layout, report)
        except gpu_layout_mig.MigShort as short:
            raise _Short(short.reason) from None
        return
    reason = ensure_mode(m, snapshot, gpu)
    if reason is not None:
        raise _Short(reason)
    if settle_devices(m, snapshot, gpu, layout, report):
        snapshot = m.scan()  # what went or moved: the rest comes from a new scan
    records = records_on(m, snapshot, gpu)
    kept = _kept(m, snapshot, gpu, layout, records, report)
    have = [placed.device_type for _, placed in kept]
    if all(have.count(t) >= n for t, n in layout.vgpus):
        return  # in place: no plan to make (and no NVML placement reads)
    vf_backend = next(p.backend for p in snapshot.parents.values() if p.physfn == gpu)
    types = _placements(m, gpu, layout, {p.device_type for _, p in kept}, vf_backend)
    plan = _plan(gpu, layout, types, kept)
    if plan is None:
        return
    _check(gpu, plan, types)
    moving = [r for r, placed in kept if placed not in plan.fixed]
    if moving:
        # Idle layout devices where the new plan wants others: they go, and
        # the plan's vGPUs are made in their place (a changed layout that
        # only fits with them elsewhere).
        for record in moving:
            if not protocol.remove_from_layout(m, record.uuid):
                raise _Short(f"{state.DOES_NOT_FIT}: it fits only once {record.uuid} on "
                             f"{record.parent} moves, and it is in use")
            report.removed.append(record.uuid)
        snapshot = m.scan()
        records = records_on(m, snapshot, gpu)
    if plan.new:
        _make(m, snapshot, gpu, plan.new, records, report)


def _plan(
    gpu: str,
    layout: GpuLayout,
    types: dict[str, placements.TypePlacements],
    kept: list[tuple[DeviceRecord, placements.Placed]],
) -> placements.Plan | None:
    """Where every vGPU of the layout goes: around every device kept where
    it is; where that does not fit, around those that must stay (held by
    an instance or a claim, draining, or recorded but missing), the idle
    layout devices placed again with the rest, each keeping its place where
    the new plan has one of its type there (``Plan.fixed``)."""
    fixed = [placed for _, placed in kept]
    try:
        return placements.plan(gpu, layout.vgpus, types, fixed)
    except exception.PlacementsDoNotFit as exc:
        first = exc
    pinned = [placed for record, placed in kept if not _movable(record, layout)]
    try:
        fresh = placements.plan(gpu, layout.vgpus, types, pinned)
    except exception.PlacementsDoNotFit:
        raise _Short(f"{state.DOES_NOT_FIT}: {first.message}") from None
    # An idle device already where the fresh plan puts one of its type stays.
    new = list(fresh.new)
    stay = list(pinned)
    for record, placed in kept:
        if _movable(record, layout) and placed in new:
            new.remove(placed)
            stay.append(placed)
    return placements.Plan(tuple(stay), tuple(new))


def _movable(record: DeviceRecord, layout: GpuLayout) -> bool:
    """An idle device of the layout (held by it, of a type it names, on the
    host): one the converge may remove to place the layout anew."""
    return (record.owner_kind is OwnerKind.STANDING and record.device_type in layout.types
            and record.placement_id is not None)


def settle_devices(
    m: DeviceManager, snapshot: HostSnapshot, gpu: str, layout: GpuLayout, report: LayoutReport
) -> bool:
    """Free devices of the layout's types join it (up to each count), other
    free ones go; the layout's devices that drain go unless in use.  True
    when something was removed (the snapshot is stale)."""
    from accel_agent.devices import layout as layout_mod

    records = [r for r in records_on(m, snapshot, gpu) if r.uuid in snapshot.mdevs]
    changed = False
    joining: list[str] = []
    for device_type in layout.types:
        of_type = [r for r in records if r.device_type == device_type]
        held = [r for r in of_type if r.assigned]
        free = sorted((r for r in of_type if r.free), key=lambda r: r.uuid)
        room = max(0, layout.count_of(device_type) - len(held))
        joining += [r.uuid for r in free[:room]]
        for record in free[room:]:
            if protocol.remove_owned(m, record.uuid):
                report.removed.append(record.uuid)
                changed = True
    for record in records:
        if (record.free and record.device_type not in layout.types
                and protocol.remove_owned(m, record.uuid)):
            report.removed.append(record.uuid)
            changed = True
    if joining:
        protocol.join_layout(m, joining)
        report.adopted += joining
    drain = layout_mod.draining_of(snapshot, m.policy, *layout_mod.holders_of(m.ledger.all()))
    for record in records_on(m, snapshot, gpu):
        if (record.owner_kind is OwnerKind.STANDING and record.uuid in drain
                and protocol.remove_from_layout(m, record.uuid)):
            report.removed.append(record.uuid)
            changed = True
    return changed


def _kept(
    m: DeviceManager,
    snapshot: HostSnapshot,
    gpu: str,
    layout: GpuLayout,
    records: list[DeviceRecord],
    report: LayoutReport,
) -> list[tuple[DeviceRecord, placements.Placed]]:
    """The devices on the GPU and where they are (the planner's ``fixed``
    unless the layout only fits with some elsewhere).  A layout device
    found elsewhere than recorded is placed again (no guest holds it); one
    an instance holds is never moved: its
    placement is recorded as found.  A recorded device missing from the
    host (recovery re-creates it) keeps its recorded place."""
    fixed: list[tuple[DeviceRecord, placements.Placed]] = []
    for record in records:
        mdev = snapshot.mdevs.get(record.uuid)
        if mdev is None:
            if record.placement_id is not None:
                # Recovery's to re-create: its place is kept, it must not move.
                pinned = dataclasses.replace(record, owner_kind=None)
                fixed.append((pinned, placements.Placed(record.device_type,
                                                        record.placement_id)))
            continue
        found = mdev.placement_id
        wanted = record.placement_id
        if found is None:
            raise _Short(f"{state.READ_BACK}: the vGPU on {record.parent} has no readable "
                         "nvidia/placement_id")
        if wanted is not None and found != wanted and record.owner_kind in (
                None, OwnerKind.STANDING):
            found = _place_again(m, record, wanted, found, report)
        elif wanted != found:
            protocol.record_placement(m, record.uuid, found)
            record = dataclasses.replace(record, placement_id=found)
        fixed.append((record, placements.Placed(record.device_type, found)))
    return fixed


def _place_again(
    m: DeviceManager, record: DeviceRecord, wanted: int, found: int, report: LayoutReport
) -> int:
    """A layout device found at ``found``, recorded at ``wanted``: placed
    again; when that fails, removed (the GPU short), or, in use (a guest
    runs on it, so it booted there), kept where it is."""
    try:
        protocol.place_again(m, record, wanted)
    except (exception.VgpuPlacementMismatch, exception.VgpuPlacementWriteFailed) as exc:
        failure = exc.message
    else:
        LOG.info("vGPU %s on %s placed again at %d (the driver had it at %d)",
                 record.uuid, record.parent, wanted, found)
        return wanted
    removed = (protocol.remove_from_layout(m, record.uuid)
               if record.owner_kind is OwnerKind.STANDING
               else protocol.remove_owned(m, record.uuid))
    if removed:
        report.removed.append(record.uuid)
        raise _Short(f"{state.READ_BACK}: {failure}; the vGPU was removed")
    protocol.record_placement(m, record.uuid, found)
    return found


def _placements(
    m: DeviceManager, gpu: str, layout: GpuLayout, others: Iterable[str], vf_backend: str
) -> dict[str, placements.TypePlacements]:
    """Each type's placement size and supported ids on the GPU, from NVML."""
    found: dict[str, placements.TypePlacements] = {}
    backend = m.backend(vf_backend)
    for device_type in dict.fromkeys((*layout.types, *others)):
        type_id = backend.placement_type_id(device_type)
        if type_id is None:
            raise _Short(f"{state.DOES_NOT_FIT}: {device_type} is no NVIDIA vGPU type")
        try:
            known = m.nvml.vgpu_placements(gpu, type_id)
        except exception.NvmlNotAvailable as exc:
            raise _Short(f"{state.NVML_UNAVAILABLE}: {exc.message}") from None
        except exception.NvmlError as exc:
            raise _Short(f"{state.DOES_NOT_FIT}: the placements of {device_type}: "
                         f"{exc.message}") from None
        found[device_type] = placements.TypePlacements(
            device_type, known.placement_size, tuple(known.supported))
    return found


def _check(gpu: str, plan: placements.Plan, types: dict[str, placements.TypePlacements]) -> None:
    """The last word before a write: every new vGPU on an id its type
    supports, overlapping nothing on the GPU (the planner's promise,
    checked where it is relied on)."""
    spans = [(p, types[p.device_type].span(p.placement_id)) for p in plan.placed]
    for placed, span in spans:
        if placed not in plan.new:
            continue
        if placed.placement_id not in types[placed.device_type].supported:
            raise _Short(f"{state.DOES_NOT_FIT}: {placed.device_type} does not support "
                         f"placement {placed.placement_id}")
        clash = [o for o, s in spans if o is not placed and s.start < span.stop
                 and span.start < s.stop]
        if clash:
            raise _Short(f"{state.DOES_NOT_FIT}: {placed.device_type}@{placed.placement_id} "
                         f"would overlap {clash[0].device_type}@{clash[0].placement_id}")


def _make(
    m: DeviceManager,
    snapshot: HostSnapshot,
    gpu: str,
    new: Iterable[placements.Placed],
    records: list[DeviceRecord],
    report: LayoutReport,
) -> None:
    """One vGPU at a time (module docstring): each its own operation, so a
    vGPU whose placement reads back elsewhere is rolled back alone."""
    recorded = {r.parent for r in records}
    free = sorted(
        p.name for p in snapshot.parents.values()
        if p.physfn == gpu and p.name not in recorded and not snapshot.by_parent.get(p.name)
    )
    for placed in new:
        if not free:
            raise _Short(f"{state.NO_FREE_VF}: every VF of the GPU holds a vGPU or is recorded")
        vf = free.pop(0)
        item = protocol.PlanItem(protocol.Slot(vf, None), placed.device_type,
                                 placement_id=placed.placement_id)
        try:
            made = protocol.make_and_assign(m, snapshot, protocol.LAYOUT, [item]).uuids
        except exception.VgpuPlacementMismatch as exc:
            raise _Short(f"{state.READ_BACK}: {exc.message}; the vGPU was removed") from None
        report.created += made
