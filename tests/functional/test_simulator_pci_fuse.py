"""The simulator's PCI side through a mounted FUSE tree: real open(2)/write(2),
the kernel's errno values crossing FUSE, and the control socket's hooks."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from accel_agent.simulator import control
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.testing import fuse_unavailable_reason, mounted

pytestmark = pytest.mark.fuse

_REASON = fuse_unavailable_reason()
if _REASON:
    pytest.skip(f"FUSE simulator unavailable: {_REASON}", allow_module_level=True)

GPU = "bus/pci/devices/0000:c1:00.0"
VF0, VF1 = "bus/pci/devices/0000:c1:00.4", "bus/pci/devices/0000:c1:00.5"
NIC = "bus/pci/devices/0000:10:00.0"
NIC_VF0 = "0000:10:10.0"


@pytest.fixture(scope="module")
def module_sim(tmp_path_factory):
    spec = build_spec(["nvidia-pf", "nvidia-vfio", "igb-sriov"], gpus=2, vfs=4)
    with mounted(spec, tmp_path_factory.mktemp("fuse") / "sys") as sim:
        yield sim


@pytest.fixture
def sim(module_sim):
    module_sim.reboot()  # every test starts from the boot state
    return module_sim


def write(path: str, data: bytes) -> int:
    """One open + one write(2), the way the agent writes sysfs; 0 or the errno."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)
    return 0


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def group_of(sim, rel: str) -> str:
    return os.path.basename(os.path.realpath(sim.path(rel, "iommu_group")))


def test_vgpu_create_and_destroy_through_fuse(sim):
    current = sim.path(VF0, "nvidia", "current_vgpu_type")
    creatable = sim.path(VF1, "nvidia", "creatable_vgpu_types")
    assert read(creatable).startswith(b"ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n")
    with pytest.raises(OSError) as info:
        read(sim.path(VF0, "nvidia", "gpu_instance_id"))
    assert info.value.errno == errno.ENXIO
    assert write(current, b"9999") == errno.EINVAL
    assert read(current) == b"0\n"
    assert write(current, b"1150") == 0  # no newline, as the agent writes it
    assert read(current) == b"1150\n"
    assert read(sim.path(VF0, "nvidia", "gpu_instance_id")) == b"0\n"
    assert read(creatable) == b"ID    : vGPU Name\n1150  : NVIDIA L40S-4Q\n1160  : NVIDIA L40S-4A\n"
    assert write(sim.path(VF1, "nvidia", "current_vgpu_type"), b"1147\n") == errno.EINVAL
    assert write(current, b"1160") == errno.EINVAL  # typed already
    status = sim.status()
    assert [(v["address"], v["type_id"]) for v in status["vgpus"]] == [("0000:c1:00.4", 1150)]
    assert write(current, b"0") == 0
    assert read(current) == b"0\n"
    assert os.listdir(sim.path("class/mdev_bus")) == ["0000:84:00.0", "0000:85:00.0"]


def test_destroy_of_a_vgpu_in_use_is_ebusy_through_fuse(sim):
    current = sim.path(VF0, "nvidia", "current_vgpu_type")
    assert write(current, b"1150") == 0
    node = sim.path("vfio", group_of(sim, VF0))
    fd = os.open(node, os.O_RDONLY)  # what QEMU holds
    try:
        with pytest.raises(OSError) as info:
            os.close(os.open(node, os.O_RDONLY))  # the agent's in-use probe
        assert info.value.errno == errno.EBUSY
        assert write(current, b"0") == errno.EBUSY
    finally:
        os.close(fd)
    sim.hold("0000:c1:00.4")  # the control socket's VM
    assert write(current, b"0") == errno.EBUSY
    assert sim.status()["vgpus"][0]["held"] is True
    sim.release("0000:c1:00.4")
    assert write(current, b"0") == 0


