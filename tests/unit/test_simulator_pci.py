"""The simulator's PCI side: SR-IOV VFs through sriov_numvfs, driver binding,
driver_override, drivers_probe and the VFIO group nodes of PCI functions, with
the kernel's errno values (accel_agent/simulator/pci.py names the sources)."""

from __future__ import annotations

import errno
import json

import pytest

from accel_agent import exception
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.spec import HostSpec, SriovPfSpec

PF = "0000:10:00.0"
PF_DIR = "bus/pci/devices/0000:10:00.0"
VF0, VF1, VF2 = "0000:10:10.0", "0000:10:10.2", "0000:10:10.4"
DRIVERS = "bus/pci/drivers"


def errno_of(func, *args) -> int:
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


@pytest.fixture
def igb() -> SimulatedHost:
    return SimulatedHost(profiles.igb_sriov(nics=2))


def numvfs(host: SimulatedHost, pf_dir: str = PF_DIR) -> int:
    return int(host.read(f"{pf_dir}/sriov_numvfs"))


def driver_of(host: SimulatedHost, addr: str) -> str | None:
    link = f"bus/pci/devices/{addr}/driver"
    if not host.exists(link):
        return None
    return host.realpath(link).rsplit("/", 1)[1]


# ------------------------------------------------------------------ layout


def test_igb_pf_layout(igb):
    pf = igb.realpath(PF_DIR)
    assert pf == "devices/pci0000:00/0000:00:1d.7/0000:10:00.0"
    assert igb.read(f"{pf}/vendor") == b"0x8086\n"
    assert igb.read(f"{pf}/device") == b"0x10c9\n"
    assert igb.readlink(f"{pf}/driver") == "../../../../bus/pci/drivers/igb"
    assert igb.read(f"{pf}/sriov_totalvfs") == b"7\n"
    assert igb.read(f"{pf}/sriov_numvfs") == b"0\n"
    assert igb.read(f"{pf}/sriov_offset") == b"128\n"
    assert igb.read(f"{pf}/sriov_stride") == b"2\n"
    assert igb.read(f"{pf}/sriov_vf_device") == b"10ca\n"
    assert igb.read(f"{pf}/sriov_drivers_autoprobe") == b"1\n"
    assert igb.read(f"{pf}/driver_override") == b"(null)\n"
    assert igb.lstat(f"{pf}/driver_override").mode & 0o777 == 0o644
    assert igb.lstat(f"{pf}/sriov_numvfs").mode & 0o777 == 0o644
    assert igb.read(f"{pf}/uevent").startswith(b"DRIVER=igb\nPCI_CLASS=20000\n")
    # the netdev an agent looks up the PF's interface by
    assert igb.listdir(f"{pf}/net") == ["enp16s0f0"]
    assert igb.realpath("class/net/enp16s0f0") == f"{pf}/net/enp16s0f0"
    assert igb.realpath("class/net/enp16s0f0/device") == pf
    assert igb.listdir("class/net") == ["enp16s0f0", "enp16s0f1"]
    assert igb.listdir(DRIVERS) == ["igb", "igbvf", "vfio-pci"]
    for drv in ("igb", "igbvf", "vfio-pci"):
        for name in ("bind", "unbind"):
            assert igb.lstat(f"{DRIVERS}/{drv}/{name}").mode & 0o777 == 0o200
    assert igb.lstat("bus/pci/drivers_probe").mode & 0o777 == 0o200
    assert not any(n.startswith("virtfn") for n in igb.listdir(pf))
    assert igb.listdir("class/mdev_bus") == []


