"""Nova 34's own PCI passthrough code on ``accelctl nova-pci-config`` (issue 23,
"Real client: Nova's own code").

The real daemon on the FUSE simulator types two vGPU VFs of the PF
0000:c1:00.0 (four VFs, type nvidia-1150) and makes an nvidia-35 mdev on the
GPU 0000:84:00.0 beside it.  ``accelctl nova-pci-config`` prints the [pci]
lines; the host's PCI devices are read from the simulated sysfs and written as
the node-device XML libvirt reports.  nova_pci_tracker.py, in Nova's own
venv, gives both to Nova: its [pci] parsing, its libvirt driver's
``_get_pci_passthrough_devices``, its PCI tracker, its Placement translator
and a claim for the printed alias.  Checked: Nova tracks exactly the typed
VFs, with the printed resource class and tags; its provider names differ from
the agent's; the claim gets a typed VF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from tests.functional.daemon_fixture import ctl, sim_agent
from tests.functional.simhost import SimHost
from tests.nova.conftest import run_in_nova

HERE = Path(__file__).resolve().parent
GPU, PF = "0000:84:00.0", "0000:c1:00.0"
# The simulated host (tests/nova/conftest.py sim): one GPU per profile, 4 VFs.
SIM_PROFILES, SIM_VFS = ("nvidia-pf", "nvidia-vfio"), 4
NODE = "testhost"  # the agent's [DEFAULT] host; Nova's node name on the same host
BODY = f"""
[devices]
enabled_mdev_types = nvidia-35, nvidia-1150
[mdev_nvidia-35]
device_addresses = {GPU}
[mdev_nvidia-1150]
device_addresses = {PF}
"""
REQUESTS = [
    {"resource_class": "VGPU", "mdev_type": "nvidia-1150"},
    {"resource_class": "VGPU", "mdev_type": "nvidia-1150"},
    {"resource_class": "VGPU", "mdev_type": "nvidia-35"},
]
RESOURCE_CLASS = "CUSTOM_NVIDIA_1150"


# --- the host as libvirt reports it -----------------------------------------------


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _nodedev_name(address: str) -> str:
    return "pci_" + address.replace(":", "_").replace(".", "_")


def _address_element(parent: etree._Element, tag: str, address: str) -> etree._Element:
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return etree.SubElement(parent, tag, domain=f"0x{domain}", bus=f"0x{bus}",
                            slot=f"0x{slot}", function=f"0x{function}")


def nodedev_xml(root: str, address: str) -> str:
    """libvirt's node-device XML of one PCI device (virNodeDeviceGetXMLDesc,
    the PCI capability as libvirt's node_device_conf.c writes it: its address
    in decimal fields, product and vendor ids, ``phys_function`` for a VF,
    ``virt_functions`` for an SR-IOV PF, its IOMMU group and NUMA node), read
    from the simulated sysfs as libvirt's udev backend reads the real one."""
    device = os.path.join(root, "bus", "pci", "devices", address)
    real = os.path.realpath(device)
    parent = os.path.basename(os.path.dirname(real))
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    top = etree.Element("device")
    etree.SubElement(top, "name").text = _nodedev_name(address)
    etree.SubElement(top, "path").text = "/sys" + real[len(os.path.realpath(root)):]
    etree.SubElement(top, "parent").text = (
        _nodedev_name(parent) if parent.count(":") == 2 else "computer"
    )
    driver = os.path.join(device, "driver")
    if os.path.islink(driver):
        etree.SubElement(etree.SubElement(top, "driver"), "name").text = os.path.basename(
            os.readlink(driver)
        )
    cap = etree.SubElement(top, "capability", type="pci")
    etree.SubElement(cap, "class").text = _read(os.path.join(device, "class"))
    for tag, value in (("domain", domain), ("bus", bus), ("slot", slot),
                       ("function", function)):
        etree.SubElement(cap, tag).text = str(int(value, 16))
    etree.SubElement(cap, "product", id=_read(os.path.join(device, "device")))
    etree.SubElement(cap, "vendor", id=_read(os.path.join(device, "vendor")))
    physfn = os.path.join(device, "physfn")
    if os.path.islink(physfn):
        phys = etree.SubElement(cap, "capability", type="phys_function")
        _address_element(phys, "address", os.path.basename(os.readlink(physfn)))
    totalvfs = os.path.join(device, "sriov_totalvfs")
    if os.path.exists(totalvfs):
        virt = etree.SubElement(cap, "capability", type="virt_functions",
                                maxCount=_read(totalvfs))
        links = sorted((n for n in os.listdir(device) if n.startswith("virtfn")),
                       key=lambda n: int(n[len("virtfn"):]))
        for link in links:
            _address_element(virt, "address",
                             os.path.basename(os.readlink(os.path.join(device, link))))
    group = os.path.join(device, "iommu_group")
    if os.path.islink(group):
        iommu = etree.SubElement(cap, "iommuGroup",
                                 number=os.path.basename(os.readlink(group)))
        _address_element(iommu, "address", address)
    numa = os.path.join(device, "numa_node")
    if os.path.exists(numa):
        etree.SubElement(cap, "numa", node=_read(numa))
    return etree.tostring(top, encoding="unicode")


