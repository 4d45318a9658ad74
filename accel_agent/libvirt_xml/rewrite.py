"""Rewrite a domain's mdev UUIDs and PCI source addresses for live migration, changing nothing else.

The source host sends the destination a domain XML in which each source mdev
UUID is replaced by the UUID the destination claimed for it
(``VIR_MIGRATE_PARAM_DEST_XML``).  Nova does this by ``address.set('uuid', dst)``
on an lxml tree and re-serialising; that keeps the meaning but not the bytes.
Here the replacement is spliced into the original text at the exact offsets of
each ``uuid`` attribute value, so aliases, guest addresses, ``<metadata>``
in foreign namespaces, comments, CDATA, quoting, attribute order, white space,
the XML declaration and the encoding all come out byte-for-byte as they went
in.  lxml still decides *which* attributes qualify (``mdevs.py``); the
tokeniser only says *where* they are, and the result is re-parsed and compared
with what Nova's tree mutation would have produced before it is returned.

Compared with Nova, the rewrite also refuses a mapping that sends two source
mdevs to one destination mdev, matches UUIDs case-insensitively, and reports
mapping entries that matched nothing.

VF-backed devices (``<hostdev type='pci'>``, ``<interface type='hostdev'>``)
move the same way, by their source PCI address (``pcirewrite.py`` says how);
:func:`rewrite_domain_xml` does both kinds in one parse, one splice and one
verification (``splice.py``), which is what a domain holding mdevs and VFs needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from accel_agent import exception
from accel_agent.libvirt_xml.hostdev import canonical_uuid
from accel_agent.libvirt_xml.mapping import canonical_one_to_one
from accel_agent.libvirt_xml.mdevs import iter_mdev_addresses
from accel_agent.libvirt_xml.parser import ParsedDomain, parse_domain
from accel_agent.libvirt_xml.pcirewrite import normalise_pci_mapping, plan_pci_rewrite
from accel_agent.libvirt_xml.splice import Edit, Mutation, locate_attr
from accel_agent.libvirt_xml.splice import splice as _splice
from accel_agent.libvirt_xml.splice import verify as _verify

__all__ = [
    "DomainRewriteResult",
    "RewriteResult",
    "normalise_mapping",
    "rewrite_domain_xml",
    "rewrite_mdev_uuids",
    "rewrite_pci_addresses",
]


class RewriteResult(NamedTuple):
    """What ``rewrite_mdev_uuids`` (or ``rewrite_pci_addresses``) did.

    ``xml`` has the input's type (str or bytes, same encoding).  ``replaced`` is
    one ``(source, destination)`` pair per rewritten attribute (per rewritten
    source address for PCI), in document order, both lowercase.  ``unused_keys``
    are the (lowercase) mapping keys that matched no device, in mapping order; a
    caller may treat them as a sign the mapping was built for another domain.
    """

    xml: str | bytes
    replaced: tuple[tuple[str, str], ...]
    unused_keys: tuple[str, ...]


class DomainRewriteResult(NamedTuple):
    """What ``rewrite_domain_xml`` did: ``RewriteResult``'s fields for each kind."""

    xml: str | bytes
    replaced_uuids: tuple[tuple[str, str], ...]
    unused_uuids: tuple[str, ...]
    replaced_pci: tuple[tuple[str, str], ...]
    unused_pci: tuple[str, ...]


def normalise_mapping(mapping: Mapping[str, str]) -> dict[str, str]:
    """Validate a ``{source UUID: destination UUID}`` mapping and lowercase it.

    Raises InvalidMdevUUID for a malformed UUID or a source given twice (in two
    cases) with different destinations, and NonInjectiveMapping when two sources
    share a destination: two guest devices backed by one mdev would either fail
    at the destination or, worse, share a vGPU.
    """
    return canonical_one_to_one(
        mapping,
        lambda value, where: canonical_uuid(value, where=where),
        lambda source, reason: exception.InvalidMdevUUID(
            uuid=source, where=" (mapping source)", reason=reason
        ),
        lambda target, sources: exception.NonInjectiveMapping(target=target, sources=sources),
    )


def rewrite_mdev_uuids(domain_xml: str | bytes, mapping: Mapping[str, str]) -> RewriteResult:
    """Replace each mdev source UUID of ``domain_xml`` by ``mapping[uuid]``.

    Only ``devices/hostdev[@type='mdev']/source/address/@uuid`` values change;
    destination UUIDs are written lowercase.  All checks happen before any output
    exists, so a refusal never leaves a half-rewritten document behind.

    Raises InvalidMdevUUID / NonInjectiveMapping for a bad mapping,
    InvalidDomainXML for input that is not a safe, well-formed ``<domain>``, and
    UnmappedMdevUUID (Nova's message, naming the first unmapped UUID; all of them
    are in ``exc.kwargs['uuids']``) when an mdev has no destination.
    """
    result = _rewrite(domain_xml, normalise_mapping(mapping), None)
    return RewriteResult(result.xml, result.replaced_uuids, result.unused_uuids)