def test_sriov_numvfs_creates_vfs_like_the_kernel(igb):
    seq = igb.events_since(0)[-1].seq if igb.events_since(0) else 0
    assert igb.write(f"{PF_DIR}/sriov_numvfs", "3") == 1  # no newline needed
    assert numvfs(igb) == 3
    pf = igb.realpath(PF_DIR)
    groups = set()
    for i, vf in enumerate((VF0, VF1, VF2)):
        assert igb.readlink(f"{pf}/virtfn{i}") == f"../{vf}"
        vf_dir = igb.realpath(f"bus/pci/devices/{vf}")
        assert vf_dir == pf.rsplit("/", 1)[0] + f"/{vf}"  # a sibling of its PF
        assert igb.readlink(f"{vf_dir}/physfn") == "../0000:10:00.0"
        assert igb.read(f"{vf_dir}/device") == b"0x10ca\n"
        assert igb.read(f"{vf_dir}/vendor") == b"0x8086\n"
        assert driver_of(igb, vf) == "igbvf"
        assert vf in igb.listdir(f"{DRIVERS}/igbvf")
        group = igb.realpath(f"{vf_dir}/iommu_group").rsplit("/", 1)[1]
        assert igb.listdir(f"kernel/iommu_groups/{group}/devices") == [vf]
        assert igb.lstat(f"vfio/{group}").mode & 0o777 == 0o600
        groups.add(group)
    assert len(groups) == 3  # each VF in its own group
    events = [(e.action, e.devpath.rsplit("/", 1)[1]) for e in igb.events_since(seq)]
    assert events == [("add", VF0), ("bind", VF0), ("add", VF1), ("bind", VF1),
                      ("add", VF2), ("bind", VF2)]
    # the second port's VFs interleave with the first's (offset 0x80 from 00.1)
    igb.write("bus/pci/devices/0000:10:00.1/sriov_numvfs", "1\n")
    assert igb.readlink("bus/pci/devices/0000:10:00.1/virtfn0") == "../0000:10:10.1"


def test_sriov_numvfs_errnos(igb):
    path = f"{PF_DIR}/sriov_numvfs"
    igb.write(path, "2\n")
    # M after N without going through 0: iov.c "Disable before enabling"
    assert errno_of(igb.write, path, "3\n") == errno.EBUSY
    assert errno_of(igb.write, path, "1") == errno.EBUSY
    # above sriov_totalvfs: ERANGE (not EINVAL)
    assert errno_of(igb.write, path, "8") == errno.ERANGE
    # kstrtou16 failures are EINVAL (overflow included)
    for bad in ("two", "-1", "65536", "", "2 ", "\n"):
        if bad == "":
            assert igb.write(path, bad) == 0  # kernfs: an empty write never reaches store
            continue
        assert errno_of(igb.write, path, bad) == errno.EINVAL, bad
    assert numvfs(igb) == 2
    assert igb.write(path, "0x2") == 3  # base 0, and the same count is a no-op
    assert numvfs(igb) == 2
    assert igb.write(path, "0\n") == 2
    assert numvfs(igb) == 0
    assert not any(n.startswith("virtfn") for n in igb.listdir(PF_DIR))
    assert not igb.exists(f"bus/pci/devices/{VF0}")
    assert igb.listdir(f"{DRIVERS}/igbvf") == ["bind", "unbind"]
    igb.write(path, "7")
    assert numvfs(igb) == 7
    assert igb.readlink(f"{PF_DIR}/virtfn6") == "../0000:10:11.4"


def test_vf_groups_are_freed_and_reused(igb):
    path = f"{PF_DIR}/sriov_numvfs"
    before = igb.listdir("kernel/iommu_groups")
    igb.write(path, "2")
    during = set(igb.listdir("kernel/iommu_groups")) - set(before)
    seq = igb.events_since(0)[-1].seq
    igb.write(path, "0")
    assert [(e.action, e.devpath.rsplit("/", 1)[1]) for e in igb.events_since(seq)] == [
        ("unbind", VF0), ("remove", VF0), ("unbind", VF1), ("remove", VF1)]
    assert igb.listdir("kernel/iommu_groups") == before
    assert sorted(igb.listdir("vfio")) == sorted(before)
    igb.write(path, "2")
    assert set(igb.listdir("kernel/iommu_groups")) - set(before) == during  # lowest free ids


def test_sriov_numvfs_needs_the_pfs_own_driver(igb):
    path = f"{PF_DIR}/sriov_numvfs"
    igb.write(f"{DRIVERS}/igb/unbind", PF)
    assert errno_of(igb.write, path, "2") == errno.ENOENT  # "no driver bound to device"
    assert igb.write(path, "0") == 1  # equal to the current count: fine without a driver
    igb.write(f"{PF_DIR}/driver_override", "vfio-pci")
    igb.write("bus/pci/drivers_probe", PF)
    assert driver_of(igb, PF) == "vfio-pci"
    assert errno_of(igb.write, path, "2") == errno.ENOENT


