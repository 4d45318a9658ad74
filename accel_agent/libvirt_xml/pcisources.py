"""Find the host PCI functions a domain uses, read the way libvirt reads them.

Selected, like the mdev selection of ``mdevs.py`` (direct children of the root
``<domain>``'s ``<devices>``, un-namespaced elements and attributes only):

* ``devices/hostdev[@type='pci']/source/address`` (libvirt reads the source
  address of a PCI hostdev whatever its ``type`` attribute says);
* ``devices/interface[@type='hostdev']/source/address[@type='pci']``.

The guest-side ``<address type='pci'>`` of a device is its child, not under
``<source>``, so it is never selected.  Each attribute is read with libvirt's
rules (``pci.parse_libvirt_uint``; absent means 0).  A value libvirt would
refuse, and a namespaced ``domain``/``bus``/``slot``/``function`` attribute on a
selected address, are refused: libvirt's ``xmlGetProp`` ignores namespaces, so
it would read ``n:bus`` as the bus while an un-namespaced reading sees none; a
rewrite that trusted the latter would leave the device libvirt opens unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from accel_agent import exception
from accel_agent.libvirt_xml.parser import ParsedDomain, parse_domain
from accel_agent.libvirt_xml.pci import FIELDS, PciAddress, field_limit, parse_libvirt_uint

if TYPE_CHECKING:
    from lxml import etree

__all__ = ["PciSource", "iter_pci_sources", "list_pci_sources"]


class PciSource(NamedTuple):
    """One selected source ``<address>``: ``parsed.start_tags[index]`` is its tag."""

    index: int
    element: etree._Element
    address: PciAddress
    kind: str  # "hostdev" or "interface": the device element holding it


def _source_kind(element: etree._Element) -> str | None:
    if element.tag != "address":
        return None
    source = element.getparent()
    if source is None or source.tag != "source":
        return None
    device = source.getparent()
    if device is None:
        return None
    if device.tag == "hostdev" and device.get("type") == "pci":
        kind = "hostdev"
    elif (
        device.tag == "interface"
        and device.get("type") == "hostdev"
        and element.get("type") == "pci"
    ):
        kind = "interface"
    else:
        return None
    devices = device.getparent()
    if devices is None or devices.tag != "devices":
        return None
    domain = devices.getparent()
    # parse_domain() already insists the root is <domain>; <devices> must hang off it.
    return kind if domain is not None and domain.getparent() is None else None


def _read_address(element: etree._Element, kind: str) -> PciAddress:
    for name in element.attrib:
        if name.startswith("{") and name.rpartition("}")[2] in FIELDS:
            raise exception.InvalidDomainXML(
                reason=f"the source address of a PCI {kind} has a namespaced attribute "
                f"{name!r}, which libvirt reads as {name.rpartition('}')[2]!r}"
            )
    numbers: list[int] = []
    for field in FIELDS:
        raw = element.get(field)
        if raw is None:
            numbers.append(0)  # libvirt's default for a missing attribute
            continue
        value = parse_libvirt_uint(raw)
        if value is None or value > field_limit(field):
            raise exception.InvalidDomainXML(
                reason=f"the source address of a PCI {kind} has {field}={raw!r}, "
                f"which libvirt refuses (expected 0-{field_limit(field):#x})"
            )
        numbers.append(value)
    return PciAddress(*numbers)


def iter_pci_sources(parsed: ParsedDomain) -> Iterator[PciSource]:
    """Yield each selected PCI source address in document order.

    Raises InvalidDomainXML for an address libvirt would read differently or refuse.
    """
    from lxml import etree

    for index, element in enumerate(parsed.root.iter(etree.Element)):
        kind = _source_kind(element)
        if kind is not None:
            yield PciSource(index, element, _read_address(element, kind), kind)


def list_pci_sources(domain_xml: str | bytes) -> list[str]:
    """The host PCI addresses of the domain's PCI hostdevs and hostdev interfaces,
    canonical ``dddd:bb:ss.f``, in document order (a repeated one repeated).

    The migration source compares this with the VFs the agent gave the instance,
    to refuse by name an agent VF that has no destination before rewriting.
    """
    parsed = parse_domain(domain_xml)
    return [str(source.address) for source in iter_pci_sources(parsed)]
