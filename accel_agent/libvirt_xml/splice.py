"""Splice new attribute values into the original text of a domain XML, and check the result.

The one implementation behind every byte-exact rewrite (mdev UUIDs, PCI source
addresses, both at once): lxml decides *which* attributes change, the
tokeniser of ``parser.py`` says *where* their values are, :func:`splice`
copies every other character (or, for bytes input, every other byte)
verbatim, and :func:`verify` re-parses the output and compares it with what
the same changes made on lxml's tree (Nova's way) would give.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from accel_agent import exception
from accel_agent.libvirt_xml.parser import Attr, ParsedDomain, decode_attr_value, make_parser

if TYPE_CHECKING:
    from lxml import etree

__all__ = ["Edit", "Mutation", "locate_attr", "splice", "verify"]


class Edit(NamedTuple):
    """Replace ``ParsedDomain.text[start:end]`` by ``new`` (start == end inserts)."""

    start: int
    end: int
    new: str


class Mutation(NamedTuple):
    """The tree change an Edit stands for: ``element.set(name, value)``."""

    element: etree._Element
    name: str
    value: str


def locate_attr(parsed: ParsedDomain, index: int, name: str, value: str) -> Attr:
    """The tokeniser's un-namespaced attribute ``name`` of element ``index``,
    checked to decode to ``value`` (what libxml2 read): if the two views
    disagree, the offsets are wrong and nothing may be spliced there."""
    attr = parsed.start_tags[index].attr(name)
    if attr is None:
        raise exception.InvalidDomainXML(reason=f"cannot locate the {name} attribute {value!r}")
    raw = parsed.text[attr.value_start : attr.value_end]
    if decode_attr_value(raw) != value:
        raise exception.InvalidDomainXML(
            reason=f"{name} attribute at offset {attr.value_start} reads {raw!r}, "
            f"libxml2 says {value!r}"
        )
    return attr


def splice(parsed: ParsedDomain, edits: list[Edit]) -> str | bytes:
    """Apply ``edits`` (sorted by offset, disjoint) to the original input,
    copying everything else verbatim; the result has the input's type."""
    text = parsed.text
    if isinstance(parsed.source, str):
        pieces: list[str] = []
        position = 0
        for edit in edits:
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
                reason=f"cannot map the value at character {edit.start} back to bytes "
                f"in encoding {codec}"
            )
        out += data[copied_up_to:start]
        out += edit.new.encode(codec)
        copied_up_to = byte_pos = end
        char_pos = edit.end
    out += data[copied_up_to:]
    return bytes(out)


def verify(parsed: ParsedDomain, output: str | bytes, mutations: Iterable[Mutation]) -> None:
    """Check the spliced output means exactly what the tree mutations would.

    Cheap insurance for a migration: a second parse of a few kilobytes.  Mutates
    ``parsed.root``, which is private to the calling rewrite.
    """
    from lxml import etree

    # libxml2 alone is enough here: the input already passed the tokeniser's
    # DOCTYPE refusal and only attribute values (and, for a missing PCI address
    # attribute, one attribute) changed, so a second tokenise (most of a
    # rewrite's cost) would find nothing new.
    try:
        if isinstance(output, str):
            result = etree.fromstring(output.encode("utf-8"), make_parser(encoding="utf-8"))
        else:
            result = etree.fromstring(output, make_parser())
    except etree.XMLSyntaxError as exc:
        raise exception.InvalidDomainXML(reason=f"internal error: rewritten XML: {exc}") from None
    expected = parsed.root
    for mutation in mutations:
        mutation.element.set(mutation.name, mutation.value)
    if etree.tostring(expected.getroottree()) != etree.tostring(result.getroottree()):
        raise exception.InvalidDomainXML(
            reason="internal error: the rewritten XML does not parse to the expected document"
        )
