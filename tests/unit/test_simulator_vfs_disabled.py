"""NVIDIA vGPU 17+ GPUs whose VFs are disabled: ``reboot --vfs-disabled``,
``driver-reload`` and ``enable-vfs`` (NVIDIA's ``sriov-manage -e``), on the
in-process model (accel_agent/simulator/pci_sriov.py, pci.py, model.py)."""

from __future__ import annotations

import errno

import pytest

from accel_agent import exception
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvidia_vfio import HEADER
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.spec import HostSpec, SriovPfSpec

PF, PF2 = "0000:c1:00.0", "0000:c2:00.0"
NIC = "0000:10:00.0"
DEV = "bus/pci/devices"
Q4 = 1150
ALL_TYPES = [t.type_id for t in profiles.L40S_VGPU_TYPES]


def vf(index: int, pf: str = PF) -> str:
    return SriovPfSpec(pf, "nvidia", "nvidia", 32, vf_offset=4).vf_address(index)


def nic_with_boot_vfs() -> HostSpec:
    """An igb port whose boot script enables 2 VFs: not NVIDIA's, so a
    ``--vfs-disabled`` reboot must leave it alone."""
    nic = SriovPfSpec(address=NIC, driver="igb", vf_driver="igbvf", total_vfs=7, num_vfs=2,
                      vendor_id=0x8086, device_id=0x10C9, vf_device_id=0x10CA,
                      vf_offset=0x80, vf_stride=2, netdev="enp16s0f0")
    return HostSpec(sriov_pfs=(nic,), profiles=("nic",))


@pytest.fixture
def host() -> SimulatedHost:
    spec = HostSpec.merge([build_spec(["nvidia-vfio", "mtty"], gpus=2, vfs=4),
                           nic_with_boot_vfs()])
    return SimulatedHost(spec)


def set_type(host: SimulatedHost, addr: str, value: int) -> None:
    host.write(f"{DEV}/{addr}/nvidia/current_vgpu_type", str(value))


def creatable(host: SimulatedHost, addr: str) -> list[int]:
    text = host.read(f"{DEV}/{addr}/nvidia/creatable_vgpu_types")
    assert text.startswith(HEADER)
    return [int(line.split(b":")[0]) for line in text[len(HEADER):].splitlines()]


def vf_count(host: SimulatedHost, pf: str) -> tuple[int, list[str], list[str]]:
    """What the agent can see of a PF's VFs: sriov_numvfs, its virtfn links,
    and the VF devices on the bus."""
    numvfs = int(host.read(f"{DEV}/{pf}/sriov_numvfs"))
    links = [n for n in host.listdir(f"{DEV}/{pf}") if n.startswith("virtfn")]
    prefix = pf.rsplit(":", 1)[0]
    devices = [d for d in host.listdir(DEV) if d.startswith(prefix) and d != pf]
    return numvfs, links, devices


def pf_status(host: SimulatedHost) -> dict[str, tuple[int, bool, bool]]:
    return {p["address"]: (p["num_vfs"], p["vfs_enabled"], p["vgpu"])
            for p in host.status()["sriov_pfs"]}


def mtty_mdev(host: SimulatedHost) -> str:
    return host.create_mdev("mtty", "mtty-2", "11111111-2222-3333-4444-555555555555")


# ------------------------------------------------------------------ reboot


def test_reboot_with_vfs_disabled_leaves_the_gpus_without_any_vf(host):
    set_type(host, vf(1), Q4)
    host.hold(vf(1))  # a VM: a reboot forgets it
    host.reboot(vfs_disabled=True)
    for pf in (PF, PF2):
        assert vf_count(host, pf) == (0, [], [])
        assert host.readlink(f"{DEV}/{pf}/driver").endswith("bus/pci/drivers/nvidia")
        assert host.read(f"{DEV}/{pf}/sriov_totalvfs") == b"32\n"
    assert not host.exists(f"{DEV}/{vf(1)}/nvidia/current_vgpu_type")
    assert host.vgpus() == [] and [v for v in host.vfs() if v["physfn"] != NIC] == []
    assert host.listdir("bus/pci/drivers/nvidia") == ["0000:c1:00.0", "0000:c2:00.0", "bind",
                                                      "unbind"]
    # Not NVIDIA's: the NIC's boot script still enabled its VFs.
    assert vf_count(host, NIC)[0] == 2
    assert pf_status(host) == {NIC: (2, True, False), PF: (0, False, True),
                               PF2: (0, False, True)}


