"""``[devices] enabled_gpu_layouts`` and ``[gpu_layout_<name>]`` (issue 36):
read into the policy, each bad value one error naming the section and the
option, a GPU given two layouts refused naming both, and the config cache
carrying the layouts.  In process, over real oslo.config objects."""

from __future__ import annotations

import pytest

from accel_agent import exception
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.gpu_layouts import GpuLayout
from tests.configutil import make_conf

TYPES = "nvidia-1188, nvidia-1186, nvidia-1184"


def policy(ini: str) -> policy_mod.DevicePolicy:
    return policy_mod.build_policy(make_conf(ini, sysfs_root="/nonexistent"))


def refusals(ini: str) -> list[str]:
    with pytest.raises(exception.ConfigErrors) as info:
        policy(ini)
    return [e.message for e in info.value.errors]


def layout(vgpus: str, gpus: str = "21:00.0", extra: str = "", types: str = TYPES) -> str:
    return (f"[devices]\nenabled_mdev_types = {types}\nenabled_gpu_layouts = l4\n{extra}"
            f"[gpu_layout_l4]\ngpus = {gpus}\nvgpus = {vgpus}\n")


def test_a_layout_is_read_normalised_and_its_types_kept():
    found = policy(layout("nvidia-1188:1, nvidia-1186:1, nvidia-1184:2",
                          gpus="0000:22:00.0, 21:00.0"))
    assert found.gpu_layouts == (GpuLayout(
        "l4", ("0000:21:00.0", "0000:22:00.0"),
        (("nvidia-1188", 1), ("nvidia-1186", 1), ("nvidia-1184", 2)), "agent"),)
    # The address-less types after the first are kept for the layout, no warning.
    assert [t.mdev_type for t in found.types] == ["nvidia-1188", "nvidia-1186", "nvidia-1184"]
    assert found.warnings == ()
    # A layout's GPU has the layout's types, never the default type.
    assert found.default_type == "nvidia-1188"
    assert found.type_for("0000:21:00.0") is None
    assert found.types_on("0000:21:00.0") == ("nvidia-1188", "nvidia-1186", "nvidia-1184")
    assert found.type_for("0000:41:00.0") == "nvidia-1188"
    assert not found.nova_reports_on("0000:22:00.0", "nvidia-1184")
    assert not found.any_nova_reports


def test_a_layout_of_one_type_nova_reports():
    found = policy(layout("nvidia-1184:8") + "reported_by = nova\n")
    assert found.nova_reports_on("0000:21:00.0", "nvidia-1184") and found.any_nova_reports
    assert not found.nova_reports_on("0000:41:00.0", "nvidia-1188")


def test_a_layout_of_several_types_nova_reports_is_refused_naming_nova_s_rule():
    (message,) = refusals(layout("nvidia-1188:1, nvidia-1184:4") + "reported_by = nova\n")
    assert message == (
        "Invalid configuration for mdev-capable devices: [gpu_layout_l4] reported_by = nova "
        "with several types: Nova (34) cannot tell one GPU's VFs of different types apart (in "
        "Placement a PF's VFs must share one resource class and one set of traits, 'VFs from "
        "the same PF cannot be configured with different resource_class values'; without it "
        "an alias matches vendor and product ids, which the types share); use reported_by = "
        "agent, or give the layout one type")


def test_an_address_less_type_no_layout_uses_is_still_dropped():
    found = policy(layout("nvidia-1188:1, nvidia-1186:1"))
    assert [t.mdev_type for t in found.types] == ["nvidia-1188", "nvidia-1186"]
    assert found.warnings == (
        "Mdev type default already set to nvidia-1188 so nvidia-1184 will not be used.",)


@pytest.mark.parametrize(("vgpus", "said"), [
    ("nvidia-1186", "[gpu_layout_l4] vgpus item 'nvidia-1186' is not <type>:<count>"),
    (":2", "[gpu_layout_l4] vgpus item ':2' is not <type>:<count>"),
    ("nvidia-1186:0", "[gpu_layout_l4] vgpus item 'nvidia-1186:0': the count must be an "
                      "integer from 1 to 65535"),
    ("nvidia-1186:two", "[gpu_layout_l4] vgpus item 'nvidia-1186:two': the count must be"),
    ("nvidia-1186:-1", "[gpu_layout_l4] vgpus item 'nvidia-1186:-1': the count must be"),
    ("nvidia-99:1", "[gpu_layout_l4] vgpus item 'nvidia-99:1': type nvidia-99 is not in "
                    "[devices] enabled_mdev_types"),
    ("i915-GVTg_V5_4:1", "[gpu_layout_l4] vgpus item 'i915-GVTg_V5_4:1': i915-GVTg_V5_4 is no "
                         "NVIDIA vGPU type of a vendor-VFIO VF (nvidia-<id>, backend "
                         "nvidia_vfio)"),
    ("nvidia-1186:1, nvidia-1186:2", "[gpu_layout_l4] vgpus names nvidia-1186 twice"),
    ("", "[gpu_layout_l4] vgpus is empty"),
])
def test_a_bad_vgpus_item_is_one_error_naming_the_section(vgpus, said):
    types = TYPES + ", i915-GVTg_V5_4"
    (message,) = refusals(layout(vgpus, types=types))
    assert said in message, message


