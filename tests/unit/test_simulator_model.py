"""The in-process simulator model: kernel errno, counters per policy, links,
blocking removes, parent lifecycle and the spec's JSON form."""

from __future__ import annotations

import dataclasses
import errno
import json
import threading
import time
import uuid as uuidlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_agent import exception
from accel_agent.simulator import profiles
from accel_agent.simulator.kabi import kstrtoul
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.spec import HostSpec, MdevSpec, ParentSpec, TypeSpec

U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
MTTY_TYPES = "class/mdev_bus/mtty/mdev_supported_types"


def new() -> str:
    return str(uuidlib.uuid4())


def errno_of(func, *args) -> int:
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


@pytest.fixture
def mtty() -> SimulatedHost:
    return SimulatedHost(profiles.mtty())


def mtty_avail(host: SimulatedHost) -> tuple[int, int]:
    return host.available("mtty", "mtty-1"), host.available("mtty", "mtty-2")


# ------------------------------------------------------------------ create errno


@pytest.mark.parametrize("data", [
    U1[:35].encode(),                    # too short
    U1.encode() + b"\r\n",               # 38 bytes (EINVAL on a real kernel: docs/design.md §4.3)
    b"83b8f4f2509f382f3c1ee6bfe0fa1001",  # no dashes: 32 bytes
    b"",  # handled below: an empty write is a no-op, not an error
])
def test_create_wrong_length_is_einval(mtty, data):
    create = f"{MTTY_TYPES}/mtty-1/create"
    if not data:
        assert mtty.write(create, data) == 0
        assert mtty.mdevs() == []
        return
    assert errno_of(mtty.write, create, data) == errno.EINVAL
    assert mtty.mdevs() == []


@pytest.mark.parametrize("text", [
    "zzzzzzzz-509f-382f-3c1e-e6bfe0fa1001",   # 36 bytes, not hex
    "83b8f4f2_509f_382f_3c1e_e6bfe0fa1001",   # wrong separators
    "not-a-uuid-but-exactly-36-chars-long",
])
def test_create_unparsable_uuid_is_einval(mtty, text):
    assert len(text) == 36
    assert errno_of(mtty.write, f"{MTTY_TYPES}/mtty-1/create", text) == errno.EINVAL
    assert mtty_avail(mtty) == (24, 12)


def test_create_accepts_bare_uuid_and_trailing_newline(mtty):
    assert mtty.write(f"{MTTY_TYPES}/mtty-1/create", U1) == 36
    assert mtty.write(f"{MTTY_TYPES}/mtty-1/create", U2 + "\n") == 37
    assert sorted(m.uuid for m in mtty.mdevs()) == sorted([U1, U2])


def test_create_does_not_check_the_37th_byte(mtty):
    # create_store() only bounds the length; guid_parse() reads 36 bytes.  So the
    # kernel takes "UUID\n" and also "UUIDx": the model does the same.
    assert mtty.write(f"{MTTY_TYPES}/mtty-1/create", U1 + "x") == 37
    assert [m.uuid for m in mtty.mdevs()] == [U1]


def test_create_uppercase_gives_lowercase_directory(mtty):
    mtty.write(f"{MTTY_TYPES}/mtty-2/create", U1.upper() + "\n")
    assert mtty.listdir("bus/mdev/devices") == [U1]
    assert U1 in mtty.listdir("devices/virtual/mtty/mtty")


def test_duplicate_uuid_is_eexist_across_types_parents_and_case():
    host = SimulatedHost(profiles.nova())
    uuid = new()
    host.create_mdev("0000:06:00.0", "nvidia-11", uuid)
    assert errno_of(host.create_mdev, "0000:06:00.0", "nvidia-11", uuid) == errno.EEXIST
    assert errno_of(host.create_mdev, "0000:07:00.0", "nvidia-12", uuid) == errno.EEXIST
    assert errno_of(host.create_mdev, "0000:07:00.0", "nvidia-11", uuid.upper()) == errno.EEXIST
    # The spec's pre-existing mdev counts too.
    assert errno_of(host.create_mdev, "0000:07:00.0", "nvidia-12",
                    profiles.NOVA_MDEV_06) == errno.EEXIST
    assert host.available("0000:07:00.0", "nvidia-12") == 10


