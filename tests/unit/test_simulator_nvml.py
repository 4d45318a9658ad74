"""The NVIDIA GPU's driver-side rules of the simulator (accel_agent/simulator/
nvidia_gpu.py), through the NVML it serves (simulator/nvml.py) and the VF
files the agent reads: mixed-size mode, placements, MIG mode and GPU
instances, MIG-backed types.  In process, one host per test (milliseconds)."""

from __future__ import annotations

import errno
import os

import pytest

from accel_agent import exception
from accel_agent.nvml import GpuInstance, MigMode, Placement
from accel_agent.simulator import profiles, profiles_nvidia
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.spec import HostSpec

L4, H200, A100, L40S = "0000:21:00.0", "0000:61:00.0", "0000:a1:00.0", "0000:c1:00.0"
DEV = "bus/pci/devices"
L4_TYPES = {t.name.removeprefix("NVIDIA L4-"): t.type_id for t in profiles_nvidia.L4_VGPU_TYPES}
H200_1G, H200_3G, H200_4C = 1414, 1418, 1421


def vf(pf: str, index: int) -> str:
    dom, bus, _ = pf.split(":")
    return f"{dom}:{bus}:00.{4 + index}"


@pytest.fixture
def host() -> SimulatedHost:
    spec = profiles.build_spec(["nvidia-l4", "nvidia-h200", "nvidia-a100-mig", "nvidia-vfio"],
                               vfs=4)
    return SimulatedHost(spec)


@pytest.fixture
def nvml(host) -> SimulatedNvml:
    return SimulatedNvml(host)


def creatable(host, addr: str) -> list[int]:
    text = host.read(f"{DEV}/{addr}/nvidia/creatable_vgpu_types").decode().splitlines()
    return [int(line.split(":")[0]) for line in text[1:]]


def set_type(host, addr: str, type_id: int) -> None:
    host.write(f"{DEV}/{addr}/nvidia/current_vgpu_type", str(type_id))


def read(host, addr: str, name: str) -> bytes:
    return host.read(f"{DEV}/{addr}/nvidia/{name}")


def errno_of(func, *args) -> int:
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


def group_node(host, addr: str) -> str:
    return "vfio/" + os.path.basename(host.realpath(f"{DEV}/{addr}/iommu_group"))


# ------------------------------------------------------------------ mixed-size mode


def test_the_gpus_and_their_capability(nvml):
    assert nvml.gpus() == (L4, H200, A100, L40S)
    assert nvml.status().available and nvml.status().source == "simulator"
    assert [nvml.heterogeneous_capable(g) for g in (L4, H200, A100, L40S)] == [
        True, True, False, True]
    assert nvml.virtualization_mode(L4) == "host_vgpu"
    with pytest.raises(exception.NvmlNotSupported, match="cannot mix vGPU sizes"):
        nvml.set_heterogeneous_mode(A100, True)
    with pytest.raises(exception.NvmlNotFound):
        nvml.heterogeneous_mode("0000:99:00.0")


def test_mixed_size_mode_refused_while_a_vgpu_exists(host, nvml):
    set_type(host, vf(L4, 0), L4_TYPES["6Q"])
    with pytest.raises(exception.NvmlInUse, match="1 vGPU"):
        nvml.set_heterogeneous_mode(L4, True)
    assert nvml.heterogeneous_mode(L4) is False
    set_type(host, vf(L4, 0), 0)
    assert nvml.set_heterogeneous_mode(L4, True) is True


def test_mixed_size_mode_refused_with_mig_enabled(nvml):
    nvml.set_mig_mode(H200, True)
    with pytest.raises(exception.NvmlNotSupported, match="MIG mode is enabled"):
        nvml.set_heterogeneous_mode(H200, True)


@pytest.mark.parametrize("event", ["reboot", "reboot-vfs-disabled", "driver-reload",
                                   "gpu-reset"])
def test_mixed_size_mode_is_lost(host, nvml, event):
    nvml.set_heterogeneous_mode(L4, True)
    if event == "reboot":
        host.reboot()
    elif event == "reboot-vfs-disabled":
        host.reboot(vfs_disabled=True)
    elif event == "driver-reload":
        host.driver_reload("nvidia")
    else:
        host.gpu_reset(L4)
    assert nvml.heterogeneous_mode(L4) is False


