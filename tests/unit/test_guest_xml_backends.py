"""Each backend's guest XML, and the migration source's rewrite of the agent's VFs
(``accel_agent.migration.source``) with a stand-in agent."""

from __future__ import annotations

import pytest

from accel_agent import exception
from accel_agent.backends import builtin
from accel_agent.backends.base import DeviceRef
from accel_agent.libvirt_xml import hostdev_xml, instance_domain_xml, list_pci_sources
from accel_agent.libvirt_xml.devices import MdevDevice, PciHostdev, instance_devices_xml
from accel_agent.migration.source import AgentVf, domain_vfs, rewrite_for_destination

UUID = "c2177883-f1bb-47f0-914d-32a22e3a8804"
DST_UUID = "0b2ff7c4-4fd4-4a6b-8bf5-d0e1f2a3b4c5"
VF_UUID = "6f1c7e0a-58a1-4b3e-9c39-2a4f1f0c1d2e"
VF, DST_VF = "0000:c1:00.4", "0000:c2:01.3"
MDEV_REF = DeviceRef(UUID, "0000:84:00.0", "nvidia-35", "mdev")
VF_REF = DeviceRef(VF_UUID, VF, "nvidia-1150", "nvidia_vfio")


def test_mdev_backend_gives_the_mdev_hostdev_unchanged() -> None:
    backend = builtin()["mdev"]
    assert backend.guest_device(MDEV_REF) == MdevDevice(UUID)
    assert backend.guest_xml(MDEV_REF) == hostdev_xml(UUID)
    # What domain-xml prints for an mdev instance is what it printed before backends.
    devices = [backend.guest_device(MDEV_REF)]
    assert instance_devices_xml(devices, ["a.b=c"]) == instance_domain_xml([UUID], ["a.b=c"])


def test_nvidia_vfio_backend_gives_the_vf_as_an_unmanaged_pci_hostdev() -> None:
    backend = builtin()["nvidia_vfio"]
    assert backend.guest_device(VF_REF) == PciHostdev(VF, managed=False)
    assert backend.guest_xml(VF_REF) == (
        '<hostdev mode="subsystem" type="pci" managed="no"><source>'
        '<address domain="0x0000" bus="0xc1" slot="0x00" function="0x4"/>'
        "</source></hostdev>"
    )
    assert backend.pci_address(VF_REF) == VF


def test_a_vf_ref_that_is_not_a_canonical_address_is_refused() -> None:
    backend = builtin()["nvidia_vfio"]
    with pytest.raises(exception.InvalidPciDeviceAddress):
        backend.guest_device(DeviceRef(VF_UUID, "c1:00.4", "nvidia-1150", "nvidia_vfio"))


# --- the migration source's rewrite --------------------------------------------------------


class Agent:
    """The source agent's answers: typed VFs on this host and whether it owns them."""

    def __init__(self, vfs: dict[str, AgentVf]) -> None:
        self._vfs = vfs
        self.asked = 0

    def mdev_types(self) -> dict[str, str | None]:
        return {}

    def vfs(self) -> dict[str, AgentVf]:
        self.asked += 1
        return self._vfs

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return []


def address(vf: str) -> str:
    domain, bus, rest = vf.split(":")
    slot, function = rest.split(".")
    return f"<address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/>"


def domain_xml(*vfs: str, mdev: str | None = UUID) -> str:
    devices = "".join(
        f"<hostdev mode='subsystem' type='pci' managed='no'><source>{address(vf)}</source>"
        f"<alias name='hostdev{i}'/></hostdev>"
        for i, vf in enumerate(vfs)
    )
    if mdev:
        devices += (
            "<hostdev mode='subsystem' type='mdev' model='vfio-pci' managed='no'>"
            f"<source><address uuid='{mdev}'/></source></hostdev>"
        )
    return f"<domain type='kvm'><name>g</name><devices>{devices}</devices></domain>"


OWNED = {VF: AgentVf(VF_UUID, "nvidia-1150", owned=True)}
NIC = "0000:06:00.0"  # a passthrough device the agent does not know


def test_one_pass_moves_the_agents_vf_and_the_mdev_and_leaves_other_pci_devices() -> None:
    xml = domain_xml(VF, NIC)
    vfs = domain_vfs(xml, Agent(OWNED))
    assert vfs == OWNED
    result = rewrite_for_destination(
        xml, {UUID: DST_UUID, VF_UUID: VF_UUID}, {VF_UUID.upper(): DST_VF}, vfs
    )
    assert result.xml == xml.replace(address(VF), address(DST_VF)).replace(UUID, DST_UUID)
    assert list_pci_sources(result.xml) == [DST_VF, NIC]
    assert result.replaced_pci == ((VF, DST_VF),)
    # The VF's UUID is the agent's name for it, never in the XML: not "unused".
    assert result.unused_uuids == ()


def test_an_agent_vf_without_a_destination_is_refused_by_name() -> None:
    xml = domain_xml(VF)
    with pytest.raises(exception.UnmappedVf) as info:
        rewrite_for_destination(xml, {UUID: DST_UUID}, {}, domain_vfs(xml, Agent(OWNED)))
    assert VF in str(info.value) and VF_UUID in str(info.value)


def test_a_vgpu_vf_the_ledger_does_not_own_is_refused_by_name() -> None:
    foreign = {VF: AgentVf(VF_UUID, "nvidia-1150", owned=False)}
    with pytest.raises(exception.ForeignVf) as info:
        domain_vfs(domain_xml(VF), Agent(foreign))
    assert VF in str(info.value) and f"accelctl adopt {VF_UUID}" in str(info.value)


def test_a_domain_without_pci_devices_does_not_ask_the_agent_and_is_as_before() -> None:
    agent = Agent(OWNED)
    xml = domain_xml()
    vfs = domain_vfs(xml, agent)
    assert vfs == {} and agent.asked == 0
    result = rewrite_for_destination(xml, {UUID: DST_UUID}, {}, vfs)
    assert result.xml == xml.replace(UUID, DST_UUID)


def test_a_destination_address_taken_by_a_device_that_stays_is_refused() -> None:
    xml = domain_xml(VF, NIC)
    with pytest.raises(exception.NonInjectivePciMapping):
        rewrite_for_destination(
            xml, {UUID: DST_UUID}, {VF_UUID: NIC}, domain_vfs(xml, Agent(OWNED))
        )