def test_mtty_exhaustion_is_enospc_and_leaves_nothing_behind(mtty):
    for _ in range(12):
        mtty.create_mdev("mtty", "mtty-2", new())
    assert mtty_avail(mtty) == (0, 0)
    assert errno_of(mtty.create_mdev, "mtty", "mtty-1", new()) == errno.ENOSPC
    assert errno_of(mtty.create_mdev, "mtty", "mtty-2", new()) == errno.ENOSPC
    assert len(mtty.listdir("bus/mdev/devices")) == 12


def test_core_counter_exhaustion_is_eusers():
    host = SimulatedHost(profiles.mdpy())
    for t in ("mdpy-vga", "mdpy-xga", "mdpy-hd", "mdpy-vga"):
        host.create_mdev("mdpy", t, new())
    assert [host.available("mdpy", t) for t in ("mdpy-vga", "mdpy-xga", "mdpy-hd")] == [0, 0, 0]
    assert errno_of(host.create_mdev, "mdpy", "mdpy-hd", new()) == errno.EUSERS


def test_i915_shared_pool_is_enospc():
    host = SimulatedHost(profiles.i915_gvtg())
    parent = "0000:00:02.0"
    host.create_mdev(parent, "i915-GVTg_V5_4", new())     # 4 of 16 units
    assert host.available(parent, "i915-GVTg_V5_8") == 6  # 12 left / 2
    assert host.available(parent, "i915-GVTg_V5_1") == 0
    assert errno_of(host.create_mdev, parent, "i915-GVTg_V5_1", new()) == errno.ENOSPC


def test_nvidia_pf_type_lock_is_einval_and_lifts_after_remove():
    host = SimulatedHost(profiles.nvidia_pf(gpus=2))
    pf, other = "0000:84:00.0", "0000:85:00.0"
    uuid = host.create_mdev(pf, "nvidia-18", new())
    assert host.available(pf, "nvidia-18") == 3
    for t in ("nvidia-35", "nvidia-36", "nvidia-15", "nvidia-20", "nvidia-22"):
        assert host.available(pf, t) == 0
    assert errno_of(host.create_mdev, pf, "nvidia-35", new()) == errno.EINVAL
    assert host.available(other, "nvidia-35") == 16  # the other pGPU is untouched
    host.remove_mdev(uuid)
    assert host.available(pf, "nvidia-35") == 16
    host.create_mdev(pf, "nvidia-35", new())


def test_nvidia_pf_full_type_is_einval():
    host = SimulatedHost(profiles.nvidia_pf(gpus=1))
    host.create_mdev("0000:84:00.0", "nvidia-22", new())
    assert host.available("0000:84:00.0", "nvidia-22") == 0
    assert errno_of(host.create_mdev, "0000:84:00.0", "nvidia-22", new()) == errno.EINVAL


def test_unregistered_parent_create_is_enodev_through_stale_handle(mtty):
    handle = mtty.open(f"{MTTY_TYPES}/mtty-1/create")
    mtty.unregister_parent("mtty")
    assert errno_of(handle.write, U1.encode()) == errno.ENODEV
    assert errno_of(mtty.stat, f"{MTTY_TYPES}/mtty-1/create") == errno.ENOENT
    assert mtty.mdevs() == []


def test_injected_probe_failure_happens_once(mtty):
    mtty.fail_next_create(errno.ENOSPC, parent="mtty", type_id="mtty-1")
    mtty.create_mdev("mtty", "mtty-2", new())        # not the faulted type: works
    assert mtty.available("mtty", "mtty-1") == 22    # the count says yes...
    assert errno_of(mtty.create_mdev, "mtty", "mtty-1", new()) == errno.ENOSPC
    mtty.create_mdev("mtty", "mtty-1", new())        # ...and the failure happens once


# ------------------------------------------------------------------ counters per policy


def test_mtty_global_pool_matches_the_lab(mtty):
    assert mtty_avail(mtty) == (24, 12)
    uuid = mtty.create_mdev("mtty", "mtty-2", U1)
    assert mtty_avail(mtty) == (22, 11)
    mtty.create_mdev("mtty", "mtty-1", new())
    assert mtty_avail(mtty) == (21, 10)
    mtty.remove_mdev(uuid)
    assert mtty_avail(mtty) == (23, 11)


