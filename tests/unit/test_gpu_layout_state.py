"""What a mixed-size layout wants of a host (issue 36,
devices/gpu_layout_state.py) and what drains (the one rule of every layout,
devices/layout_members.py, as devices/layout.py calls it), over snapshots
of a GPU with four VFs."""

from __future__ import annotations

import dataclasses

from accel_agent.devices import gpu_layout_state as state
from accel_agent.devices import layout, layout_members
from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.devices.policy import DevicePolicy
from accel_agent.sysfs.model import HostSnapshot, Mdev, Parent

GPU, OTHER = "0000:c1:00.0", "0000:c2:00.0"
VFS = [f"0000:c1:00.{f}" for f in (4, 5, 6, 7)]
Q24, Q12, Q4 = "nvidia-1155", "nvidia-1153", "nvidia-1150"
MIX = GpuLayout("mix", (GPU,), ((Q24, 1), (Q12, 1), (Q4, 2)))


def vf(name: str, pf: str = GPU) -> Parent:
    return Parent(name=name, device_path=f"devices/{name}", pci_address=name, physical_gpu=pf,
                  physfn=pf, numa_node=0, driver="nvidia", vendor_id="0x10de",
                  device_id="0x26b9", types={}, backend="nvidia_vfio")


def snapshot(typed: dict[str, str], extra_vfs: tuple[Parent, ...] = ()) -> HostSnapshot:
    parents = {p.name: p for p in (*map(vf, VFS), *extra_vfs)}
    mdevs = [Mdev(uuid=f"00000000-0000-0000-0000-{i:012d}", parent=v, mdev_type=t,
                  iommu_group=i, backend="nvidia_vfio", address=v, placement_id=0)
             for i, (v, t) in enumerate(sorted(typed.items()))]
    return HostSnapshot.build("/sys", parents, {m.uuid: m for m in mdevs})


def uid(i: int) -> str:
    return f"00000000-0000-0000-0000-{i:012d}"


def policy(*layouts: GpuLayout) -> DevicePolicy:
    return DevicePolicy(types=(), gpu_layouts=layouts)


def test_the_gpus_of_a_layout_are_those_with_vfs_the_rest_is_missing() -> None:
    snap = snapshot({})
    both = GpuLayout("mix", (GPU, OTHER), MIX.vgpus)
    assert state.layout_gpus(snap, policy(both)) == {GPU: both}
    assert state.missing_gpus(snap, policy(both)) == (OTHER,)
    assert layout.missing_gpus(snap, policy(both)) == (OTHER,)
    assert state.on_mixed_gpu(policy(MIX), snap.parents[VFS[0]])
    assert not state.on_mixed_gpu(policy(), snap.parents[VFS[0]])


def test_a_type_dropped_by_a_change_drains_and_only_its_members() -> None:
    snap = snapshot({VFS[0]: Q24, VFS[1]: Q12, VFS[2]: Q4, VFS[3]: Q4})
    members = frozenset(uid(i) for i in range(4))
    holders = {uid(0): None, uid(1): "vm-a", uid(2): None, uid(3): None}
    changed = dataclasses.replace(MIX, vgpus=((Q24, 1), (Q4, 2)))
    # vm-a's 12Q is the layout's device of a type it no longer names.
    assert layout_members.draining(snap, policy(changed), holders, members) == {uid(1)}
    assert layout.draining_of(snap, policy(changed), holders, members) == {uid(1)}
    # Not a member (vm-a's own, never the layout's): not the layout's to drain.
    assert layout_members.draining(snap, policy(changed), holders, members - {uid(1)}) == set()


def test_a_lowered_count_drains_instances_devices_first_in_uuid_order() -> None:
    snap = snapshot({VFS[0]: Q24, VFS[1]: Q12, VFS[2]: Q4, VFS[3]: Q4})
    members = frozenset(uid(i) for i in range(4))
    holders = {uid(0): None, uid(1): None, uid(2): None, uid(3): "vm-b"}
    lowered = dataclasses.replace(MIX, vgpus=((Q24, 1), (Q12, 1), (Q4, 1)))
    assert layout_members.draining(snap, policy(lowered), holders, members) == {uid(3)}
    # The standing layouts' rules never see a mixed layout's GPU.
    assert layout.draining_of(snap, policy(lowered), holders, members) == {uid(3)}


def test_short_counts_what_is_there_and_keeps_the_converge_s_reason() -> None:
    snap = snapshot({VFS[0]: Q24, VFS[2]: Q4})
    members = frozenset({uid(0), uid(1)})
    holders = {uid(0): None, uid(1): None}
    found = state.short(snap, policy(MIX), holders, members, {})
    assert found == {GPU: state.MixedShort("gpu_layout_mix", 4, 2, state.DOES_NOT_FIT)}
    full = snapshot({VFS[0]: Q24, VFS[1]: Q12, VFS[2]: Q4, VFS[3]: Q4})
    all_four = {uid(i): None for i in range(4)}
    assert state.short(full, policy(MIX), all_four, frozenset(all_four), {}) == {}
    why = {GPU: f"{state.MODE_IN_USE}: 1 vGPU(s) exist on it"}
    (short,) = state.short(full, policy(MIX), all_four, frozenset(all_four), why).values()
    assert (short.present, short.reason) == (4, why[GPU])
    # Health's row: the GPU, the layout, the count and the reason.
    mixed = layout.state_of(full, policy(MIX), all_four, frozenset(all_four), reasons=why)
    assert mixed.short[GPU].text(GPU) == (
        f"{GPU} has 4 of 4 gpu_layout_mix ({why[GPU]})")


def test_an_instance_s_vgpu_of_a_type_its_mixed_layout_names_is_no_refusal() -> None:
    """Recovery, a reload and check-config share owner_refusals: on a GPU
    of a mixed-size layout, a held vGPU of a type the layout names keeps its
    owner; one of a type it no longer names would be retyped: refused."""
    from accel_agent.devices import recovery
    from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
    from accel_agent.devices.protocol import Existing

    snap = snapshot({VFS[1]: Q12})

    def held(device_type: str) -> DeviceRecord:
        return DeviceRecord(uid(0), VFS[1], device_type, DeviceState.PRESENT, "vm-a",
                            OwnerKind.INSTANCE, None, None, False, 0.0, 0.0,
                            backend="nvidia_vfio", placement_id=24)

    devices = Existing(snap, {})
    assert recovery.owner_refusals([held(Q12)], policy(MIX), devices) == []
    changed = dataclasses.replace(MIX, vgpus=((Q24, 1), (Q4, 2)))
    (refusal,) = recovery.owner_refusals([held(Q12)], policy(changed), devices)
    assert "vm-a" in refusal.message and Q12 in refusal.message