def test_a_plain_reboot_keeps_the_vfs(host):
    set_type(host, vf(1), Q4)
    host.reboot()
    numvfs, links, devices = vf_count(host, PF)
    assert (numvfs, len(links), len(devices)) == (4, 4, 4)
    assert host.read(f"{DEV}/{vf(1)}/nvidia/current_vgpu_type") == b"0\n"
    assert pf_status(host)[PF] == (4, True, True)


def test_a_plain_reboot_after_a_vfs_disabled_one_enables_them_again(host):
    host.reboot(vfs_disabled=True)
    host.reboot()
    assert vf_count(host, PF2)[0] == 4


# ------------------------------------------------------------------ enable-vfs


def test_enable_vfs_all_brings_every_vf_back_untyped_bound_and_announced(host):
    host.reboot(vfs_disabled=True)
    seq = host.events_since()[-1].seq
    assert host.enable_vfs("ALL") == {"enabled": [PF, PF2], "already_enabled": []}
    for pf in (PF, PF2):
        numvfs, links, devices = vf_count(host, pf)
        assert (numvfs, len(links), len(devices)) == (32, 32, 32)  # sriov_totalvfs
        assert host.readlink(f"{DEV}/{pf}/virtfn31") == f"../{vf(31, pf)}"
    for addr in (vf(0), vf(31), vf(5, PF2)):
        d = f"{DEV}/{addr}"
        assert host.readlink(f"{d}/driver").endswith("bus/pci/drivers/nvidia")
        assert host.read(f"{d}/nvidia/current_vgpu_type") == b"0\n"
        assert creatable(host, addr) == ALL_TYPES  # the creatable list is full again
    events = [(e.action, e.devpath.rsplit("/", 1)[1]) for e in host.events_since(seq)]
    assert events[:2] == [("add", vf(0)), ("bind", vf(0))]
    assert events.count(("add", vf(31, PF2))) == 1 and len(events) == 2 * 64
    # The homogeneous rule works on the new VFs.
    set_type(host, vf(0), Q4)
    assert creatable(host, vf(1)) == [Q4, 1160]
    assert pf_status(host)[PF] == (32, True, True)


def test_enable_vfs_of_one_gpu_leaves_the_other_and_is_idempotent(host):
    host.reboot(vfs_disabled=True)
    assert host.enable_vfs("0000:C1:00.0") == {"enabled": [PF], "already_enabled": []}
    assert vf_count(host, PF2) == (0, [], [])
    generation = host.generation
    assert host.enable_vfs("all") == {"enabled": [PF2], "already_enabled": [PF]}
    assert host.enable_vfs(PF) == {"enabled": [], "already_enabled": [PF]}
    assert vf_count(host, PF)[0] == 32
    assert host.generation > generation


def test_enable_vfs_leaves_a_gpu_that_kept_its_boot_vfs_alone(host):
    set_type(host, vf(2), Q4)
    assert host.enable_vfs("ALL") == {"enabled": [], "already_enabled": [PF, PF2]}
    assert vf_count(host, PF)[0] == 4
    assert host.read(f"{DEV}/{vf(2)}/nvidia/current_vgpu_type") == b"1150\n"


@pytest.mark.parametrize(("target", "message"), [
    (NIC, "is not an NVIDIA vGPU 17\\+ GPU"),
    ("0000:84:00.0", "is not an NVIDIA vGPU 17\\+ GPU"),
    ("mtty", "neither a PCI address nor ALL"),
    ("", "neither a PCI address nor ALL"),
])
def test_enable_vfs_refuses_what_is_no_vgpu_gpu(host, target, message):
    host.reboot(vfs_disabled=True)
    generation = host.generation
    with pytest.raises(exception.SimulatorError, match=message):
        host.enable_vfs(target)
    assert host.generation == generation