def pci_addresses(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "bus", "pci", "devices")))


def typed_vfs(root: str) -> dict[str, str]:
    """{VF address: its vGPU type id} of every VF sysfs shows typed."""
    typed = {}
    for address in pci_addresses(root):
        path = os.path.join(root, "bus", "pci", "devices", address, "nvidia",
                            "current_vgpu_type")
        if os.path.exists(path) and _read(path) != "0":
            typed[address] = _read(path)
    return typed


# --- the agent's side ---------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(sim: SimHost, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the agent typed and printed, and the host as libvirt reports it."""
    with sim_agent(sim, tmp_path_factory.mktemp("agent"), BODY) as agent:
        agent.daemon.start()
        client = agent.daemon.client()
        handles = client.attach("vm-nova", REQUESTS)["attachments"]
        text = ctl(agent.config, "nova-pci-config", "--live-migratable", "yes")
        document = ctl(agent.config, "nova-pci-config", "--json", "--live-migratable", "yes")
        inventory = client.inventory()
    assert text.returncode == 0 and document.returncode == 0, text.stderr + document.stderr
    return {
        "vfs": sorted(h["address"] for h in handles if h["backend"] == "nvidia_vfio"),
        "mdev": next(h for h in handles if h["backend"] != "nvidia_vfio"),
        "text": text.stdout,
        "document": json.loads(document.stdout),
        "providers": [p["name"] for p in inventory["providers"]],
        "typed": typed_vfs(sim.root),
        "pci": pci_addresses(sim.root),
        "nodedevs": [nodedev_xml(sim.root, a) for a in pci_addresses(sim.root)],
    }


def option_values(text: str, option: str) -> list[str]:
    """The values of ``option`` in the printed [pci] section, as nova.conf
    holds them (oslo.config takes everything after ``=``)."""
    return [line.split("=", 1)[1].strip() for line in text.splitlines()
            if line.split("=", 1)[0].strip() == option]


@pytest.fixture(scope="module")
def nova(nova_python: Path, sim: SimHost, agent: dict[str, Any]) -> dict[str, Any]:
    cases = {
        "agent": {
            "device_spec": option_values(agent["text"], "device_spec"),
            "alias": option_values(agent["text"], "alias"),
            "flavor_alias": "nvidia-1150:1",  # the alias named after the type
        },
    }
    # What the printed comment warns of: the same lines on a controller
    # without [filter_scheduler] pci_in_placement.
    cases["no_pci_in_placement"] = {**cases["agent"], "pci_in_placement": False}
    return run_in_nova(nova_python, HERE / "nova_pci_tracker.py", {
        "node": NODE, "sysfs_root": sim.root, "nodedevs": agent["nodedevs"], "cases": cases,
    })


@pytest.fixture(scope="module")
def nova_agent(nova: dict[str, Any]) -> dict[str, Any]:
    """Nova's answer to the agent's lines as printed."""
    answer = nova["agent"]
    assert answer["error"] is None, answer["error"]["traceback"]
    return answer


# --- the host and the agent's output (no Nova needed) ------------------------------


def test_the_host_has_untyped_siblings_a_pf_and_an_mdev_gpu_beside_the_typed_vfs(agent):
    """Without these the test below would not tell "exactly the typed VFs" apart."""
    assert len(agent["vfs"]) == 2
    assert agent["typed"] == {vf: "1150" for vf in agent["vfs"]}
    siblings = [a for a in agent["pci"] if a.startswith("0000:c1:00.") and a != PF]
    assert len(siblings) == 4 and set(agent["vfs"]) < set(siblings)
    assert {GPU, PF} <= set(agent["pci"])
    assert agent["mdev"]["parent"] == GPU


def test_the_text_and_json_forms_say_the_same(agent):
    document = agent["document"]
    assert [json.loads(v) for v in option_values(agent["text"], "device_spec")] == (
        document["device_spec"]
    )
    assert [json.loads(v) for v in option_values(agent["text"], "alias")] == document["alias"]
    assert [v["address"] for v in document["vfs"]] == agent["vfs"]


# --- Nova's own code on it ----------------------------------------------------------


def test_nova_parses_every_printed_line(nova_agent, agent):
    # PciDeviceSpec keeps the tags that are not address/ids, normalised.
    assert nova_agent["specs"] == [
        {"managed": "false", "live_migratable": "true", "resource_class": RESOURCE_CLASS}
    ] * len(agent["vfs"])
    assert nova_agent["aliases"] == {
        "nvidia-1150": {
            "numa_policy": "legacy",
            "specs": [{"dev_type": "type-VF", "resource_class": RESOURCE_CLASS,
                       "live_migratable": "true"}],
        }
    }