def test_global_pool_spans_parents():
    types = (TypeSpec("mtty-1", weight=1), TypeSpec("mtty-2", weight=2))
    spec = HostSpec(parents=[
        ParentSpec(name=n, kind="virtual", driver="mtty", policy="global", capacity=4,
                   types=types) for n in ("mtty", "mtty2")])
    host = SimulatedHost(spec)
    host.create_mdev("mtty", "mtty-2", new())
    assert host.available("mtty2", "mtty-1") == 2
    assert host.available("mtty2", "mtty-2") == 1


@pytest.mark.parametrize(("spec", "parent", "type_id", "watched"), [
    (profiles.nova(), "0000:07:00.0", "nvidia-11", {"nvidia-11": (7, 6), "nvidia-12": (10, 10)}),
    (profiles.i915_gvtg(), "0000:00:02.0", "i915-GVTg_V5_8",
     {"i915-GVTg_V5_8": (8, 7), "i915-GVTg_V5_4": (4, 3), "i915-GVTg_V5_1": (1, 0)}),
    (profiles.mtty(), "mtty", "mtty-1", {"mtty-1": (24, 23), "mtty-2": (12, 11)}),
    (profiles.mdpy(), "mdpy", "mdpy-xga", {"mdpy-vga": (4, 3), "mdpy-hd": (4, 3)}),
    (profiles.nvidia_pf(1), "0000:84:00.0", "nvidia-15",
     {"nvidia-15": (8, 7), "nvidia-36": (16, 0)}),
    (profiles.nvidia_sriov(1, 4), "0000:41:00.4", "nvidia-475",
     {"nvidia-475": (1, 0), "nvidia-471": (1, 0)}),
], ids=["independent", "shared", "global", "core", "nvidia-equal-size", "nvidia-vf"])
def test_counters_move_on_create_and_come_back_on_remove(spec, parent, type_id, watched):
    host = SimulatedHost(spec)
    before = {t: host.available(parent, t) for t in watched}
    assert before == {t: v[0] for t, v in watched.items()}
    uuid = host.create_mdev(parent, type_id, new())
    assert {t: host.available(parent, t) for t in watched} == {t: v[1] for t, v in watched.items()}
    host.remove_mdev(uuid)
    assert {t: host.available(parent, t) for t in watched} == before


def test_nova_counts():
    host = SimulatedHost(profiles.nova())
    assert host.available("0000:06:00.0", "nvidia-11") == 15
    assert host.available("0000:07:00.0", "nvidia-11") == 7
    assert host.available("0000:07:00.0", "nvidia-12") == 10
    assert {(m.parent, m.type_id) for m in host.mdevs()} == {
        ("0000:06:00.0", "nvidia-11"), ("0000:07:00.0", "nvidia-11")}


def test_sriov_budget_is_per_pf_not_per_vf():
    host = SimulatedHost(profiles.nvidia_sriov(gpus=1, vfs=16))
    vfs = [p for p in host.parent_names() if p.startswith("0000:41:")]
    assert len(vfs) == 16
    assert "0000:41:00.0" not in vfs  # the PF is no parent
    assert all(host.available(vf, "nvidia-474") == 1 for vf in vfs)  # 16 x "1"...
    made = []
    for vf in vfs:
        try:
            made.append(host.create_mdev(vf, "nvidia-474", new()))
        except OSError as exc:
            assert exc.errno == errno.EINVAL
    assert len(made) == 4  # ...but max_instance=4 per physical GPU
    assert sum(host.available(vf, "nvidia-474") for vf in vfs) == 0


def test_sriov_siblings_offer_only_the_type_in_use():
    host = SimulatedHost(profiles.nvidia_sriov(gpus=2, vfs=4))
    host.create_mdev("0000:41:00.4", "nvidia-473", new())
    assert [host.available("0000:41:00.4", t.type_id) for t in profiles.A100_TYPES] == [0] * 6
    assert host.available("0000:41:00.5", "nvidia-473") == 1
    assert host.available("0000:41:00.5", "nvidia-471") == 0
    assert errno_of(host.create_mdev, "0000:41:00.5", "nvidia-471", new()) == errno.EINVAL
    assert host.available("0000:42:00.4", "nvidia-471") == 1  # other GPU unaffected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 5)), max_size=40))
