"""Rewrite a domain's mdev UUIDs for live migration, changing nothing else.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from accel_agent import exception
from accel_agent.libvirt_xml.hostdev import canonical_uuid
from accel_agent.libvirt_xml.mdevs import iter_mdev_addresses
from accel_agent.libvirt_xml.parser import (
    ParsedDomain,
    decode_attr_value,
    make_parser,
    parse_domain,
)

__all__ = ["RewriteResult", "normalise_mapping", "rewrite_mdev_uuids"]


class RewriteResult(NamedTuple):
    """What ``rewrite_mdev_uuids`` did.

    ``xml`` has the input's type (str or bytes, same encoding).  ``replaced`` is
    one ``(source, destination)`` pair per rewritten attribute, in document order,
    both lowercase.  ``unused_keys`` are the (lowercase) mapping keys that matched
    no mdev, in mapping order; a caller may treat them as a sign the mapping was
    built for another domain.
    """

    xml: str | bytes
    replaced: tuple[tuple[str, str], ...]
    unused_keys: tuple[str, ...]


class _Edit(NamedTuple):
    start: int  # offsets into ParsedDomain.text of the raw attribute value
    end: int
    new: str


def normalise_mapping(mapping: Mapping[str, str]) -> dict[str, str]:
    """Validate a ``{source UUID: destination UUID}`` mapping and lowercase it.

    Raises InvalidMdevUUID for a malformed UUID or a source given twice (in two
    cases) with different destinations, and NonInjectiveMapping when two sources
    share a destination: two guest devices backed by one mdev would either fail
    at the destination or, worse, share a vGPU.
    """
    canonical: dict[str, str] = {}
    for source, target in mapping.items():
        key = canonical_uuid(source, where=" (mapping source)")
        value = canonical_uuid(target, where=f" (mapping destination for {source})")
        previous = canonical.get(key)
        if previous is not None and previous != value:
            raise exception.InvalidMdevUUID(
                uuid=source,
                where=" (mapping source)",
                reason=f"mapped twice, to {previous} and to {value}",
            )
        canonical[key] = value

    sources_of: dict[str, list[str]] = {}
    for key, value in canonical.items():
        sources_of.setdefault(value, []).append(key)
    for target, sources in sources_of.items():
        if len(sources) > 1:
            raise exception.NonInjectiveMapping(target=target, sources=" and ".join(sources))
    return canonical


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
    canonical = normalise_mapping(mapping)
    parsed = parse_domain(domain_xml)

    edits: list[_Edit] = []
    targets: list[str] = []
    replaced: list[tuple[str, str]] = []
    unmapped: list[str] = []
    for index, element in iter_mdev_addresses(parsed):
        value = str(element.get("uuid"))
        target = canonical.get(value.lower())
        if target is None:
            unmapped.append(value)
            continue
        attr = parsed.start_tags[index].attr("uuid")
        if attr is None:
            raise exception.InvalidDomainXML(reason=f"cannot locate uuid attribute of {value}")
        raw = parsed.text[attr.value_start : attr.value_end]
        # The tokeniser and libxml2 must agree on the value, or the offsets are wrong.
        if decode_attr_value(raw) != value:
            raise exception.InvalidDomainXML(
                reason=f"uuid attribute at offset {attr.value_start} reads {raw!r}, "
                f"libxml2 says {value!r}"
            )
        edits.append(_Edit(attr.value_start, attr.value_end, target))
        targets.append(target)
        replaced.append((value.lower(), target))
    if unmapped:
        raise exception.UnmappedMdevUUID(uuid=unmapped[0], uuids=unmapped)

    output = _splice(parsed, edits)
    _verify(parsed, output, targets)
    used = {source for source, _ in replaced}
    unused = tuple(key for key in canonical if key not in used)
    return RewriteResult(output, tuple(replaced), unused)


def _splice(parsed: ParsedDomain, edits: list[_Edit]) -> str | bytes:
    """Apply ``edits`` to the original input, copying everything else verbatim."""
    text = parsed.text
    if isinstance(parsed.source, str):
        pieces: list[str] = []
        position = 0
        for edit in edits:  # document order, so already sorted and disjoint
            pieces.append(text[position : edit.start])
            pieces.append(edit.new)
            position = edit.end
        pieces.append(text[position:])
        return "".join(pieces)

    # Bytes: map character offsets to byte offsets by encoding the text between
    # edits, then copy the *original* bytes around each edit.  Untouched bytes are
    # never re-encoded, so the encoding, BOM and any odd byte sequences survive.
    data = parsed.source
    codec = parsed.codec
    if codec is None:  # parse_domain sets a codec for every bytes input
        raise TypeError("bytes input parsed without a codec")
    out = bytearray()
    char_pos = 0
    byte_pos = len(parsed.bom)
    copied_up_to = 0
    for edit in edits:
        start = byte_pos + len(text[char_pos : edit.start].encode(codec))
        end = start + len(text[edit.start : edit.end].encode(codec))
        if data[start:end].decode(codec, errors="replace") != text[edit.start : edit.end]:
            raise exception.InvalidDomainXML(
                reason=f"cannot map the uuid at character {edit.start} back to bytes "
                f"in encoding {codec}"
            )
        out += data[copied_up_to:start]
        out += edit.new.encode(codec)
        copied_up_to = byte_pos = end
        char_pos = edit.end
    out += data[copied_up_to:]
    return bytes(out)


def _verify(parsed: ParsedDomain, output: str | bytes, targets: list[str]) -> None:
    """Check the spliced output means exactly what Nova's tree mutation would.

    Cheap insurance for a migration: a second parse of a few kilobytes.  Mutates
    ``parsed.root``, which is private to this call.
    """
    from lxml import etree

    # libxml2 alone is enough here: the input already passed the tokeniser's
    # DOCTYPE refusal and only UUID characters changed, so a second tokenise
    # (most of a rewrite's cost) would find nothing new.
    try:
        if isinstance(output, str):
            result = etree.fromstring(output.encode("utf-8"), make_parser(encoding="utf-8"))
        else:
            result = etree.fromstring(output, make_parser())
    except etree.XMLSyntaxError as exc:
        raise exception.InvalidDomainXML(reason=f"internal error: rewritten XML: {exc}") from None
    expected = parsed.root
    for (_, element), target in zip(iter_mdev_addresses(parsed), targets, strict=True):
        element.set("uuid", target)
    if etree.tostring(expected.getroottree()) != etree.tostring(result.getroottree()):
        raise exception.InvalidDomainXML(
            reason="internal error: the rewritten XML does not parse to the expected document"
        )
