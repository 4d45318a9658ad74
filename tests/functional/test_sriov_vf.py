"""The ``sriov_vf`` backend on the FUSE simulator's ``igb-sriov`` profile,
every PCI write through the REAL privsep helper (the capability-less sysfs
context), every outcome read back from the simulated sysfs itself.

The simulator has no netlink: the network half here is a recorder that
checks *when* the pool service asks for settings and resets (before the
hand-over, after the return, after a failed hand-over).  The settings
themselves are proven against a real netlink socket
(test_vf_netlink.py) and on a real igb driver (the igb lab).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from accel_agent import exception, privileged
from accel_agent.backends.base import DeviceRef
from accel_agent.backends.sriov_vf import SriovVfBackend, device_uuid
from accel_agent.devices.writers import PrivsepWriter
from accel_agent.sriov.pools import build_pools
from accel_agent.sriov.vfpool import VfPools
from tests.configutil import make_conf
from tests.functional.privsep_fixture import privsep_daemon, skip_unless_root
from tests.functional.simhost import SimHost, simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

PF0, PF1 = "0000:10:00.0", "0000:10:00.1"
VF0, VF1 = "0000:10:10.0", "0000:10:10.2"  # PF0's virtfn0, virtfn1 (offset 0x80, stride 2)
MAC = "52:54:00:12:34:01"


class RecordingNet:
    """The network half as a recorder (see the module docstring)."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.calls: list[tuple[str, str, int, dict[str, Any], str | None]] = []
        self.fail: exception.AccelAgentException | None = None

    def apply(self, pf_netdev: str, vf: int, settings: Mapping[str, Any], pf: str):
        vf_addr = _virtfn(self.host, pf, vf)
        self.calls.append(("apply", pf_netdev, vf, dict(settings), _driver(self.host, vf_addr)))
        if self.fail is not None:
            raise self.fail
        return {"before": {}, "after": {"vf": vf, **settings}}

    def reset(self, pf_netdev: str, vf: int, pf: str):
        vf_addr = _virtfn(self.host, pf, vf)
        self.calls.append(("reset", pf_netdev, vf, {}, _driver(self.host, vf_addr)))
        return {"before": {}, "after": {"vf": vf}}


def _dev(host: SimHost, addr: str, *parts: str) -> str:
    return os.path.join(host.root, "bus", "pci", "devices", addr, *parts)


def _virtfn(host: SimHost, pf: str, index: int) -> str:
    return os.path.basename(os.readlink(_dev(host, pf, f"virtfn{index}")))


def _driver(host: SimHost, addr: str) -> str | None:
    try:
        return os.path.basename(os.readlink(_dev(host, addr, "driver")))
    except FileNotFoundError:
        return None


def _override(host: SimHost, addr: str) -> str:
    with open(_dev(host, addr, "driver_override")) as f:
        return f.read().strip()


def _numvfs(host: SimHost, pf: str) -> int:
    with open(_dev(host, pf, "sriov_numvfs")) as f:
        return int(f.read())


