"""The nvidia-vfio profile: NVIDIA vGPU 17+ VFs typed through
nvidia/current_vgpu_type (accel_agent/simulator/nvidia_vfio.py), on the
in-process model."""

from __future__ import annotations

import errno

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_agent import exception
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvidia_vfio import HEADER
from accel_agent.simulator.profiles import build_spec

PF, PF2 = "0000:c1:00.0", "0000:c2:00.0"
DEV = "bus/pci/devices"
TYPES = {t.type_id: t for t in profiles.L40S_VGPU_TYPES}
Q1, Q4, A4, Q24, Q48 = 1147, 1150, 1160, 1155, 1156


def vf(index: int, pf: str = PF) -> str:
    return profiles.SriovPfSpec(pf, "nvidia", "nvidia", 32, vf_offset=4).vf_address(index)


def errno_of(func, *args) -> int:
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


@pytest.fixture
def host() -> SimulatedHost:
    return SimulatedHost(profiles.nvidia_vfio(gpus=2, vfs=4))


def creatable(host: SimulatedHost, addr: str) -> list[int]:
    text = host.read(f"{DEV}/{addr}/nvidia/creatable_vgpu_types")
    assert text.startswith(HEADER)
    return [int(line.split(b":")[0]) for line in text[len(HEADER):].splitlines()]


def current(host: SimulatedHost, addr: str) -> int:
    return int(host.read(f"{DEV}/{addr}/nvidia/current_vgpu_type"))


def set_type(host: SimulatedHost, addr: str, value: int | str) -> int:
    return host.write(f"{DEV}/{addr}/nvidia/current_vgpu_type", str(value))


# ------------------------------------------------------------------ layout


def test_layout_matches_vgpu17(host):
    pf = host.realpath(f"{DEV}/{PF}")
    assert pf == "devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0"
    assert host.readlink(f"{pf}/driver") == "../../../../bus/pci/drivers/nvidia"
    assert host.read(f"{pf}/sriov_totalvfs") == b"32\n"
    assert host.read(f"{pf}/sriov_numvfs") == b"4\n"
    assert "mdev_supported_types" not in host.listdir(pf)
    assert "nvidia" not in host.listdir(pf)  # contested on real PFs: not relied upon
    assert host.listdir("class/mdev_bus") == []
    assert [host.readlink(f"{pf}/virtfn{i}") for i in range(4)] == [
        "../0000:c1:00.4", "../0000:c1:00.5", "../0000:c1:00.6", "../0000:c1:00.7"]
    groups = set()
    for i in range(4):
        d = host.realpath(f"{DEV}/{vf(i)}")
        assert host.readlink(f"{d}/physfn") == "../0000:c1:00.0"
        assert (host.read(f"{d}/vendor"), host.read(f"{d}/device")) == (b"0x10de\n", b"0x26b9\n")
        assert host.readlink(f"{d}/driver").endswith("bus/pci/drivers/nvidia")
        group = host.realpath(f"{d}/iommu_group").rsplit("/", 1)[1]
        assert host.exists(f"vfio/{group}")
        groups.add(group)
        assert host.listdir(f"{d}/nvidia") == ["creatable_vgpu_types", "current_vgpu_type",
                                               "gpu_instance_id", "placement_id", "vgpu_params"]
        modes = {n: host.lstat(f"{d}/nvidia/{n}").mode & 0o777
                 for n in host.listdir(f"{d}/nvidia")}
        assert modes == {"creatable_vgpu_types": 0o444, "current_vgpu_type": 0o644,
                         "gpu_instance_id": 0o644, "placement_id": 0o644, "vgpu_params": 0o644}
    assert len(groups) == 4


def test_creatable_list_of_an_empty_card_is_the_real_drivers(host):
    text = host.read(f"{DEV}/{vf(0)}/nvidia/creatable_vgpu_types").decode()
    lines = text.splitlines()
    assert lines[0] == "ID    : vGPU Name"
    assert lines[1:4] == ["1145  : NVIDIA L40S-1B", "1146  : NVIDIA L40S-2B",
                          "1147  : NVIDIA L40S-1Q"]
    assert lines[12] == "1156  : NVIDIA L40S-48Q"
    assert lines[-1] == "2164  : NVIDIA L40S-3B"
    assert len(lines) == 1 + 23
    assert host.read(f"{DEV}/{vf(0)}/nvidia/current_vgpu_type") == b"0\n"
    assert host.read(f"{DEV}/{vf(0)}/nvidia/vgpu_params") == b""
    assert errno_of(host.read, f"{DEV}/{vf(0)}/nvidia/gpu_instance_id") == errno.ENXIO
    assert errno_of(host.read, f"{DEV}/{vf(0)}/nvidia/placement_id") == errno.ENXIO