def test_sriov_invariants_hold_under_any_sequence(ops):
    host = SimulatedHost(profiles.nvidia_sriov(gpus=1, vfs=8))
    vfs = sorted(host.parent_names())
    limits = {t.type_id: t.limit for t in profiles.A100_TYPES}
    for is_create, vf_i, type_i in ops:
        mdevs = host.mdevs()
        if is_create or not mdevs:
            type_id = profiles.A100_TYPES[type_i].type_id
            said = host.available(vfs[vf_i], type_id)
            try:
                host.create_mdev(vfs[vf_i], type_id, new())
                assert said == 1
            except OSError as exc:
                assert (said, exc.errno) == (0, errno.EINVAL)
        else:
            host.remove_mdev(mdevs[vf_i % len(mdevs)].uuid)
        mdevs = host.mdevs()
        types = {m.type_id for m in mdevs}
        assert len(types) <= 1                                         # equal-size per PF
        assert all(sum(m.parent == vf for m in mdevs) <= 1 for vf in vfs)  # <= 1 per VF
        for t in types:
            assert sum(m.type_id == t for m in mdevs) <= limits[t]        # max_instance per PF


# ------------------------------------------------------------------ layout and links


def test_mdev_links_match_the_kernel(mtty):
    mtty.create_mdev("mtty", "mtty-2", U1)
    dev = f"bus/mdev/devices/{U1}"
    assert mtty.readlink(dev) == f"../../../devices/virtual/mtty/mtty/{U1}"
    assert mtty.readlink(f"{dev}/mdev_type") == "../mdev_supported_types/mtty-2"
    group = mtty.mdevs()[0].iommu_group
    assert mtty.readlink(f"{dev}/iommu_group") == f"../../../../../kernel/iommu_groups/{group}"
    assert mtty.readlink(f"{dev}/driver") == "../../../../../bus/mdev/drivers/mtty"
    assert mtty.readlink(f"{dev}/subsystem") == "../../../../../bus/mdev"
    assert mtty.readlink(f"{MTTY_TYPES}/mtty-2/devices/{U1}") == f"../../../{U1}"
    assert mtty.readlink("class/mdev_bus/mtty") == "../../devices/virtual/mtty/mtty"
    # ...and they resolve where the kernel's do.
    assert mtty.realpath(dev) == f"devices/virtual/mtty/mtty/{U1}"
    parent_dir = "devices/virtual/mtty/mtty"
    assert mtty.realpath(f"{dev}/mdev_type") == f"{parent_dir}/mdev_supported_types/mtty-2"
    assert mtty.realpath(f"{dev}/iommu_group") == f"kernel/iommu_groups/{group}"
    assert mtty.realpath(f"kernel/iommu_groups/{group}/devices/{U1}") == mtty.realpath(dev)
    assert mtty.read(f"{dev}/mdev_type/name") == b"Dual port serial\n"
    assert mtty.listdir(f"{MTTY_TYPES}/mtty-2/devices") == [U1]
    assert mtty.listdir(f"{MTTY_TYPES}/mtty-1/devices") == []


