"""Attach requests as the API and accelctl take them (issue 15, item 5): each
bad field is named by its path in the request, and a good request becomes
the manager's plain data, canonical so that a repeat compares equal."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from accel_agent import exception
from accel_agent.attach_requests import MAX_REQUESTS, parse
from accel_agent.devices.requests import DeviceRequest, PoolRequest, document
from accel_agent.sriov.pools import Pool

POOLS = MappingProxyType(
    {
        "nic_a": Pool("nic_a", ("0000:3b:00.0", "0000:3b:00.1"), "CUSTOM_NIC_A", (), 4),
        "nic_b": Pool("nic_b", ("0000:5e:00.0",), "SRIOV_NET_VF", (), None),
    }
)


def test_a_vgpu_and_a_vf_become_plain_requests_in_canonical_form() -> None:
    parsed = parse(
        [
            {"resource_class": "VGPU"},
            {"pool": "nic_a", "mac": "52:54:00:AB:CD:EF", "vlan": 100, "pf": "3B:00.1"},
            {"mdev_type": "nvidia-35", "count": 2, "parent": "0000:84:00.0"},
        ],
        POOLS,
    )
    assert parsed == [
        DeviceRequest(1, "VGPU"),
        PoolRequest("sriov_vf", "nic_a", {"mac": "52:54:00:ab:cd:ef", "vlan": 100}, "0000:3b:00.1"),
        DeviceRequest(2, None, "nvidia-35", "0000:84:00.0"),
    ]
    # a repeat spelled differently is the same request
    again = parse(
        [
            {"resource_class": "VGPU", "count": 1},
            {"pf": "0000:3b:00.1", "vlan": 100, "mac": "52:54:00:ab:cd:ef", "pool": "nic_a"},
            {"mdev_type": "nvidia-35", "count": 2, "parent": "84:00.0"},
        ],
        POOLS,
    )
    assert document(again) == document(parsed)


@pytest.mark.parametrize(
    ("requests", "field", "words"),
    [
        ([{"pool": "nic_a", "mac": "01:00:5e:00:00:01"}], "requests[0].mac", "multicast"),
        ([{"pool": "nic_a", "mac": "ff:ff:ff:ff:ff:ff"}], "requests[0].mac", "multicast"),
        ([{"pool": "nic_a", "mac": "00:00:00:00:00:00"}], "requests[0].mac", "zero MAC"),
        ([{"pool": "nic_a", "mac": "52:54:00:12:34"}], "requests[0].mac", "six hex pairs"),
        ([{"pool": "nic_a", "vlan": 4096}], "requests[0].vlan", "0..4095"),
        ([{"pool": "nic_a", "vlan": -1}], "requests[0].vlan", "0..4095"),
        ([{"pool": "nic_a", "vlan": True}], "requests[0].vlan", "integer"),
        ([{"pool": "nic_a", "qos": 3}], "requests[0].qos", "needs vlan"),
        ([{"resource_class": "VGPU"}, {"pool": "nic_c"}], "requests[1].pool", "nic_a, nic_b"),
        ([{"pool": 7}], "requests[0].pool", "no VF pool"),
        ([{"pool": "nic_a", "pf": "0000:5e:00.0"}], "requests[0].pf", "not in pool nic_a"),
        ([{"pool": "nic_a", "pf": "0000:99:00.0"}], "requests[0].pf", "device_addresses"),
        ([{"pool": "nic_a", "pf": "eth0"}], "requests[0].pf", "not a PCI address"),
        ([{"pool": "nic_a", "link_state": "up"}], "requests[0].link_state", "auto, enable"),
        ([{"pool": "nic_a", "speed": 10}], "requests[0].speed", "unknown VF setting"),
        ([{"resource_class": "vgpu"}], "requests[0].resource_class", "resource class"),
        ([{"resource_class": "VGPU", "count": 0}], "requests[0].count", "1 to 64"),
        ([{"resource_class": "VGPU", "count": "1"}], "requests[0].count", "1 to 64"),
        ([{"mdev_type": "nvidia-35\n"}], "requests[0].mdev_type", "must match"),
        ([{"mdev_type": "nvidia-35", "parent": "../x"}], "requests[0].parent", "neither"),
        ([{"count": 1}], "requests[0]", "names neither a pool"),
        ([{"resource_class": "VGPU", "mac": "52:54:00:00:00:01"}], "requests[0].mac", "unknown"),
        (["VGPU"], "requests[0]", "object"),
        ([], "requests", "non-empty list"),
        ({"pool": "nic_a"}, "requests", "list"),
        ([{"resource_class": "VGPU"}] * (MAX_REQUESTS + 1), "requests", "at most"),
    ],
)
def test_each_bad_field_is_named(requests: object, field: str, words: str) -> None:
    with pytest.raises(exception.InvalidAttachRequest) as info:
        parse(requests, POOLS)
    assert info.value.kwargs["field"] == field
    message = str(info.value)
    assert message.startswith(f"Invalid attach request: {field}: ") and words in message, message


def test_no_pool_configured_refuses_a_vf_request_by_its_pool() -> None:
    with pytest.raises(exception.InvalidAttachRequest) as info:
        parse([{"pool": "nic_a"}], {})
    assert info.value.kwargs["field"] == "requests[0].pool" and "none" in str(info.value)