# ------------------------------------------------------------------ create / destroy


@pytest.mark.parametrize("data", ["1150", "1150\n", "0x47e", "+1150"])
def test_writing_an_id_creates_with_or_without_newline(host, data):
    assert set_type(host, vf(1), data) == len(data)
    assert current(host, vf(1)) == Q4
    assert host.read(f"{DEV}/{vf(1)}/nvidia/gpu_instance_id") == b"0\n"
    assert creatable(host, vf(1)) == []  # a typed VF lists the header only
    assert host.vgpus() == [{"address": vf(1), "physfn": PF, "type_id": Q4,
                             "name": "NVIDIA L40S-4Q", "iommu_group": vgpu_group(host, vf(1)),
                             "held": False}]


def vgpu_group(host: SimulatedHost, addr: str) -> int:
    return int(host.realpath(f"{DEV}/{addr}/iommu_group").rsplit("/", 1)[1])


@pytest.mark.parametrize(("data", "code"), [
    ("abc", errno.EINVAL), ("1150\n\n", errno.EINVAL), (" 1150", errno.EINVAL),
    ("-1", errno.EINVAL), (str(1 << 64), errno.ERANGE),
    ("9999", errno.EINVAL),   # no such type on an L40S
    ("1414", errno.EINVAL),   # an H200 type id
])
def test_bad_writes_fail_and_leave_zero(host, data, code):
    assert errno_of(set_type, host, vf(0), data) == code
    assert current(host, vf(0)) == 0
    assert len(creatable(host, vf(0))) == 23


def test_zero_on_a_free_vf_is_a_noop_and_a_typed_vf_takes_no_other_id(host):
    assert set_type(host, vf(0), "0\n") == 2
    assert current(host, vf(0)) == 0
    set_type(host, vf(0), Q4)
    assert errno_of(set_type, host, vf(0), A4) == errno.EINVAL  # same size, but the VF is typed
    assert errno_of(set_type, host, vf(0), Q4) == errno.EINVAL  # even the same id
    assert current(host, vf(0)) == Q4
    set_type(host, vf(0), 0)
    assert current(host, vf(0)) == 0
    assert errno_of(host.read, f"{DEV}/{vf(0)}/nvidia/gpu_instance_id") == errno.ENXIO
    assert len(creatable(host, vf(0))) == 23  # the card is empty again: every size


def test_equal_size_rule_on_the_card_only(host):
    set_type(host, vf(0), Q4)
    # siblings: only the 4 GiB types (4Q and 4A) stay creatable
    assert creatable(host, vf(1)) == [Q4, A4]
    assert errno_of(set_type, host, vf(1), Q1) == errno.EINVAL
    assert current(host, vf(1)) == 0
    set_type(host, vf(1), A4)  # same size, other series: allowed
    assert creatable(host, vf(2)) == [Q4, A4]
    assert len(creatable(host, vf(0, PF2))) == 23  # the other GPU is untouched


def test_a_type_at_its_per_gpu_maximum_is_no_longer_listed(host):
    assert TYPES[Q24].max_instances == 2 and TYPES[Q48].max_instances == 1
    set_type(host, vf(0), Q24)
    assert creatable(host, vf(1)) == [Q24, 1165]
    set_type(host, vf(1), Q24)
    assert creatable(host, vf(2)) == []  # 2 x 24 GiB fill the 48 GiB card
    assert errno_of(set_type, host, vf(2), Q24) == errno.EINVAL
    set_type(host, vf(1), 0)
    assert creatable(host, vf(2)) == [Q24, 1165]
    set_type(host, vf(0), 0)
    set_type(host, vf(3), Q48)
    assert all(creatable(host, vf(i)) == [] for i in range(4))