def test_injected_vgpu_write_failure_through_the_control_socket(sim):
    sim.fail_next_vgpu_write("EIO", vf="0000:c1:00.5", type_id=1150)
    assert write(sim.path(VF0, "nvidia", "current_vgpu_type"), b"1150") == 0  # another VF
    assert write(sim.path(VF1, "nvidia", "current_vgpu_type"), b"1150") == errno.EIO
    assert write(sim.path(VF1, "nvidia", "current_vgpu_type"), b"1150") == 0


def test_reboot_resets_vgpus(sim):
    assert write(sim.path(VF0, "nvidia", "current_vgpu_type"), b"1156") == 0
    sim.reboot()
    assert read(sim.path(VF0, "nvidia", "current_vgpu_type")) == b"0\n"
    assert read(sim.path(GPU, "sriov_numvfs")) == b"4\n"


def vfs_enabled(sim) -> dict[str, bool]:
    return {p["address"]: p["vfs_enabled"] for p in sim.status()["sriov_pfs"]}


def test_reboot_with_vfs_disabled_then_enable_vfs_through_fuse(sim):
    current = sim.path(VF0, "nvidia", "current_vgpu_type")
    assert write(current, b"1150") == 0
    stale = os.open(current, os.O_RDONLY)  # the agent had it open across the reboot
    try:
        sim.reboot(vfs_disabled=True)
        with pytest.raises(OSError) as info:
            os.pread(stale, 64, 0)
        assert info.value.errno == errno.ENODEV
    finally:
        os.close(stale)
    for gpu in (GPU, "bus/pci/devices/0000:c2:00.0"):
        assert read(sim.path(gpu, "sriov_numvfs")) == b"0\n"
        assert read(sim.path(gpu, "sriov_totalvfs")) == b"32\n"
        assert [n for n in os.listdir(sim.path(gpu)) if n.startswith("virtfn")] == []
    assert not os.path.lexists(sim.path(VF0))
    assert not any(d.startswith("0000:c1:00.") and d != "0000:c1:00.0"
                   for d in os.listdir(sim.path("bus/pci/devices")))
    assert vfs_enabled(sim) == {"0000:10:00.0": False, "0000:c1:00.0": False,
                                "0000:c2:00.0": False}  # the NIC has none at boot
    # The mdev GPUs of the same host are back as after any reboot.
    assert os.listdir(sim.path("class/mdev_bus")) == ["0000:84:00.0", "0000:85:00.0"]

    assert sim.enable_vfs("ALL") == {"enabled": ["0000:c1:00.0", "0000:c2:00.0"],
                                     "already_enabled": []}
    assert read(sim.path(GPU, "sriov_numvfs")) == b"32\n"
    assert os.readlink(sim.path(GPU, "virtfn31")) == "../0000:c1:04.3"
    assert read(current) == b"0\n"
    creatable = read(sim.path(GPU, "virtfn31", "nvidia", "creatable_vgpu_types"))
    assert len(creatable.splitlines()) == 1 + 23  # every type: the card is empty
    assert os.path.basename(os.path.realpath(sim.path(VF0, "driver"))) == "nvidia"
    assert vfs_enabled(sim) == {"0000:10:00.0": False, "0000:c1:00.0": True,
                                "0000:c2:00.0": True}
    assert write(current, b"1150") == 0  # and they can be typed again


def test_driver_reload_is_refused_while_a_vfs_group_is_open_through_fuse(sim):
    assert write(sim.path(VF1, "nvidia", "current_vgpu_type"), b"1156") == 0
    fd = os.open(sim.path("vfio", group_of(sim, VF1)), os.O_RDONLY)  # QEMU has it
    try:
        with pytest.raises(Exception, match="module in use"):
            sim.driver_reload("nvidia")
        assert read(sim.path(VF1, "nvidia", "current_vgpu_type")) == b"1156\n"
    finally:
        os.close(fd)
    assert "0000:c1:00.0" in sim.driver_reload("nvidia")
    assert read(sim.path(GPU, "sriov_numvfs")) == b"0\n"
    assert not os.path.lexists(sim.path(VF1))


