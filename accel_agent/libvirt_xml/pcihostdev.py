"""Build the guest XML of a PCI VF: ``<hostdev type='pci'>`` or ``<interface type='hostdev'>``.

Two backends hand VFs to guests (docs/design.md §10.3, §10.4):

* NVIDIA vGPU 17+ (``nvidia_vfio``): the vGPU *is* the VF, kept bound to
  ``nvidia``.  ``<hostdev mode='subsystem' type='pci' managed='no'>``:
  ``managed='yes'`` would make libvirt rebind the VF to vfio-pci and destroy
  the vGPU (docs/design.md §10.3).
* SR-IOV network VFs (``sriov_vf``): ``<interface type='hostdev'
  managed='no'>`` with ``<mac>`` and, for a tagged VLAN, ``<vlan><tag/></vlan>``;
  libvirt programs that MAC and VLAN on the VF through the PF when the domain
  starts and resets them on destroy (docs/design.md §10.4).

What libvirt 9.0 writes back for a defined domain (test driver), which the
builders match attribute for attribute and element for element:

* ``<hostdev mode='subsystem' type='pci' managed='no'><source><address
  domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/></source></hostdev>``
  (``managed`` always written; the address in ``0x%04x``/``0x%02x``/``0x%02x``/``0x%x``
  whatever spelling it was given);
* ``<interface type='hostdev'><mac address='52:54:00:ab:cd:ef'/><source><address
  type='pci' domain=... bus=... slot=... function=.../></source><vlan><tag
  id='100'/></vlan>`` plus a driver-made ``<target dev=.../>``: mac, source, vlan in
  that order; the MAC lowercase; ``managed`` written only when 'yes' (no is the
  default for interfaces).  The builder still writes ``managed='no'``: it is the
  decision that matters most for these devices and costs nothing to state.

lxml is imported inside the functions, as in ``hostdev.py``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.libvirt_xml.pci import FIELDS, PciAddress, canonical_pci_address, libvirt_format

if TYPE_CHECKING:
    from lxml import etree

__all__ = [
    "MAX_VLAN_ID",
    "build_hostdev_interface",
    "build_pci_hostdev",
    "canonical_mac",
    "check_vlan",
    "hostdev_interface_xml",
    "pci_hostdev_xml",
]

# 802.1Q's 12 bits; libvirt refuses 4096 ("vlan tag id 4096 too large (maximum 4095)").
MAX_VLAN_ID = 4095

_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")


def canonical_mac(text: object, where: str = "") -> str:
    """Return a unicast MAC as libvirt writes it: six lowercase hex pairs with colons.

    Refused: any other spelling (libvirt would take ``52:54:0:1:2:3``; the agent
    wants one spelling so MACs compare as strings), a multicast or broadcast
    address (libvirt: "expected unicast mac address"; the VF driver answers
    EINVAL), and ``00:00:00:00:00:00``, which libvirt accepts but which is the
    value the reset of a VF writes, i.e. "no MAC".
    """
    if not isinstance(text, str) or _MAC_RE.fullmatch(text) is None:
        raise exception.InvalidMacAddress(
            mac=text, where=where, reason="expected six hexadecimal pairs separated by ':'"
        )
    mac = text.lower()
    if int(mac[:2], 16) & 1:
        raise exception.InvalidMacAddress(
            mac=text, where=where, reason="multicast address (the first octet is odd)"
        )
    if mac == "00:00:00:00:00:00":
        raise exception.InvalidMacAddress(mac=text, where=where, reason="all-zero address")
    return mac


def check_vlan(vlan: object, where: str = "") -> int | None:
    """Return the VLAN id to tag with, or None for untagged.

    ``None`` and ``0`` both mean untagged and give no ``<vlan>`` element:
    without one, libvirt writes VLAN 0 to the VF itself (docs/design.md §10.4), so
    ``<tag id='0'/>`` would only make the XML differ from libvirt's own
    round-trip of an untagged interface.  Otherwise an int 1-4095 (not a bool,
    not a string).
    """
    if vlan is None:
        return None
    if isinstance(vlan, bool) or not isinstance(vlan, int):
        raise exception.InvalidVlanId(vlan=vlan, where=where, reason="expected an integer or None")
    if not 0 <= vlan <= MAX_VLAN_ID:
        raise exception.InvalidVlanId(vlan=vlan, where=where, reason=f"must be 0-{MAX_VLAN_ID}")
    return vlan or None


def _managed(managed: object) -> str:
    # A str like "no" would be truthy: insist on a real bool.
    if not isinstance(managed, bool):
        raise TypeError(f"managed must be True or False, not {managed!r}")
    return "yes" if managed else "no"


def _pci_address_attrs(address: str) -> dict[str, str]:
    numbers = PciAddress.from_canonical(address)
    return {field: libvirt_format(field, getattr(numbers, field)) for field in FIELDS}


def build_pci_hostdev(address: str, managed: bool = False) -> etree._Element:
    """Return a detached ``<hostdev type='pci'>`` for the VF at ``address``.

    ``address`` must be canonical ``DDDD:BB:SS.F`` (InvalidPciDeviceAddress
    otherwise).  Leave ``managed`` False for a vGPU VF (see the module doc).
    """
    from lxml import etree

    canonical = canonical_pci_address(address)
    hostdev = etree.Element("hostdev")
    # libvirt's attribute order; the schema ignores it.
    hostdev.set("mode", "subsystem")
    hostdev.set("type", "pci")
    hostdev.set("managed", _managed(managed))
    source = etree.SubElement(hostdev, "source")
    etree.SubElement(source, "address", _pci_address_attrs(canonical))
    return hostdev


def pci_hostdev_xml(address: str, managed: bool = False, *, pretty: bool = False) -> str:
    """``build_pci_hostdev`` serialised as a str (no XML declaration)."""
    from lxml import etree

    element = build_pci_hostdev(address, managed=managed)
    return etree.tostring(element, encoding="unicode", pretty_print=pretty)


def build_hostdev_interface(
    address: str, mac: str, vlan: int | None = None, managed: bool = False
) -> etree._Element:
    """Return a detached ``<interface type='hostdev'>`` for the network VF at ``address``.

    ``mac`` is the guest's MAC (unicast, :func:`canonical_mac`), ``vlan`` the
    tag libvirt programs on the VF (:func:`check_vlan`: None or 0 is untagged).
    With ``managed=False`` the VF must already be bound to vfio-pci, which is
    the agent's job at prepare time.
    """
    from lxml import etree

    canonical = canonical_pci_address(address)
    mac_value = canonical_mac(mac)
    vlan_id = check_vlan(vlan)
    interface = etree.Element("interface")
    interface.set("type", "hostdev")
    interface.set("managed", _managed(managed))
    etree.SubElement(interface, "mac", address=mac_value)
    source = etree.SubElement(interface, "source")
    etree.SubElement(source, "address", {"type": "pci", **_pci_address_attrs(canonical)})
    if vlan_id is not None:
        tag = etree.SubElement(etree.SubElement(interface, "vlan"), "tag")
        tag.set("id", str(vlan_id))
    return interface


def hostdev_interface_xml(
    address: str,
    mac: str,
    vlan: int | None = None,
    managed: bool = False,
    *,
    pretty: bool = False,
) -> str:
    """``build_hostdev_interface`` serialised as a str (no XML declaration)."""
    from lxml import etree

    element = build_hostdev_interface(address, mac, vlan=vlan, managed=managed)
    return etree.tostring(element, encoding="unicode", pretty_print=pretty)
