"""VF network settings: validation, and apply/reset with read-back and rollback,
over a link that answers like igb did on a real kernel (docs/design.md
§10.4): EOPNOTSUPP for link_state, EINVAL for
min_tx_rate, and spoofchk/trust reported.  The real netlink socket is the
functional tier's (tests/functional/test_vf_netlink.py) and the lab's."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from accel_agent import exception
from accel_agent.sriov import vfconfig
from accel_agent.sriov.vfconfig import LinkRefused, VfSettings, VfState

MAC = "52:54:00:aa:bb:01"


class IgbLink:
    """Two VFs, in igb's start state; ``writes`` records every write."""

    name = "enp0s3"

    def __init__(self, num_vfs: int = 2) -> None:
        self.vfs = {
            i: {
                "mac": "00:00:00:00:00:00", "vlan": 0, "qos": 0, "spoofchk": 1, "trust": 0,
                "link_state": 0, "min_tx_rate": 0, "max_tx_rate": 0,
            }
            for i in range(num_vfs)
        }
        self.writes: list[tuple[int, str, dict[str, Any]]] = []
        self.refuse: dict[str, int] = {"link_state": errno.EOPNOTSUPP}
        self.ignore: set[str] = set()  # accepted but not applied (a lying driver)
        self.unreported: set[str] = set()

    def read(self, vf: int) -> VfState:
        if vf not in self.vfs:
            raise exception.VfIndexOutOfRange(pf=self.name, num_vfs=len(self.vfs), vf=vf)
        v = self.vfs[vf]

        def get(name: str) -> Any:
            return None if name in self.unreported else v[name]

        return VfState(
            vf=vf, mac=get("mac"), vlan=get("vlan"), qos=get("qos"),
            spoofchk=None if get("spoofchk") is None else bool(v["spoofchk"]),
            trust=None if get("trust") is None else bool(v["trust"]),
            link_state=vfconfig.LINK_STATES[v["link_state"]],
            max_tx_rate=v["max_tx_rate"], min_tx_rate=v["min_tx_rate"],
        )

    def write(self, vf: int, attribute: str, value: dict[str, Any]) -> None:
        self.writes.append((vf, attribute, dict(value)))
        if attribute in self.refuse:
            raise LinkRefused(self.refuse[attribute], "refused")
        if attribute == "rate" and value["min_tx_rate"]:
            raise LinkRefused(errno.EINVAL, "Invalid argument")  # igb_ndo_set_vf_bw
        if attribute in self.ignore:
            return
        self.vfs[vf].update(value)


# --- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"mac": "01:00:5e:00:00:01"}, "mac"),  # multicast
        ({"mac": "ff:ff:ff:ff:ff:ff"}, "mac"),  # broadcast is multicast too
        ({"mac": "00:00:00:00:00:00"}, "mac"),  # not an address outside a reset
        ({"mac": "52:54:00:aa:bb"}, "mac"),
        ({"mac": "52-54-00-aa-bb-01"}, "mac"),
        ({"mac": "52:54:00:aa:bb:01\n"}, "mac"),
        ({"vlan": 4096}, "vlan"),
        ({"vlan": -1}, "vlan"),
        ({"vlan": True}, "vlan"),
        ({"vlan": "100"}, "vlan"),
        ({"vlan": 5, "qos": 8}, "qos"),
        ({"qos": 3}, "qos"),  # qos travels with a vlan
        ({"spoofchk": 1}, "spoofchk"),
        ({"trust": "yes"}, "trust"),
        ({"link_state": "up"}, "link_state"),
        ({"max_tx_rate": -5}, "max_tx_rate"),
        ({"max_tx_rate": 2**32}, "max_tx_rate"),
        ({"max_tx_rate": 10, "min_tx_rate": 20}, "min_tx_rate"),
        ({"vlans": 5}, "vlans"),  # a typo is refused, not ignored
    ],
)
def test_invalid_settings_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(exception.InvalidVfSetting) as info:
        vfconfig.validate_settings(raw)
    assert info.value.kwargs["field"] == field
    assert field in str(info.value)


def test_valid_settings_are_normalised() -> None:
    got = vfconfig.validate_settings(
        {"mac": "52:54:00:AA:BB:01", "vlan": 4095, "qos": 7, "spoofchk": False,
         "trust": True, "link_state": "disable", "max_tx_rate": 100}
    )
    assert got == VfSettings(mac=MAC, vlan=4095, qos=7, spoofchk=False, trust=True,
                             link_state="disable", max_tx_rate=100)
    assert vfconfig.validate_settings({"vlan": 0}).vlan == 0
    assert vfconfig.validate_settings({"mac": "00:00:00:00:00:00"}, allow_zero_mac=True).mac


# --- apply ------------------------------------------------------------------------------