def test_sriov_numvfs_through_the_shell_and_fuse(sim):
    numvfs = sim.path(NIC, "sriov_numvfs")
    res = subprocess.run(["sh", "-c", f"echo 3 > '{numvfs}'"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert read(numvfs) == b"3\n"
    assert os.readlink(sim.path(NIC, "virtfn2")) == "../0000:10:10.4"
    assert os.path.basename(os.path.realpath(sim.path(NIC, "virtfn0", "driver"))) == "igbvf"
    assert os.path.realpath(sim.path(NIC, "virtfn0", "physfn")) == os.path.realpath(
        sim.path(NIC))
    assert write(numvfs, b"2") == errno.EBUSY
    assert write(numvfs, b"8") == errno.ERANGE
    assert write(numvfs, b"two") == errno.EINVAL
    assert write(numvfs, b"0\n") == 0
    assert not os.path.lexists(sim.path(NIC, "virtfn0"))
    assert os.listdir(sim.path(NIC, "net")) == ["enp16s0f0"]


def test_a_vf_handed_to_vfio_pci_through_fuse(sim):
    assert write(sim.path(NIC, "sriov_numvfs"), b"2") == 0
    vf = f"bus/pci/devices/{NIC_VF0}"
    node = sim.path("vfio", group_of(sim, vf))
    with pytest.raises(OSError) as info:
        os.open(node, os.O_RDONLY)
    assert info.value.errno == errno.ENODEV  # igbvf is no VFIO driver
    drivers = sim.path("bus/pci/drivers")
    assert write(os.path.join(drivers, "vfio-pci", "bind"), NIC_VF0.encode()) == errno.ENODEV
    assert write(sim.path(vf, "driver_override"), b"vfio-pci") == 0
    assert read(sim.path(vf, "driver_override")) == b"vfio-pci\n"
    assert write(os.path.join(drivers, "igbvf", "unbind"), NIC_VF0.encode()) == 0
    assert not os.path.lexists(sim.path(vf, "driver"))
    assert write(sim.path("bus/pci/drivers_probe"), NIC_VF0.encode() + b"\n") == 0
    assert os.readlink(sim.path(vf, "driver")).endswith("bus/pci/drivers/vfio-pci")
    # unbind through a driver the device is not bound to
    assert write(os.path.join(drivers, "igbvf", "unbind"), NIC_VF0.encode()) == errno.ENODEV
    fd = os.open(node, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            os.open(node, os.O_RDONLY)
        assert info.value.errno == errno.EBUSY
        assert write(os.path.join(drivers, "vfio-pci", "unbind"), NIC_VF0.encode()) == \
            errno.EBUSY
        assert write(sim.path(NIC, "sriov_numvfs"), b"0") == errno.EBUSY
    finally:
        os.close(fd)
    assert write(os.path.join(drivers, "vfio-pci", "bind"), NIC_VF0.encode()) == errno.EBUSY
    assert write(os.path.join(drivers, "igbvf", "unbind"), b"0000:10:1f.0") == errno.ENODEV
    assert write(sim.path(NIC, "sriov_numvfs"), b"0") == 0
    assert not os.path.exists(node)


def _hand_to_vfio_pci(sim) -> tuple[str, str]:
    """NIC_VF0 bound to vfio-pci; its unbind file and its group node."""
    vf = f"bus/pci/devices/{NIC_VF0}"
    drivers = sim.path("bus/pci/drivers")
    assert write(sim.path(NIC, "sriov_numvfs"), b"2") == 0
    assert write(sim.path(vf, "driver_override"), b"vfio-pci") == 0
    assert write(os.path.join(drivers, "igbvf", "unbind"), NIC_VF0.encode()) == 0
    assert write(os.path.join(drivers, "vfio-pci", "bind"), NIC_VF0.encode()) == 0
    return os.path.join(drivers, "vfio-pci", "unbind"), sim.path("vfio", group_of(sim, vf))


def rebind(sim) -> None:
    assert write(sim.path("bus/pci/drivers/vfio-pci/bind"), NIC_VF0.encode()) == 0


def test_a_closed_group_is_free_for_the_very_next_write_through_fuse(sim):
    """The agent's in-use probe opens and closes the group, then unbinds at
    once.  The kernel lets the group go inside close(2); FUSE's RELEASE comes
    later, so the simulator lets go at FLUSH.  When it let go at RELEASE,
    about 3 unbinds in 100 failed with EBUSY; 300 in a row passing is what
    that fault cannot do (0.97**300 < 0.0002)."""
    unbind, node = _hand_to_vfio_pci(sim)
    refused = 0
    for _ in range(300):
        os.close(os.open(node, os.O_RDONLY | os.O_NONBLOCK))
        if write(unbind, NIC_VF0.encode()) != 0:
            refused += 1
            continue
        rebind(sim)
    assert refused == 0


def test_a_killed_holder_lets_go_before_it_is_reaped_through_fuse(sim):
    """A VM holds the group: its unbind is EBUSY.  Killed, and reaped by its
    parent, it holds nothing: the kernel closes a dying task's files in
    do_exit(), and the simulator lets go at the FLUSH of that close."""
    unbind, node = _hand_to_vfio_pci(sim)
    holder = ("import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
              "print('held', flush=True); time.sleep(600)")
    for _ in range(5):
        vm = subprocess.Popen([sys.executable, "-c", holder, node], stdout=subprocess.PIPE)
        try:
            assert vm.stdout.readline() == b"held\n"
            assert write(unbind, NIC_VF0.encode()) == errno.EBUSY
        finally:
            vm.kill()
            vm.wait()
            vm.stdout.close()
        assert write(unbind, NIC_VF0.encode()) == 0
        rebind(sim)


def test_cli_mounts_nvidia_vfio_and_shows_typed_vfs(tmp_path):
    rundir = tempfile.mkdtemp(prefix="accel-sim-cli-", dir="/tmp")
    env = dict(os.environ, ACCEL_SIM_RUNDIR=rundir)
    mp = str(tmp_path / "sys")
    cmd = [sys.executable, "-m", "accel_agent.simulator"]
    try:
        res = subprocess.run([*cmd, "mount", mp, "--profile", "nvidia-vfio", "--gpus", "2",
                              "--vfs", "16"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        gpu2 = os.path.join(mp, "bus/pci/devices/0000:c2:00.0")
        assert read(os.path.join(gpu2, "sriov_numvfs")) == b"16\n"
        assert os.readlink(os.path.join(gpu2, "virtfn15")) == "../0000:c2:02.3"
        assert write(os.path.join(gpu2, "virtfn15", "nvidia", "current_vgpu_type"),
                     b"1155") == 0
        res = subprocess.run([*cmd, "status", mp], env=env, capture_output=True, text=True,
                             timeout=30, check=False)
        assert res.returncode == 0, res.stderr
        assert "  pf 0000:c2:00.0 nvidia  vfs 16/32  vgpus 1" in res.stdout
        assert "  vgpu 0000:c2:02.3 1155 NVIDIA L40S-24Q group" in res.stdout
        res = subprocess.run([*cmd, "fail-next-vgpu-write", mp, "ENOSPC", "--vf",
                              "0000:c2:02.3", "--type-id", "0"], env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert res.returncode == 0, res.stderr
        assert write(os.path.join(gpu2, "virtfn15", "nvidia", "current_vgpu_type"),
                     b"0") == errno.ENOSPC
        # A VM holds it: EBUSY, unless the driver is told to accept.
        vgpu_type = os.path.join(gpu2, "virtfn15", "nvidia", "current_vgpu_type")

        def simulate(*args: str) -> None:
            res = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True,
                                 timeout=30, check=False)
            assert res.returncode == 0, res.stderr

        simulate("hold", mp, "0000:c2:02.3")
        assert write(vgpu_type, b"0") == errno.EBUSY
        simulate("accept-held-vgpu-destroy", mp)
        simulate("accept-held-vgpu-destroy", mp, "--refuse")
        assert write(vgpu_type, b"0") == errno.EBUSY
        simulate("accept-held-vgpu-destroy", mp)
        assert write(vgpu_type, b"0") == 0 and read(vgpu_type) == b"0\n"
        res = subprocess.run([*cmd, "hold", mp, "0000:c2:00.4"], env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert res.returncode == 0, res.stderr
        res = subprocess.run([*cmd, "hold", mp, "0000:c2:1f.0"], env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert res.returncode == 1 and "no PCI device 0000:c2:1f.0" in res.stderr
        res = subprocess.run([*cmd, "umount", mp], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
    finally:
        if control.is_mounted(mp):
            control.fusermount_unmount(mp, lazy=True)
        shutil.rmtree(rundir, ignore_errors=True)


def test_the_agents_nvml_and_the_fuse_tree_are_one_state(sim):
    """What the daemon does: read the tree (real open(2) through FUSE) and ask
    the NVML the tree names (accel_agent.nvml.for_sysfs_root): a mode set
    through NVML changes what the VFs list, a vGPU typed through the tree is
    an active vGPU to NVML, and NVML's IN_USE crosses the socket as itself."""
    from accel_agent import exception, nvml
    from accel_agent.nvml.simulated import SimulatedNvmlClient

    gpus = nvml.for_sysfs_root(sim.root)
    assert isinstance(gpus, SimulatedNvmlClient)
    assert gpus.status().source == "simulator"
    assert gpus.gpus() == ("0000:c1:00.0", "0000:c2:00.0")
    pf = "0000:c1:00.0"
    creatable = sim.path(VF1, "nvidia", "creatable_vgpu_types")
    assert gpus.set_heterogeneous_mode(pf, True) is True
    assert write(sim.path(VF0, "nvidia", "current_vgpu_type"), b"1155") == 0  # L40S-24Q
    listed = read(creatable).decode()
    # Mixed-size mode: the other half takes any size, not only 24 GB.
    assert "1147  : NVIDIA L40S-1Q" in listed and "1155  : NVIDIA L40S-24Q" in listed
    assert read(sim.path(VF0, "nvidia", "placement_id")) == b"0\n"
    [vgpu] = gpus.vgpu_instances(pf)
    assert (vgpu.vf, vgpu.type_id, vgpu.placement_id) == ("0000:c1:00.4", 1155, 0)
    assert gpus.vgpu_placements(pf, 1155).creatable == (24,)
    with pytest.raises(exception.NvmlInUse, match="1 vGPU"):
        gpus.set_heterogeneous_mode(pf, False)
    with pytest.raises(exception.NvmlNotSupported, match="no MIG"):
        gpus.mig_mode(pf)
    sim.reboot()
    assert gpus.heterogeneous_mode(pf) is False  # lost with the reboot, as the tree's types


def test_a_vm_cannot_open_a_vgpu_on_an_overlapping_placement_through_fuse(sim):
    """The write of a bad placement succeeds; QEMU's read-write open of the
    VF's group fails (the guest does not boot), the in-use probe's read-only
    open does not."""
    from accel_agent import nvml

    nvml.for_sysfs_root(sim.root).set_heterogeneous_mode("0000:c1:00.0", True)
    assert write(sim.path(VF0, "nvidia", "current_vgpu_type"), b"1155") == 0  # 0..24
    assert write(sim.path(VF1, "nvidia", "current_vgpu_type"), b"1155") == 0  # 24..48
    assert write(sim.path(VF1, "nvidia", "vgpu_params"), b"vgpu-placement-id=12") == 0
    node = sim.path("vfio", group_of(sim, VF1))
    before = len(sim.status()["vgpu_boot_failures"])  # kept across reboots, as writes are
    os.close(os.open(node, os.O_RDONLY | os.O_NONBLOCK))
    with pytest.raises(OSError) as info:
        os.open(node, os.O_RDWR)
    assert info.value.errno == errno.EIO
    assert [f["vf"] for f in sim.status()["vgpu_boot_failures"][before:]] == ["0000:c1:00.5"]
    assert write(sim.path(VF1, "nvidia", "vgpu_params"), b"vgpu-placement-id=24") == 0
    os.close(os.open(node, os.O_RDWR))
