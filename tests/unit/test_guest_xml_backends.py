"""Each backend's guest XML."""

from __future__ import annotations

import pytest

from accel_agent import exception
from accel_agent.backends import builtin
from accel_agent.backends.base import DeviceRef
from accel_agent.libvirt_xml import hostdev_xml, instance_domain_xml
from accel_agent.libvirt_xml.devices import MdevDevice, PciHostdev, instance_devices_xml

UUID = "c2177883-f1bb-47f0-914d-32a22e3a8804"
VF_UUID = "6f1c7e0a-58a1-4b3e-9c39-2a4f1f0c1d2e"
VF = "0000:c1:00.4"
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