CONF = f"""
[devices]
enabled_vf_pools = nic_a
[vf_pool_nic_a]
device_addresses = {PF0}, 10:00.1
resource_class = CUSTOM_NIC_A
traits = CUSTOM_FAST
num_vfs = 3
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHost]:
    skip_unless_root()
    base = tmp_path_factory.mktemp("sriov")
    with simulated_host(base, ["igb-sriov"], nics=2) as host, privsep_daemon(
        base, host.root  # type: ignore[arg-type]
    ):
        yield host


@pytest.fixture
def env(sim: SimHost) -> tuple[SimHost, VfPools, RecordingNet]:
    sim.sim.reboot()  # no VFs, every function on its own driver
    net = RecordingNet(sim)
    conf = make_conf(CONF, sysfs_root=sim.root)
    pools = VfPools(sim.root, build_pools(conf), PrivsepWriter(sim.root), net, host="testhost")
    return sim, pools, net


def test_num_vfs_is_written_through_the_helper_only_when_asked(env) -> None:
    host, pools, _ = env
    assert _numvfs(host, PF0) == 0 and pools.inventory() == []
    assert pools.ensure_num_vfs() == {PF0: (0, 3), PF1: (0, 3)}
    assert _numvfs(host, PF0) == 3 and _virtfn(host, PF0, 0) == VF0
    assert _driver(host, VF0) == "igbvf"
    assert pools.ensure_num_vfs() == {}  # nothing differs: nothing written
    inventory = pools.inventory()
    assert [p["name"] for p in inventory] == ["testhost_pci_0000_10_00_0",
                                              "testhost_pci_0000_10_00_1"]
    assert inventory[0]["inventory"]["total"] == 3 and inventory[0]["used"] == 0
    assert inventory[0]["resource_class"] == "CUSTOM_NIC_A"
    assert inventory[0]["traits"] == ["CUSTOM_FAST"]


def test_num_vfs_is_not_changed_under_a_handed_over_vf(env) -> None:
    host, pools, _ = env
    pools.ensure_num_vfs()
    pools.prepare("nic_a", {"mac": MAC})
    with pytest.raises(exception.VfsHandedOver) as info:
        privileged.set_num_vfs(PF0, 2, sysfs_root=host.root)
    assert VF0 in str(info.value)
    assert _numvfs(host, PF0) == 3 and _driver(host, VF0) == "vfio-pci"
    # M after N goes through 0, which the kernel requires
    assert privileged.set_num_vfs(PF1, 2, sysfs_root=host.root) == 3
    assert _numvfs(host, PF1) == 2
    with pytest.raises(exception.SriovNumVfsRefused) as info:
        privileged.set_num_vfs(PF1, 8, sysfs_root=host.root)
    assert info.value.kwargs["errno"] == "ERANGE"


def test_prepare_sets_the_network_first_then_hands_over(env) -> None:
    host, pools, net = env
    pools.ensure_num_vfs()
    prepared = pools.prepare("nic_a", {"mac": MAC, "vlan": 100, "trust": True})
    assert (prepared.vf, prepared.pf, prepared.vf_index) == (VF0, PF0, 0)
    assert prepared.uuid == device_uuid(VF0)
    assert _driver(host, VF0) == "vfio-pci" and _override(host, VF0) == "vfio-pci"
    # the settings went to the PF's netdev while the VF was still on igbvf
    assert net.calls == [("apply", "enp16s0f0", 0, {"mac": MAC, "vlan": 100, "trust": True},
                          "igbvf")]
    xml = prepared.interface_xml()
    assert xml.startswith('<interface type="hostdev" managed="no">'), xml
    assert 'bus="0x10" slot="0x10" function="0x0"' in xml
    assert f'<mac address="{MAC}"/>' in xml and '<tag id="100"/>' in xml
    # the next one is another VF; a used one counts in the inventory
    second = pools.prepare("nic_a", {"mac": "52:54:00:12:34:02"})
    assert second.vf == VF1
    assert pools.inventory()[0]["used"] == 2
    # exclude: VFs the caller's ledger holds are not free either
    third = pools.prepare("nic_a", exclude={_virtfn(host, PF0, 2)})
    assert third.pf == PF1


def test_unprepare_resets_the_vf_between_vfio_and_its_driver_and_is_idempotent(env) -> None:
    host, pools, net = env
    pools.ensure_num_vfs()
    prepared = pools.prepare("nic_a", {"mac": MAC})
    net.calls.clear()
    pools.unprepare(prepared.vf)
    assert _driver(host, VF0) == "igbvf" and _override(host, VF0) == "(null)"
    # reset while the VF is on no driver: off vfio-pci, not yet back on igbvf
    assert net.calls == [("reset", "enp16s0f0", 0, {}, None)]
    pools.unprepare(prepared.vf)
    assert _driver(host, VF0) == "igbvf"
    assert pools.free_vfs("nic_a")[0][1].address == VF0


def test_a_vf_a_vm_holds_is_kept_with_its_settings(env) -> None:
    host, pools, net = env
    pools.ensure_num_vfs()
    prepared = pools.prepare("nic_a", {"mac": MAC})
    host.sim.hold(prepared.vf)
    net.calls.clear()
    try:
        with pytest.raises(exception.VfInUse):
            pools.unprepare(prepared.vf)
        assert _driver(host, VF0) == "vfio-pci" and net.calls == []
    finally:
        host.sim.release(prepared.vf)
    pools.unprepare(prepared.vf)
    assert _driver(host, VF0) == "igbvf"


def test_refused_settings_leave_the_vf_on_its_driver(env) -> None:
    host, pools, net = env
    pools.ensure_num_vfs()
    net.fail = exception.VfSettingRefused(
        pf=PF0, vf=0, setting="link_state", value="enable", errno="EOPNOTSUPP",
        error="Operation not supported", rollback="rolled back mac")
    with pytest.raises(exception.VfSettingRefused):
        pools.prepare("nic_a", {"mac": MAC, "link_state": "enable"})
    assert _driver(host, VF0) == "igbvf" and _override(host, VF0) == "(null)"
    assert pools.inventory()[0]["used"] == 0


@pytest.mark.parametrize(
    ("pool", "settings", "error", "field"),
    [
        ("nic_a", {"mac": "01:00:5e:00:00:01"}, exception.InvalidVfSetting, "mac"),
        ("nic_a", {"vlan": 4096}, exception.InvalidVfSetting, "vlan"),
        ("nic_b", {"mac": MAC}, exception.UnknownVfPool, None),
    ],
)
def test_bad_input_prepares_nothing(env, pool, settings, error, field) -> None:
    host, pools, net = env
    pools.ensure_num_vfs()
    with pytest.raises(error) as info:
        pools.prepare(pool, settings)
    if field:
        assert info.value.kwargs["field"] == field
    assert net.calls == [] and _driver(host, VF0) == "igbvf"


def test_no_free_vf_says_why(env) -> None:
    _, pools, _ = env
    with pytest.raises(exception.NoFreeVf) as info:  # no VFs enabled at all
        pools.prepare("nic_a", {"mac": MAC})
    assert f"{PF0}: 0 VF(s)" in str(info.value)


@pytest.mark.parametrize(
    "vf",
    ["10:10.0", "0000:10:10.0/../../..", "0000:10:10.0\n", "../0000:10:10.0", PF0],
)
def test_the_helper_refuses_anything_but_a_canonical_vf(env, vf) -> None:
    host, pools, _ = env
    pools.ensure_num_vfs()
    with pytest.raises((exception.PrivilegedInputRejected, exception.NotSriovVf)):
        privileged.bind_vfio(vf, sysfs_root=host.root)
    assert _driver(host, PF0) == "igb" and _driver(host, VF0) == "igbvf"


def test_the_backend_makes_and_unmakes_the_ledgers_device(env) -> None:
    host, pools, _ = env
    pools.ensure_num_vfs()
    backend, writer = SriovVfBackend(), PrivsepWriter(host.root)
    with pytest.raises(exception.VfUuidMismatch) as refused:
        backend.create(writer, VF0, "nic_a", device_uuid(VF1))
    assert refused.value.message == (
        f"device {device_uuid(VF1)} is not the device of pool VF {VF0}, whose UUID is "
        f"{device_uuid(VF0)} (derived from the VF's address)"
    )
    assert _driver(host, VF0) == "igbvf"  # nothing made
    backend.create(writer, VF0, "nic_a", device_uuid(VF0))
    assert _driver(host, VF0) == "vfio-pci"
    device = DeviceRef(device_uuid(VF0), VF0, "nic_a", "sriov_vf")
    assert backend.pci_address(device) == VF0
    backend.destroy(writer, device, 5.0)
    assert _driver(host, VF0) == "igbvf"