def test_mixed_size_mode_is_cleared_by_enabling_the_vfs(host, nvml):
    """Set before the VFs (sriov-manage -e), it reads back on and is gone after."""
    host.reboot(vfs_disabled=True)
    assert nvml.set_heterogeneous_mode(L4, True) is True
    assert nvml.heterogeneous_mode(L4) is True
    assert host.enable_vfs(L4)["enabled"] == [L4]
    assert nvml.heterogeneous_mode(L4) is False, "mixed-size mode survived enable-vfs"
    nvml.set_heterogeneous_mode(L4, True)
    assert host.enable_vfs(L4) == {"enabled": [], "already_enabled": [L4]}
    assert nvml.heterogeneous_mode(L4) is True  # a GPU that has VFs is left alone


# ------------------------------------------------------------------ placements


def test_the_guides_l4_6q_placements(nvml):
    six = nvml.vgpu_placements(L4, L4_TYPES["6Q"])
    assert (six.placement_size, six.supported, six.creatable) == (6, (0, 6, 12, 18),
                                                                   (0, 6, 12, 18))
    with pytest.raises(exception.NvmlInvalidArgument):
        nvml.vgpu_placements(L4, 9999)
    with pytest.raises(exception.NvmlNotSupported):
        nvml.vgpu_placements(H200, H200_1G)  # MIG-backed: no placements of its own


def test_the_creatable_list_mixes_sizes_in_mixed_size_mode(host, nvml):
    set_type(host, vf(L4, 0), L4_TYPES["12Q"])
    homogeneous = creatable(host, vf(L4, 1))
    assert homogeneous == [L4_TYPES["12Q"]]  # equal-size mode: the first size locks
    set_type(host, vf(L4, 0), 0)
    nvml.set_heterogeneous_mode(L4, True)
    set_type(host, vf(L4, 0), L4_TYPES["12Q"])
    assert read(host, vf(L4, 0), "placement_id") == b"0\n"
    set_type(host, vf(L4, 1), L4_TYPES["6Q"])
    assert read(host, vf(L4, 1), "placement_id") == b"12\n"
    # What fits in 18..24 now: 1, 2, 3, 4 and 6 GB, three sizes and more.
    assert creatable(host, vf(L4, 2)) == [L4_TYPES[k] for k in ("1Q", "2Q", "3Q", "4Q", "6Q")]
    set_type(host, vf(L4, 2), L4_TYPES["3Q"])
    assert read(host, vf(L4, 2), "placement_id") == b"18\n"
    assert nvml.vgpu_placements(L4, L4_TYPES["3Q"]).creatable == (21,)
    assert nvml.vgpu_placements(L4, L4_TYPES["6Q"]).creatable == ()
    assert {(v.vf, v.type_id, v.placement_id) for v in nvml.vgpu_instances(L4)} == {
        (vf(L4, 0), L4_TYPES["12Q"], 0), (vf(L4, 1), L4_TYPES["6Q"], 12),
        (vf(L4, 2), L4_TYPES["3Q"], 18)}


def test_placement_files_exist_only_for_a_vgpu(host, nvml):
    free = vf(L4, 0)
    assert errno_of(read, host, free, "placement_id") == errno.ENXIO
    assert errno_of(read, host, free, "gpu_instance_id") == errno.ENXIO
    assert read(host, free, "vgpu_params") == b""
    assert errno_of(host.write, f"{DEV}/{free}/nvidia/vgpu_params",
                    b"vgpu-placement-id=6") == errno.ENXIO
    nvml.set_heterogeneous_mode(L4, True)
    set_type(host, free, L4_TYPES["6Q"])
    assert read(host, free, "placement_id") == b"0\n"
    host.write(f"{DEV}/{free}/nvidia/vgpu_params", b"vgpu-placement-id=18\n")
    assert read(host, free, "placement_id") == b"18\n"
    for bad in (b"placement=6", b"vgpu-placement-id=x", b"vgpu-placement-id=6 7"):
        assert errno_of(host.write, f"{DEV}/{free}/nvidia/vgpu_params", bad) == errno.EINVAL
    assert read(host, free, "placement_id") == b"18\n"


