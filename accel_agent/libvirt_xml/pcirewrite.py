"""Plan the rewrite of PCI source addresses for live migration (issue 14 item 5).

A VF-backed device (NVIDIA vGPU 17+ VF, SR-IOV network VF) is named in the
domain XML by its host PCI address; on the destination it is another VF, so
the source rewrites ``domain``/``bus``/``slot``/``function`` of each selected
source ``<address>`` (``pcisources.py``) whose address, read as libvirt reads
it, is a mapping key.  ``rewrite.py`` splices the planned edits together with
any mdev UUID edits, in one pass.

How the new values are written:

* an attribute whose number does not change is not touched at all (so an
  identity mapping is byte-identical, and ``domain='0x0000'`` stays as written);
* a changed one is written in the spelling it had (``pci.format_like``: hex
  keeps prefix, width and letter case, decimal stays decimal, anything else
  becomes libvirt's ``0x%04x``/``0x%02x``/``0x%02x``/``0x%x``);
* a missing attribute (libvirt's 0) that must become non-zero is added after
  the tag's last attribute, in libvirt's spelling and the quote of that
  attribute (``'`` when there is none).

PCI devices whose address is not a key are left alone: unlike mdevs, they may
be unrelated passthrough devices (the caller refuses unmapped *agent* VFs by
name, from ``list_pci_sources``).  Refused: a malformed mapping, one that
sends two sources to one destination, and one whose destination is the
address of a PCI device of the domain that stays where it is (libvirt refuses
a domain with two hostdevs on one function).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from accel_agent import exception
from accel_agent.libvirt_xml.mapping import canonical_one_to_one
from accel_agent.libvirt_xml.parser import ParsedDomain
from accel_agent.libvirt_xml.pci import FIELDS, PciAddress, canonical_pci_address, format_like
from accel_agent.libvirt_xml.pcisources import iter_pci_sources
from accel_agent.libvirt_xml.splice import Edit, Mutation, locate_attr

__all__ = ["PciPlan", "normalise_pci_mapping", "plan_pci_rewrite"]


class PciPlan(NamedTuple):
    edits: list[Edit]
    mutations: list[Mutation]
    replaced: list[tuple[str, str]]  # (source, destination) per rewritten address


def normalise_pci_mapping(mapping: Mapping[str, str]) -> dict[str, str]:
    """Validate a ``{source address: destination address}`` mapping and lowercase it.

    Raises InvalidPciDeviceAddress for an address that is not ``DDDD:BB:SS.F``
    or a source given twice (in two cases) with different destinations, and
    NonInjectivePciMapping when two sources share a destination.
    """
    return canonical_one_to_one(
        mapping,
        lambda value, where: canonical_pci_address(value, where=where),
        lambda source, reason: exception.InvalidPciDeviceAddress(
            address=source, where=" (mapping source)", reason=reason
        ),
        lambda target, sources: exception.NonInjectivePciMapping(target=target, sources=sources),
    )


def plan_pci_rewrite(parsed: ParsedDomain, mapping: Mapping[str, str]) -> PciPlan:
    """The edits that move each mapped PCI source to its destination.

    ``mapping`` must come from :func:`normalise_pci_mapping`.
    """
    sources = list(iter_pci_sources(parsed))
    staying = {str(source.address) for source in sources} - mapping.keys()
    plan = PciPlan([], [], [])
    for source in sources:
        old = str(source.address)
        target = mapping.get(old)
        if target is None:
            continue
        if target in staying:
            raise exception.NonInjectivePciMapping(
                target=target,
                sources=f"{old} and the domain's own unmapped PCI device at {target}",
            )
        new = PciAddress.from_canonical(target)
        added: list[tuple[str, str]] = []
        for field in FIELDS:
            value = getattr(new, field)
            if value == getattr(source.address, field):
                continue
            raw = source.element.get(field)
            text = format_like(raw, field, value)
            if raw is None:
                added.append((field, text))
            else:
                attr = locate_attr(parsed, source.index, field, raw)
                plan.edits.append(Edit(attr.value_start, attr.value_end, text))
            plan.mutations.append(Mutation(source.element, field, text))
        if added:
            plan.edits.append(_insertion(parsed, source.index, added))
        plan.replaced.append((old, target))
    return plan


def _insertion(parsed: ParsedDomain, index: int, added: list[tuple[str, str]]) -> Edit:
    """One Edit adding ``added`` after the tag's last attribute, where lxml's
    ``set()`` of a new attribute puts it, so :func:`verify` sees the same order."""
    tag = parsed.start_tags[index]
    if tag.attrs:
        last = tag.attrs[-1]
        position, quote = last.value_end + 1, last.quote  # just after its closing quote
    else:
        position, quote = tag.start + 1 + len(tag.name), "'"
    text = "".join(f" {field}={quote}{value}{quote}" for field, value in added)
    return Edit(position, position, text)