def test_disabling_vfs_while_one_is_in_use_is_ebusy(igb):
    path = f"{PF_DIR}/sriov_numvfs"
    igb.write(path, "2")
    to_vfio(igb, VF1)
    group = vf_group(igb, VF1)
    handle = igb.open(f"vfio/{group}")
    assert errno_of(igb.write, path, "0") == errno.EBUSY
    assert numvfs(igb) == 2 and driver_of(igb, VF1) == "vfio-pci"
    handle.close()
    igb.hold(VF1)  # a VM holds it (control "hold ADDR")
    assert errno_of(igb.write, path, "0") == errno.EBUSY
    igb.release(VF1)
    igb.write(path, "0")
    assert numvfs(igb) == 0


# ------------------------------------------------------------------ binding


def vf_group(host: SimulatedHost, addr: str) -> str:
    return host.realpath(f"bus/pci/devices/{addr}/iommu_group").rsplit("/", 1)[1]


def to_vfio(host: SimulatedHost, addr: str) -> None:
    """What the agent (and libvirt's managed='no' recipe) does."""
    host.write(f"bus/pci/devices/{addr}/driver_override", "vfio-pci")
    drv = driver_of(host, addr)
    if drv:
        host.write(f"{DRIVERS}/{drv}/unbind", addr)
    host.write("bus/pci/drivers_probe", addr)


def test_driver_override_reads_and_writes_like_the_kernel(igb):
    path = f"{PF_DIR}/driver_override"
    assert igb.read(path) == b"(null)\n"
    assert igb.write(path, "vfio-pci") == 8
    assert igb.read(path) == b"vfio-pci\n"
    igb.write(path, "\n")  # "\n" clears
    assert igb.read(path) == b"(null)\n"
    igb.write(path, "vfio-pci\nignored")  # cut at the first newline
    assert igb.read(path) == b"vfio-pci\n"
    igb.write(path, "igb\0junk")  # kstrndup stops at NUL
    assert igb.read(path) == b"igb\n"
    assert errno_of(igb.write, path, "x" * 4095) == errno.EINVAL
    assert igb.read(path) == b"igb\n"
    igb.write(path, "x" * 4094)
    assert igb.read(path) == b"x" * 4094 + b"\n"
    assert igb.write(path, "") == 0  # never reaches store


def test_unbind_and_bind(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "1")
    seq = igb.events_since(0)[-1].seq
    vf_dir = igb.realpath(f"bus/pci/devices/{VF0}")
    # unbind: only from the driver it is bound to, by a name sysfs_streq() matches
    assert errno_of(igb.write, f"{DRIVERS}/vfio-pci/unbind", VF0) == errno.ENODEV
    assert errno_of(igb.write, f"{DRIVERS}/igbvf/unbind", VF0 + "\n\n") == errno.ENODEV
    assert errno_of(igb.write, f"{DRIVERS}/igbvf/unbind", "0000:10:1f.0") == errno.ENODEV
    assert igb.write(f"{DRIVERS}/igbvf/unbind", VF0 + "\n") == 13
    assert driver_of(igb, VF0) is None
    assert not igb.exists(f"{vf_dir}/driver")
    assert VF0 not in igb.listdir(f"{DRIVERS}/igbvf")
    assert not igb.read(f"{vf_dir}/uevent").startswith(b"DRIVER=")
    # bind: vfio-pci matches nothing by id, so without driver_override it is ENODEV
    assert errno_of(igb.write, f"{DRIVERS}/vfio-pci/bind", VF0) == errno.ENODEV
    igb.write(f"{vf_dir}/driver_override", "vfio-pci\n")
    # ...and with driver_override set, only that driver matches, even the device's own fails
    assert errno_of(igb.write, f"{DRIVERS}/igbvf/bind", VF0) == errno.ENODEV
    assert igb.write(f"{DRIVERS}/vfio-pci/bind", VF0) == 12
    assert driver_of(igb, VF0) == "vfio-pci"
    assert igb.read(f"{vf_dir}/uevent").startswith(b"DRIVER=vfio-pci\n")
    assert errno_of(igb.write, f"{DRIVERS}/vfio-pci/bind", VF0) == errno.EBUSY  # already bound
    assert errno_of(igb.write, f"{DRIVERS}/vfio-pci/bind", "0000:99:00.0") == errno.ENODEV
    # another vendor's driver through driver_override: its probe refuses the device
    igb.write(f"{DRIVERS}/vfio-pci/unbind", VF0)
    igb.write(f"{vf_dir}/driver_override", "igb")
    assert errno_of(igb.write, f"{DRIVERS}/igb/bind", VF0) == errno.ENODEV
    igb.write(f"{vf_dir}/driver_override", "\n")
    igb.write(f"{DRIVERS}/igbvf/bind", VF0)
    assert driver_of(igb, VF0) == "igbvf"
    events = [(e.action, e.env.get("DRIVER")) for e in igb.events_since(seq)
              if e.devpath.endswith(VF0)]
    assert events == [("unbind", None), ("bind", "vfio-pci"), ("unbind", None),
                      ("bind", "igbvf")]


