"""The sriov_vf backend on a real igb driver: VFs enabled through the agent's
sysfs daemon, MAC/VLAN/rate/spoofchk/trust set through its CAP_NET_ADMIN
daemon and checked with ``ip link show``, a setting igb refuses rolling back
the rest, the hand-over to vfio-pci and back, the reset at unprepare, and a
VF whose VFIO group is held kept as it is.  Facts: docs/design.md §10.4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from tests.realkernel.sriov import igblab
from tests.realkernel.sriov.igblab import NUM_VFS, POOL, Lab

MAC0, MAC1 = "52:54:00:ab:cd:01", "52:54:00:ab:cd:02"


def test_vfs_enabled_by_the_agent_are_on_igbvf(lab: Lab) -> None:
    info = lab.info
    assert info.driver == "igb" and info.total_vfs == 7
    assert info.num_vfs == NUM_VFS and [v.index for v in info.vfs] == [0, 1]
    assert lab.pools.ensure_num_vfs() == {}  # already so: nothing written
    assert lab.pools.inventory()[0]["inventory"]["total"] == NUM_VFS


def test_prepare_sets_the_vf_through_igb_and_hands_it_to_vfio(lab: Lab) -> None:
    prepared = lab.pools.prepare(
        POOL,
        {"mac": MAC0, "vlan": 100, "qos": 3, "spoofchk": False, "trust": True, "max_tx_rate": 100},
    )
    assert (prepared.pf, prepared.vf_index) == (lab.pf, 0)
    # read back by the daemon (ext_mask=1) ...
    assert prepared.state["mac"] == MAC0 and prepared.state["vlan"] == 100
    assert prepared.state["trust"] is True and prepared.state["max_tx_rate"] == 100
    # ... and by iproute2, independently
    line = lab.ip_vf(0)
    for words in (
        MAC0,
        "vlan 100",
        "qos 3",
        "max_tx_rate 100Mbps",
        "spoof checking off",
        "trust on",
    ):
        assert words in line, line
    vf = lab.vf(0)
    assert vf.driver == "vfio-pci" and vf.driver_override == "vfio-pci"
    assert os.path.exists(f"/dev/vfio/{vf.iommu_group}")
    assert lab.pools.inventory()[0]["used"] == 1
    # the other VF is untouched
    assert "00:00:00:00:00:00" in lab.ip_vf(1) and "vlan" not in lab.ip_vf(1)


def test_a_setting_igb_refuses_rolls_back_the_rest(lab: Lab) -> None:
    with pytest.raises(exception.VfSettingRefused) as info:
        lab.pools.prepare(POOL, {"mac": MAC1, "vlan": 200, "link_state": "enable"})
    err = info.value
    assert not isinstance(err, exception.VfRollbackFailed)
    assert (err.kwargs["vf"], err.kwargs["setting"], err.kwargs["errno"]) == (
        0,
        "link_state",
        "EOPNOTSUPP",
    ), err
    assert lab.pf in str(err) and "rolled back vlan, mac" in str(err), err
    line = lab.ip_vf(0)
    assert "00:00:00:00:00:00" in line and "vlan 200" not in line, line
    assert lab.vf(0).driver == "igbvf"  # never handed over


def test_min_tx_rate_is_refused_with_einval_and_rolled_back(lab: Lab) -> None:
    with pytest.raises(exception.VfSettingRefused) as info:
        privileged.apply_vf_settings(
            lab.netdev, 1, {"mac": MAC1, "min_tx_rate": 10, "max_tx_rate": 100}, pf=lab.pf
        )
    assert (info.value.kwargs["setting"], info.value.kwargs["errno"]) == ("rate", "EINVAL")
    assert "00:00:00:00:00:00" in lab.ip_vf(1)


def test_unprepare_returns_the_vf_and_resets_it(lab: Lab) -> None:
    prepared = lab.pools.prepare(
        POOL, {"mac": MAC0, "vlan": 100, "spoofchk": False, "trust": True, "max_tx_rate": 50}
    )
    lab.pools.unprepare(prepared.vf)
    vf = lab.vf(0)
    assert vf.driver == "igbvf" and vf.driver_override is None
    line = lab.ip_vf(0)
    # The administrative MAC is gone (reset to 0 before the give-back); igbvf,
    # probed afterwards, picked a random one and told the PF: that is what the
    # PF reports now, never the tenant's.
    assert MAC0 not in line and "vlan" not in line, line
    assert "spoof checking on" in line and "trust off" in line, line
    assert "max_tx_rate" not in line, line
    net = Path("/sys/bus/pci/devices", prepared.vf, "net")
    (address,) = [(d / "address").read_text().strip() for d in net.iterdir()]
    assert address != MAC0 and address in line, (address, line)
    lab.pools.unprepare(prepared.vf)  # idempotent


def test_a_vf_whose_group_is_held_is_kept_with_its_settings(lab: Lab) -> None:
    prepared = lab.pools.prepare(POOL, {"mac": MAC0})
    fd = igblab.hold_group(lab.vf(0))
    try:
        with pytest.raises(exception.VfInUse):
            lab.pools.unprepare(prepared.vf)
        assert lab.vf(0).driver == "vfio-pci" and MAC0 in lab.ip_vf(0)
        with pytest.raises(exception.VfsHandedOver):  # no sriov_numvfs under it
            privileged.set_num_vfs(lab.pf, 0, sysfs_root="/sys")
        assert lab.info.num_vfs == NUM_VFS
    finally:
        os.close(fd)
    lab.pools.unprepare(prepared.vf)
    assert lab.vf(0).driver == "igbvf"