def test_apply_writes_one_attribute_per_request_and_reads_back() -> None:
    link = IgbLink()
    wanted = VfSettings(mac=MAC, vlan=100, qos=3, spoofchk=False, trust=True, max_tx_rate=100)
    before, after = vfconfig.apply(link, "0000:01:00.0", 1, wanted)
    assert [w[1] for w in link.writes] == ["mac", "vlan", "rate", "spoofchk", "trust"]
    assert link.writes[2] == (1, "rate", {"min_tx_rate": 0, "max_tx_rate": 100})
    assert before.mac == "00:00:00:00:00:00"
    assert (after.mac, after.vlan, after.qos, after.spoofchk, after.trust, after.max_tx_rate) == (
        MAC, 100, 3, False, True, 100)
    assert link.vfs[0]["mac"] == "00:00:00:00:00:00"  # the other VF untouched


def test_a_refused_setting_rolls_back_the_rest_and_names_vf_setting_errno() -> None:
    link = IgbLink()
    link.vfs[1].update(vlan=7)
    wanted = VfSettings(mac=MAC, vlan=100, trust=True, link_state="enable")
    with pytest.raises(exception.VfSettingRefused) as info:
        vfconfig.apply(link, "0000:01:00.0", 1, wanted)
    err = info.value
    assert not isinstance(err, exception.VfRollbackFailed)
    assert (err.kwargs["vf"], err.kwargs["setting"], err.kwargs["errno"]) == (
        1, "link_state", "EOPNOTSUPP")
    assert "0000:01:00.0" in str(err) and "rolled back trust, vlan, mac" in str(err)
    # the VF is as it was, and the undo went in reverse order
    assert link.vfs[1]["mac"] == "00:00:00:00:00:00" and link.vfs[1]["vlan"] == 7
    assert not link.vfs[1]["trust"]
    assert [w[1] for w in link.writes] == [
        "mac", "vlan", "trust", "link_state", "trust", "vlan", "mac"]


def test_min_tx_rate_einval_like_igb() -> None:
    link = IgbLink()
    with pytest.raises(exception.VfSettingRefused) as info:
        vfconfig.apply(link, "pf", 0, VfSettings(mac=MAC, min_tx_rate=10, max_tx_rate=100))
    assert info.value.kwargs["errno"] == "EINVAL" and info.value.kwargs["setting"] == "rate"
    assert link.vfs[0]["mac"] == "00:00:00:00:00:00"


def test_rollback_that_fails_says_half_configured() -> None:
    link = IgbLink()

    original = link.write

    def write(vf: int, attribute: str, value: dict[str, Any]) -> None:
        if attribute == "mac" and value["mac"] == "00:00:00:00:00:00":
            raise LinkRefused(errno.EBUSY, "Device or resource busy")
        original(vf, attribute, value)

    link.write = write  # type: ignore[method-assign]
    with pytest.raises(exception.VfRollbackFailed) as info:
        vfconfig.apply(link, "pf", 0, VfSettings(mac=MAC, link_state="auto"))
    assert "half-configured" in str(info.value) and "mac (EBUSY)" in str(info.value)
    assert isinstance(info.value, exception.VfSettingRefused)  # callers catch one class


def test_a_setting_the_read_back_contradicts_is_rolled_back() -> None:
    link = IgbLink()
    link.ignore.add("vlan")  # the driver says yes and does nothing
    with pytest.raises(exception.VfSettingNotApplied) as info:
        vfconfig.apply(link, "pf", 0, VfSettings(mac=MAC, vlan=100))
    assert info.value.kwargs["setting"] == "vlan" and info.value.kwargs["found"] == 0
    assert link.vfs[0]["mac"] == "00:00:00:00:00:00"


def test_an_unreported_setting_is_taken_as_written() -> None:
    link = IgbLink()
    link.unreported.add("trust")
    _, after = vfconfig.apply(link, "pf", 0, VfSettings(trust=True))
    assert after.trust is None and link.vfs[0]["trust"] == 1


def test_absent_vf_is_refused_before_any_write() -> None:
    link = IgbLink(num_vfs=2)
    with pytest.raises(exception.VfIndexOutOfRange):
        vfconfig.apply(link, "pf", 5, VfSettings(mac=MAC))
    assert link.writes == []


# --- reset ------------------------------------------------------------------------------


def test_reset_writes_only_what_differs_so_igb_link_state_is_not_asked() -> None:
    link = IgbLink()
    vfconfig.apply(link, "pf", 0, VfSettings(mac=MAC, vlan=100, qos=2, spoofchk=False,
                                               trust=True, max_tx_rate=50))
    link.writes.clear()
    _, after = vfconfig.reset(link, "pf", 0)
    assert "link_state" not in [w[1] for w in link.writes]
    assert (after.mac, after.vlan, after.qos, after.spoofchk, after.trust, after.link_state,
            after.max_tx_rate) == ("00:00:00:00:00:00", 0, 0, True, False, "auto", 0)
    link.writes.clear()
    vfconfig.reset(link, "pf", 0)
    assert link.writes == []  # already reset: nothing written


def test_reset_of_a_link_state_left_enabled_is_written() -> None:
    link = IgbLink()
    link.refuse.clear()
    link.vfs[0]["link_state"] = 1
    vfconfig.reset(link, "pf", 0)
    assert link.writes == [(0, "link_state", {"link_state": 0})]