@pytest.mark.parametrize(("gpus", "said"), [
    ("21:00", "incorrect device address: 21:00 (in [gpu_layout_l4] gpus; expected a GPU's "
              "PCI address"),
    ("21:00.0,,22:00.0", "incorrect device address: '' (in [gpu_layout_l4] gpus"),
    ("21:00.0, 0000:21:00.0", "[gpu_layout_l4] gpus names 0000:21:00.0 twice"),
    ("", "[gpu_layout_l4] gpus is empty"),
])
def test_a_bad_gpu_address_is_one_error_naming_the_section(gpus, said):
    (message,) = refusals(layout("nvidia-1186:2", gpus=gpus))
    assert said in message, message


def test_a_bad_layout_name_and_a_name_listed_twice_are_refused():
    ini = (f"[devices]\nenabled_mdev_types = {TYPES}\nenabled_gpu_layouts = l4, L4!, l4\n"
           "[gpu_layout_l4]\ngpus = 21:00.0\nvgpus = nvidia-1186:1\n")
    assert refusals(ini) == [
        "Invalid configuration for mdev-capable devices: layout l4 is listed 2 times in "
        "[devices] enabled_gpu_layouts",
        "Invalid configuration for mdev-capable devices: layout 'L4!' in [devices] "
        "enabled_gpu_layouts is no layout name: lower-case letters, digits, '_' and '-', at "
        "most 32, starting with a letter or digit",
    ]


def test_a_gpu_in_two_layouts_is_refused_naming_both_sections():
    ini = (f"[devices]\nenabled_mdev_types = {TYPES}\nenabled_gpu_layouts = a, b\n"
           "[gpu_layout_a]\ngpus = 21:00.0, 22:00.0\nvgpus = nvidia-1186:1\n"
           "[gpu_layout_b]\ngpus = 0000:22:00.0\nvgpus = nvidia-1184:1\n")
    assert refusals(ini) == [
        "Invalid configuration for mdev-capable devices: duplicate layouts for PCI ID "
        "0000:22:00.0: in [gpu_layout_a] gpus and in [gpu_layout_b] gpus: a GPU has one "
        "layout; remove it from one of them"]


def test_a_gpu_in_a_layout_and_in_a_type_s_device_addresses_is_refused_naming_both():
    extra = "[mdev_nvidia-1184]\ndevice_addresses = 0000:21:00.0\n"
    (message,) = refusals(layout("nvidia-1186:1", extra=extra))
    assert message == (
        "Invalid configuration for mdev-capable devices: duplicate layouts for PCI ID "
        "0000:21:00.0: in [gpu_layout_l4] gpus and in [mdev_nvidia-1184] device_addresses: "
        "a GPU has one layout; remove it from one of them")
    # The duplicate-address rule's class: what catches one catches both.
    with pytest.raises(exception.ConfigErrors) as info:
        policy(layout("nvidia-1186:1", extra=extra))
    assert isinstance(info.value.errors[0], exception.DuplicateDeviceAddress)


def test_a_standing_layout_on_a_gpu_of_a_mixed_layout_is_refused():
    extra = "[mdev_nvidia-1184]\ndevice_addresses = 21:00.0\nstanding = 4\n"
    (message,) = refusals(layout("nvidia-1186:1", extra=extra))
    assert ("in [gpu_layout_l4] gpus and in [mdev_nvidia-1184] device_addresses (and its "
            "standing = 4 would lay the GPU out twice)") in message


def test_a_layout_section_nobody_enabled_is_named_in_a_warning():
    found = policy(layout("nvidia-1186:1") + "[gpu_layout_spare]\ngpus = 23:00.0\n")
    assert ("section [gpu_layout_spare] is ignored: layout spare is not in [devices] "
            "enabled_gpu_layouts") in found.warnings


def test_the_config_cache_carries_the_layouts():
    conf = make_conf(layout("nvidia-1188:1, nvidia-1184:2"), sysfs_root="/nonexistent")
    inputs, errors = policy_mod.read_policy_inputs(conf)
    assert errors == []
    again = policy_mod.PolicyInputs.from_dict(inputs.to_dict())
    assert again == inputs
    assert policy_mod.resolve_policy(again, "/nonexistent").gpu_layouts == (GpuLayout(
        "l4", ("0000:21:00.0",), (("nvidia-1188", 1), ("nvidia-1184", 2))),)
    # A cache written before layouts existed still reads.
    old = {k: v for k, v in inputs.to_dict().items() if "layout" not in k}
    assert policy_mod.PolicyInputs.from_dict(old).layout_options == ()