def test_lists_shrink_as_the_card_fills():
    host = SimulatedHost(profiles.nvidia_vfio(gpus=1, vfs=16))
    assert TYPES[Q4].max_instances == 12
    for i in range(12):
        free = [vf(j) for j in range(i, 16)]
        expected = [Q4, A4] if i else list(TYPES)
        assert [creatable(host, a) for a in free] == [expected] * len(free), i
        set_type(host, vf(i), Q4)
    # 4 VFs are still free, but the 4 GiB types are at their per-GPU maximum
    assert [creatable(host, vf(j)) for j in range(12, 16)] == [[]] * 4
    assert errno_of(set_type, host, vf(12), Q4) == errno.EINVAL
    set_type(host, vf(3), 0)
    assert creatable(host, vf(12)) == [Q4, A4]


def test_a_card_without_a_free_vf_lists_only_the_header():
    host = SimulatedHost(profiles.nvidia_vfio(gpus=1, vfs=16))
    for i in range(16):
        set_type(host, vf(i), Q1)  # 1 GiB types allow 32: the VFs run out first
    assert all(host.read(f"{DEV}/{vf(i)}/nvidia/creatable_vgpu_types") == HEADER
               for i in range(16))
    set_type(host, vf(7), 0)
    assert creatable(host, vf(7)) == [1145, Q1, 1157]  # 1B, 1Q, 1A


def test_destroy_while_the_vm_holds_the_vf_is_ebusy(host):
    set_type(host, vf(2), Q4)
    node = f"vfio/{vgpu_group(host, vf(2))}"
    handle = host.open(node)  # QEMU has the VFIO group open
    assert errno_of(host.open, node) == errno.EBUSY
    assert errno_of(set_type, host, vf(2), 0) == errno.EBUSY
    assert current(host, vf(2)) == Q4
    handle.close()
    host.hold(vf(2))  # control "hold ADDR"
    assert host.vgpus()[0]["held"] is True
    assert errno_of(set_type, host, vf(2), "0\n") == errno.EBUSY
    assert errno_of(host.write, f"{DEV}/{PF}/sriov_numvfs", "0") == errno.EBUSY
    host.release(vf(2))
    set_type(host, vf(2), 0)
    assert host.vgpus() == []