def test_an_overlapping_placement_is_accepted_then_the_vm_cannot_start(host, nvml):
    nvml.set_heterogeneous_mode(L4, True)
    set_type(host, vf(L4, 0), L4_TYPES["12Q"])  # 0..12
    set_type(host, vf(L4, 1), L4_TYPES["6Q"])  # 12..18
    # The write takes any id: the driver finds out only when the guest starts.
    host.write(f"{DEV}/{vf(L4, 1)}/nvidia/vgpu_params", b"vgpu-placement-id=6")
    node = group_node(host, vf(L4, 1))
    host.open(node).close()  # libvirt's and the agent's read-only probe: fine
    assert errno_of(host.open, node, os.O_RDWR) == errno.EIO
    with pytest.raises(exception.SimulatorError, match="overlaps the vGPU of"):
        host.hold(vf(L4, 1))
    failures = host.status()["vgpu_boot_failures"]
    assert [(f["vf"], f["placement_id"]) for f in failures] == [(vf(L4, 1), 6)] * 2
    assert "overlaps the vGPU of 0000:21:00.4 at 0:12" in failures[0]["reason"]
    # An unsupported id fails the same way; a free supported one boots.
    host.write(f"{DEV}/{vf(L4, 1)}/nvidia/vgpu_params", b"vgpu-placement-id=13")
    assert errno_of(host.open, node, os.O_RDWR) == errno.EIO
    host.write(f"{DEV}/{vf(L4, 1)}/nvidia/vgpu_params", b"vgpu-placement-id=18")
    host.open(node, os.O_RDWR).close()
    host.hold(vf(L4, 1))
    assert errno_of(host.write, f"{DEV}/{vf(L4, 1)}/nvidia/vgpu_params",
                    b"vgpu-placement-id=12") == errno.EBUSY


# ------------------------------------------------------------------ MIG


def test_the_h200_profile_table_is_the_real_gpus(nvml):
    table = {p.profile_id: (p.name, p.instance_count, p.memory_mib,
                            tuple(str(x) for x in p.placements))
             for p in nvml.gpu_instance_profiles(H200)}
    assert table == {
        19: ("1g.18gb", 7, 16384, ("0:1", "1:1", "2:1", "3:1", "4:1", "5:1", "6:1")),
        20: ("1g.18gb+me", 1, 16384, ("0:1", "1:1", "2:1", "3:1", "4:1", "5:1", "6:1")),
        15: ("1g.35gb", 4, 33280, ("0:2", "2:2", "4:2", "6:2")),
        14: ("2g.35gb", 3, 33280, ("0:2", "2:2", "4:2")),
        9: ("3g.71gb", 2, 71424, ("0:4", "4:4")),
        5: ("4g.71gb", 1, 71424, ("0:4",)),
        0: ("7g.141gb", 1, 143360, ("0:8",)),
    }
    with pytest.raises(exception.NvmlNotSupported):
        nvml.mig_mode(L4)


def test_mig_mode_is_pending_while_the_gpu_is_in_use(host, nvml):
    set_type(host, vf(H200, 0), H200_4C)
    change = nvml.set_mig_mode(H200, True)
    assert (change.mode, change.activation) == (MigMode(False, True), "IN_USE")
    with pytest.raises(exception.SimulatorError, match="in use"):
        host.gpu_reset(H200)  # the agent never resets; neither does a busy GPU
    set_type(host, vf(H200, 0), 0)
    host.gpu_reset(H200)
    assert nvml.mig_mode(H200) == MigMode(True, True)
    assert nvml.set_mig_mode(A100, True).activation == "SUCCESS"


def test_mig_mode_across_a_reboot_a100_keeps_it_h200_does_not(host, nvml):
    for gpu in (H200, A100):
        nvml.set_mig_mode(gpu, True)
        nvml.create_gpu_instance(gpu, 9, Placement(0, 4))
    host.reboot()
    assert nvml.mig_mode(A100) == MigMode(True, True)
    assert nvml.mig_mode(H200) == MigMode(False, False)
    assert nvml.gpu_instances(A100) == () == nvml.gpu_instances(H200)


def test_gpu_instances_at_their_placements(nvml):
    with pytest.raises(exception.NvmlNotSupported, match="MIG mode is not enabled"):
        nvml.create_gpu_instance(H200, 19, Placement(0, 1))
    nvml.set_mig_mode(H200, True)
    assert nvml.create_gpu_instance(H200, 9, Placement(4, 4)) == GpuInstance(1, 9,
                                                                             Placement(4, 4))
    with pytest.raises(exception.NvmlInsufficientResources, match="overlaps GPU instance 1"):
        nvml.create_gpu_instance(H200, 19, Placement(5, 1))
    with pytest.raises(exception.NvmlInvalidArgument, match="no placement 1:2"):
        nvml.create_gpu_instance(H200, 15, Placement(1, 2))
    with pytest.raises(exception.NvmlInvalidArgument, match="no GPU instance profile 7"):
        nvml.create_gpu_instance(H200, 7, Placement(0, 1))
    for start in (0, 1, 2):
        nvml.create_gpu_instance(H200, 19, Placement(start, 1))
    assert [(g.gpu_instance_id, g.profile_id, str(g.placement))
            for g in nvml.gpu_instances(H200)] == [
        (1, 9, "4:4"), (2, 19, "0:1"), (3, 19, "1:1"), (4, 19, "2:1")]
    nvml.destroy_gpu_instance(H200, 3)
    with pytest.raises(exception.NvmlNotFound):
        nvml.destroy_gpu_instance(H200, 3)
    with pytest.raises(exception.NvmlInUse, match="GPU instance"):
        nvml.set_mig_mode(H200, False)