def test_pci_parent_layout():
    host = SimulatedHost(build_spec(["nvidia-pf", "nvidia-sriov"], gpus=1))
    pf_dir = "devices/pci0000:80/0000:80:01.0/0000:84:00.0"
    assert host.realpath("class/mdev_bus/0000:84:00.0") == pf_dir
    assert host.readlink("class/mdev_bus/0000:84:00.0") == f"../../{pf_dir}"
    assert host.readlink(f"{pf_dir}/driver") == "../../../../bus/pci/drivers/nvidia"
    assert host.readlink(f"{pf_dir}/subsystem") == "../../../../bus/pci"
    assert host.read(f"{pf_dir}/vendor") == b"0x10de\n"
    assert host.read(f"{pf_dir}/numa_node") == b"0\n"
    assert host.realpath("bus/pci/devices/0000:84:00.0") == pf_dir
    types = f"{pf_dir}/mdev_supported_types/nvidia-35"
    assert host.read(f"{types}/name") == b"GRID M60-0B\n"
    assert host.read(f"{types}/description").endswith(b"max_instance=16\n")
    assert host.read(f"{types}/device_api") == b"vfio-pci\n"
    assert host.lstat(f"{types}/create").mode & 0o777 == 0o200
    assert host.lstat(f"{types}/available_instances").mode & 0o777 == 0o444
    assert host.lstat(f"{types}/devices").is_dir
    # SR-IOV: VF parents point at their PF, the PF lists them and is no mdev parent.
    vf = host.realpath("class/mdev_bus/0000:41:00.4")
    assert host.readlink(f"{vf}/physfn") == "../0000:41:00.0"
    assert host.realpath(f"{vf}/physfn") == vf.rsplit("/", 1)[0] + "/0000:41:00.0"
    pf = host.realpath("bus/pci/devices/0000:41:00.0")
    assert host.readlink(f"{pf}/virtfn0") == "../0000:41:00.4"
    assert host.readlink(f"{pf}/virtfn15") == "../0000:41:02.3"
    assert "mdev_supported_types" not in host.listdir(pf)
    assert "0000:41:00.0" not in host.listdir("class/mdev_bus")


def test_every_link_resolves_and_values_end_with_newline():
    host = SimulatedHost(build_spec(["nvidia-pf", "nvidia-sriov", "i915-gvtg", "mtty", "nova"],
                                    vfs=4))
    host.create_mdev("mtty", "mtty-1", U1)
    entries = host.export_tree()
    for e in entries:
        if e.kind == "link":
            assert host.exists(e.path), e.path
        elif e.kind == "file" and e.data is not None:
            assert e.data.endswith(b"\n"), e.path


# ------------------------------------------------------------------ remove


def test_remove_zero_is_a_noop_and_garbage_is_einval(mtty):
    mtty.create_mdev("mtty", "mtty-1", U1)
    remove = f"bus/mdev/devices/{U1}/remove"
    assert mtty.write(remove, "0\n") == 2
    for bad in ("yes", "-1", "1 ", " 1", "0x", "08", "\n", "1\n\n"):
        assert errno_of(mtty.write, remove, bad) == errno.EINVAL, bad
    assert errno_of(mtty.write, remove, str(1 << 64)) == errno.ERANGE
    assert [m.uuid for m in mtty.mdevs()] == [U1]
    assert mtty.write(remove, "0x1\n") == 4   # kstrtoul base 0: hex is fine
    assert mtty.mdevs() == []
    assert not mtty.exists(f"bus/mdev/devices/{U1}")
    assert mtty.listdir("kernel/iommu_groups") == []


@pytest.mark.parametrize(("text", "value"), [
    (b"1", 1), (b"2\n", 2), (b"+1", 1), (b"0x10", 16), (b"010", 8), (b"0", 0)])
def test_kstrtoul(text, value):
    assert kstrtoul(text) == value


def test_write_only_and_read_only_attributes_give_eio(mtty):
    mtty.create_mdev("mtty", "mtty-1", U1)
    assert errno_of(mtty.read, f"{MTTY_TYPES}/mtty-1/create") == errno.EIO
    assert errno_of(mtty.read, f"bus/mdev/devices/{U1}/remove") == errno.EIO
    assert errno_of(mtty.write, f"{MTTY_TYPES}/mtty-1/available_instances", "3") == errno.EIO
    assert errno_of(mtty.read, f"{MTTY_TYPES}/mtty-1/description") == errno.ENOENT
    assert errno_of(mtty.open, MTTY_TYPES) == errno.EISDIR


