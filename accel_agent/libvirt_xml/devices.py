"""An instance's devices as small descriptions, and the XML that attaches them all.

The manager hands the guest side of every device an instance holds, whatever
backend made it, to :func:`instance_devices_xml`:

* :class:`MdevDevice` -> ``<hostdev type='mdev'>`` (``hostdev.py``)
* :class:`PciHostdev` -> ``<hostdev type='pci' managed='no'>`` (a vGPU VF)
* :class:`NetworkVf` -> ``<interface type='hostdev' managed='no'>`` (a NIC VF)

Each description validates and canonicalises its fields when it is made, so
two descriptions of the same device compare equal and a bad value is reported
where it was written, not when the XML is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from accel_agent import exception
from accel_agent.libvirt_xml.hostdev import canonical_uuid, hostdev_xml, qemu_commandline_xml
from accel_agent.libvirt_xml.pci import canonical_pci_address
from accel_agent.libvirt_xml.pcihostdev import (
    canonical_mac,
    check_vlan,
    hostdev_interface_xml,
    pci_hostdev_xml,
)

__all__ = [
    "DeviceDescription",
    "MdevDevice",
    "NetworkVf",
    "PciHostdev",
    "device_xml",
    "instance_devices_xml",
]


@dataclass(frozen=True, slots=True)
class MdevDevice:
    """An mdev, by UUID (any case in, lowercase kept)."""

    uuid: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "uuid", canonical_uuid(self.uuid))


@dataclass(frozen=True, slots=True)
class PciHostdev:
    """A PCI function passed through as is, e.g. an NVIDIA vGPU 17+ VF."""

    address: str
    managed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", canonical_pci_address(self.address))
        if not isinstance(self.managed, bool):
            raise TypeError(f"managed must be True or False, not {self.managed!r}")


@dataclass(frozen=True, slots=True)
class NetworkVf:
    """An SR-IOV network VF with the MAC and VLAN libvirt programs on it.

    ``vlan`` None or 0 is untagged and is kept as None (see ``check_vlan``).
    """

    address: str
    mac: str
    vlan: int | None = None
    managed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", canonical_pci_address(self.address))
        object.__setattr__(self, "mac", canonical_mac(self.mac))
        object.__setattr__(self, "vlan", check_vlan(self.vlan))
        if not isinstance(self.managed, bool):
            raise TypeError(f"managed must be True or False, not {self.managed!r}")


DeviceDescription = MdevDevice | PciHostdev | NetworkVf


def device_xml(device: DeviceDescription) -> str:
    """The guest XML of one device (one element, no XML declaration)."""
    if isinstance(device, MdevDevice):
        return hostdev_xml(device.uuid)
    if isinstance(device, PciHostdev):
        return pci_hostdev_xml(device.address, managed=device.managed)
    if isinstance(device, NetworkVf):
        return hostdev_interface_xml(
            device.address, device.mac, vlan=device.vlan, managed=device.managed
        )
    raise TypeError(f"expected MdevDevice, PciHostdev or NetworkVf, not {type(device).__name__}")


def _refuse_duplicates(devices: list[DeviceDescription]) -> None:
    # libvirt refuses a second hostdev on one host device ("Hostdev already exists in
    # the domain configuration"), an <interface type='hostdev'> included; say so here,
    # with the device's name, rather than at define time on some compute host.
    uuids: set[str] = set()
    addresses: set[str] = set()
    for device in devices:
        if isinstance(device, MdevDevice):
            if device.uuid in uuids:
                raise exception.InvalidMdevUUID(
                    uuid=device.uuid, where="", reason="given twice; each mdev can be attached once"
                )
            uuids.add(device.uuid)
        elif isinstance(device, PciHostdev | NetworkVf):
            if device.address in addresses:
                raise exception.InvalidPciDeviceAddress(
                    address=device.address,
                    where="",
                    reason="given twice; each PCI function can be attached once",
                )
            addresses.add(device.address)


def instance_devices_xml(
    devices: Iterable[DeviceDescription], qemu_globals: Iterable[str] = ()
) -> str:
    """Each device's element, in the given order, one a line (for ``<devices>``),
    then, when ``qemu_globals`` names any, one ``<qemu:commandline>`` (for
    ``<domain>`` itself), exactly as ``instance_domain_xml`` lays them out.

    A device given twice is refused (InvalidMdevUUID / InvalidPciDeviceAddress).
    """
    device_list = list(devices)
    _refuse_duplicates(device_list)
    parts = ["\n".join(device_xml(device) for device in device_list)]
    settings = list(qemu_globals)
    if settings:
        parts.append(qemu_commandline_xml(settings))
    return "\n".join(parts)
