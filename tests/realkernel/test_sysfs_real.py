"""The agent's read side and the kernel's mdev ABI, on a REAL kernel (mtty).

Runs in the lab guest only (see conftest.py).  Needs nothing beyond what the
agent has today: the sysfs scanner, ``accelctl check-config/types/inventory``,
and raw ``write(2)`` calls that pin down the errno values the agent's
privileged writer has to map: EEXIST 17, EINVAL 22, ENOSPC 28, ENOENT 2.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from accel_agent.sysfs import scanner
from tests.realkernel import mdevlab
from tests.realkernel.mdevlab import DEVICES_DIR, TYPES_DIR


def _errno_of(func, *args) -> int:
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


# --- scan -----------------------------------------------------------------------------


def test_scan_finds_parent_mtty_with_both_types() -> None:
    snapshot = scanner.scan(mdevlab.SYSFS)

    assert list(snapshot.parents) == ["mtty"]
    parent = snapshot.parents["mtty"]
    # A virtual parent, not a PCI device: /sys/devices/virtual/mtty/mtty.
    assert parent.device_path == "devices/virtual/mtty/mtty"
    assert parent.pci_address is None
    assert parent.is_virtual
    assert parent.physical_gpu == "mtty"
    assert sorted(parent.types) == ["mtty-1", "mtty-2"]
    one, two = parent.types["mtty-1"], parent.types["mtty-2"]
    assert (one.name, one.device_api, one.available_instances) == (
        "Single port serial",
        "vfio-pci",
        24,
    )
    assert (two.name, two.device_api, two.available_instances) == (
        "Dual port serial",
        "vfio-pci",
        12,
    )
    # mtty has no show_description: the kernel hides the file, the scan says None.
    assert not os.path.exists(f"{TYPES_DIR}/mtty-1/description")
    assert one.description is None and two.description is None
    assert dict(snapshot.mdevs) == {}
    assert snapshot.warnings == ()


def test_created_mdev_appears_in_scan_with_kernel_links() -> None:
    uuid = mdevlab.new_uuid()
    mdevlab.create("mtty-2", uuid)

    assert os.readlink(f"{DEVICES_DIR}/{uuid}/mdev_type") == "../mdev_supported_types/mtty-2"
    snapshot = scanner.scan(mdevlab.SYSFS)
    mdev = snapshot.mdevs[uuid]
    assert (mdev.uuid, mdev.parent, mdev.mdev_type) == (uuid, "mtty", "mtty-2")
    # The vfio core gives every emulated-IOMMU device its own group.
    assert isinstance(mdev.iommu_group, int)
    assert snapshot.mdevs_on("mtty", "mtty-2") == [mdev]
    assert snapshot.mdevs_on("mtty", "mtty-1") == []
    types = snapshot.parents["mtty"].types
    assert types["mtty-2"].available_instances == 11
    assert types["mtty-1"].available_instances == 22
    assert snapshot.warnings == ()


# --- counters ---------------------------------------------------------------------


def test_counters_follow_create_and_remove_across_types() -> None:
    """Both types draw on one pool of 24 ports, so creating either moves both."""
    one, two = mdevlab.new_uuid(), mdevlab.new_uuid()

    mdevlab.create("mtty-1", one)
    assert mdevlab.available() == mdevlab.expected_available(1) == {"mtty-1": 23, "mtty-2": 11}
    mdevlab.create("mtty-2", two)
    assert mdevlab.available() == mdevlab.expected_available(3) == {"mtty-1": 21, "mtty-2": 10}
    assert mdevlab.mdevs() == {one: "mtty-1", two: "mtty-2"}
    assert sorted(os.listdir(f"{TYPES_DIR}/mtty-2/devices")) == [two]

    mdevlab.remove(one)
    assert mdevlab.available() == mdevlab.expected_available(2)
    mdevlab.remove(two)
    # remove is synchronous: gone and counted back as soon as write() returns
    assert not os.path.exists(f"{DEVICES_DIR}/{two}")
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE


# --- errno values the agent maps ---------------------------------------------------


def test_duplicate_uuid_is_eexist_on_any_type_and_spelling() -> None:
    uuid = mdevlab.new_uuid()
    mdevlab.create("mtty-2", uuid)

    assert _errno_of(mdevlab.create, "mtty-2", uuid) == errno.EEXIST == 17
    # the mdev core's list is global: another type of the same parent too
    assert _errno_of(mdevlab.create, "mtty-1", uuid) == errno.EEXIST
    # UUIDs are compared as values, not strings
    assert _errno_of(mdevlab.create, "mtty-1", uuid.upper()) == errno.EEXIST
    assert mdevlab.mdevs() == {uuid: "mtty-2"}
    assert mdevlab.available() == mdevlab.expected_available(2)


@pytest.mark.parametrize(
    "payload",
    [
        "not-a-uuid",
        "83b8f4f2509f382f3c1ee6bfe0fa1001",  # no dashes
        "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\r\n",  # length must be 36 or 37
        "\n",
    ],
    ids=["garbage", "no-dashes", "crlf", "newline-only"],
)
def test_malformed_uuid_is_einval(payload: str) -> None:
    assert _errno_of(mdevlab.create, "mtty-1", payload) == errno.EINVAL == 22
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE


def test_exhaustion_is_enospc_and_leaves_nothing_behind() -> None:
    made = [mdevlab.new_uuid() for _ in range(12)]
    for uuid in made:
        mdevlab.create("mtty-2", uuid)
    assert mdevlab.available() == {"mtty-1": 0, "mtty-2": 0}

    refused = mdevlab.new_uuid()
    assert _errno_of(mdevlab.create, "mtty-2", refused) == errno.ENOSPC == 28
    assert _errno_of(mdevlab.create, "mtty-1", refused) == errno.ENOSPC
    # a failed create leaves no device directory and does not move a counter
    assert not os.path.exists(f"{DEVICES_DIR}/{refused}")
    assert set(mdevlab.mdevs()) == set(made)
    snapshot = scanner.scan(mdevlab.SYSFS)
    assert len(snapshot.mdevs_on("mtty", "mtty-2")) == 12
    assert snapshot.parents["mtty"].types["mtty-2"].available_instances == 0

    for uuid in made:
        mdevlab.remove(uuid)
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE


def test_remove_of_a_removed_mdev_is_enoent_and_the_uuid_is_reusable() -> None:
    uuid = mdevlab.new_uuid()
    mdevlab.create("mtty-1", uuid)
    mdevlab.remove(uuid)

    assert _errno_of(mdevlab.remove, uuid) == errno.ENOENT
    # the same UUID can be created again at once (what recovery relies on)
    mdevlab.create("mtty-2", uuid)
    assert mdevlab.mdevs() == {uuid: "mtty-2"}


# --- accelctl against the real sysfs ------------------------------------------------


def test_check_config_accepts_mtty_as_device_address(agent_config: Path) -> None:
    result = mdevlab.ok(mdevlab.accelctl("check-config", "--strict", config=agent_config))
    assert "configuration OK: 1 mdev type(s) enabled, 1 provider(s) on 1 mdev parent(s)" in (
        result.stdout
    ), mdevlab.describe(result)


def test_check_config_strict_rejects_an_address_that_is_no_parent(tmp_path: Path) -> None:
    config = mdevlab.write_config(
        tmp_path / "bad.conf", tmp_path / "state", device_addresses="0000:84:00.0"
    )
    result = mdevlab.accelctl("check-config", "--strict", config=config)
    assert result.returncode == 1, mdevlab.describe(result)
    assert "0000:84:00.0" in result.stderr, mdevlab.describe(result)


def test_types_and_inventory_show_real_counters(agent_config: Path) -> None:
    uuid = mdevlab.new_uuid()
    mdevlab.create("mtty-2", uuid)

    types = mdevlab.ok_json(mdevlab.accelctl("types", "--json", config=agent_config))
    assert [p["name"] for p in types["parents"]] == ["mtty"]
    parent = types["parents"][0]
    assert parent["configured_type"] == "mtty-2"
    assert parent["pci_address"] is None
    by_type = {t["type_id"]: t for t in parent["types"]}
    assert sorted(by_type) == ["mtty-1", "mtty-2"]
    assert (by_type["mtty-2"]["available_instances"], by_type["mtty-2"]["mdevs"]) == (11, 1)
    assert (by_type["mtty-1"]["available_instances"], by_type["mtty-1"]["mdevs"]) == (22, 0)
    assert by_type["mtty-2"]["device_api"] == "vfio-pci"

    inventory = mdevlab.ok_json(mdevlab.accelctl("inventory", "--json", config=agent_config))
    providers = inventory["providers"]
    assert len(providers) == 1, inventory
    provider = providers[0]
    assert provider["name"] == "realkernel_mtty_mtty"
    assert (provider["mdev_type"], provider["resource_class"]) == ("mtty-2", "VGPU")
    assert (provider["parent_device"], provider["pci_address"]) == ("mtty", None)
    # the mdev made behind the agent's back is foreign: it uses capacity
    assert provider["used"] == 1
    # total = existing mdevs of the type + what the kernel still offers
    assert provider["inventory"]["total"] == 12
    assert provider["inventory"]["max_unit"] == 12