def rewrite_pci_addresses(domain_xml: str | bytes, mapping: Mapping[str, str]) -> RewriteResult:
    """Move each mapped PCI source of ``domain_xml`` to ``mapping[address]``.

    ``mapping`` is ``{source: destination}``, canonical ``DDDD:BB:SS.F`` (either
    case).  Only the ``domain``/``bus``/``slot``/``function`` attributes of
    ``devices/hostdev[@type='pci']/source/address`` and
    ``devices/interface[@type='hostdev']/source/address[@type='pci']`` whose
    address (read as libvirt reads it) is a key change; PCI devices not in the
    mapping and mdevs are left alone.  See ``pcirewrite.py`` for the spelling
    of the new values.

    Raises InvalidPciDeviceAddress / NonInjectivePciMapping for a bad mapping
    (or one that would put two devices on one function) and InvalidDomainXML for
    input that is not a safe, well-formed ``<domain>`` or holds a PCI source
    address libvirt would read differently or refuse.
    """
    result = _rewrite(domain_xml, None, normalise_pci_mapping(mapping))
    return RewriteResult(result.xml, result.replaced_pci, result.unused_pci)


def rewrite_domain_xml(
    domain_xml: str | bytes,
    mdev_uuids: Mapping[str, str],
    pci_addresses: Mapping[str, str],
) -> DomainRewriteResult:
    """Both rewrites in one pass: what the migration source sends the destination.

    Every mdev must be in ``mdev_uuids`` (as for ``rewrite_mdev_uuids``);
    PCI sources not in ``pci_addresses`` stay (as for ``rewrite_pci_addresses``).
    Raises whatever either raises; nothing is written unless both succeed.
    """
    return _rewrite(domain_xml, normalise_mapping(mdev_uuids), normalise_pci_mapping(pci_addresses))


def _rewrite(
    domain_xml: str | bytes,
    uuid_mapping: dict[str, str] | None,
    pci_mapping: dict[str, str] | None,
) -> DomainRewriteResult:
    """Parse once, plan each kind (None: leave that kind alone, unchecked),
    splice once, verify once."""
    parsed = parse_domain(domain_xml)
    edits: list[Edit] = []
    mutations: list[Mutation] = []
    replaced_uuids: list[tuple[str, str]] = []
    replaced_pci: list[tuple[str, str]] = []
    if uuid_mapping is not None:
        replaced_uuids = _plan_mdev_rewrite(parsed, uuid_mapping, edits, mutations)
    if pci_mapping is not None:
        plan = plan_pci_rewrite(parsed, pci_mapping)
        edits.extend(plan.edits)
        mutations.extend(plan.mutations)
        replaced_pci = plan.replaced
    edits.sort(key=lambda edit: (edit.start, edit.end))

    output = _splice(parsed, edits)
    _verify(parsed, output, mutations)
    return DomainRewriteResult(
        output,
        tuple(replaced_uuids),
        _unused(uuid_mapping, replaced_uuids),
        tuple(replaced_pci),
        _unused(pci_mapping, replaced_pci),
    )


def _plan_mdev_rewrite(
    parsed: ParsedDomain,
    mapping: dict[str, str],
    edits: list[Edit],
    mutations: list[Mutation],
) -> list[tuple[str, str]]:
    """Append the edits that replace each mdev UUID; refuse an unmapped one."""
    replaced: list[tuple[str, str]] = []
    unmapped: list[str] = []
    for index, element in iter_mdev_addresses(parsed):
        value = str(element.get("uuid"))
        target = mapping.get(value.lower())
        if target is None:
            unmapped.append(value)
            continue
        attr = locate_attr(parsed, index, "uuid", value)
        edits.append(Edit(attr.value_start, attr.value_end, target))
        mutations.append(Mutation(element, "uuid", target))
        replaced.append((value.lower(), target))
    if unmapped:
        raise exception.UnmappedMdevUUID(uuid=unmapped[0], uuids=unmapped)
    return replaced


def _unused(mapping: dict[str, str] | None, replaced: list[tuple[str, str]]) -> tuple[str, ...]:
    if mapping is None:
        return ()
    used = {source for source, _ in replaced}
    return tuple(key for key in mapping if key not in used)