def test_every_type_write_is_recorded_with_whether_a_vm_held_the_vf(host):
    set_type(host, vf(2), Q4)
    host.hold(vf(2))
    assert errno_of(set_type, host, vf(2), 0) == errno.EBUSY
    assert errno_of(set_type, host, vf(1), "x") == errno.EINVAL
    host.release(vf(2))
    set_type(host, vf(2), "0\n")
    assert [(w["vf"], w["data"], w["held"], w["outcome"]) for w in host.vgpu_writes()] == [
        (vf(2), str(Q4), False, "ok"),
        (vf(2), "0", True, "EBUSY"),
        (vf(1), "x", False, "EINVAL"),
        (vf(2), "0\n", False, "ok"),
    ]
    seqs = [w["seq"] for w in host.vgpu_writes()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    host.reboot()  # kept across reboots, like blocked_removes
    assert [w["seq"] for w in host.vgpu_writes()] == seqs


def test_a_driver_that_accepts_a_destroy_under_a_vm_until_the_next_reboot(host):
    set_type(host, vf(2), Q4)
    host.hold(vf(2))
    host.accept_held_vgpu_destroy()
    set_type(host, vf(2), 0)  # destroyed under the VM: no EBUSY to save it
    assert current(host, vf(2)) == 0
    assert host.vgpu_writes()[-1] | {"seq": 0} == {
        "seq": 0, "vf": vf(2), "data": "0", "held": True, "outcome": "ok"}
    host.reboot()
    set_type(host, vf(2), Q4)
    host.hold(vf(2))
    assert errno_of(set_type, host, vf(2), 0) == errno.EBUSY  # the reboot forgot it


def test_injected_failures_happen_once_and_match(host):
    host.fail_next_vgpu_write(errno.EIO, vf=vf(1), type_id=Q4)
    set_type(host, vf(0), Q4)  # another VF: not matched
    assert errno_of(set_type, host, vf(1), Q4) == errno.EIO
    assert current(host, vf(1)) == 0
    set_type(host, vf(1), Q4)
    host.fail_next_vgpu_write(errno.EBUSY, type_id=0)  # a destroy that fails
    assert errno_of(set_type, host, vf(1), 0) == errno.EBUSY
    assert current(host, vf(1)) == Q4
    set_type(host, vf(1), 0)
    with pytest.raises(exception.SimulatorError, match="no PCI device"):
        host.fail_next_vgpu_write(errno.EIO, vf="0000:c1:1f.0")


def test_reboot_resets_every_vf_to_zero(host):
    set_type(host, vf(0), Q4)
    set_type(host, vf(0, PF2), Q1)
    host.hold(vf(0))
    host.fail_next_vgpu_write(errno.EIO)
    host.write(f"{DEV}/{PF2}/sriov_numvfs", "0")
    host.reboot()
    assert host.vgpus() == []
    for pf in (PF, PF2):
        assert host.read(f"{DEV}/{pf}/sriov_numvfs") == b"4\n"  # enabled at boot again
        assert all(current(host, vf(i, pf)) == 0 for i in range(4))
    set_type(host, vf(0), Q4)  # the injected fault is forgotten too
    assert current(host, vf(0)) == Q4


def test_sriov_cycle_destroys_vgpus_and_new_vfs_come_untyped(host):
    set_type(host, vf(0), Q4)
    path = f"{DEV}/{PF}/sriov_numvfs"
    assert errno_of(host.write, path, "8") == errno.EBUSY  # 4 enabled: disable first
    assert errno_of(host.write, path, "33") == errno.ERANGE
    host.write(path, "0")
    assert host.vgpus() == [] and not host.exists(f"{DEV}/{vf(0)}")
    host.write(path, "8")
    assert [current(host, vf(i)) for i in range(8)] == [0] * 8
    assert len(creatable(host, vf(7))) == 23


def test_rebinding_a_vf_away_from_nvidia_destroys_its_vgpu(host):
    set_type(host, vf(0), Q4)
    host.write("bus/pci/drivers/nvidia/unbind", vf(0))
    assert not host.exists(f"{DEV}/{vf(0)}/nvidia")
    assert host.vgpus() == []
    assert len(creatable(host, vf(1))) == 23
    host.write("bus/pci/drivers/nvidia/bind", vf(0))
    assert current(host, vf(0)) == 0
    # bound to nvidia the group node opens (vendor VFIO); on no driver it does not
    host.open(f"vfio/{vgpu_group(host, vf(0))}").close()


def test_status_shows_typed_vfs(host):
    set_type(host, vf(3), Q4)
    status = host.status()
    assert [v["address"] for v in status["vgpus"]] == [vf(3)]
    assert [v["vgpu_type"] for v in status["vfs"] if v["physfn"] == PF] == [0, 0, 0, Q4]
    assert [(p["address"], p["num_vfs"]) for p in status["sriov_pfs"]] == [(PF, 4), (PF2, 4)]


def test_profile_options_are_validated():
    with pytest.raises(exception.SimulatorSpecInvalid, match="vfs must be"):
        build_spec(["nvidia-vfio"], vfs=33)
    with pytest.raises(exception.SimulatorSpecInvalid, match="gpus must be"):
        build_spec(["nvidia-vfio"], gpus=61)
    spec = build_spec(["nvidia-vfio"])
    assert [(p.address, p.num_vfs, p.total_vfs) for p in spec.sriov_pfs] == [(PF, 16, 32)]


def test_export_tree_records_unreadable_files_as_none(host):
    entries = {e.path: e for e in host.export_tree()}
    d = host.realpath(f"{DEV}/{vf(0)}")
    assert entries[f"{d}/nvidia/gpu_instance_id"].data is None
    assert entries[f"{d}/nvidia/current_vgpu_type"].data == b"0\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from([0, *TYPES])), max_size=40))
def test_invariants_hold_under_any_sequence(ops):
    host = SimulatedHost(profiles.nvidia_vfio(gpus=1, vfs=8))
    for vf_i, value in ops:
        addr = vf(vf_i)
        listed = creatable(host, addr)
        before = current(host, addr)
        try:
            set_type(host, addr, value)
            ok = True
        except OSError as exc:
            assert exc.errno == errno.EINVAL
            ok = False
        if value == 0:
            assert ok and current(host, addr) == 0
        else:
            assert ok == (value in listed)  # a write succeeds exactly when it was listed
            assert current(host, addr) == (value if ok else before)
        placed = [TYPES[v["type_id"]] for v in host.vgpus()]
        assert len({t.framebuffer_mib for t in placed}) <= 1          # equal size per card
        assert all(len(placed) <= t.max_instances for t in placed)    # per-GPU maximum
