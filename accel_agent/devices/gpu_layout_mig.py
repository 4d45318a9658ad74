"""Bring each GPU of a MIG-backed layout (``[gpu_layout_<name>]`` with
``mig``, issue 37) to its layout, in the order NVIDIA's driver needs
(docs/design.md §16; NVIDIA AI Enterprise, "Configuring a GPU for
MIG-Backed vGPUs"):

1. **VFs present**: only a GPU with VFs on the host is converged at all
   (gpu_layout_state.layout_gpus): enabling the VFs (``sriov-manage -e``)
   wipes every GPU instance, so one made before them is lost;
2. **MIG mode current** (:func:`ensure_mode`): on, go on; off and nothing
   in use on the GPU (no vGPU on it), set through NVML and read back;
   pending (a change that waits for a GPU reset, or set while the GPU was
   busy) or NVML's RESET_REQUIRED: the GPU is short with "needs a GPU
   reset" and nothing on it is touched.  The agent never resets a GPU and
   never enables MIG on a GPU with a vGPU on it;
3. **GPU instances created at planned placements, read back**
   (:func:`ensure_instances`): the layout's instances (``mig``, checked
   against its types by gpu_layout_fit.mig_needed) planned by
   mig_plan.plan around those that exist and hold a vGPU (``fixed``:
   never moved, never destroyed), each created then found in NVML's list
   at its profile and placement; a free instance the layout has no use for
   is destroyed (NVML refuses one in use anyway).  Each instance is
   recorded in the ledger (schema 7: GPU, placement, profile, the layout);
   one recorded and gone (nothing MIG survives a reboot, a driver reload,
   a GPU reset or a VF enable) is rebuilt at its recorded placement first;
4. **MIG-backed types written to VFs, each VF's ``gpu_instance_id`` read
   back**: one vGPU at a time on a free VF (the driver puts it on a free
   instance of its type's profile); then every vGPU of the layout must
   read back on a distinct instance of its type's profile.

A GPU taken out of every MIG-backed layout (dropped from ``gpus``, its
layout disabled or made time-sliced) keeps nothing of the agent's:
:func:`release_dropped` destroys each GPU instance the agent recorded there
once no vGPU uses it (its vGPUs drain first, as a layout's devices do) and
forgets its record.  MIG mode is left as it is: turning it off is the
operator's choice, and needs an idle GPU.

Recovery calls :func:`prepare` (steps 2 and 3) before it re-types the
recorded vGPUs of such a GPU after a reboot, a driver reload, a GPU reset
or a VF re-enable, so their instances are there first.  What cannot be
done leaves the GPU short with the reason (``DeviceManager.mixed_reasons``,
health's ``layout.short``).  Free devices join or leave and a changed
layout drains as for a time-sliced layout (gpu_layout_converge's
``settle_devices``, gpu_layout_state's draining).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import gpu_layout_fit, mig_plan, protocol
from accel_agent.devices import gpu_layout_state as state
from accel_agent.devices.ledger import DeviceState
from accel_agent.nvml.types import Placement

if TYPE_CHECKING:
    from accel_agent.devices.gpu_layouts import GpuLayout
    from accel_agent.devices.layout import LayoutReport
    from accel_agent.devices.ledger import GpuInstanceRecord
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.nvml.types import GpuInstance
    from accel_agent.sysfs.model import HostSnapshot, Mdev

LOG = logging.getLogger(__name__)


class MigShort(Exception):
    """This GPU stops here, for ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _vgpus_on(snapshot: HostSnapshot, gpu: str) -> list[Mdev]:
    return sorted((m for m in snapshot.mdevs.values()
                   if (p := snapshot.parents.get(m.parent)) is not None and p.physfn == gpu),
                  key=lambda m: m.parent)