@pytest.mark.parametrize("event", ["enable-vfs", "reboot", "driver-reload", "gpu-reset"])
def test_gpu_instances_are_gone_after(host, nvml, event):
    if event == "enable-vfs":
        host.reboot(vfs_disabled=True)
    nvml.set_mig_mode(A100, True)
    nvml.create_gpu_instance(A100, 19, Placement(0, 1))
    if event == "enable-vfs":
        assert host.enable_vfs(A100)["enabled"] == [A100]
    elif event == "reboot":
        host.reboot()
    elif event == "driver-reload":
        host.driver_reload("nvidia")
    else:
        host.gpu_reset(A100)
    assert nvml.gpu_instances(A100) == (), f"GPU instances survived {event}"
    assert nvml.mig_mode(A100) == MigMode(True, True)  # the A100-class keeps its mode


def test_a_mig_backed_type_needs_a_free_gpu_instance(host, nvml):
    vf0, vf1 = vf(H200, 0), vf(H200, 1)
    time_sliced = creatable(host, vf0)
    assert H200_1G not in time_sliced and H200_4C in time_sliced
    nvml.set_mig_mode(H200, True)
    assert creatable(host, vf0) == []  # MIG on: no time-sliced type, no instance yet
    assert errno_of(set_type, host, vf0, H200_1G) == errno.EIO
    assert read(host, vf0, "current_vgpu_type") == b"0\n"
    assert errno_of(set_type, host, vf0, H200_4C) == errno.EINVAL
    gi = nvml.create_gpu_instance(H200, 19, Placement(6, 1))
    nvml.create_gpu_instance(H200, 9, Placement(0, 4))
    assert creatable(host, vf0) == [H200_1G, H200_3G]
    assert [t.type_id for t in nvml.vgpu_types(H200, creatable=True)] == [H200_1G, H200_3G]
    set_type(host, vf0, H200_1G)
    assert read(host, vf0, "gpu_instance_id") == f"{gi.gpu_instance_id}\n".encode()
    assert creatable(host, vf1) == [H200_3G]  # the 1g instance is taken
    assert errno_of(set_type, host, vf1, H200_1G) == errno.EIO
    [vgpu] = nvml.vgpu_instances(H200)
    assert (vgpu.vf, vgpu.type_id, vgpu.gpu_instance_id, vgpu.placement_id) == (
        vf0, H200_1G, gi.gpu_instance_id, None)
    with pytest.raises(exception.NvmlInUse, match=f"the vGPU of {vf0} uses it"):
        nvml.destroy_gpu_instance(H200, gi.gpu_instance_id)
    types = {t.type_id: t for t in nvml.vgpu_types(H200)}
    assert types[H200_1G].gpu_instance_profile_id == 19
    assert types[H200_4C].gpu_instance_profile_id is None


# ------------------------------------------------------------------ the spec travels


def test_the_specs_json_keeps_placements_and_mig():
    """The FUSE simulator is a subprocess that gets the spec as JSON."""
    spec = profiles.build_spec(["nvidia-l4", "nvidia-h200", "nvidia-a100-mig"])
    again = HostSpec.from_json(spec.to_json())
    assert again == spec
    h200 = next(p for p in again.sriov_pfs if p.address == H200)
    assert h200.mig is not None and h200.mig.mode_persists is False
    assert h200.heterogeneous is True


@pytest.mark.parametrize(("change", "message"), [
    ({"placements": [0, 6, 6]}, "listed twice"),
    ({"placement_size": None}, "placements without a placement_size"),
    ({"gpu_instance_profile": 19}, "MIG-backed type has no placements"),
])
def test_bad_vgpu_type_specs_are_refused(change, message):
    data = {"type_id": 1, "name": "T", "framebuffer_mib": 1024, "max_instances": 4,
            "placement_size": 6, "placements": [0, 6], **change}
    with pytest.raises(exception.SimulatorSpecInvalid, match=message):
        profiles.VgpuTypeSpec.from_dict(data)


def test_a_mig_backed_type_needs_its_profile_in_the_gpus_spec():
    pf = profiles.nvidia_h200().sriov_pfs[0]
    without_mig = {k: v for k, v in pf.to_dict().items() if k != "mig"}
    with pytest.raises(exception.SimulatorSpecInvalid, match="profile 19, which the GPU's MIG"):
        profiles.SriovPfSpec.from_dict(without_mig)
