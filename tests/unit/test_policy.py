"""Config -> type per parent: Nova's semantics plus docs/design.md §3.3's fixes."""

import os

import pytest

from accel_agent import exception
from accel_agent.devices import policy as policy_mod
from tests.configutil import make_conf


@pytest.fixture
def sysfs(tmp_path):
    """An empty tree with one virtual parent link (mtty), enough for the
    policy: it reads sysfs only to accept virtual parent names."""
    (tmp_path / "devices" / "virtual" / "mtty" / "mtty").mkdir(parents=True)
    (tmp_path / "class" / "mdev_bus").mkdir(parents=True)
    os.symlink("../../devices/virtual/mtty/mtty", tmp_path / "class" / "mdev_bus" / "mtty")
    return str(tmp_path)


def build(ini, sysfs):
    return policy_mod.build_policy(make_conf(ini, sysfs_root=sysfs))


def errors_of(ini, sysfs):
    with pytest.raises(exception.ConfigErrors) as info:
        build(ini, sysfs)
    return [e.message for e in info.value.errors]


def test_empty_enabled_types_manage_nothing(sysfs):
    policy = build("[devices]\nenabled_mdev_types =\n", sysfs)
    assert not policy.enabled
    assert policy.type_for("0000:84:00.0") is None


def test_duplicate_address_across_types_names_address_and_both_types(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        [mdev_nvidia-35]
        device_addresses = 0000:84:00.0
        [mdev_nvidia-36]
        device_addresses = 0000:84:00.0
        """,
        sysfs,
    )
    assert len(messages) == 1
    assert "0000:84:00.0" in messages[0]
    assert "nvidia-35" in messages[0] and "nvidia-36" in messages[0]
    assert messages[0].startswith("Invalid configuration for mdev-capable devices: duplicate")


def test_duplicate_address_within_one_type(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        device_addresses = 0000:84:00.0, 0000:84:00.0
        """,
        sysfs,
    )
    assert "0000:84:00.0" in messages[0]
    assert messages[0].count("nvidia-35") == 2


def test_duplicate_detected_after_normalising(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        [mdev_nvidia-35]
        device_addresses = 0000:AF:00.0
        [mdev_nvidia-36]
        device_addresses = af:00.0
        """,
        sysfs,
    )
    assert "0000:af:00.0" in messages[0]


def test_upper_case_and_short_forms_match_kernel_names(sysfs):
    policy = build(
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        [mdev_nvidia-35]
        device_addresses = 0000:AF:00.0
        [mdev_nvidia-36]
        device_addresses = 84:00.0
        """,
        sysfs,
    )
    assert policy.type_for("0000:af:00.0") == "nvidia-35"
    assert policy.type_for("0000:84:00.0") == "nvidia-36"
    assert policy.type_for("0000:85:00.0") is None


@pytest.mark.parametrize("addresses", ["", "0000:07:00.0"])
def test_a_type_listed_twice_is_refused_naming_it(sysfs, addresses):
    # Nova refuses "nvidia-12, nvidia-12" (with addresses); never be laxer.
    messages = errors_of(
        f"""
        [devices]
        enabled_mdev_types = nvidia-12, nvidia-35, nvidia-12
        [mdev_nvidia-12]
        device_addresses = {addresses}
        [mdev_nvidia-35]
        device_addresses = 0000:08:00.0
        """,
        sysfs,
    )
    assert messages == [
        "Invalid configuration for mdev-capable devices: type nvidia-12 is listed 2 times "
        "in [devices] enabled_mdev_types; list each type once"
    ]


def test_an_empty_address_in_a_list_is_refused_and_quoted(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        device_addresses = 0000:84:00.0,,0000:85:00.0
        """,
        sysfs,
    )
    assert len(messages) == 1
    assert "incorrect device address: '' (an empty item in [mdev_nvidia-35]" in messages[0]


def test_malformed_address_refused_and_virtual_parent_accepted(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = mtty-1
        [mdev_mtty-1]
        device_addresses = whoops, mtty
        """,
        sysfs,
    )
    assert len(messages) == 1
    assert "incorrect device address: whoops" in messages[0]
    policy = build(
        "[devices]\nenabled_mdev_types = mtty-1\n[mdev_mtty-1]\ndevice_addresses = mtty\n", sysfs
    )
    assert policy.type_for("mtty") == "mtty-1"


def test_novas_virtual_parent_spelling_is_accepted(sysfs):
    policy = build(
        "[devices]\nenabled_mdev_types = mtty-2\n[mdev_mtty-2]\ndevice_addresses = mtty_mtty\n",
        sysfs,
    )
    assert policy.type_for("mtty") == "mtty-2"


def test_first_address_less_type_is_default_later_ones_warned_and_ignored(sysfs):
    policy = build(
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36, nvidia-37
        [mdev_nvidia-35]
        [mdev_nvidia-36]
        device_addresses = 0000:86:00.0
        [mdev_nvidia-37]
        """,
        sysfs,
    )
    assert policy.default_type == "nvidia-35"
    assert policy.type_for("0000:86:00.0") == "nvidia-36"
    assert policy.type_for("0000:99:00.0") == "nvidia-35"
    assert [t.mdev_type for t in policy.types] == ["nvidia-35", "nvidia-36"]
    assert any("nvidia-35 so nvidia-37 will not be used" in w for w in policy.warnings)


def test_default_type_mdev_class_is_honoured(sysfs):
    policy = build(
        "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\nmdev_class = CUSTOM_A\n",
        sysfs,
    )
    assert policy.config_of("nvidia-35").mdev_class == "CUSTOM_A"


def test_bad_mdev_class_and_max_instances_are_errors_naming_values(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        mdev_class = custom_lower
        max_instances = 0
        """,
        sysfs,
    )
    assert any("custom_lower" in m and "nvidia-35" in m for m in messages)
    assert any("max_instances 0" in m for m in messages)


def test_every_error_is_collected(sysfs):
    messages = errors_of(
        """
        [devices]
        enabled_mdev_types = a, b
        [mdev_a]
        device_addresses = whoops, 0000:84:00.0
        [mdev_b]
        device_addresses = 84:00.0, nope
        """,
        sysfs,
    )
    assert len(messages) == 3


def test_deprecated_names_still_work(sysfs):
    policy = build(
        """
        [devices]
        enabled_vgpu_types = nvidia-35, nvidia-36
        [vgpu_nvidia-36]
        device_addresses = 0000:86:00.0
        """,
        sysfs,
    )
    assert policy.type_for("0000:86:00.0") == "nvidia-36"
    assert policy.default_type == "nvidia-35"


def test_sections_of_types_not_enabled_are_warned(sysfs):
    policy = build(
        "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-99]\ndevice_addresses = 84:00.0\n",
        sysfs,
    )
    assert any("[mdev_nvidia-99]" in w for w in policy.warnings)