def test_drivers_probe(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "1")
    probe = "bus/pci/drivers_probe"
    assert errno_of(igb.write, probe, "0000:10:1f.0") == errno.ENODEV
    assert igb.write(probe, VF0) == 12  # bound already: nothing happens
    assert driver_of(igb, VF0) == "igbvf"
    to_vfio(igb, VF0)
    assert driver_of(igb, VF0) == "vfio-pci"
    # back to its own driver: clear the override, unbind, probe
    igb.write(f"bus/pci/devices/{VF0}/driver_override", "\n")
    igb.write(f"{DRIVERS}/vfio-pci/unbind", VF0)
    igb.write(probe, VF0 + "\n")
    assert driver_of(igb, VF0) == "igbvf"
    # an override naming no loaded driver: the probe binds nothing and succeeds
    igb.write(f"bus/pci/devices/{VF0}/driver_override", "no-such-driver")
    igb.write(f"{DRIVERS}/igbvf/unbind", VF0)
    assert igb.write(probe, VF0) == 12
    assert driver_of(igb, VF0) is None


def test_autoprobe_off_leaves_new_vfs_unbound(igb):
    auto = f"{PF_DIR}/sriov_drivers_autoprobe"
    assert errno_of(igb.write, auto, "maybe") == errno.EINVAL
    igb.write(auto, "0\n")
    assert igb.read(auto) == b"0\n"
    igb.write(f"{PF_DIR}/sriov_numvfs", "1")
    assert driver_of(igb, VF0) is None
    # pci_device_can_probe(): no probe without autoprobe or driver_override
    assert errno_of(igb.write, f"{DRIVERS}/igbvf/bind", VF0) == errno.ENODEV
    igb.write("bus/pci/drivers_probe", VF0)
    assert driver_of(igb, VF0) is None
    igb.write(f"bus/pci/devices/{VF0}/driver_override", "vfio-pci")
    igb.write("bus/pci/drivers_probe", VF0)
    assert driver_of(igb, VF0) == "vfio-pci"


def test_group_node_opens_only_on_a_vfio_driver_and_once(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "1")
    node = f"vfio/{vf_group(igb, VF0)}"
    assert errno_of(igb.open, node) == errno.ENODEV  # igbvf is no VFIO driver
    with pytest.raises(exception.SimulatorError, match="not to a VFIO driver"):
        igb.hold(VF0)
    to_vfio(igb, VF0)
    first = igb.open(node)
    assert errno_of(igb.open, node) == errno.EBUSY
    # a device in use cannot be unbound (the kernel would block; the model says EBUSY)
    assert errno_of(igb.write, f"{DRIVERS}/vfio-pci/unbind", VF0) == errno.EBUSY
    assert driver_of(igb, VF0) == "vfio-pci"
    first.close()
    igb.open(node).close()
    igb.hold(VF0, after_probe=True)
    igb.open(node).close()  # the probe gets in, the VM right after it
    assert errno_of(igb.open, node) == errno.EBUSY
    assert [v["held"] for v in igb.vfs()] == [True]
    igb.release(VF0)
    igb.write(f"{DRIVERS}/vfio-pci/unbind", VF0)
    assert errno_of(igb.open, node) == errno.ENODEV


