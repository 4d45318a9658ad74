"""Hardened parsing of libvirt domain XML, plus a tokeniser that keeps offsets.

Domain XML reaches the agent from libvirt, from the migration peer and from
operators (``accelctl xml rewrite``), so it is treated as untrusted:

* DTDs are refused outright.  libvirt never emits one, and a DOCTYPE is the
  only way into entity expansion (billion laughs) and external entities
  (XXE).  The refusal happens in our own tokeniser *before* libxml2 sees the
  bytes, and is checked again on libxml2's ``docinfo`` afterwards.
* libxml2 runs with ``resolve_entities=False, no_network=True,
  load_dtd=False, huge_tree=False`` so that even if the first check were
  wrong nothing is fetched or expanded, and its size limits stay on.

lxml gives us the meaning of the document (which elements are which), but
re-serialising an lxml tree is not byte-identical to the input (quotes,
whitespace inside tags, the XML declaration, character references ...).  The
UUID rewrite must change nothing but the UUIDs, so this module also tokenises
the source text itself and records, for every element in document order, the
exact offsets of its attribute values.  The two views are cross-checked
element by element; any disagreement is a refusal, never a guess.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel_agent import exception

if TYPE_CHECKING:
    from lxml import etree

__all__ = [
    "Attr",
    "ParsedDomain",
    "StartTag",
    "make_parser",
    "parse_domain",
    "tokenise",
]

# XML's white space (production S) is exactly these four characters; str.isspace()
# would also accept e.g. U+00A0, which XML does not.
_S = " \t\r\n"
_SKIP_S = re.compile(r"[ \t\r\n]*")
# Lenient on purpose: libxml2 has already checked well-formedness, and the tokeniser
# only needs to find boundaries correctly in documents libxml2 accepted.
_NAME = re.compile(r"[^ \t\r\n/>=<\"']+")
_ATTR = re.compile(r"([^ \t\r\n/>=<\"']+)[ \t\r\n]*=[ \t\r\n]*([\"'])")
_CHAR_REF = re.compile(r"&(#[0-9]+|#x[0-9a-fA-F]+|lt|gt|amp|apos|quot);")
_PREDEFINED = {"lt": "<", "gt": ">", "amp": "&", "apos": "'", "quot": '"'}

# Byte-order marks, longest first so that UTF-32-LE is not mistaken for UTF-16-LE.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
)
# XML 1.0 appendix F: without a BOM, the first bytes of "<?" identify wide encodings.
_WIDE_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\x00<", "utf-32-be"),
    (b"<\x00\x00\x00", "utf-32-le"),
    (b"\x00<\x00?", "utf-16-be"),
    (b"<\x00?\x00", "utf-16-le"),
)
_DECL_ENCODING = re.compile(
    rb"<\?xml[ \t\r\n][^>]*?encoding[ \t\r\n]*=[ \t\r\n]*([\"'])([A-Za-z][A-Za-z0-9._-]*)\1"
)


@dataclass(frozen=True, slots=True)
class Attr:
    """One attribute as written: ``text[value_start:value_end]`` is its raw value."""

    name: str
    value_start: int
    value_end: int
    quote: str


@dataclass(frozen=True, slots=True)
class StartTag:
    """A start tag or empty-element tag; ``text[start:end]`` is the whole tag."""

    name: str
    start: int
    end: int
    attrs: tuple[Attr, ...]

    def attr(self, name: str) -> Attr | None:
        for attr in self.attrs:
            if attr.name == name:
                return attr
        return None


@dataclass(frozen=True)
class ParsedDomain:
    """A parsed ``<domain>`` with both views of it.

    ``text`` is the source as a str: the input itself for str input, the decoded
    bytes (without BOM) for bytes input.  ``start_tags[i]`` is the tag of the i-th
    element of ``root.iter(etree.Element)``; every offset indexes ``text``.
    ``codec``/``bom`` say how ``text`` maps back to the input bytes (None for str).
    """

    root: etree._Element
    text: str
    start_tags: tuple[StartTag, ...]
    source: str | bytes
    codec: str | None
    bom: bytes


class _TokenError(Exception):
    """The tokeniser could not follow the text (only possible if it is malformed)."""


def make_parser(*, encoding: str | None = None) -> etree.XMLParser:
    """The one libxml2 configuration the agent uses for domain XML."""
    from lxml import etree

    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_blank_text=False,
        remove_comments=False,
        remove_pis=False,
        strip_cdata=False,
        recover=False,
        encoding=encoding,
    )


def decode_attr_value(raw: str) -> str:
    """The value libxml2 reports for an attribute written as ``raw``.

    XML 1.0 §3.3.3 for CDATA attributes (no DTD here, so every attribute is CDATA):
    line ends become LF, literal white space becomes a space, then references are
    expanded (a ``&#10;`` stays a newline).
    """
    normalised = raw.replace("\r\n", "\n").replace("\r", "\n")
    normalised = normalised.replace("\t", " ").replace("\n", " ")

    def expand(match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref.startswith("#x"):
            return chr(int(ref[2:], 16))
        if ref.startswith("#"):
            return chr(int(ref[1:]))
        return _PREDEFINED[ref]

    return _CHAR_REF.sub(expand, normalised)


def tokenise(text: str) -> tuple[StartTag, ...]:
    """Return every start/empty-element tag of ``text`` in document order.

    Comments, CDATA sections and processing instructions are skipped as opaque
    spans, so a UUID inside them is never mistaken for an attribute.  Any
    ``<!`` construct other than a comment or CDATA (DOCTYPE, ENTITY, ...) raises
    InvalidDomainXML at once: that is the DTD refusal.
    """
    tags: list[StartTag] = []
    pos = 0
    length = len(text)
    while True:
        lt = text.find("<", pos)
        if lt < 0:
            break
        if text.startswith("<!--", lt):
            pos = _find_end(text, "-->", lt + 4)
        elif text.startswith("<![CDATA[", lt):
            pos = _find_end(text, "]]>", lt + 9)
        elif text.startswith("<?", lt):
            pos = _find_end(text, "?>", lt + 2)
        elif text.startswith("<!", lt):
            word = _NAME.match(text, lt + 2)
            what = word.group(0) if word else text[lt + 2 : lt + 12]
            raise exception.InvalidDomainXML(
                reason=f"<!{what} declarations are not allowed (DTDs and entities are refused "
                f"to rule out entity expansion and external entities)"
            )
        elif text.startswith("</", lt):
            pos = _find_end(text, ">", lt + 2)
        else:
            tag = _start_tag(text, lt, length)
            tags.append(tag)
            pos = tag.end
    return tuple(tags)


def _find_end(text: str, terminator: str, start: int) -> int:
    end = text.find(terminator, start)
    if end < 0:
        raise _TokenError(f"unterminated construct, expected {terminator!r}")
    return end + len(terminator)


def _start_tag(text: str, lt: int, length: int) -> StartTag:
    name = _NAME.match(text, lt + 1)
    if name is None:
        raise _TokenError(f"no element name at offset {lt}")
    pos = name.end()
    attrs: list[Attr] = []
    while True:
        pos = _SKIP_S.match(text, pos).end()
        if pos >= length:
            raise _TokenError(f"unterminated start tag at offset {lt}")
        if text.startswith("/>", pos):
            return StartTag(name.group(0), lt, pos + 2, tuple(attrs))
        if text[pos] == ">":
            return StartTag(name.group(0), lt, pos + 1, tuple(attrs))
        attr = _ATTR.match(text, pos)
        if attr is None:
            raise _TokenError(f"cannot read attribute at offset {pos}")
        quote = attr.group(2)
        value_start = attr.end()
        # An attribute value cannot contain its own quote character (it would be
        # written &quot;/&apos;), so the next one closes it; '>' may occur inside.
        value_end = text.find(quote, value_start)
        if value_end < 0:
            raise _TokenError(f"unterminated attribute value at offset {value_start}")
        attrs.append(Attr(attr.group(1), value_start, value_end, quote))
        pos = value_end + 1


def _sniff_encoding(data: bytes) -> tuple[str, bytes]:
    """(Python codec, BOM) of an XML byte string, the way XML 1.0 appendix F says."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return codec, bom
    for signature, codec in _WIDE_SIGNATURES:
        if data.startswith(signature):
            return codec, b""
    declared = _DECL_ENCODING.match(data)
    if declared is None:
        return "utf-8", b""
    name = declared.group(2).decode("ascii")
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        raise exception.InvalidDomainXML(reason=f"unsupported encoding {name!r}") from None
    if codec in ("utf-16", "utf-32"):
        # Declared wide but no BOM and no wide signature: the bytes contradict it.
        raise exception.InvalidDomainXML(reason=f"encoding {name!r} declared without a BOM")
    return codec, b""


def _element_name_matches(element: etree._Element, raw_name: str) -> bool:
    from lxml import etree

    prefix, _, local = raw_name.rpartition(":")
    return etree.QName(element).localname == local and (element.prefix or "") == prefix


def parse_domain(xml: str | bytes) -> ParsedDomain:
    """Parse libvirt domain XML safely; raise InvalidDomainXML on anything suspect.

    Refused: a DOCTYPE or any other markup declaration, XML that is not
    well-formed, a root other than an un-namespaced ``<domain>``, and bytes whose
    encoding cannot be mapped back to byte offsets.
    """
    from lxml import etree

    if isinstance(xml, bytes | bytearray):
        data = bytes(xml)
        codec, bom = _sniff_encoding(data)
        try:
            text = data[len(bom) :].decode(codec)
        except (UnicodeDecodeError, LookupError) as exc:
            # LookupError: a codec that is not a text encoding (base64, ...).
            raise exception.InvalidDomainXML(reason=f"cannot decode as {codec}: {exc}") from None
        source: str | bytes = data
        lxml_input = data
        parser = make_parser()
    elif isinstance(xml, str):
        text = xml
        source = xml
        codec, bom = None, b""
        # lxml refuses a str that carries an encoding declaration, and libvirt's
        # XMLDesc() str usually does not, but files do.  Encode to UTF-8 and tell
        # libxml2 to ignore the declaration: the characters are what count.
        lxml_input = xml.encode("utf-8", errors="surrogatepass")
        parser = make_parser(encoding="utf-8")
    else:
        raise TypeError(f"domain XML must be str or bytes, not {type(xml).__name__}")

    # Tokenise first: this is where a DOCTYPE is refused before libxml2 reads it.
    token_error: _TokenError | None = None
    start_tags: tuple[StartTag, ...] = ()
    try:
        start_tags = tokenise(text)
    except _TokenError as exc:
        # Report libxml2's (better) diagnosis of the malformed text below.
        token_error = exc

    try:
        root = etree.fromstring(lxml_input, parser)
    except etree.XMLSyntaxError as exc:
        raise exception.InvalidDomainXML(reason=str(exc)) from None
    if root is None:
        raise exception.InvalidDomainXML(reason="empty document")
    docinfo = root.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise exception.InvalidDomainXML(reason="DOCTYPE declarations are not allowed")
    if token_error is not None:
        raise exception.InvalidDomainXML(reason=f"cannot tokenise: {token_error}")
    if root.tag != "domain":
        raise exception.InvalidDomainXML(
            reason=f"root element is {root.tag!r}, expected an un-namespaced 'domain'"
        )

    elements = list(root.iter(etree.Element))
    # Our tags include none outside the root (XML allows exactly one element there).
    if len(elements) != len(start_tags):
        raise exception.InvalidDomainXML(
            reason=f"tokeniser found {len(start_tags)} elements, libxml2 {len(elements)}"
        )
    for element, tag in zip(elements, start_tags, strict=True):
        if not _element_name_matches(element, tag.name):
            raise exception.InvalidDomainXML(
                reason=f"tokeniser and libxml2 disagree at offset {tag.start}: "
                f"{tag.name!r} vs {element.tag!r}"
            )
    return ParsedDomain(root, text, start_tags, source, codec, bom)
