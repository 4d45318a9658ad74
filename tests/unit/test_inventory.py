"""Inventory math (docs/design.md §5.1) on simulated hosts: Nova's numbers and ours."""

from accel_agent.devices import inventory as inventory_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.sysfs import scan
from tests.configutil import make_conf

UUIDS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(1, 40)]


def host_tree(tmp_path, *profiles, mutate=None, **options):
    host = SimulatedHost(build_spec(profiles, **options))
    if mutate:
        mutate(host)
    root = str(tmp_path / "sys")
    materialise(host, root)
    return root


def inventory(root, ini, free=()):
    conf = make_conf(ini, sysfs_root=root)
    policy = policy_mod.build_policy(conf)
    return inventory_mod.compute_inventory(scan(root), policy, "testhost", free)


def totals(inv):
    return {p.name: p.total for p in inv.providers}


def test_nova_single_type_16_and_8(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(root, "[devices]\nenabled_mdev_types = nvidia-11\n")
    assert totals(inv) == {
        "testhost_pci_0000_06_00_0": 16,
        "testhost_pci_0000_07_00_0": 8,
    }
    record = inv.providers[0].inventory_record()
    assert record == {
        "total": 16,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": 16,
        "step_size": 1,
        "allocation_ratio": 1.0,
    }


def test_nova_two_types_16_and_10(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(
        root,
        """
        [devices]
        enabled_mdev_types = nvidia-11, nvidia-12
        [mdev_nvidia-11]
        device_addresses = 0000:06:00.0
        [mdev_nvidia-12]
        device_addresses = 0000:07:00.0
        """,
    )
    assert totals(inv) == {"testhost_pci_0000_06_00_0": 16, "testhost_pci_0000_07_00_0": 10}
    p07 = inv.provider("testhost_pci_0000_07_00_0")
    # The nvidia-11 mdev on 07 is not nvidia-12 capacity, and not counted as used there.
    assert p07.device_type == "nvidia-12" and p07.used == 0


def test_first_address_less_type_is_default_with_its_custom_class(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(
        root,
        """
        [devices]
        enabled_mdev_types = nvidia-11, nvidia-12, nvidia-99
        [mdev_nvidia-11]
        mdev_class = CUSTOM_M60_0B
        [mdev_nvidia-12]
        device_addresses = 07:00.0
        [mdev_nvidia-99]
        """,
    )
    p06 = inv.provider("testhost_pci_0000_06_00_0")
    assert (p06.device_type, p06.resource_class, p06.total) == ("nvidia-11", "CUSTOM_M60_0B", 16)
    assert inv.provider("testhost_pci_0000_07_00_0").resource_class == "VGPU"


def test_parent_configured_for_a_type_it_lacks_warns_and_gets_no_provider(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(
        root,
        """
        [devices]
        enabled_mdev_types = nvidia-12
        [mdev_nvidia-12]
        device_addresses = 0000:06:00.0, 0000:07:00.0
        """,
    )
    assert list(totals(inv)) == ["testhost_pci_0000_07_00_0"]
    assert any("0000:06:00.0" in w and "nvidia-12" in w for w in inv.warnings)


def test_upper_case_and_short_config_addresses_match_kernel_parents(tmp_path):
    root = host_tree(tmp_path, "nvidia-pf", gpus=8)
    assert "0000:8a:00.0" in scan(root).parents
    inv = inventory(
        root,
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        [mdev_nvidia-35]
        device_addresses = 0000:8A:00.0
        [mdev_nvidia-36]
        device_addresses = 8B:00.0
        """,
    )
    assert {p.name: p.device_type for p in inv.providers} == {
        "testhost_pci_0000_8a_00_0": "nvidia-35",
        "testhost_pci_0000_8b_00_0": "nvidia-36",
    }


def test_max_instances_caps_per_physical_gpu_and_never_below_existing(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(
        root, "[devices]\nenabled_mdev_types = nvidia-11\n[mdev_nvidia-11]\nmax_instances = 2\n"
    )
    # Per GPU, not host-wide (Nova zeroes 06 here and deletes its provider).
    assert totals(inv) == {"testhost_pci_0000_06_00_0": 2, "testhost_pci_0000_07_00_0": 2}
    inv = inventory(
        root, "[devices]\nenabled_mdev_types = nvidia-11\n[mdev_nvidia-11]\nmax_instances = 1\n"
    )
    assert totals(inv) == {"testhost_pci_0000_06_00_0": 1, "testhost_pci_0000_07_00_0": 1}


def test_sriov_capacity_is_per_physical_gpu_not_the_sum_of_vfs(tmp_path):
    root = host_tree(tmp_path, "nvidia-sriov", gpus=2, vfs=16)
    snap = scan(root)
    vf_type = next(iter(snap.parents["0000:41:00.4"].types.values()))
    limit = vf_type.max_instance
    assert limit is not None and limit < 16
    inv = inventory(root, f"[devices]\nenabled_mdev_types = {vf_type.type_id}\n")
    # 16 VFs each read 1, the card holds ``limit``: one provider per card.
    assert totals(inv) == {
        "testhost_pci_0000_41_00_0": limit,
        "testhost_pci_0000_42_00_0": limit,
    }
    provider = inv.provider("testhost_pci_0000_41_00_0")
    assert provider.parent_device == "0000:41:00.0" and len(provider.parent_devices) == 16
    assert provider.pci_address == "0000:41:00.0"


def test_sriov_budget_counts_existing_vgpus(tmp_path):
    def use_two(host):
        type_id = next(iter(host.spec.parent("0000:41:00.4").types)).type_id
        host.create_mdev("0000:41:00.4", type_id, UUIDS[0])
        host.create_mdev("0000:41:00.5", type_id, UUIDS[1])

    root = host_tree(tmp_path, "nvidia-sriov", mutate=use_two)
    type_id = scan(root).mdevs[UUIDS[0]].mdev_type
    limit = scan(root).parents["0000:41:00.6"].types[type_id].max_instance
    inv = inventory(root, f"[devices]\nenabled_mdev_types = {type_id}\n")
    provider = inv.providers[0]
    assert provider.total == limit
    assert provider.used == 2


def test_foreign_and_other_type_mdevs_count_as_used_not_free(tmp_path):
    root = host_tree(tmp_path, "nova")
    inv = inventory(root, "[devices]\nenabled_mdev_types = nvidia-11\n")
    # Nothing is owned yet: the existing mdevs are foreign, hence used.
    assert {p.name: p.used for p in inv.providers} == {
        "testhost_pci_0000_06_00_0": 1,
        "testhost_pci_0000_07_00_0": 1,
    }
    from accel_agent.simulator.profiles import NOVA_MDEV_06

    inv = inventory(root, "[devices]\nenabled_mdev_types = nvidia-11\n", free=[NOVA_MDEV_06])
    assert inv.provider("testhost_pci_0000_06_00_0").used == 0


def test_traits_and_provider_fields(tmp_path):
    root = host_tree(tmp_path, "mtty")
    inv = inventory(
        root, "[devices]\nenabled_mdev_types = mtty-2\n[mdev_mtty-2]\ndevice_addresses = mtty\n"
    )
    (provider,) = inv.providers
    doc = inv.to_dict()
    assert doc["host"] == "testhost"
    entry = doc["providers"][0]
    assert entry["name"] == "testhost_mtty_mtty" and entry["parent_provider"] == "testhost"
    assert entry["parent_device"] == "mtty" and entry["pci_address"] is None
    assert entry["traits"] == ["CUSTOM_MDEV_MTTY_2", "CUSTOM_OWNER_ACCEL_AGENT"]
    assert entry["inventory"]["total"] == 12 == provider.total


def test_no_enabled_types_no_providers_and_zero_capacity_no_provider(tmp_path):
    root = host_tree(tmp_path, "nova")
    assert inventory(root, "[devices]\nenabled_mdev_types =\n").providers == ()
    full = host_tree(
        tmp_path / "full",
        "mtty",
        mutate=lambda h: [h.create_mdev("mtty", "mtty-2", u) for u in UUIDS[:12]],
    )
    inv = inventory(full, "[devices]\nenabled_mdev_types = mtty-1\n")
    # mtty-1 reads 0 and none exists: no provider (Placement refuses total 0).
    assert inv.providers == ()


def test_type_trait_normalisation():
    assert inventory_mod.type_trait("nvidia-35") == "CUSTOM_MDEV_NVIDIA_35"
    assert inventory_mod.type_trait("i915-GVTg_V5_4") == "CUSTOM_MDEV_I915_GVTG_V5_4"
