"""libvirt domain XML for mdevs and PCI VFs: build devices, list and rewrite their sources.

Public API (re-exported lazily, see below)::

    build_hostdev(uuid, model="vfio-pci", display=None, ramfb=None) -> lxml element
    hostdev_xml(uuid, ...) -> str
    domain_hostdevs_xml(uuids, ...) -> str
    qemu_commandline_xml(qemu_globals) -> str   (<qemu:commandline> of -global settings)
    instance_domain_xml(uuids, qemu_globals=()) -> str   (what `accelctl domain-xml` prints)
    canonical_uuid(text) -> str
    list_mdev_uuids(domain_xml) -> list[str]
    rewrite_mdev_uuids(domain_xml, mapping) -> RewriteResult(xml, replaced, unused_keys)
    parse_domain(domain_xml) -> ParsedDomain  (hardened: no DTD, no network, no entities)

PCI VFs (vGPU 17+ VFs, SR-IOV network VFs)::

    canonical_pci_address(text) -> str          ('DDDD:BB:SS.F' -> lowercase, else
                                                  InvalidPciDeviceAddress)
    canonical_mac(text) -> str                   (unicast, lowercase, else InvalidMacAddress)
    build_pci_hostdev(address, managed=False) -> lxml element   (<hostdev type='pci'>)
    pci_hostdev_xml(address, managed=False) -> str
    build_hostdev_interface(address, mac, vlan=None, managed=False) -> lxml element
    hostdev_interface_xml(address, mac, vlan=None, managed=False) -> str
                                                  (<interface type='hostdev'>; vlan None/0:
                                                  untagged, no <vlan>; else InvalidVlanId)
    MdevDevice(uuid), PciHostdev(address, managed=False),
    NetworkVf(address, mac, vlan=None, managed=False)   (frozen, validated descriptions)
    device_xml(device) -> str
    instance_devices_xml(devices, qemu_globals=()) -> str   (instance_domain_xml for any mix)
    list_pci_sources(domain_xml) -> list[str]    (host PCI addresses of PCI hostdevs and
                                                  hostdev interfaces, document order)
    rewrite_pci_addresses(domain_xml, mapping) -> RewriteResult
    rewrite_domain_xml(domain_xml, mdev_uuids, pci_addresses)
        -> DomainRewriteResult(xml, replaced_uuids, unused_uuids, replaced_pci, unused_pci)

The names are resolved on first use (PEP 562) so that importing
``accel_agent.libvirt_xml.cli`` for ``accelctl`` does not pull in lxml.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.devices import (
        DeviceDescription,
        MdevDevice,
        NetworkVf,
        PciHostdev,
        device_xml,
        instance_devices_xml,
    )
    from accel_agent.libvirt_xml.hostdev import (
        QEMU_NAMESPACE,
        build_hostdev,
        canonical_uuid,
        domain_hostdevs_xml,
        hostdev_xml,
        instance_domain_xml,
        qemu_commandline_xml,
    )
    from accel_agent.libvirt_xml.mdevs import list_mdev_uuids
    from accel_agent.libvirt_xml.parser import ParsedDomain, parse_domain
    from accel_agent.libvirt_xml.pci import canonical_pci_address
    from accel_agent.libvirt_xml.pcihostdev import (
        build_hostdev_interface,
        build_pci_hostdev,
        canonical_mac,
        hostdev_interface_xml,
        pci_hostdev_xml,
    )
    from accel_agent.libvirt_xml.pcisources import list_pci_sources
    from accel_agent.libvirt_xml.rewrite import (
        DomainRewriteResult,
        RewriteResult,
        rewrite_domain_xml,
        rewrite_mdev_uuids,
        rewrite_pci_addresses,
    )

_EXPORTS = {
    "QEMU_NAMESPACE": "hostdev",
    "build_hostdev": "hostdev",
    "canonical_uuid": "hostdev",
    "domain_hostdevs_xml": "hostdev",
    "hostdev_xml": "hostdev",
    "instance_domain_xml": "hostdev",
    "qemu_commandline_xml": "hostdev",
    "list_mdev_uuids": "mdevs",
    "ParsedDomain": "parser",
    "parse_domain": "parser",
    "RewriteResult": "rewrite",
    "rewrite_mdev_uuids": "rewrite",
    "DeviceDescription": "devices",
    "MdevDevice": "devices",
    "NetworkVf": "devices",
    "PciHostdev": "devices",
    "device_xml": "devices",
    "instance_devices_xml": "devices",
    "canonical_pci_address": "pci",
    "build_hostdev_interface": "pcihostdev",
    "build_pci_hostdev": "pcihostdev",
    "canonical_mac": "pcihostdev",
    "hostdev_interface_xml": "pcihostdev",
    "pci_hostdev_xml": "pcihostdev",
    "list_pci_sources": "pcisources",
    "DomainRewriteResult": "rewrite",
    "rewrite_domain_xml": "rewrite",
    "rewrite_pci_addresses": "rewrite",
}

__all__ = [
    "QEMU_NAMESPACE",
    "DeviceDescription",
    "DomainRewriteResult",
    "MdevDevice",
    "NetworkVf",
    "ParsedDomain",
    "PciHostdev",
    "RewriteResult",
    "build_hostdev",
    "build_hostdev_interface",
    "build_pci_hostdev",
    "canonical_mac",
    "canonical_pci_address",
    "canonical_uuid",
    "device_xml",
    "domain_hostdevs_xml",
    "hostdev_interface_xml",
    "hostdev_xml",
    "instance_devices_xml",
    "instance_domain_xml",
    "list_mdev_uuids",
    "list_pci_sources",
    "parse_domain",
    "pci_hostdev_xml",
    "qemu_commandline_xml",
    "rewrite_domain_xml",
    "rewrite_mdev_uuids",
    "rewrite_pci_addresses",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