def test_remove_of_held_mdev_blocks_until_release(mtty):
    mtty.create_mdev("mtty", "mtty-1", U1)
    stale = mtty.open(f"bus/mdev/devices/{U1}/remove")
    mtty.hold(U1)
    result: list[object] = []
    writer = threading.Thread(target=lambda: result.append(mtty.write(
        f"bus/mdev/devices/{U1}/remove", "1")))
    writer.start()
    deadline = time.monotonic() + 10
    while not mtty.blocked_removes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [b.outcome for b in mtty.blocked_removes] == ["waiting"]
    assert writer.is_alive() and result == []
    # device_remove_file_self(): the attribute is gone while the remove waits.
    assert not mtty.exists(f"bus/mdev/devices/{U1}/remove")
    assert errno_of(stale.write, b"1") == errno.ENODEV
    assert mtty.exists(f"bus/mdev/devices/{U1}")
    mtty.release(U1)
    writer.join(10)
    assert not writer.is_alive()
    assert result == [1]
    assert mtty.mdevs() == []
    assert mtty.blocked_removes[0].outcome == "released"


def test_blocked_remove_gives_up_with_eintr_after_the_cap():
    host = SimulatedHost(profiles.mtty(), remove_block_timeout=0.05)
    host.create_mdev("mtty", "mtty-1", U1)
    host.hold(U1)
    assert errno_of(host.remove_mdev, U1) == errno.EINTR
    assert [m.uuid for m in host.mdevs()] == [U1]
    assert host.exists(f"bus/mdev/devices/{U1}/remove")  # put back for a later try
    assert host.blocked_removes[0].outcome == "timeout"
    host.release(U1)
    host.remove_mdev(U1)
    assert host.mdevs() == []


def test_the_cap_can_be_changed_on_a_live_host():
    # remove_block_timeout stays a plain attribute of the host for its callers,
    # although the mdev side (mdev.py) is what waits.
    host = SimulatedHost(profiles.mtty(), remove_block_timeout=0.05)
    host.remove_block_timeout = 0
    assert host.remove_block_timeout == 0
    host.create_mdev("mtty", "mtty-1", U1)
    host.hold(U1)
    with pytest.raises(OSError, match="still held after 0 s") as caught:
        host.remove_mdev(U1)
    assert caught.value.errno == errno.EINTR


def test_vfio_group_node_is_exclusive_and_blocks_remove_while_open(mtty):
    mtty.create_mdev("mtty", "mtty-1", U1)
    (info,) = mtty.mdevs()
    node = f"vfio/{info.iommu_group}"
    assert mtty.lstat(node).mode & 0o777 == 0o600
    first = mtty.open(node)
    # vfio_group_fops_open(): one opener at a time.
    assert errno_of(mtty.open, node) == errno.EBUSY
    writer = threading.Thread(target=lambda: mtty.remove_mdev(U1), daemon=True)
    writer.start()
    deadline = time.monotonic() + 10
    while not mtty.blocked_removes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [b.outcome for b in mtty.blocked_removes] == ["waiting"]
    first.close()
    writer.join(10)
    assert not writer.is_alive() and mtty.mdevs() == []
    assert not mtty.exists(node)  # the group node goes with its mdev


def test_a_held_mdev_answers_ebusy_on_its_group_node_until_released(mtty):
    mtty.create_mdev("mtty", "mtty-1", U1)
    (info,) = mtty.mdevs()
    mtty.hold(U1)
    assert errno_of(mtty.open, f"vfio/{info.iommu_group}") == errno.EBUSY
    mtty.release(U1)
    handle = mtty.open(f"vfio/{info.iommu_group}")
    handle.close()
    handle.close()  # idempotent
    mtty.remove_mdev(U1)
    assert mtty.mdevs() == []


def test_hold_after_probe_lets_one_open_in_then_holds(mtty):
    """The race the agent's remove timeout exists for: a VM that opens the
    group right after the in-use probe closed it."""
    mtty.create_mdev("mtty", "mtty-1", U1)
    (info,) = mtty.mdevs()
    mtty.hold(U1, after_probe=True)
    assert [m.held for m in mtty.mdevs()] == [False]
    mtty.open(f"vfio/{info.iommu_group}").close()  # the probe
    assert [m.held for m in mtty.mdevs()] == [True]
    assert errno_of(mtty.open, f"vfio/{info.iommu_group}") == errno.EBUSY


def test_hold_of_unknown_mdev_is_an_error(mtty):
    with pytest.raises(exception.MdevNotFound):
        mtty.hold(U1)


# ------------------------------------------------------------------ host lifecycle