def ensure_mode(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> None:
    """MIG mode current on ``gpu`` (module docstring, step 2); raises
    :class:`MigShort` with why not."""
    nvml = m.nvml
    try:
        mode = nvml.mig_mode(gpu)
        if mode.current:
            return
        if mode.pending:
            raise MigShort(f"{state.NEEDS_RESET}: MIG mode is pending (on after the next "
                           "GPU reset); the agent never resets a GPU")
        held = _vgpus_on(snapshot, gpu)
        if held:
            raise MigShort(f"{state.MIG_IN_USE}: {len(held)} vGPU(s) exist on it "
                           f"({', '.join(v.parent for v in held)}); remove them, or reboot, "
                           "and the agent sets it")
        mode = protocol.set_mig_mode(m, gpu)
    except exception.NvmlNotAvailable as exc:
        raise MigShort(f"{state.NVML_UNAVAILABLE}: {exc.message}") from None
    except exception.NvmlNotSupported as exc:
        raise MigShort(f"{gpu_layout_fit.MIG_NOT_SUPPORTED}: {exc.message}") from None
    except (exception.NvmlResetRequired, exception.NvmlInUse) as exc:
        raise MigShort(f"{state.NEEDS_RESET}: {exc.message}") from None
    except exception.NvmlError as exc:
        raise MigShort(f"MIG mode cannot be set: {exc.message}") from None
    if not mode.current:
        raise MigShort(f"{state.NEEDS_RESET}: MIG mode set, it reads back pending (the GPU "
                       "was busy); the agent never resets a GPU")
    LOG.info("GPU %s: MIG mode set and read back on", gpu)


def ensure_instances(
    m: DeviceManager, snapshot: HostSnapshot, gpu: str, layout: GpuLayout
) -> tuple[GpuInstance, ...]:
    """The layout's GPU instances on ``gpu`` (module docstring, step 3), MIG
    mode being on; the GPU's instances afterwards.  Raises :class:`MigShort`."""
    nvml = m.nvml
    try:
        needed = gpu_layout_fit.mig_needed(nvml, gpu, layout)
        existing = nvml.gpu_instances(gpu)
        recorded = _recorded(m, snapshot, gpu)
    except (exception.MigLayoutInvalid, exception.LayoutCannotFit) as exc:
        raise MigShort(f"{state.DOES_NOT_FIT}: {exc.message}") from None
    except exception.NvmlNotAvailable as exc:
        raise MigShort(f"{state.NVML_UNAVAILABLE}: {exc.message}") from None
    except exception.NvmlError as exc:
        raise MigShort(f"{state.DOES_NOT_FIT}: {exc.message}") from None
    used = {v.gpu_instance_id for v in _vgpus_on(snapshot, gpu) if v.gpu_instance_id}
    # An instance a vGPU holds stays where it is; free ones stay while the
    # layout needs one of their profile, the others go.
    room = {n.profile.profile_id: n.count for n in needed}
    for profile_id, count in recorded.items():
        # More vGPUs of a profile recorded than a shrunk layout names (held
        # by instances, they drain): after a wipe their instances are
        # rebuilt for recovery to re-type them on, not forgotten as surplus.
        room[profile_id] = max(room.get(profile_id, 0), count)
    for gi in existing:
        if gi.gpu_instance_id in used:
            room[gi.profile_id] = room.get(gi.profile_id, 0) - 1
    kept: list[GpuInstance] = [g for g in existing if g.gpu_instance_id in used]
    for gi in sorted(existing, key=lambda g: g.gpu_instance_id):
        if gi.gpu_instance_id in used:
            continue
        if room.get(gi.profile_id, 0) > 0:
            room[gi.profile_id] -= 1
            kept.append(gi)
            continue
        try:
            protocol.destroy_gpu_instance(m, gpu, gi)
        except exception.NvmlError as exc:
            raise MigShort(f"{state.DOES_NOT_FIT}: GPU instance {gi.gpu_instance_id} the "
                           f"layout has no use for cannot be destroyed: {exc.message}") from None
        LOG.info("GPU %s: destroyed free GPU instance %d (profile %d at %s): the layout "
                 "has no use for it", gpu, gi.gpu_instance_id, gi.profile_id, gi.placement)
    known = {(r.start, r.size, r.profile_id, r.owner) for r in m.ledger.gpu_instances(gpu)}
    for gi in kept:
        if (gi.placement.start, gi.placement.size, gi.profile_id, layout.section) not in known:
            # The layout's now (one made before a crash, too).
            protocol.record_gpu_instance(m, gpu, gi, layout.section)
    # The instances recorded and gone (a reboot, a reload, a reset, a VF
    # enable): rebuilt where they were while the layout still needs them.
    here = {g.placement.start for g in kept}
    for recorded in m.ledger.gpu_instances(gpu):
        if recorded.start in here:
            continue
        place = Placement(recorded.start, recorded.size)
        if room.get(recorded.profile_id, 0) <= 0 or any(
                place.overlaps(g.placement) for g in kept):
            protocol.forget_gpu_instance(m, gpu, recorded.start)
            continue
        try:
            made = _create(m, gpu, layout.section, recorded.profile_id, place)
        except MigShort as short:
            # A record the GPU no longer takes (another profile table, a
            # hand-edited ledger): forgotten, and the instance planned afresh.
            LOG.warning("GPU %s: recorded GPU instance profile %d@%s not rebuilt (%s); "
                        "planned afresh", gpu, recorded.profile_id, place, short.reason)
            protocol.forget_gpu_instance(m, gpu, recorded.start)
            continue
        room[recorded.profile_id] -= 1
        kept.append(made)
        here.add(recorded.start)
    try:
        plan = mig_plan.plan(gpu, needed, kept)
    except exception.MigPlacementsDoNotFit as exc:
        raise MigShort(f"{state.DOES_NOT_FIT}: {exc.message}") from None
    for planned in plan.new:
        _create(m, gpu, layout.section, planned.profile_id, planned.placement)
    return nvml.gpu_instances(gpu)


def _recorded(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> dict[int, int]:
    """GPU instance profile id -> the vGPUs of a MIG-backed type the ledger
    records on ``gpu`` (typed, or after a reboot, a driver reload or a VF
    enable not yet again: recovery re-types each on an instance of its
    profile)."""
    profile_of = {f"{gpu_layout_fit.TYPE_PREFIX}{t.type_id}": t.gpu_instance_profile_id
                  for t in m.nvml.vgpu_types(gpu)}
    recorded: dict[int, int] = {}
    for record in m.ledger.all():
        parent = snapshot.parents.get(record.parent)
        if parent is None or parent.physfn != gpu or record.state is not DeviceState.PRESENT:
            continue
        profile_id = profile_of.get(str(record.device_type))
        if profile_id is not None:
            recorded[profile_id] = recorded.get(profile_id, 0) + 1
    return recorded


def _create(
    m: DeviceManager, gpu: str, owner: str, profile_id: int, placement: Placement
) -> GpuInstance:
    """One GPU instance created, read back and recorded as ``owner``'s (a
    layout's section)."""
    where = f"profile {profile_id}@{placement}"
    try:
        made = protocol.create_gpu_instance(m, gpu, profile_id, placement, owner)
    except exception.NvmlError as exc:
        raise MigShort(f"{state.GI_READ_BACK}: {where} could not be created: "
                       f"{exc.message}") from None
    if made is None:
        raise MigShort(f"{state.GI_READ_BACK}: {where} was created and NVML does not list it "
                       "there")
    LOG.info("GPU %s: GPU instance %d created at %s", gpu, made.gpu_instance_id, where)
    return made


def prepare(m: DeviceManager, snapshot: HostSnapshot, gpu: str, layout: GpuLayout) -> None:
    """Steps 2 and 3 (module docstring): what a MIG-backed vGPU needs before
    its type is written.  Raises :class:`MigShort`."""
    ensure_mode(m, snapshot, gpu)
    ensure_instances(m, snapshot, gpu, layout)


def converge_gpu(
    m: DeviceManager, snapshot: HostSnapshot, gpu: str, layout: GpuLayout, report: LayoutReport
) -> None:
    """One GPU of a MIG-backed layout (module docstring).  Raises
    :class:`MigShort` where it stops."""
    from accel_agent.devices import gpu_layout_converge

    ensure_mode(m, snapshot, gpu)
    if gpu_layout_converge.settle_devices(m, snapshot, gpu, layout, report):
        snapshot = m.scan()
    instances = ensure_instances(m, snapshot, gpu, layout)
    snapshot = m.scan()  # the VFs list the types of the instances just made
    records = gpu_layout_converge.records_on(m, snapshot, gpu)
    # Recorded ones missing from the host are recovery's to re-type, on the
    # instances just made: counted as there.
    have = [r.device_type for r in records]
    missing = [t for t, n in layout.vgpus for _ in range(max(0, n - have.count(t)))]
    if missing:
        recorded = {r.parent for r in records}
        free = sorted(p.name for p in snapshot.parents.values()
                      if p.physfn == gpu and p.name not in recorded
                      and not snapshot.by_parent.get(p.name))
        for device_type in missing:
            if not free:
                raise MigShort(f"{state.NO_FREE_VF}: every VF of the GPU holds a vGPU or is "
                               "recorded")
            item = protocol.PlanItem(protocol.Slot(free.pop(0), None), device_type)
            report.created += protocol.make_and_assign(m, snapshot, protocol.LAYOUT,
                                                       [item]).uuids
        snapshot = m.scan()
    check_instances(gpu, layout, _vgpus_on(snapshot, gpu), instances, m)


def check_instances(
    gpu: str, layout: GpuLayout, vgpus: list[Mdev], instances: tuple[GpuInstance, ...],
    m: DeviceManager,
) -> None:
    """Each vGPU of the layout's types read back on its own GPU instance of
    its type's profile (``nvidia/gpu_instance_id``).  Raises
    :class:`MigShort` naming the first that is not."""
    profile_of = {f"{gpu_layout_fit.TYPE_PREFIX}{t.type_id}": t.gpu_instance_profile_id
                  for t in m.nvml.vgpu_types(gpu)}
    by_id = {g.gpu_instance_id: g for g in instances}
    seen: dict[int, str] = {}
    for vgpu in vgpus:
        if vgpu.mdev_type not in layout.types:
            continue
        gi = by_id.get(vgpu.gpu_instance_id or -1)
        if gi is None or gi.profile_id != profile_of.get(str(vgpu.mdev_type)):
            raise MigShort(
                f"{state.GI_READ_BACK}: the vGPU on {vgpu.parent} ({vgpu.mdev_type}) reads "
                f"back nvidia/gpu_instance_id {vgpu.gpu_instance_id}, no GPU instance of its "
                f"profile {profile_of.get(str(vgpu.mdev_type))} on the GPU")
        if gi.gpu_instance_id in seen:
            raise MigShort(f"{state.GI_READ_BACK}: the vGPUs on {seen[gi.gpu_instance_id]} "
                           f"and {vgpu.parent} read back the same GPU instance "
                           f"{gi.gpu_instance_id}")
        seen[gi.gpu_instance_id] = vgpu.parent


def prepare_recorded(m: DeviceManager, snapshot: HostSnapshot, gpu: str) -> None:
    """What recovery needs on a GPU no MIG-backed layout names any more but
    whose GPU instances are still recorded (a guest's vGPU kept them,
    :func:`release_dropped`): after a reboot, a driver reload or a VF enable
    wiped them, MIG mode and those instances come back at their recorded
    placements, so the guest's vGPUs are re-typed, not lost.  They go once
    free, as before.  Raises :class:`MigShort`."""
    ensure_mode(m, snapshot, gpu)
    try:
        existing = {(g.placement.start, g.placement.size, g.profile_id)
                    for g in m.nvml.gpu_instances(gpu)}
    except exception.NvmlError as exc:
        raise MigShort(f"{state.NVML_UNAVAILABLE}: {exc.message}") from None
    for record in m.ledger.gpu_instances(gpu):
        if (record.start, record.size, record.profile_id) not in existing:
            _create(m, gpu, record.owner, record.profile_id,
                    Placement(record.start, record.size))


def release_dropped(m: DeviceManager, snapshot: HostSnapshot) -> None:
    """The GPU instances recorded on GPUs no MIG-backed layout names any
    more (module docstring): a free one destroyed, its record forgotten; one
    a vGPU uses kept, recorded, until that vGPU is gone (a later converge);
    a record whose instance is gone forgotten."""
    recorded_on: dict[str, list[GpuInstanceRecord]] = {}
    for record in m.ledger.gpu_instances():
        recorded_on.setdefault(record.gpu, []).append(record)
    for gpu, records in sorted(recorded_on.items()):
        layout = m.policy.gpu_layout_for(gpu)
        if layout is not None and layout.is_mig:
            continue
        try:
            existing = {(g.placement.start, g.placement.size, g.profile_id): g
                        for g in m.nvml.gpu_instances(gpu)}
        except exception.NvmlError as exc:
            LOG.debug("GPU %s: GPU instances of a former MIG layout not read: %s", gpu,
                      exc.message)
            continue
        used = {v.gpu_instance_id for v in _vgpus_on(snapshot, gpu) if v.gpu_instance_id}
        for record in records:
            gi = existing.get((record.start, record.size, record.profile_id))
            if gi is None:
                protocol.forget_gpu_instance(m, gpu, record.start)
                continue
            if gi.gpu_instance_id in used:
                continue
            try:
                protocol.destroy_gpu_instance(m, gpu, gi)
            except exception.NvmlError as exc:  # in use after all: a later converge
                LOG.warning("GPU %s: GPU instance %d of the former layout %s kept: %s", gpu,
                            gi.gpu_instance_id, record.owner, exc.message)
                continue
            LOG.info("GPU %s: destroyed GPU instance %d (profile %d at %s): no MIG-backed "
                     "layout names the GPU any more", gpu, gi.gpu_instance_id, gi.profile_id,
                     gi.placement)