def test_the_libvirt_driver_reports_the_pf_its_vfs_and_the_mdev_gpu(nova_agent, agent):
    """The dicts the tracker is fed are the libvirt driver's, from the host's
    node devices: every PCI device, typed or not."""
    reported = {d["address"]: d for d in nova_agent["hypervisor"]}
    assert sorted(reported) == agent["pci"]
    assert reported[PF]["dev_type"] == "type-PF"
    assert reported[GPU]["dev_type"] == "type-PCI"
    for vf in agent["vfs"]:
        assert reported[vf]["dev_type"] == "type-VF" and reported[vf]["parent_addr"] == PF
        assert (reported[vf]["vendor_id"], reported[vf]["numa_node"]) == ("10de", 0)
    # GPUs, not NICs: no netdev, so no MAC and no SR-IOV network details.
    assert not any("mac_address" in d or "capabilities" in d for d in reported.values())


def test_nova_tracks_exactly_the_typed_vfs_with_the_printed_tags(nova_agent, agent):
    tracked = {d["address"]: d for d in nova_agent["tracked"]}
    assert sorted(tracked) == agent["vfs"]  # not the siblings, the PF, the mdev GPU
    for vf in agent["vfs"]:
        device = tracked[vf]
        assert (device["dev_type"], device["parent_addr"], device["status"]) == (
            "type-VF", PF, "available"
        )
        # The device's own copy of the spec tags: what the libvirt driver reads
        # when it writes the guest's <hostdev managed=...>.
        assert device["extra_info"]["managed"] == "false"
        assert device["extra_info"]["live_migratable"] == "true"
        assert device["spec_tags"]["resource_class"] == RESOURCE_CLASS
    [pool] = nova_agent["pools"]
    assert pool["count"] == len(agent["vfs"]) and pool["address"] == PF
    assert (pool["managed"], pool["live_migratable"]) == ("false", "true")


def test_nova_reports_the_typed_vfs_under_the_printed_class_with_the_migration_trait(
    nova_agent, agent
):
    root, *children = sorted(nova_agent["providers"], key=lambda p: p["parent_uuid"] or "")
    assert root["name"] == NODE and root["parent_uuid"] is None
    [child] = children
    assert child["parent_uuid"] == root["uuid"]
    assert list(child["inventory"]) == [RESOURCE_CLASS]
    assert child["inventory"][RESOURCE_CLASS]["total"] == len(agent["vfs"])
    assert {"COMPUTE_MANAGED_PCI_DEVICE", "HW_PCI_LIVE_MIGRATABLE"} <= set(child["traits"])


def test_nova_and_the_agent_name_their_providers_apart(nova_agent, agent):
    """Nova names a PF's provider ``<node>_<PF address, upper case>``
    (pci_placement_translator); the agent ``<host>_<libvirt node-device
    name>``.  The same GPU, two names: neither overwrites the other's (issue
    23's reported_by decides which of them counts it)."""
    nova_names = {p["name"] for p in nova_agent["providers"] if p["parent_uuid"]}
    assert nova_names == {f"{NODE}_{PF.upper()}"}
    agent_names = set(agent["providers"])
    assert f"{NODE}_{_nodedev_name(PF)}" in agent_names  # the same PF, the agent's name
    assert f"{NODE}_{_nodedev_name(GPU)}" in agent_names
    assert not nova_names & agent_names


def test_a_nova_claim_for_the_printed_alias_gets_a_typed_vf(nova_agent, agent):
    assert nova_agent["claim_error"] is None
    assert nova_agent["supported"] is True
    assert len(nova_agent["claimed"]) == 1 and nova_agent["claimed"][0] in agent["vfs"]
    # The conductor lets an instance of this flavor live-migrate.
    assert nova_agent["live_migratable_request"] is True
    # The guest gets the VF unmanaged: libvirt leaves it on nvidia, the vGPU lives.
    [hostdev] = [etree.fromstring(x) for x in nova_agent["hostdevs"]]
    assert (hostdev.get("type"), hostdev.get("managed")) == ("pci", "no")
    address = hostdev.find("source/address")
    got = tuple(int(address.get(k), 16) for k in ("domain", "bus", "slot", "function"))
    domain, bus, rest = nova_agent["claimed"][0].split(":")
    slot, function = rest.split(".")
    assert got == (int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16))


def test_nova_compute_starts_with_the_live_migratable_tag_only_from_its_floor(nova_agent):
    """Nova 34's init_host refuses a device_spec with live_migratable below
    libvirt 10.0.0 / QEMU 8.2.2, what the printed comment says."""
    assert "live_migratable" in nova_agent["startup"]["9.0.0/8.2.2"]
    assert nova_agent["startup"]["10.0.0/8.2.2"] is None


def test_without_pci_in_placement_nova_refuses_the_printed_alias(nova):
    """What the printed comment warns of: an alias with only a resource class
    needs [filter_scheduler] pci_in_placement where aliases are parsed."""
    error = nova["no_pci_in_placement"]["error"]
    assert error["type"] == "PciInvalidAlias" and "nvidia-1150" in error["message"]