def test_reboot_drops_every_mdev_and_restores_counters():
    host = SimulatedHost(build_spec(["mtty", "nova"]))
    host.create_mdev("mtty", "mtty-2", U1)
    host.hold(U1)
    host.unregister_parent("0000:06:00.0")
    host.reboot()
    assert host.mdevs() == []
    assert host.listdir("bus/mdev/devices") == []
    assert host.listdir("kernel/iommu_groups") == ["0", "1"]  # the two PCI functions' groups
    assert mtty_avail(host) == (24, 12)
    assert host.available("0000:06:00.0", "nvidia-11") == 16  # registered again
    assert host.available("0000:07:00.0", "nvidia-11") == 8
    assert host.boot_count == 2


def test_reboot_forgets_an_injected_create_failure(mtty):
    mtty.fail_next_create(errno.ENOSPC, parent="mtty")
    mtty.reboot()
    mtty.create_mdev("mtty", "mtty-1", U1)
    assert [m.uuid for m in mtty.mdevs()] == [U1]


def test_unregister_destroys_children_and_register_brings_types_back():
    host = SimulatedHost(profiles.nova())
    host.unregister_parent("0000:07:00.0")
    assert "0000:07:00.0" not in host.listdir("class/mdev_bus")
    assert not host.exists(f"bus/mdev/devices/{profiles.NOVA_MDEV_07}")
    assert [m.uuid for m in host.mdevs()] == [profiles.NOVA_MDEV_06]
    pci_dir = host.realpath("bus/pci/devices/0000:07:00.0")
    assert "mdev_supported_types" not in host.listdir(pci_dir)  # the device itself stays
    host.register_parent("0000:07:00.0")
    assert host.available("0000:07:00.0", "nvidia-11") == 8
    assert [e.env.get("MDEV_STATE") for e in host.events_since(0)
            if e.action == "change"][-2:] == ["unregistered", "registered"]
    with pytest.raises(exception.ParentNotFound):
        host.unregister_parent("0000:99:00.0")


def test_events_record_adds_and_removes(mtty):
    seq = mtty.events_since(0)[-1].seq
    mtty.create_mdev("mtty", "mtty-1", U1)
    mtty.remove_mdev(U1)
    events = [(e.action, e.subsystem, e.devpath) for e in mtty.events_since(seq)]
    path = f"/devices/virtual/mtty/mtty/{U1}"
    assert events == [("add", "mdev", path), ("bind", "mdev", path), ("remove", "mdev", path)]


def test_pre_existing_held_mdev_from_spec():
    spec = dataclasses.replace(profiles.mtty(), mdevs=[MdevSpec(U1, "mtty", "mtty-2", held=True)])
    host = SimulatedHost(spec, remove_block_timeout=0.01)
    assert mtty_avail(host) == (22, 11)
    assert errno_of(host.remove_mdev, U1) == errno.EINTR


# ------------------------------------------------------------------ spec and profiles


def test_spec_json_round_trip():
    spec = build_spec(["nvidia-pf", "nvidia-sriov", "i915-gvtg", "mtty", "mdpy", "nova"],
                      gpus=2, vfs=3)
    text = spec.to_json()
    back = HostSpec.from_json(text)
    assert back == spec
    assert back.to_dict() == json.loads(text)
    assert back.profiles == spec.profiles
    # The short [uuid, parent, type] mdev form is accepted too.
    data = json.loads(text)
    data["mdevs"] = [[U1, "mtty", "mtty-1"]]
    assert HostSpec.from_dict(data).mdevs == (MdevSpec(U1, "mtty", "mtty-1"),)


def _mtty_dict() -> dict:
    return profiles.mtty().to_dict()