def test_release_all_lets_go_of_pci_holds_too(igb):
    # What the front's stop does (SimulatedHost.close): no VM may keep a device.
    igb.write(f"{PF_DIR}/sriov_numvfs", "1")
    to_vfio(igb, VF0)
    igb.hold(VF0)
    node = f"vfio/{vf_group(igb, VF0)}"
    assert errno_of(igb.open, node) == errno.EBUSY
    igb.release_all()
    assert [v["held"] for v in igb.vfs()] == [False]
    igb.open(node).close()


def test_unbinding_the_pf_driver_disables_sriov_and_the_netdev(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "2")
    to_vfio(igb, VF1)
    igb.hold(VF1)
    assert errno_of(igb.write, f"{DRIVERS}/igb/unbind", PF) == errno.EBUSY
    assert numvfs(igb) == 2 and igb.exists("class/net/enp16s0f0")
    igb.release(VF1)
    igb.write(f"{DRIVERS}/igb/unbind", PF)
    assert numvfs(igb) == 0
    assert not igb.exists(f"bus/pci/devices/{VF0}")
    assert not igb.exists(f"{PF_DIR}/net")
    assert not igb.exists("class/net/enp16s0f0")
    igb.write(f"{DRIVERS}/igb/bind", PF)
    assert igb.listdir(f"{PF_DIR}/net") == ["enp16s0f0"]
    assert numvfs(igb) == 0  # igb's max_vfs defaults to 0: VFs stay disabled


def test_reboot_restores_the_boot_state(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "3")
    to_vfio(igb, VF0)
    igb.hold(VF0)
    igb.write("bus/pci/devices/0000:10:00.1/driver_override", "vfio-pci")
    igb.write(f"{DRIVERS}/igb/unbind", "0000:10:00.1")
    igb.write(f"{PF_DIR}/sriov_drivers_autoprobe", "0")
    igb.reboot()
    assert numvfs(igb) == 0
    assert igb.vfs() == []
    assert driver_of(igb, "0000:10:00.1") == "igb"
    assert igb.read("bus/pci/devices/0000:10:00.1/driver_override") == b"(null)\n"
    assert igb.read(f"{PF_DIR}/sriov_drivers_autoprobe") == b"1\n"
    assert igb.listdir("class/net") == ["enp16s0f0", "enp16s0f1"]
    assert igb.status()["pci_functions"] == []


def test_status_lists_pfs_vfs_and_rebound_functions(igb):
    igb.write(f"{PF_DIR}/sriov_numvfs", "2")
    to_vfio(igb, VF1)
    status = json.loads(json.dumps(igb.status()))  # JSON-clean, as the control socket sends it
    assert status["sriov_pfs"][0] == {"address": PF, "driver": "igb", "total_vfs": 7,
                                      "num_vfs": 2, "vfs_enabled": True, "vgpu": False,
                                      "netdev": "enp16s0f0"}
    assert [(v["address"], v["driver"], v["driver_override"], v["vgpu_type"])
            for v in status["vfs"]] == [(VF0, "igbvf", None, 0), (VF1, "vfio-pci", "vfio-pci", 0)]
    assert status["pci_functions"] == []


# ------------------------------------------------------------------ mdev parents on the PCI bus


def test_unbinding_an_mdev_parent_unregisters_it_and_binding_registers_it():
    host = SimulatedHost(profiles.nova())
    parent = "0000:06:00.0"
    host.hold(profiles.NOVA_MDEV_06)
    assert errno_of(host.write, f"{DRIVERS}/nvidia/unbind", parent) == errno.EBUSY
    assert parent in host.listdir("class/mdev_bus")
    host.release(profiles.NOVA_MDEV_06)
    host.write(f"{DRIVERS}/nvidia/unbind", parent)
    assert parent not in host.listdir("class/mdev_bus")
    assert [m.parent for m in host.mdevs()] == ["0000:07:00.0"]
    # a whole GPU for passthrough: vfio-pci, and its group node opens
    to_vfio(host, parent)
    node = f"vfio/{vf_group(host, parent)}"
    host.open(node).close()
    host.write(f"bus/pci/devices/{parent}/driver_override", "\n")
    host.write(f"{DRIVERS}/vfio-pci/unbind", parent)
    host.write(f"{DRIVERS}/nvidia/bind", parent)
    assert host.available(parent, "nvidia-11") == 16  # registered again, no mdev
    assert errno_of(host.open, node) == errno.ENODEV


