"""``accelctl explain``: the verdict on each host an operator meets, read
from static trees (the real H200 capture, simulated hosts), offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_agent import backends, exception, explain
from accel_agent.backends.host import scan_host
from accel_agent.cmd import ctl
from accel_agent.config import check
from accel_agent.config import lint as config_lint
from accel_agent.devices import policy as policy_mod
from accel_agent.explain import facts, pciids, render
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.sriov.pools import Pool
from tests import hosttrees
from tests.configutil import make_conf

# A pci.ids of the real format with the ids these hosts use; like Debian's
# 2023 list it knows no H200 (10de:2335).
PCI_IDS = """\
# comment
10de  NVIDIA Corporation
\t20f1  GA100 [A100 PCIe 40GB]
\t26b9  AD102GL [L40S]
\t\t10de 1851  L40S
1002  Advanced Micro Devices, Inc. [AMD/ATI]
\t740f  Aldebaran/MI200 [Instinct MI210]
8086  Intel Corporation
\t3e92  CoffeeLake-S GT2 [UHD Graphics 630]
C 03  Display controller
\t00  VGA compatible controller
\t02  3D controller
\t80  Display controller
C 12  Processing accelerators
"""
GPU1 = profiles.nvidia_vfio_pf(0)
VF0 = profiles.vf_address(GPU1, 0)


@pytest.fixture
def ids(tmp_path: Path) -> str:
    path = tmp_path / "pci.ids"
    path.write_text(PCI_IDS)
    return str(path)


def document(root: str, ids: str | None, conf_text: str = "", address: str | None = None,
             pools: dict | None = None) -> dict:
    policy = policy_mod.build_policy(make_conf(conf_text, sysfs_root=root)) if conf_text else None
    snapshot = scan_host(root, backends.builtin())
    return explain.explain(snapshot, explain.Asks.of(policy, pools), address, "h", ids)


def device(doc: dict, address: str) -> dict:
    (found,) = [d for d in doc["devices"] if d["address"] == address]
    return found


def codes(dev: dict) -> list[str]:
    return [p["code"] for p in dev["problems"]]


# --- the real H200 (datacenter driver, no vGPU manager) ---------------------------------


H200_CONF = "[devices]\nenabled_mdev_types = nvidia-1150\n[mdev_nvidia-1150]\n" \
            f"device_addresses = {hosttrees.H200}\n"


def test_the_h200_capture_says_no_vgpu_manager_is_loaded_and_what_to_install(tmp_path, ids):
    root = hosttrees.h200_tree(tmp_path / "h200")
    doc = document(root, ids, H200_CONF)
    # The virtio functions are no GPU: the H200 alone is explained.
    assert [d["address"] for d in doc["devices"]] == [hosttrees.H200]
    gpu = doc["devices"][0]
    verdict = gpu["verdict"]
    assert verdict["code"] == "no-vgpu-manager"
    assert verdict["summary"].startswith("no vGPU manager is loaded: the GPU is on NVIDIA's "
                                         "datacenter driver (580.159.04, open kernel module)")
    assert verdict["next_step"].startswith("install NVIDIA's vGPU manager (host driver) for "
                                           "this GPU")
    assert "virtual machine (virtio devices (1af4))" in verdict["next_step"]
    assert codes(gpu) == ["no-vgpu-manager", "no-sriov-capability", "iommu-off"]
    assert gpu["nvidia"]["vgpu_manager"] == "absent"
    assert (gpu["driver"], gpu["numa_node"], gpu["iommu_group"], gpu["sriov"]) == \
        ("nvidia", None, None, None)
    assert (gpu["vendor_id"], gpu["device_id"], gpu["subsystem_id"], gpu["class"]) == \
        ("10de", "2335", "10de:18bf", "0x030200")
    assert (gpu["name"], gpu["class_name"]) == ("NVIDIA Corporation device 2335", "3D controller")
    assert gpu["config"]["mdev_type"] == "nvidia-1150"
    assert gpu["config"]["source"] == "device_addresses"
    assert doc["proc_root"] == str(tmp_path / "h200" / "proc")
    assert doc["facts"]["iommu_groups"] == 0 and doc["facts"]["vgpu_vfio_module"] is False
    assert doc["facts"]["nvidia_driver"].startswith("NVRM version: NVIDIA UNIX Open Kernel")


def test_check_config_carries_the_verdict_on_the_h200(tmp_path):
    root = hosttrees.h200_tree(tmp_path / "h200")
    _errors, warnings, _state = check.check(make_conf(H200_CONF, sysfs_root=root))
    (warning,) = [w for w in warnings if w.startswith(hosttrees.H200)]
    assert warning.startswith(
        "0000:00:06.0 (configured for nvidia-1150) is not an mdev parent on this host: "
        "no vGPU manager is loaded: the GPU is on NVIDIA's datacenter driver (580.159.04")
    assert "install NVIDIA's vGPU manager" in warning and "\n" not in warning
    # check-config --json points it at no file or option (none is wrong)
    assert config_lint.locate(warning) == config_lint.Location()


def test_accelctl_explain_on_the_h200_capture(tmp_path, capsys):
    root = hosttrees.h200_tree(tmp_path / "h200")
    assert ctl.main(["--sysfs-root", root, "explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0000:00:06.0  NVIDIA Corporation")
    assert "  verdict:      no vGPU manager is loaded" in out
    assert "  next step:    install NVIDIA's vGPU manager" in out
    assert "  IOMMU group:  none: the IOMMU is off" in out
    assert "  SR-IOV:       not visible (no sriov_totalvfs)" in out
    assert ctl.main(["--sysfs-root", root, "explain", "00:06.0", "--json"]) == 0
    (gpu,) = json.loads(capsys.readouterr().out)["devices"]
    assert gpu["verdict"]["code"] == "no-vgpu-manager"


def test_an_address_not_on_the_host_is_1_and_a_malformed_one_2(tmp_path, capsys):
    root = hosttrees.h200_tree(tmp_path / "h200")
    assert ctl.main(["--sysfs-root", root, "explain", "0000:99:00.0"]) == 1
    assert "no PCI device or mdev parent 0000:99:00.0 on this host" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        ctl.main(["--sysfs-root", root, "explain", "0000:99:00.9/.."])
    assert exit_info.value.code == 2
    assert "'0000:99:00.9/..' is neither a PCI address" in capsys.readouterr().err


def test_without_pci_ids_the_name_is_unknown_with_the_ids(tmp_path):
    root = hosttrees.h200_tree(tmp_path / "h200")
    gpu = device(document(root, None), hosttrees.H200)
    assert (gpu["name"], gpu["vendor_name"], gpu["class_name"]) == \
        ("unknown (10de:2335)", None, None)
    assert "names are unknown" in render.text(document(root, None))


# --- simulated hosts --------------------------------------------------------------------


VGPU_CONF = f"[devices]\nenabled_mdev_types = nvidia-1150\n[mdev_nvidia-1150]\n" \
            f"device_addresses = {GPU1}\n"


def test_a_vgpu17_host_is_ready_and_shows_its_vfs(tmp_path, ids):
    host = hosttrees.vgpu17(vfs=4)
    host.write(f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type", "1150")
    root = hosttrees.simulated_tree(host, tmp_path)
    gpu = device(document(root, ids, VGPU_CONF), GPU1)
    assert gpu["verdict"]["code"] == "ready" and gpu["problems"] == []
    assert gpu["verdict"]["summary"].startswith("ready: offers nvidia-1150 (")
    assert gpu["name"] == "NVIDIA Corporation AD102GL [L40S]"
    assert gpu["nvidia"]["vgpu_manager"] == "loaded"
    assert gpu["nvidia"]["typed_vfs"] == {VF0: "nvidia-1150"}
    assert gpu["nvidia"]["vfs_with_vgpu_files"] == 4
    assert {"type_id": "nvidia-1150", "name": "NVIDIA L40S-4Q"} in gpu["nvidia"]["creatable_types"]
    assert gpu["sriov"]["total_vfs"] == 32 and gpu["sriov"]["num_vfs"] == 4
    assert [v["vgpu_type"] for v in gpu["sriov"]["vfs"]] == ["nvidia-1150", None, None, None]
    types = {t["type_id"]: t for t in gpu["mdev_types"]}
    assert types["nvidia-1150"]["devices"] == 1


def test_vfs_not_enabled_names_sriov_manage(tmp_path, ids):
    root = hosttrees.simulated_tree(hosttrees.vgpu17(vfs=4, vfs_enabled=False), tmp_path)
    gpu = device(document(root, ids, VGPU_CONF), GPU1)
    assert codes(gpu) == ["vfs-not-enabled"]
    assert gpu["verdict"]["summary"].startswith("VFs not enabled: the GPU has SR-IOV (32 VFs)")
    assert gpu["verdict"]["next_step"].startswith(f"run /usr/lib/nvidia/sriov-manage -e {GPU1}")
    # check-config's warning says the same
    _errors, warnings, _state = check.check(make_conf(VGPU_CONF, sysfs_root=root))
    assert any(w.startswith(f"{GPU1} (configured for nvidia-1150) is not an mdev parent on "
                            "this host: VFs not enabled") for w in warnings)


def test_iommu_off_says_how_to_turn_it_on(tmp_path, ids):
    root = hosttrees.iommu_off(hosttrees.simulated_tree(hosttrees.vgpu17(vfs=2), tmp_path))
    gpu = device(document(root, ids, VGPU_CONF), GPU1)
    assert codes(gpu) == ["iommu-off"]
    assert gpu["verdict"]["summary"].startswith("IOMMU is off: the kernel made no IOMMU groups")
    step = gpu["verdict"]["next_step"]
    assert "intel_iommu=on" in step and "amd_iommu" in step and "iommu=pt" in step
    assert "vIOMMU" in step


def test_a_datacenter_driver_with_sriov_but_no_manager_is_not_told_to_enable_vfs(tmp_path, ids):
    """An H100 on bare metal with the datacenter driver shows SR-IOV too:
    enabling VFs would give nothing without the vGPU manager."""
    root = hosttrees.simulated_tree(hosttrees.vgpu17(vfs=4, vfs_enabled=False), tmp_path)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "modules").write_text("nvidia 14299136 0 - Live 0x0\n")
    gpu = device(document(root, ids), GPU1)
    assert codes(gpu) == ["no-vgpu-manager"]
    (tmp_path / "proc" / "modules").write_text("nvidia_vgpu_vfio 1 0 - Live 0x0\nnvidia 1 0\n")
    gpu = device(document(root, ids), GPU1)
    assert codes(gpu) == ["vfs-not-enabled"]
    assert gpu["nvidia"]["evidence"] == "the nvidia_vgpu_vfio module is loaded"


def test_an_mdev_vgpu_host_and_a_virtual_parent_are_ready(tmp_path, ids):
    host = SimulatedHost(profiles.build_spec(["nvidia-pf", "mtty"], gpus=1))
    root = hosttrees.simulated_tree(host, tmp_path)
    doc = document(root, ids, "[devices]\nenabled_mdev_types = nvidia-35\n")
    gpu = device(doc, "0000:84:00.0")
    assert gpu["verdict"]["code"] == "ready"
    assert gpu["verdict"]["summary"].startswith("ready: offers nvidia-35 (")
    assert gpu["config"]["source"] == "default"
    assert gpu["nvidia"]["evidence"] == "the nvidia driver registered mdev types on it"
    mtty = device(doc, "mtty")
    assert (mtty["kind"], mtty["verdict"]["code"]) == ("virtual", "ready")
    assert mtty["verdict"]["summary"] == ("ready: offers mtty-1, mtty-2; the configuration "
                                          "gives it the default type nvidia-35, which it does "
                                          "not offer")


def test_an_intel_gpu_with_gvtg_is_ready_and_without_it_says_how(tmp_path, ids):
    root = hosttrees.simulated_tree(hosttrees.intel_gvtg(), tmp_path / "a")
    gpu = device(document(root, ids), hosttrees.INTEL_IGPU)
    assert gpu["verdict"]["code"] == "ready"
    assert gpu["name"] == "Intel Corporation CoffeeLake-S GT2 [UHD Graphics 630]"
    assert {t["type_id"] for t in gpu["mdev_types"]} >= {"i915-GVTg_V5_4"}
    assert gpu["nvidia"] is None
    root = hosttrees.simulated_tree(hosttrees.intel_without_gvtg(), tmp_path / "b")
    gpu = device(document(root, ids), hosttrees.INTEL_IGPU)
    assert codes(gpu) == ["gvt-g-off"]
    assert "i915.enable_gvt=1" in gpu["verdict"]["next_step"]


def test_an_amd_gpu_on_amdgpu_shares_nothing(tmp_path, ids):
    root = hosttrees.simulated_tree(hosttrees.amd_gpu(), tmp_path)
    gpu = device(document(root, ids), hosttrees.AMD_GPU)
    assert codes(gpu) == ["no-sharing"]
    assert gpu["verdict"]["summary"].startswith("offers no mdev types and no SR-IOV VFs: amdgpu")
    assert "GIM" in gpu["verdict"]["next_step"]
    assert (gpu["name"], gpu["class_name"], gpu["numa_node"]) == \
        ("Advanced Micro Devices, Inc. [AMD/ATI] Aldebaran/MI200 [Instinct MI210]",
         "Display controller", 0)


def test_a_nic_in_a_vf_pool_is_explained_by_address_with_its_pool(tmp_path, ids):
    root = hosttrees.simulated_tree(SimulatedHost(profiles.build_spec(["igb-sriov"])), tmp_path)
    pf, _ = profiles.igb_port(0)
    pools = {"nic": Pool("nic", (pf,), "CUSTOM_NIC", (), None)}
    assert document(root, ids, pools=pools)["devices"] == []  # no GPU: not listed
    nic = device(document(root, ids, address=pf, pools=pools), pf)
    assert codes(nic) == ["vfs-not-enabled"]
    assert f"/sys/bus/pci/devices/{pf}/sriov_numvfs" in nic["verdict"]["next_step"]
    assert "VF pool nic" in nic["verdict"]["next_step"]
    assert nic["config"]["vf_pool"] == {"name": "nic", "num_vfs": None}


def test_one_vf_by_address_and_address_forms(tmp_path, ids):
    root = hosttrees.simulated_tree(hosttrees.vgpu17(vfs=2), tmp_path)
    vf = device(document(root, ids, address=VF0), VF0)
    assert (vf["physfn"], vf["verdict"]["code"]) == (GPU1, "ready")
    assert explain.normalise_address("C1:00.4") == VF0
    assert explain.normalise_address("mtty") == "mtty"
    for bad in ("0000:c1:00.8", "../x", "", "a:b"):
        with pytest.raises(exception.InvalidPciAddress):
            explain.normalise_address(bad)
    with pytest.raises(exception.DeviceNotOnHost):
        document(root, ids, address="0000:99:00.0")


def test_proc_is_read_beside_the_sysfs_root_and_at_proc_for_sys():
    assert facts.proc_root_for("/sys") == "/proc"
    assert facts.proc_root_for("/sys/") == "/proc"
    assert facts.proc_root_for("/srv/capture/sys") == "/srv/capture/proc"


def test_pci_ids_reads_vendor_device_subsystem_and_class(ids):
    names, classes = pciids.PciIds(ids).lookup(
        [("10de", "26b9", "10de", "1851"), ("10de", "2335", None, None),
         ("abcd", "0001", None, None)], [0x030200, 0x120000, 0x0C0300])
    assert names[("10de", "26b9", "10de", "1851")] == pciids.Names(
        "NVIDIA Corporation", "AD102GL [L40S]", "L40S")
    assert names[("10de", "2335", None, None)] == pciids.Names("NVIDIA Corporation")
    assert pciids.display_name("abcd", "0001", names[("abcd", "0001", None, None)]) == \
        "unknown (abcd:0001)"
    assert classes == {0x030200: "3D controller", 0x120000: "Processing accelerators"}
    assert pciids.PciIds(ids + ".missing").lookup([("10de", "2335", None, None)]) == ({}, {})
