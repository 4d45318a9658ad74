"""Find the mdevs a domain uses: ``devices/hostdev[@type='mdev']/source/address/@uuid``.

The selection is Nova's ``_update_mdev_xml`` selection, so the agent and Nova
agree on which devices migrate: only ``<hostdev>`` elements that are direct
children of the domain's ``<devices>``, with ``type='mdev'`` (``mode``, ``model``
and ``managed`` are not checked), and only un-namespaced elements and
attributes, so look-alikes inside ``<metadata>`` (foreign namespaces) never
count.  Where Nova takes the first ``source/address``, we take every one: the
schema allows only one, and a second one must not be silently skipped by a
rewrite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from accel_agent.libvirt_xml.parser import ParsedDomain, parse_domain

if TYPE_CHECKING:
    from lxml import etree

__all__ = ["iter_mdev_addresses", "list_mdev_uuids"]


def _is_mdev_address(element: etree._Element) -> bool:
    if element.tag != "address" or element.get("uuid") is None:
        return False
    source = element.getparent()
    if source is None or source.tag != "source":
        return False
    hostdev = source.getparent()
    if hostdev is None or hostdev.tag != "hostdev" or hostdev.get("type") != "mdev":
        return False
    devices = hostdev.getparent()
    if devices is None or devices.tag != "devices":
        return False
    domain = devices.getparent()
    # parse_domain() already insists the root is <domain>; <devices> must hang off it.
    return domain is not None and domain.getparent() is None


def iter_mdev_addresses(parsed: ParsedDomain) -> Iterator[tuple[int, etree._Element]]:
    """Yield ``(element index, <address>)`` for each mdev source address, in order.

    The index is the element's position in ``root.iter(etree.Element)``, which is
    also its position in ``parsed.start_tags``.
    """
    from lxml import etree

    for index, element in enumerate(parsed.root.iter(etree.Element)):
        if _is_mdev_address(element):
            yield index, element


def list_mdev_uuids(domain_xml: str | bytes) -> list[str]:
    """The domain's mdev UUIDs, lowercased, in document order.

    Values are reported as written (lowercased), not validated: a malformed one is
    still the domain's, and hiding it would hide the problem.
    """
    parsed = parse_domain(domain_xml)
    return [str(element.get("uuid")).lower() for _, element in iter_mdev_addresses(parsed)]