# ------------------------------------------------------------------ combining, spec


def test_profiles_combine_without_overlap_and_every_link_resolves():
    spec = build_spec(["nvidia-pf", "nvidia-sriov", "nvidia-vfio", "igb-sriov", "i915-gvtg",
                       "mtty", "nova"], gpus=2, vfs=16, nics=3)
    host = SimulatedHost(spec)
    for pf in ("0000:10:00.0", "0000:10:00.1", "0000:11:00.0"):
        host.write(f"bus/pci/devices/{pf}/sriov_numvfs", "7")
    host.write("bus/pci/devices/0000:c1:00.0/sriov_numvfs", "0")
    host.write("bus/pci/devices/0000:c1:00.0/sriov_numvfs", "32")
    addresses = host.listdir("bus/pci/devices")
    # nvidia-pf 2; nvidia-sriov 2 PFs + 32 VFs; nvidia-vfio 2 PFs + 32 + 16 VFs;
    # igb 3 ports + 21 VFs; i915 1; nova 2
    assert len(addresses) == len(set(addresses)) == 2 + (2 + 32) + (2 + 48) + (3 + 21) + 1 + 2
    assert host.listdir("class/mdev_bus") == sorted(
        ["0000:84:00.0", "0000:85:00.0", "0000:00:02.0", "mtty", "0000:06:00.0",
         "0000:07:00.0", *(p.name for p in spec.parents if p.physfn)])
    groups = [host.realpath(f"bus/pci/devices/{a}/iommu_group") for a in addresses]
    assert len(set(groups)) == len(groups)
    for e in host.export_tree():
        if e.kind == "link":
            assert host.exists(e.path), e.path


def test_sriov_pf_spec_validation():
    good = profiles.igb_sriov().sriov_pfs[0]
    with pytest.raises(exception.SimulatorSpecInvalid, match="defined twice"):
        # the VF range of 10:00.0 (10:10.0 ..) covers this PF
        HostSpec(sriov_pfs=[good, SriovPfSpec("0000:10:10.2", "igb", "igbvf", 1)])
    with pytest.raises(exception.SimulatorSpecInvalid, match="defined twice"):
        HostSpec.merge([profiles.igb_sriov(), profiles.igb_sriov()])
    with pytest.raises(exception.SimulatorSpecInvalid, match="num_vfs 8 > total_vfs 7"):
        SriovPfSpec(PF, "igb", "igbvf", 7, num_vfs=8)
    with pytest.raises(exception.SimulatorSpecInvalid, match="beyond bus ff"):
        SriovPfSpec("0000:ff:1f.0", "igb", "igbvf", 7, vf_offset=0x80, vf_stride=2)
    with pytest.raises(exception.SimulatorSpecInvalid, match="not an interface name"):
        SriovPfSpec(PF, "igb", "igbvf", 7, netdev="a/b")
    with pytest.raises(exception.SimulatorSpecInvalid, match="unknown field"):
        HostSpec.from_dict({"sriov_pfs": [{**good.to_dict(), "colour": "blue"}]})
    with pytest.raises(exception.SimulatorSpecInvalid, match="nics must be"):
        build_spec(["igb-sriov"], nics=17)


def test_spec_json_round_trip_with_sriov_pfs():
    spec = build_spec(["nvidia-vfio", "igb-sriov", "mtty"], gpus=2, vfs=3, nics=2)
    back = HostSpec.from_json(spec.to_json())
    assert back == spec
    assert back.sriov_pfs[0].vgpu_types == profiles.L40S_VGPU_TYPES