def _with(path: str, value: object) -> dict:
    data = _mtty_dict()
    node: dict = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize(("data", "needle"), [
    (_with("parents.0.colour", "blue"), "unknown field(s) colour"),
    (_with("parents.0.policy", "magic"), "policy 'magic'"),
    (_with("parents.0.capacity", None), "needs a capacity"),
    (_with("parents.0.types.0.type_id", "nvidia-11"), "must start with the parent's driver"),
    (_with("parents.0.types.0.device_api", "vfio-usb"), "device_api"),
    (_with("parents.0.types.0.weight", 0), "weight must be >= 1"),
    ({"parents": [{"name": "0000:84:00.0", "types": [{"type_id": "nvidia-1"}]}]},
     "needs max_instances"),
    ({"parents": [{"name": "0000:84:0.0", "types": []}]}, "not a PCI address"),
    ({"parents": [{"name": "0000:AF:00.0", "types": []}]}, "'0000:af:00.0'"),
    ({"parents": [{"name": "0000:84:00.4", "physfn": "0000:84:00.0",
                   "types": [{"type_id": "nvidia-1", "max_instances": 1}]}]},
     "physfn 0000:84:00.0 is not a PCI device"),
    ({"parents": [], "mdevs": [[U1, "mtty", "mtty-1"]]}, "parent mtty is not in the spec"),
    (_with("mdevs", [[U1, ["mtty"], "mtty-1"]]), "parent ['mtty'] is not a valid sysfs name"),
    (_with("mdevs", [[U1, "mtty", {"a": 1}]]), "type_id {'a': 1} is not a valid sysfs name"),
    ({"parents": "x"}, "spec.parents must be a list"),
    ([], "spec must be an object"),
])
def test_bad_spec_raises_a_clear_error(data, needle):
    with pytest.raises(exception.SimulatorSpecInvalid) as info:
        HostSpec.from_dict(data)
    assert needle in str(info.value)


def test_duplicate_names_across_profiles_are_refused():
    with pytest.raises(exception.SimulatorSpecInvalid, match="defined twice"):
        HostSpec.merge([profiles.mtty(), profiles.mtty()])
    with pytest.raises(exception.SimulatorSpecInvalid, match="not valid JSON"):
        HostSpec.from_json("{")


def test_build_spec_options():
    spec = build_spec(["nvidia-pf", "nvidia-sriov", "mtty"], gpus=2, vfs=3)
    names = [p.name for p in spec.parents]
    assert names[:2] == ["0000:84:00.0", "0000:85:00.0"]
    assert sum(p.physfn == "0000:41:00.0" for p in spec.parents) == 3
    assert [d.address for d in spec.devices] == ["0000:41:00.0", "0000:42:00.0"]
    assert "mtty" in names
    with pytest.raises(exception.SimulatorSpecInvalid, match="vfs not used"):
        build_spec(["nvidia-pf"], vfs=2)
    with pytest.raises(exception.SimulatorSpecInvalid, match="unknown profile"):
        build_spec(["nvidia-xx"])
    with pytest.raises(exception.SimulatorSpecInvalid, match="gpus must be"):
        build_spec(["nvidia-pf"], gpus=0)


def test_mtty_profile_matches_the_real_module():
    host = SimulatedHost(profiles.mtty())
    assert host.listdir("class/mdev_bus") == ["mtty"]
    assert host.listdir(MTTY_TYPES) == ["mtty-1", "mtty-2"]
    assert host.read(f"{MTTY_TYPES}/mtty-1/name") == b"Single port serial\n"
    assert host.read(f"{MTTY_TYPES}/mtty-2/name") == b"Dual port serial\n"
    assert host.read(f"{MTTY_TYPES}/mtty-1/device_api") == b"vfio-pci\n"
    assert not host.exists(f"{MTTY_TYPES}/mtty-1/description")
    assert host.listdir(f"{MTTY_TYPES}/mtty-1") == [
        "available_instances", "create", "device_api", "devices", "name"]


def test_i915_description_is_multi_line():
    host = SimulatedHost(profiles.i915_gvtg())
    text = host.read("class/mdev_bus/0000:00:02.0/mdev_supported_types/i915-GVTg_V5_4/description")
    assert text == (b"low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\n"
                    b"resolution: 1920x1200\nweight: 4\n")


def test_synthetic_scale():
    host = SimulatedHost(profiles.synthetic(parents=256, types=24))
    assert len(host.listdir("class/mdev_bus")) == 256
    first = host.parent_names()[0]
    assert len(host.listdir(f"class/mdev_bus/{first}/mdev_supported_types")) == 24
    assert len(set(host.parent_names())) == 256
