"""VF pools: configuration, the sysfs read side on a plain tree, and the
order of prepare's halves when the hand-over fails (writers recorded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from oslo_config import cfg

from accel_agent import exception
from accel_agent.sriov.pools import build_pools
from accel_agent.sriov.vfpool import VfPools
from accel_agent.sysfs import sriov as sriov_sysfs
from tests.configutil import make_conf

PF = "0000:3b:00.0"
VFS = ("0000:3b:10.0", "0000:3b:10.2")


def pools_of(ini: str):
    return build_pools(make_conf(ini))


def test_pools_are_read_with_normalised_addresses() -> None:
    pools = pools_of(
        "[devices]\nenabled_vf_pools = nic_a, nic_b\n"
        "[vf_pool_nic_a]\ndevice_addresses = 3B:00.0\nnum_vfs = 4\ntraits = CUSTOM_X\n"
        "[vf_pool_nic_b]\ndevice_addresses = 0000:3b:00.1\nresource_class = CUSTOM_FPGA\n"
    )
    assert pools["nic_a"].device_addresses == (PF,) and pools["nic_a"].num_vfs == 4
    assert pools["nic_a"].resource_class == "SRIOV_NET_VF"
    assert pools["nic_a"].traits == ("CUSTOM_X",)
    assert pools["nic_b"].resource_class == "CUSTOM_FPGA" and pools["nic_b"].num_vfs is None


@pytest.mark.parametrize(
    ("ini", "words"),
    [
        ("[devices]\nenabled_vf_pools = a\n[vf_pool_a]\ndevice_addresses = 3b:00.0, "
         "0000:3B:00.0\n", "also in pool a"),
        ("[devices]\nenabled_vf_pools = a, b\n[vf_pool_a]\ndevice_addresses = 3b:00.0\n"
         "[vf_pool_b]\ndevice_addresses = 0000:3b:00.0\n", "also in pool a"),
        ("[devices]\nenabled_vf_pools = a\n[vf_pool_a]\ndevice_addresses = nic0\n",
         "not a PCI address"),
        ("[devices]\nenabled_vf_pools = a\n", "no device_addresses"),
        ("[devices]\nenabled_vf_pools = Nic-A\n", "pool name"),
        ("[devices]\nenabled_vf_pools = a, a\n[vf_pool_a]\ndevice_addresses = 3b:00.0\n",
         "listed twice"),
    ],
)
def test_bad_pools_refuse_the_configuration(ini: str, words: str) -> None:
    with pytest.raises(exception.InvalidVfPoolConfig) as info:
        pools_of(ini)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "line",
    [
        "resource_class = NOT_A_CLASS",
        "resource_class = custom_lower",
        "traits = lower_case",
        "traits = NOT_A_STANDARD_TRAIT",
        "num_vfs = -1",
        "num_vfs = 65536",
    ],
)
def test_option_types_are_checked_by_oslo_config(line: str) -> None:
    with pytest.raises((cfg.ConfigFileValueError, ValueError)):
        pools_of(f"[devices]\nenabled_vf_pools = a\n[vf_pool_a]\ndevice_addresses = 3b:00.0\n"
                 f"{line}\n")


def tree(base: Path, driver: str = "igbvf") -> str:
    """A /sys-shaped PF with two VFs on ``driver`` and a netdev."""
    root = base / "sys"
    devices = root / "devices" / "pci0000:3a"
    pf = devices / PF
    (pf / "net" / "ens1f0").mkdir(parents=True)
    (pf / "sriov_totalvfs").write_text("7\n")
    (pf / "sriov_numvfs").write_text("2\n")
    drivers = root / "bus" / "pci" / "drivers"
    (drivers / "igb").mkdir(parents=True)
    (drivers / driver).mkdir(exist_ok=True)
    (pf / "driver").symlink_to(drivers / "igb")
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    (root / "bus" / "pci" / "devices" / PF).symlink_to(pf)
    for i, vf in enumerate(VFS):
        (devices / vf).mkdir()
        (devices / vf / "driver_override").write_text("(null)\n")
        (devices / vf / "driver").symlink_to(drivers / driver)
        (devices / vf / "physfn").symlink_to(pf)
        (pf / f"virtfn{i}").symlink_to(devices / vf)
        (root / "bus" / "pci" / "devices" / vf).symlink_to(devices / vf)
    return str(root)


def test_read_pf_finds_vfs_netdev_and_drivers(tmp_path: Path) -> None:
    root = tree(tmp_path)
    info = sriov_sysfs.read_pf(root, PF)
    assert (info.netdev, info.total_vfs, info.num_vfs, info.driver) == ("ens1f0", 7, 2, "igb")
    assert [(v.address, v.index, v.driver) for v in info.vfs] == [
        (VFS[0], 0, "igbvf"), (VFS[1], 1, "igbvf")]
    with pytest.raises(sriov_sysfs.NotAPf):
        sriov_sysfs.read_pf(root, VFS[0])
    os.symlink("/etc", os.path.join(root, "devices", "pci0000:3a", PF, "virtfn2"))
    assert "not a link to a PCI device inside the root" in sriov_sysfs.read_pf(root, PF).warnings[0]


class Recorder:
    def __init__(self, fail_bind: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_bind = fail_bind

    def set_num_vfs(self, pf: str, count: int) -> int:
        self.calls.append(("num_vfs", (pf, count)))
        return 0

    def bind_vfio(self, vf: str) -> None:
        self.calls.append(("bind", vf))
        if self.fail_bind:
            raise exception.PciRebindFailed(action="hand-over", address=vf, step="bind",
                                            errno="ENODEV", error="No such device")

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None:
        self.calls.append(("unbind" if give_back else "unbind-only", vf))
        return "igbvf"

    def apply(self, pf_netdev: str, vf: int, settings: Any, pf: str) -> dict:
        self.calls.append(("apply", (pf_netdev, vf, dict(settings))))
        return {"before": {}, "after": {}}

    def reset(self, pf_netdev: str, vf: int, pf: str) -> dict:
        self.calls.append(("reset", (pf_netdev, vf)))
        return {"before": {}, "after": {}}


def service(tmp_path: Path, recorder: Recorder, driver: str = "igbvf") -> VfPools:
    conf = make_conf(f"[devices]\nenabled_vf_pools = a\n[vf_pool_a]\ndevice_addresses = {PF}\n")
    return VfPools(tree(tmp_path, driver), build_pools(conf), recorder, recorder, "h")


def test_a_failed_hand_over_resets_the_settings(tmp_path: Path) -> None:
    rec = Recorder(fail_bind=True)
    with pytest.raises(exception.PciRebindFailed):
        service(tmp_path, rec).prepare("a", {"mac": "52:54:00:00:00:09"})
    assert rec.calls == [
        ("apply", ("ens1f0", 0, {"mac": "52:54:00:00:00:09"})),
        ("bind", VFS[0]),
        ("reset", ("ens1f0", 0)),
    ]


def test_vfs_on_vfio_pci_are_used_not_free(tmp_path: Path) -> None:
    rec = Recorder()
    pools = service(tmp_path, rec, driver="vfio-pci")
    assert pools.free_vfs("a") == []
    assert pools.inventory()[0]["used"] == 2
    with pytest.raises(exception.NoFreeVf) as info:
        pools.prepare("a")
    assert "2 on vfio-pci" in str(info.value) and rec.calls == []


def test_unprepare_resets_between_leaving_vfio_and_the_give_back(tmp_path: Path) -> None:
    rec = Recorder()
    service(tmp_path, rec, driver="vfio-pci").unprepare(VFS[1])
    assert rec.calls == [("unbind-only", VFS[1]), ("reset", ("ens1f0", 1)), ("unbind", VFS[1])]