def test_enable_vfs_all_changes_nothing_when_one_gpu_is_off_its_driver(host):
    host.reboot(vfs_disabled=True)
    host.write("bus/pci/drivers/nvidia/unbind", PF2)
    with pytest.raises(exception.SimulatorError, match=f"{PF2} is bound to no driver"):
        host.enable_vfs("ALL")
    assert vf_count(host, PF) == (0, [], [])  # checked before anything changed
    host.write(f"{DEV}/{PF}/driver_override", "vfio-pci")
    host.write("bus/pci/drivers/nvidia/unbind", PF)
    host.write("bus/pci/drivers_probe", PF)
    with pytest.raises(exception.SimulatorError, match=f"{PF} is bound to vfio-pci, not nvidia"):
        host.enable_vfs(PF)
    assert vf_count(host, PF) == (0, [], [])


def test_enable_vfs_on_a_host_without_vgpu_gpus_is_an_error():
    host = SimulatedHost(build_spec(["igb-sriov"]))
    with pytest.raises(exception.SimulatorError, match="no NVIDIA vGPU 17"):
        host.enable_vfs("ALL")


# ------------------------------------------------------------------ driver-reload


def test_driver_reload_disables_the_vfs_and_leaves_other_drivers_alone(host):
    uuid = mtty_mdev(host)
    set_type(host, vf(0), Q4)
    handle = host.open(f"{DEV}/{vf(0)}/nvidia/current_vgpu_type")
    assert host.driver_reload() == [PF, PF2]
    for pf in (PF, PF2):
        assert vf_count(host, pf) == (0, [], [])
        assert host.readlink(f"{DEV}/{pf}/driver").endswith("bus/pci/drivers/nvidia")
    assert host.vgpus() == []
    with pytest.raises(OSError) as info:
        handle.read()  # a stale descriptor of a VF that went away
    assert info.value.errno == errno.ENODEV
    assert [m.uuid for m in host.mdevs()] == [uuid]  # mtty's mdev survives
    assert vf_count(host, NIC)[0] == 2  # igb was not reloaded
    assert host.enable_vfs("ALL")["enabled"] == [PF, PF2]
    assert creatable(host, vf(0)) == ALL_TYPES


def test_driver_reload_is_refused_while_a_vf_is_in_use(host):
    set_type(host, vf(3, PF2), Q4)
    host.hold(vf(3, PF2))
    generation = host.generation
    with pytest.raises(exception.SimulatorError, match="rmmod nvidia: module in use"):
        host.driver_reload("nvidia")
    assert host.generation == generation
    assert vf_count(host, PF)[0] == 4
    assert [v["address"] for v in host.vgpus()] == [vf(3, PF2)]
    host.release(vf(3, PF2))
    host.driver_reload("nvidia")
    assert host.vgpus() == []


def test_reloading_a_nic_driver_disables_its_vfs_and_reregisters_its_netdev(host):
    assert host.driver_reload("igb") == [NIC]
    assert vf_count(host, NIC)[0] == 0  # igb's max_vfs defaults to 0
    assert host.listdir(f"{DEV}/{NIC}/net") == ["enp16s0f0"]
    assert vf_count(host, PF)[0] == 4


def test_driver_reload_of_an_mdev_drivers_parent_destroys_its_mdevs():
    host = SimulatedHost(build_spec(["nvidia-pf"], gpus=1))
    parent = host.parent_names()[0]
    type_id = host.listdir(f"class/mdev_bus/{parent}/mdev_supported_types")[0]
    host.create_mdev(parent, type_id, "11111111-2222-3333-4444-555555555555")
    host.driver_reload("nvidia")
    assert host.mdevs() == []
    assert host.parent_names(registered_only=True) == [parent]


def test_driver_reload_of_an_unknown_driver_is_an_error(host):
    with pytest.raises(exception.SimulatorError, match="no PCI device is bound to nouveau"):
        host.driver_reload("nouveau")
