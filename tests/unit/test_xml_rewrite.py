"""Byte-exact rewrite of mdev UUIDs in domain XML (accel_agent.libvirt_xml.rewrite).

Most expectations are written as "the input with exactly these substrings
replaced", computed by the test from where it put the UUIDs, never by the code
under test.
"""

from __future__ import annotations

import codecs
import re
import uuid as uuidlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_agent import exception
from accel_agent.libvirt_xml import (
    DomainRewriteResult,
    list_mdev_uuids,
    list_pci_sources,
    rewrite_domain_xml,
    rewrite_mdev_uuids,
    rewrite_pci_addresses,
)
from accel_agent.libvirt_xml import parser as parser_mod
from accel_agent.libvirt_xml import rewrite as rewrite_mod

SRC = "c2177883-f1bb-47f0-914d-32a22e3a8804"
DST = "0b2ff7c4-4fd4-4a6b-8bf5-d0e1f2a3b4c5"
SRC2 = "6f1c7e0a-58a1-4b3e-9c39-2a4f1f0c1d2e"
DST2 = "9d8e7f60-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
OTHER = "11111111-2222-4333-8444-555555555555"
OTHER_DST = "aaaaaaaa-2222-4333-8444-555555555555"


def mdev(uuid: str, quote: str = "'", extra: str = "") -> str:
    q = quote
    return (
        f"<hostdev mode={q}subsystem{q} type={q}mdev{q} model={q}vfio-pci{q}>"
        f"<source><address uuid={q}{uuid}{q}/></source>{extra}</hostdev>"
    )


def domain(devices: str, head: str = "") -> str:
    return f"<domain type='kvm'>{head}<devices>{devices}</devices></domain>"


def splice(text: str, *pairs: tuple[str, str]) -> str:
    """``text`` with each ``old`` replaced by ``new``, asserting each occurs exactly once."""
    for old, new in pairs:
        assert text.count(old) == 1, f"test bug: {old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    return text


# --- Nova's test_update_mdev_xml and its failure twin -----------------------------------

NOVA_PATTERN = """<domain>
  <devices>
    <hostdev mode="subsystem" type="mdev" model="vfio-pci">
      <source>
        <address uuid="%s"/>
      </source>
    </hostdev>
  </devices>
</domain>"""


def test_nova_update_mdev_xml_case_is_byte_identical_except_uuid() -> None:
    result = rewrite_mdev_uuids(NOVA_PATTERN % SRC, {SRC: DST})
    assert result.xml == NOVA_PATTERN % DST
    assert result.replaced == ((SRC, DST),)
    assert result.unused_keys == ()


def test_nova_update_mdev_xml_fails_on_notfound_mdev() -> None:
    with pytest.raises(exception.UnmappedMdevUUID) as info:
        rewrite_mdev_uuids(NOVA_PATTERN % SRC, {OTHER: DST})
    # Nova's wording, naming the UUID, so existing alerting keeps matching.
    assert str(info.value) == (
        "Unable to find the destination mediated device UUID to use for this source "
        f"mdev UUID : {SRC}"
    )


# --- edge cases Nova's test_migration.py leaves out (docs/design.md §7.2) --------------


@pytest.mark.parametrize(
    "hostdev",
    [
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'/>",
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source/></hostdev>",
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        "<address type='pci'/></source></hostdev>",
    ],
    ids=["no-source", "no-address", "address-without-uuid"],
)
def test_mdev_hostdev_without_uuid_is_skipped_and_untouched(hostdev: str) -> None:
    xml = domain(hostdev + mdev(SRC))
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == splice(xml, (SRC, DST))
    assert result.replaced == ((SRC, DST),)


def test_pci_hostdev_is_untouched() -> None:
    pci = (
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        "<address domain='0x0000' bus='0x06' slot='0x00' function='0x1'/></source>"
        f"<alias name='hostdev1'/><!-- {SRC} --></hostdev>"
    )
    xml = domain(pci + mdev(SRC2))
    result = rewrite_mdev_uuids(xml, {SRC2: DST2})
    assert result.xml == splice(xml, (SRC2, DST2))
    assert pci in result.xml


def test_sixteen_mdevs_all_rewritten_in_document_order() -> None:
    sources = [f"{i:08x}-aaaa-4bbb-8ccc-{i:012x}" for i in range(16)]
    targets = [f"{i:08x}-dddd-4eee-8fff-{i:012x}" for i in range(16)]
    xml = domain("\n    ".join(mdev(s, quote="'\""[i % 2]) for i, s in enumerate(sources)))
    result = rewrite_mdev_uuids(xml, dict(zip(sources, targets, strict=True)))
    assert result.xml == splice(xml, *zip(sources, targets, strict=True))
    assert result.replaced == tuple(zip(sources, targets, strict=True))
    assert list_mdev_uuids(result.xml) == targets


def test_unused_mapping_keys_are_reported_in_mapping_order() -> None:
    xml = domain(mdev(SRC))
    result = rewrite_mdev_uuids(xml, {OTHER.upper(): DST2, SRC: DST, SRC2: OTHER})
    assert result.unused_keys == (OTHER, SRC2)  # lowercased
    assert result.xml == splice(xml, (SRC, DST))


def test_non_injective_mapping_is_refused_naming_both_sources() -> None:
    xml = domain(mdev(SRC) + mdev(SRC2))
    with pytest.raises(exception.NonInjectiveMapping) as info:
        rewrite_mdev_uuids(xml, {SRC: DST, SRC2: DST.upper()})
    message = str(info.value)
    assert DST in message and SRC in message and SRC2 in message


def test_non_injective_mapping_refused_even_when_one_source_is_unused() -> None:
    with pytest.raises(exception.NonInjectiveMapping):
        rewrite_mdev_uuids(domain(mdev(SRC)), {SRC: DST, OTHER: DST})


@pytest.mark.parametrize(
    ("xml_uuid", "map_key"),
    [(SRC.upper(), SRC), (SRC, SRC.upper()), (SRC.upper(), SRC.upper()), (SRC.title(), SRC)],
    ids=["upper-xml", "upper-map", "both-upper", "mixed-xml"],
)
def test_uuids_match_case_insensitively_and_destination_is_lowercase(
    xml_uuid: str, map_key: str
) -> None:
    xml = domain(mdev(xml_uuid))
    result = rewrite_mdev_uuids(xml, {map_key: DST.upper()})
    assert result.xml == splice(xml, (xml_uuid, DST))
    assert result.replaced == ((SRC, DST),)


LIVE_XML = f"""<domain type='kvm' id='7' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>instance-00000001</name>
  <uuid>0c9fba8a-8a3b-4e4f-93f3-c5c2f8d4d0a1</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:package version="29.0.0"/>
      <nova:name>vm with {SRC}</nova:name>
      <nova:owner><nova:user uuid="{SRC}">admin</nova:user></nova:owner>
    </nova:instance>
    <x:hostdev xmlns:x="urn:example:mdev" type="mdev"><x:source>
      <x:address uuid="{SRC}"/></x:source></x:hostdev>
    <address xmlns="urn:example:other" uuid='{SRC}'/>
  </metadata>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>
      <source>
        <address uuid='{SRC}'/>
      </source>
      <alias name='hostdev0'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci'>
      <source>
        <address uuid="{SRC2}"/>
      </source>
      <alias name='ua-{SRC2}'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x06' function='0x0'/>
    </hostdev>
  </devices>
  <qemu:commandline><qemu:arg value='-uuid={SRC}'/></qemu:commandline>
</domain>
"""


def test_live_xml_alias_guest_address_and_foreign_metadata_preserved() -> None:
    result = rewrite_mdev_uuids(LIVE_XML, {SRC: DST, SRC2: DST2})
    expected = LIVE_XML.replace(
        f"<address uuid='{SRC}'/>\n      </source>\n      <alias name='hostdev0'/>",
        f"<address uuid='{DST}'/>\n      </source>\n      <alias name='hostdev0'/>",
    ).replace(f'<address uuid="{SRC2}"/>', f'<address uuid="{DST2}"/>')
    assert expected != LIVE_XML
    assert result.xml == expected
    # The alias that embeds the source UUID is the guest's name for the device, not
    # the host device: it must stay (Nova leaves it too).
    assert f"<alias name='ua-{SRC2}'/>" in result.xml
    assert result.xml.count(SRC) == LIVE_XML.count(SRC) - 1


def test_identity_mapping_is_byte_identical() -> None:
    result = rewrite_mdev_uuids(LIVE_XML, {SRC: SRC, SRC2: SRC2})
    assert result.xml == LIVE_XML
    assert result.replaced == ((SRC, SRC), (SRC2, SRC2))


def test_rewrite_then_inverse_restores_input() -> None:
    forward = rewrite_mdev_uuids(LIVE_XML, {SRC: DST, SRC2: DST2})
    back = rewrite_mdev_uuids(forward.xml, {DST: SRC, DST2: SRC2})
    assert back.xml == LIVE_XML


def test_rewriting_the_output_again_with_the_same_mapping_refuses() -> None:
    # Not silently idempotent: the destination UUIDs are not in the mapping, and a
    # second rewrite by mistake must be loud rather than a no-op that hides it.
    once = rewrite_mdev_uuids(domain(mdev(SRC)), {SRC: DST})
    with pytest.raises(exception.UnmappedMdevUUID, match=DST):
        rewrite_mdev_uuids(once.xml, {SRC: DST})


def test_swap_mapping_is_allowed() -> None:
    xml = domain(mdev(SRC) + mdev(SRC2))
    result = rewrite_mdev_uuids(xml, {SRC: SRC2, SRC2: SRC})
    assert result.xml == domain(mdev(SRC2) + mdev(SRC))


# --- what must stay untouched -----------------------------------------------------------


def test_uuid_in_comment_is_untouched_even_inside_the_hostdev() -> None:
    fake = f"<!-- <address uuid='{SRC}'/> {SRC} -->"
    xml = domain(
        f"{fake}<hostdev mode='subsystem' type='mdev' model='vfio-pci'>{fake}<source>{fake}"
        f"<address uuid='{SRC}'/></source></hostdev>"
    )
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == xml.replace(
        f"{fake}<address uuid='{SRC}'/>", f"{fake}<address uuid='{DST}'/>"
    )
    assert result.xml.count(fake) == 3


def test_uuid_in_cdata_and_processing_instruction_is_untouched() -> None:
    cdata = f"<![CDATA[<address uuid='{SRC}'/> ]] > {SRC}]]>"
    pi = f"<?accel <address uuid='{SRC}'/>?>"
    xml = (
        f"{pi}\n<domain type='kvm'><description>{cdata}</description>{pi}"
        f"<devices>{mdev(SRC)}</devices></domain>\n{pi}"
    )
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == xml.replace(mdev(SRC), mdev(DST))
    assert result.xml.count(cdata) == 1 and result.xml.count(pi) == 3


def test_uuid_in_text_and_other_attributes_is_untouched() -> None:
    xml = domain(
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci' xuuid='{SRC}'>"
        f"<source xmlns:n='urn:n'><address n:uuid='{SRC2}' data-uuid='{SRC}' uuid='{SRC}'/>"
        f"</source><alias name='{SRC}'/></hostdev>",
        head=f"<title>{SRC}</title><description uuid='{SRC}'>{SRC}</description>",
    )
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == xml.replace(f" uuid='{SRC}'/>", f" uuid='{DST}'/>")
    assert result.xml.count(SRC) == xml.count(SRC) - 1


def test_namespaced_address_attribute_alone_does_not_qualify() -> None:
    # n:uuid is a different attribute: this hostdev has no mdev UUID, so no refusal.
    xml = domain(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source xmlns:n='urn:n'>"
        f"<address n:uuid='{SRC}'/></source></hostdev>"
    )
    result = rewrite_mdev_uuids(xml, {})
    assert result.xml == xml and result.replaced == ()


@pytest.mark.parametrize(
    "devices",
    [
        # not a direct child of <devices>
        f"<controller type='usb'>{mdev(SRC)}</controller>",
        # namespaced look-alikes
        f"<x:hostdev xmlns:x='urn:x' type='mdev'><x:source><x:address uuid='{SRC}'/>"
        "</x:source></x:hostdev>",
        f"<hostdev xmlns='urn:x' type='mdev'><source><address uuid='{SRC}'/></source></hostdev>",
        # wrong type, and an mdev address not directly under <source>
        f"<hostdev mode='subsystem' type='pci'><source><address uuid='{SRC}'/></source></hostdev>",
        f"<hostdev type='mdev'><source><x><address uuid='{SRC}'/></x></source></hostdev>",
        f"<hostdev type='mdev'><address uuid='{SRC}'/></hostdev>",
    ],
    ids=["nested", "prefixed-ns", "default-ns", "type-pci", "deeper", "no-source"],
)
def test_look_alikes_outside_the_selection_are_untouched(devices: str) -> None:
    xml = domain(devices + mdev(SRC2))
    result = rewrite_mdev_uuids(xml, {SRC2: DST2})
    assert result.xml == splice(xml, (SRC2, DST2))


def test_hostdev_outside_devices_is_untouched() -> None:
    xml = (
        f"<domain type='kvm'>{mdev(SRC)}<os><devices>{mdev(SRC)}</devices></os>"
        f"<devices>{mdev(SRC2)}</devices></domain>"
    )
    result = rewrite_mdev_uuids(xml, {SRC2: DST2})
    assert result.xml == splice(xml, (SRC2, DST2))


def test_mode_and_model_are_not_checked_like_nova() -> None:
    xml = domain(
        f"<hostdev mode='capabilities' type='mdev' model='vfio-ap'><source>"
        f"<address uuid='{SRC}'/></source></hostdev>"
    )
    assert rewrite_mdev_uuids(xml, {SRC: DST}).xml == splice(xml, (SRC, DST))


# --- quoting, attribute order, white space ----------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "<address uuid='{u}'/>",
        '<address uuid="{u}"/>',
        '<address uuid = "{u}" />',
        "<address\n\tuuid\r\n=\n'{u}'\n/>",
        "<address uuid='{u}' type='mdev' note=\"it's > that\"/>",
        "<address type='mdev' note='a \"b\" > c' uuid=\"{u}\"/>",
        "<address uuid='{u}'></address>",
        "<address other='uuid=\"{o}\"' uuid='{u}'/>",
    ],
    ids=[
        "single",
        "double",
        "spaces",
        "newlines-tabs",
        "uuid-first",
        "uuid-last",
        "open-close",
        "decoy-value",
    ],
)
def test_quoting_order_and_whitespace_preserved(address: str) -> None:
    tag = address.format(u=SRC, o=SRC2)
    xml = domain(
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>{tag}</source></hostdev>"
    )
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == xml.replace(tag, address.format(u=DST, o=SRC2))


def test_crlf_line_endings_preserved() -> None:
    xml = NOVA_PATTERN.replace("\n", "\r\n") % SRC
    assert rewrite_mdev_uuids(xml, {SRC: DST}).xml == NOVA_PATTERN.replace("\n", "\r\n") % DST


def test_character_reference_in_uuid_is_matched_and_replaced_whole() -> None:
    # libvirt never writes this, but it is the same value, so it must match.
    written = "&#x63;2177883-f1bb-47f0-914d-32a22e3a8804"
    xml = domain(mdev(written))
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == splice(xml, (written, DST))


def test_duplicate_source_in_xml_rewritten_everywhere() -> None:
    xml = domain(mdev(SRC) + mdev(SRC.upper()))
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == domain(mdev(DST) + mdev(DST))
    assert result.replaced == ((SRC, DST), (SRC, DST))


def test_domain_without_mdevs_passes_through() -> None:
    xml = domain("<disk type='file'/>")
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert result.xml == xml and result.replaced == () and result.unused_keys == (SRC,)


# --- types and encodings ----------------------------------------------------------------


def test_bytes_with_single_quoted_declaration_preserved() -> None:
    head = b"<?xml version='1.0' encoding='UTF-8'?>\n"
    body = (NOVA_PATTERN % SRC).encode()
    result = rewrite_mdev_uuids(head + body, {SRC: DST})
    assert isinstance(result.xml, bytes)
    assert result.xml == head + (NOVA_PATTERN % DST).encode()


def test_str_with_declaration_preserved() -> None:
    xml = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n' + NOVA_PATTERN % SRC
    result = rewrite_mdev_uuids(xml, {SRC: DST})
    assert isinstance(result.xml, str)
    assert result.xml == '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n' + (
        NOVA_PATTERN % DST
    )


def test_bytearray_in_gives_bytes_out() -> None:
    result = rewrite_mdev_uuids(bytearray((NOVA_PATTERN % SRC).encode()), {SRC: DST})
    assert result.xml == (NOVA_PATTERN % DST).encode()


NON_ASCII_DOC = (
    "<domain type='kvm'><description>Grüße, € and 中文 {u}</description>"
    "<!-- 注释 {u} --><devices>" + mdev("{u}") + "</devices></domain>"
)


@pytest.mark.parametrize(
    ("encoding", "declared", "bom"),
    [
        ("utf-8", "UTF-8", b""),
        ("utf-8", "UTF-8", codecs.BOM_UTF8),
        ("utf-16-le", "UTF-16", codecs.BOM_UTF16_LE),
        ("utf-16-be", "UTF-16", codecs.BOM_UTF16_BE),
        ("iso-8859-1", "ISO-8859-1", b""),
    ],
    ids=["utf8", "utf8-bom", "utf16le", "utf16be", "latin1"],
)
def test_bytes_in_other_encodings_preserved(encoding: str, declared: str, bom: bytes) -> None:
    def render(uuid: str) -> bytes:
        text = f"<?xml version='1.0' encoding='{declared}'?>\n" + NON_ASCII_DOC.format(u=uuid)
        # latin-1 cannot hold € or 中文: use character references, still valid XML.
        return bom + text.encode(encoding, errors="xmlcharrefreplace")

    result = rewrite_mdev_uuids(render(SRC), {SRC: DST})
    # The description and comment keep SRC (they are not hostdev UUIDs).
    expected = render(SRC).replace(
        f"uuid='{SRC}'".encode(encoding), f"uuid='{DST}'".encode(encoding)
    )
    assert expected != render(SRC)
    assert result.xml == expected


def test_declared_encoding_without_bom_for_wide_encoding_is_refused() -> None:
    data = b"<?xml version='1.0' encoding='UTF-16'?><domain/>"
    with pytest.raises(exception.InvalidDomainXML, match="without a BOM"):
        rewrite_mdev_uuids(data, {})


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(exception.InvalidDomainXML, match="unsupported encoding"):
        rewrite_mdev_uuids(b"<?xml version='1.0' encoding='x-no-such'?><domain/>", {})


# --- refusals ---------------------------------------------------------------------------


def test_unmapped_refused_naming_first_and_listing_all() -> None:
    xml = domain(mdev(SRC) + mdev(OTHER) + mdev(SRC2.upper()))
    with pytest.raises(exception.UnmappedMdevUUID) as info:
        rewrite_mdev_uuids(xml, {OTHER: DST})
    assert SRC in str(info.value)
    assert info.value.kwargs["uuids"] == [SRC, SRC2.upper()]


@pytest.mark.parametrize(
    "mapping",
    [
        {"not-a-uuid": DST},
        {SRC: "not-a-uuid"},
        {SRC: DST + "0"},
        {SRC.replace("-", ""): DST},  # bare hex: uuid.UUID() would take it; we do not
        {"{" + SRC + "}": DST},
        {SRC: f" {DST}"},
        {SRC: None},
    ],
    ids=["bad-key", "bad-value", "too-long", "no-hyphens", "braces", "space", "none"],
)
def test_malformed_mapping_refused(mapping: dict) -> None:
    with pytest.raises(exception.InvalidMdevUUID, match="mapping"):
        rewrite_mdev_uuids(domain(mdev(SRC)), mapping)


def test_key_given_twice_in_different_case_with_different_targets_refused() -> None:
    with pytest.raises(exception.InvalidMdevUUID, match="mapped twice"):
        rewrite_mdev_uuids(domain(mdev(SRC)), {SRC: DST, SRC.upper(): DST2})


def test_key_given_twice_in_different_case_with_same_target_accepted() -> None:
    result = rewrite_mdev_uuids(domain(mdev(SRC)), {SRC: DST, SRC.upper(): DST.upper()})
    assert result.xml == domain(mdev(DST))


@pytest.mark.parametrize(
    "xml",
    [
        f"<network><devices>{mdev(SRC)}</devices></network>",
        f"<domain xmlns='urn:x'><devices>{mdev(SRC)}</devices></domain>",
        f"<x:domain xmlns:x='urn:x'><devices>{mdev(SRC)}</devices></x:domain>",
    ],
    ids=["network", "default-namespace", "prefixed"],
)
def test_non_domain_root_refused(xml: str) -> None:
    with pytest.raises(exception.InvalidDomainXML, match="root element"):
        rewrite_mdev_uuids(xml, {SRC: DST})


@pytest.mark.parametrize(
    "xml",
    [
        "<!DOCTYPE domain><domain><devices/></domain>",
        '<!DOCTYPE domain [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
        '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><domain><title>&c;</title></domain>',
        '<!DOCTYPE domain [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<domain><title>&x;</title></domain>",
        '<?xml version="1.0"?>\n<!-- c -->\n<!DOCTYPE domain SYSTEM "http://example.invalid/d.dtd">'
        "<domain/>",
    ],
    ids=["plain-doctype", "billion-laughs", "xxe", "external-dtd"],
)
def test_doctype_and_entities_refused(xml: str) -> None:
    for data in (xml, xml.encode()):
        with pytest.raises(exception.InvalidDomainXML, match="not allowed"):
            rewrite_mdev_uuids(data, {})


@pytest.mark.parametrize(
    "xml",
    [
        "",
        "<domain>",
        "<domain><devices></domain>",
        "<domain>&undefined;</domain>",
        "not xml",
        "<domain/><domain/>",
    ],
)
def test_malformed_xml_refused(xml: str) -> None:
    with pytest.raises(exception.InvalidDomainXML):
        rewrite_mdev_uuids(xml, {})


def test_wrong_input_type_refused() -> None:
    with pytest.raises(TypeError):
        rewrite_mdev_uuids(123, {})  # type: ignore[arg-type]


def test_self_check_catches_a_wrong_splice(monkeypatch: pytest.MonkeyPatch) -> None:
    # If the splice ever wrote to the wrong place, the re-parse comparison must refuse.
    real = rewrite_mod._splice

    def shifted(parsed: parser_mod.ParsedDomain, edits: list) -> str | bytes:
        return real(parsed, [e._replace(start=e.start - 1, end=e.end - 1) for e in edits])

    monkeypatch.setattr(rewrite_mod, "_splice", shifted)
    with pytest.raises(exception.InvalidDomainXML):
        rewrite_mdev_uuids(domain(mdev(SRC), head="<title>x</title>"), {SRC: DST})


def test_tokeniser_disagreement_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = parser_mod.tokenise
    monkeypatch.setattr(parser_mod, "tokenise", lambda text: real(text)[:-1])
    with pytest.raises(exception.InvalidDomainXML, match="tokeniser"):
        rewrite_mdev_uuids(domain(mdev(SRC)), {SRC: DST})


# --- property: arbitrary documents ------------------------------------------------------

_WS = st.sampled_from(["", " ", "\n", "\n  ", "\t", "\r\n    "])
_QUOTE = st.sampled_from(["'", '"'])
_EQ = st.sampled_from(["=", " = ", "\n=\t"])
# Text safe in comments, CDATA, PIs, text and attribute values: no '-' (comments), '<'
# and '&' (markup), quotes, '?' (PIs) or ']' (CDATA ends, forbidden "]]>" in text).
_TEXT = st.text(alphabet="abc XYZ019é€中>\n", max_size=12)


@st.composite
def documents(draw: st.DrawFn) -> tuple[list[tuple[str, bool]], list[str]]:
    """A domain as pieces ``(text, is_mdev_uuid_value)`` plus its pool of UUIDs.

    The generator knows exactly where the qualifying UUID values are, so the test
    can compute the expected output without the code under test.
    """
    pool = [str(u) for u in draw(st.lists(st.uuids(), min_size=1, max_size=6, unique=True))]
    any_uuid = st.sampled_from(pool)
    pieces: list[tuple[str, bool]] = []

    def put(text: str, is_uuid: bool = False) -> None:
        pieces.append((text, is_uuid))

    def attr(name: str, value: str) -> str:
        q = draw(_QUOTE)
        return f"{draw(st.sampled_from([' ', chr(10), '  ']))}{name}{draw(_EQ)}{q}{value}{q}"

    if draw(st.booleans()):
        q = draw(_QUOTE)
        put(f"<?xml version={q}1.0{q} encoding={q}UTF-8{q}?>{draw(_WS)}")
    put(f"<!-- {draw(any_uuid)} -->{draw(_WS)}" if draw(st.booleans()) else "")
    put(f"<domain{attr('type', 'kvm')}>{draw(_WS)}")
    if draw(st.booleans()):
        put(
            f"<metadata><m:i xmlns:m='urn:m'{attr('uuid', draw(any_uuid))}>"
            f"<address{attr('uuid', draw(any_uuid))}/></m:i></metadata>{draw(_WS)}"
        )
    if draw(st.booleans()):
        put(
            f"<description><![CDATA[{draw(_TEXT)}<address uuid='{draw(any_uuid)}'/>]]>"
            f"</description>{draw(_WS)}"
        )
    put(f"<devices>{draw(_WS)}")
    for kind in draw(
        st.lists(st.sampled_from(["mdev", "pci", "comment", "disk", "empty"]), max_size=10)
    ):
        if kind == "mdev":
            value = draw(any_uuid)
            value = draw(st.sampled_from([value, value.upper()]))
            before = draw(st.sampled_from(["", attr("x", draw(_TEXT))]))
            after = draw(st.sampled_from(["", attr("y", draw(_TEXT))]))
            q = draw(_QUOTE)
            put(
                f"<hostdev{attr('mode', 'subsystem')}{attr('type', 'mdev')}"
                f"{attr('model', 'vfio-pci')}>{draw(_WS)}<source>{draw(_WS)}"
                f"<address{before} uuid{draw(_EQ)}{q}"
            )
            put(value, True)
            put(
                f"{q}{after}{draw(st.sampled_from(['/>', ' />', '></address>']))}{draw(_WS)}"
                f"</source>{draw(_WS)}"
            )
            if draw(st.booleans()):
                put(
                    f"<alias{attr('name', 'ua-' + draw(any_uuid))}/>"
                    f"<address type='pci' domain='0x0000' bus='0x00' slot='0x05'"
                    f" function='0x0'/>"
                )
            put(f"<!-- {draw(any_uuid)} --></hostdev>{draw(_WS)}")
        elif kind == "pci":
            put(
                f"<hostdev{attr('type', 'pci')}><source>"
                f"<address{attr('uuid', draw(any_uuid))}/></source></hostdev>{draw(_WS)}"
            )
        elif kind == "comment":
            put(f"<!-- {draw(_TEXT)} <address uuid='{draw(any_uuid)}'/> -->{draw(_WS)}")
        elif kind == "disk":
            put(
                f"<disk{attr('type', 'file')}><serial>{draw(any_uuid)} {draw(_TEXT)}"
                f"</serial></disk>{draw(_WS)}"
            )
        else:
            put(f"<hostdev{attr('type', 'mdev')}><source/></hostdev>{draw(_WS)}")
    put(f"</devices>{draw(_WS)}</domain>{draw(_WS)}")
    return pieces, pool


def _render(pieces: list[tuple[str, bool]], mapping: dict[str, str] | None = None) -> str:
    if mapping is None:
        return "".join(text for text, _ in pieces)
    return "".join(mapping[text.lower()] if is_uuid else text for text, is_uuid in pieces)


def _uuid_spans(pieces: list[tuple[str, bool]]) -> list[range]:
    spans, position = [], 0
    for text, is_uuid in pieces:
        if is_uuid:
            spans.append(range(position, position + len(text)))
        position += len(text)
    return spans


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), data=st.data())
def test_property_bijective_rewrite_and_inverse(
    doc: tuple[list[tuple[str, bool]], list[str]], data: st.DataObject
) -> None:
    pieces, pool = doc
    original = _render(pieces)
    used = {text.lower() for text, is_uuid in pieces if is_uuid}
    # Destinations: fresh UUIDs, or a permutation of the pool (sources and
    # destinations overlap, as in a swap).
    if data.draw(st.booleans(), label="permute"):
        targets = data.draw(st.permutations(pool), label="perm")
    else:
        fresh = data.draw(
            st.lists(st.uuids(), min_size=len(pool), max_size=len(pool), unique=True), "fresh"
        )
        targets = [str(u) for u in fresh]
    forward = dict(zip(pool, targets, strict=True))
    upper_keys = data.draw(st.booleans(), label="upper keys")
    given_map = {(k.upper() if upper_keys else k): v.upper() for k, v in forward.items()}
    as_bytes = data.draw(st.booleans(), label="bytes")

    source = original.encode() if as_bytes else original
    result = rewrite_mdev_uuids(source, given_map)

    expected = _render(pieces, forward)
    assert result.xml == (expected.encode() if as_bytes else expected)
    assert set(result.unused_keys) == set(pool) - used
    assert [s for s, _ in result.replaced] == [t.lower() for t, u in pieces if u]

    # The output differs from the input only inside qualifying uuid attribute values.
    out = result.xml.decode() if isinstance(result.xml, bytes) else result.xml
    assert len(out) == len(original)
    inside = {i for span in _uuid_spans(pieces) for i in span}
    assert all(i in inside for i, (a, b) in enumerate(zip(original, out, strict=True)) if a != b)

    # And back: the inverse mapping restores the input, except that mdev UUIDs
    # come back lowercase (destinations are always written lowercase).
    inverse = {v: k for k, v in forward.items()}
    back = rewrite_mdev_uuids(result.xml, inverse)
    restored = "".join(t.lower() if u else t for t, u in pieces)
    assert back.xml == (restored.encode() if as_bytes else restored)
    if original == restored:
        assert back.xml == source


# === PCI source addresses (VF-backed devices) ===========================================

VF = "0000:c1:00.4"
VF2 = "0000:c1:00.5"
DVF = "0000:82:01.2"
DVF2 = "0001:83:00.7"
OTHER_VF = "0000:06:00.1"


def pci_attrs(address: str, quote: str = "'") -> str:
    """The source address attributes as libvirt writes them."""
    q = quote
    domain_, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return (
        f"domain={q}0x{domain_}{q} bus={q}0x{bus}{q} slot={q}0x{slot}{q} "
        f"function={q}0x{int(function, 16):x}{q}"
    )


def vf_hostdev(attrs: str, guest: str = "") -> str:
    return (
        "<hostdev mode='subsystem' type='pci' managed='no'>"
        f"<source><address {attrs}/></source>{guest}</hostdev>"
    )


def vf_interface(attrs: str, guest: str = "") -> str:
    return (
        "<interface type='hostdev' managed='no'><mac address='52:54:00:12:34:56'/>"
        f"<source><address type='pci' {attrs}/></source><vlan><tag id='100'/></vlan>"
        f"{guest}</interface>"
    )


def guest_address(address: str) -> str:
    return f"<address type='pci' {pci_attrs(address)}/>"


def test_pci_hostdev_and_interface_sources_rewritten_guest_addresses_kept() -> None:
    # The guest <address type='pci'> carries the very same numbers and must not move.
    xml = domain(
        vf_hostdev(pci_attrs(VF), guest=guest_address(VF))
        + vf_interface(pci_attrs(VF2), guest=guest_address(VF2))
    )
    result = rewrite_pci_addresses(xml, {VF: DVF, VF2: DVF2})
    expected = xml.replace(
        f"<source><address {pci_attrs(VF)}/>", f"<source><address {pci_attrs(DVF)}/>"
    ).replace(
        f"<address type='pci' {pci_attrs(VF2)}/></source>",
        f"<address type='pci' {pci_attrs(DVF2)}/></source>",
    )
    assert expected.count(guest_address(VF)) == 1 and expected.count(guest_address(VF2)) == 1
    assert result.xml == expected
    assert result.replaced == ((VF, DVF), (VF2, DVF2))
    assert result.unused_keys == ()
    assert list_pci_sources(result.xml) == [DVF, DVF2]


def test_only_changed_attributes_are_touched() -> None:
    # 0000:c1:00.4 -> 0000:c1:00.6: only function differs; domain/bus/slot keep their bytes
    # even when written oddly (libvirt tolerates them, a rewrite has no reason to "fix" them).
    xml = domain(vf_hostdev("domain='+0' bus='0301' slot=' 0' function='0x4'"))
    result = rewrite_pci_addresses(xml, {VF: "0000:c1:00.6"})
    assert result.xml == splice(xml, ("function='0x4'", "function='0x6'"))


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        # hex: prefix, width and letter case kept
        ("domain='0x0000' bus='0xc1' slot='0x00' function='0x4'",
         "domain='0x0001' bus='0xab' slot='0x1f' function='0x7'"),
        ("domain='0x0000' bus='0xC1' slot='0x00' function='0x4'",
         "domain='0x0001' bus='0xAB' slot='0x1f' function='0x7'"),
        ("domain='0X0000' bus='0XC1' slot='0X0' function='0X04'",
         "domain='0X0001' bus='0XAB' slot='0X1f' function='0X07'"),
        ("domain='0x0' bus='0x00c1' slot='0x000' function='0x4'",
         "domain='0x1' bus='0x00ab' slot='0x01f' function='0x7'"),
        # decimal stays decimal
        ("domain='0' bus='193' slot='0' function='4'",
         "domain='1' bus='171' slot='31' function='7'"),
        # octal, mixed case, white space, '+': libvirt's own spelling
        ("domain='00' bus='0301' slot='00' function='04'",
         "domain='0x0001' bus='0xab' slot='0x1f' function='0x7'"),
        ("domain='0x0000' bus=' 0xc1' slot='+0' function=' 4'",
         "domain='0x0001' bus='0xab' slot='0x1f' function='0x7'"),
        # character references: the value is what counts, replaced whole
        ("domain='&#x30;x0000' bus='0x&#99;1' slot='0x00' function='&#52;'",
         "domain='0x0001' bus='0xab' slot='0x1f' function='7'"),
    ],
    ids=["libvirt", "upper", "upper-prefix", "widths", "decimal", "octal", "odd", "char-refs"],
)
def test_new_values_keep_the_spelling_of_the_old_ones(written: str, expected: str) -> None:
    xml = domain(vf_hostdev(written, guest=guest_address(VF)))
    result = rewrite_pci_addresses(xml, {VF: "0001:ab:1f.7"})
    # The guest <address> may carry the same text: only the one under <source> moves.
    assert result.xml == splice(
        xml, (f"<source><address {written}/>", f"<source><address {expected}/>")
    )


def test_mixed_case_hex_is_written_in_libvirts_spelling() -> None:
    # 0xaB says no letter case to keep, so the new value takes libvirt's lowercase.
    xml = domain(vf_hostdev("domain='0x0000' bus='0xaB' slot='0x00' function='0x4'"))
    result = rewrite_pci_addresses(xml, {"0000:ab:00.4": "0000:cd:00.4"})
    assert result.xml == splice(xml, ("bus='0xaB'", "bus='0xcd'"))


@pytest.mark.parametrize(
    ("written", "target", "expected"),
    [
        # absent attributes are 0 for libvirt: left absent when the target keeps 0 ...
        (
            "bus='0xc1' slot='0x00' function='0x4'",
            "0000:82:00.4",
            "bus='0x82' slot='0x00' function='0x4'",
        ),
        # ... added after the last attribute, in libvirt's spelling and that quote, if not
        (
            "bus='0xc1' function=\"0x4\"",
            "0001:c1:02.4",
            "bus='0xc1' function=\"0x4\" domain=\"0x0001\" slot=\"0x02\"",
        ),
        # ... or right after the name; the input's space before '/>' stays where it was
        ("", "0002:c1:00.4", "domain='0x0002' bus='0xc1' function='0x4' "),
    ],
    ids=["stays-absent", "added", "all-absent"],
)
def test_absent_attributes(written: str, target: str, expected: str) -> None:
    source = list_pci_sources(domain(vf_hostdev(written)))[0]
    xml = domain(vf_hostdev(written))
    result = rewrite_pci_addresses(xml, {source: target})
    assert result.xml == splice(xml, (f"<address {written}/>", f"<address {expected}/>"))
    assert list_pci_sources(result.xml) == [target]


def test_absent_attributes_added_to_an_empty_tag_and_an_open_close_tag() -> None:
    xml = domain(
        "<hostdev type='pci'><source><address/></source></hostdev>"
        "<hostdev type='pci'><source><address bus='1'\n></address></source></hostdev>"
    )
    result = rewrite_pci_addresses(xml, {"0000:00:00.0": DVF, "0000:01:00.0": DVF2})
    assert result.xml == domain(
        "<hostdev type='pci'><source><address bus='0x82' slot='0x01' function='0x2'/>"
        "</source></hostdev>"
        "<hostdev type='pci'><source><address bus='131' domain='0x0001' function='0x7'\n>"
        "</address></source></hostdev>"
    )


@pytest.mark.parametrize("quote", ["'", '"'])
def test_pci_quoting_white_space_and_attribute_order_preserved(quote: str) -> None:
    q = quote
    tag = (
        f"<address\n  function = {q}0x4{q}\tslot={q}0x00{q} note={q}bus=0xc1 &gt; x{q}"
        f"\r\n bus={q}0xc1{q} domain={q}0x0000{q} />"
    )
    xml = domain(f"<hostdev type='pci' managed='no'><source>{tag}</source></hostdev>")
    result = rewrite_pci_addresses(xml, {VF: "0000:c2:03.5"})
    assert result.xml == xml.replace(
        tag,
        tag.replace(f"function = {q}0x4", f"function = {q}0x5")
        .replace(f"slot={q}0x00", f"slot={q}0x03")
        .replace(f"bus={q}0xc1{q} domain", f"bus={q}0xc2{q} domain"),
    )
    assert f"note={q}bus=0xc1 &gt; x{q}" in result.xml


def test_pci_crlf_comments_metadata_and_look_alikes_untouched() -> None:
    decoy = f"<hostdev type='pci'><source><address {pci_attrs(VF)}/></source></hostdev>"
    xml = (
        "<?xml version='1.0' encoding='UTF-8'?>\r\n<domain type='kvm'>\r\n"
        f"  <metadata><m:x xmlns:m='urn:m'>{decoy}</m:x></metadata>\r\n"
        f"  <!-- {decoy} -->\r\n"
        "  <devices>\r\n"
        f"    <hub>{decoy}</hub>\r\n"
        f"    <x:hostdev xmlns:x='urn:x' type='pci'><x:source><x:address {pci_attrs(VF)}/>"
        "</x:source></x:hostdev>\r\n"
        f"    <hostdev type='pci'><!-- {decoy} --><source><!-- <address {pci_attrs(VF)}/> -->\r\n"
        f"      <address {pci_attrs(VF)}/><!-- x --></source>\r\n"
        f"      <address type='pci' {pci_attrs(VF)}/>\r\n    </hostdev>\r\n"
        f"    <hostdev type='mdev'><source><address uuid='{SRC}'/></source>"
        f"<address type='pci' {pci_attrs(VF)}/></hostdev>\r\n"
        f"    <interface type='network'><source network='n'/>"
        f"<address type='pci' {pci_attrs(VF)}/></interface>\r\n"
        "  </devices>\r\n</domain>\r\n"
    )
    result = rewrite_pci_addresses(xml, {VF: DVF})
    assert result.xml == splice(
        xml,
        (
            f"-->\r\n      <address {pci_attrs(VF)}/>",
            f"-->\r\n      <address {pci_attrs(DVF)}/>",
        ),
    )
    # mdevs are not rewrite_pci_addresses' business, mapped or not.
    assert result.replaced == ((VF, DVF),)


def test_pci_rewrite_of_bytes_keeps_encoding_bom_and_declaration() -> None:
    def render(address: str, encoding: str, bom: bytes) -> bytes:
        text = (
            f"<?xml version='1.0' encoding='{'UTF-16' if '16' in encoding else 'UTF-8'}'?>\n"
            "<domain type='kvm'><description>Grüße € 中文 0xc1</description><devices>"
            + vf_hostdev(pci_attrs(address), guest=guest_address(VF))
            + "</devices></domain>\n"
        )
        return bom + text.encode(encoding)

    for encoding, bom in (
        ("utf-8", b""),
        ("utf-8", codecs.BOM_UTF8),
        ("utf-16-le", codecs.BOM_UTF16_LE),
        ("utf-16-be", codecs.BOM_UTF16_BE),
    ):
        result = rewrite_pci_addresses(render(VF, encoding, bom), {VF: DVF})
        assert isinstance(result.xml, bytes)
        assert result.xml == render(DVF, encoding, bom), encoding


def test_pci_identity_mapping_is_byte_identical_and_swap_and_inverse_work() -> None:
    xml = domain(
        vf_hostdev("domain='0' bus='0301' slot='+0' function=' 4'")
        + vf_interface(pci_attrs(VF2).replace("0xc1", "0xC1"))
    )
    identity = rewrite_pci_addresses(xml, {VF: VF, VF2: VF2})
    assert identity.xml == xml and identity.replaced == ((VF, VF), (VF2, VF2))

    swapped = rewrite_pci_addresses(xml, {VF: VF2, VF2: VF})
    assert list_pci_sources(swapped.xml) == [VF2, VF]
    assert swapped.xml == splice(
        xml,
        ("function=' 4'", "function='0x5'"),
        ("function='0x5'/></source><vlan", "function='0x4'/></source><vlan"),
    )

    forward = rewrite_pci_addresses(xml, {VF: DVF, VF2: DVF2})
    back = rewrite_pci_addresses(forward.xml, {DVF: VF, DVF2: VF2})
    assert list_pci_sources(back.xml) == [VF, VF2]
    # Changed attributes took a spelling on the way (0301 -> 0x82 -> 0xc1); the one that
    # never changed (domain '0') kept its bytes; 0xC1 -> 0x83 has no letter to say the
    # case, so it came back lowercase.
    assert back.xml == splice(
        xml,
        ("bus='0301' slot='+0' function=' 4'", "bus='0xc1' slot='0x00' function='0x4'"),
        ("bus='0xC1'", "bus='0xc1'"),
    )


def test_pci_devices_not_in_the_mapping_are_left_alone_and_unused_keys_reported() -> None:
    unrelated = vf_hostdev(pci_attrs(OTHER_VF))
    xml = domain(unrelated + vf_hostdev(pci_attrs(VF)))
    result = rewrite_pci_addresses(xml, {"0000:C1:00.4": DVF, "0000:99:00.0": DVF2})
    assert result.xml == splice(
        xml, (f"<address {pci_attrs(VF)}/>", f"<address {pci_attrs(DVF)}/>")
    )
    assert unrelated in result.xml
    assert result.replaced == ((VF, DVF),)
    assert result.unused_keys == ("0000:99:00.0",)


def test_pci_address_used_twice_in_the_domain_is_rewritten_everywhere() -> None:
    xml = domain(vf_hostdev(pci_attrs(VF)) + vf_hostdev("bus='193' function='4'"))
    result = rewrite_pci_addresses(xml, {VF: DVF})
    assert list_pci_sources(result.xml) == [DVF, DVF]
    assert result.replaced == ((VF, DVF), (VF, DVF))


def test_pci_non_injective_mapping_refused_naming_both() -> None:
    with pytest.raises(exception.NonInjectivePciMapping) as info:
        rewrite_pci_addresses(domain(vf_hostdev(pci_attrs(VF))), {VF: DVF, VF2: DVF.upper()})
    assert isinstance(info.value, exception.NonInjectiveMapping)
    assert all(a in str(info.value) for a in (VF, VF2, DVF))


def test_pci_destination_on_a_device_that_stays_is_refused() -> None:
    # libvirt refuses two hostdevs on one function ("Hostdev already exists").
    xml = domain(vf_hostdev(pci_attrs(OTHER_VF)) + vf_interface(pci_attrs(VF)))
    with pytest.raises(exception.NonInjectivePciMapping) as info:
        rewrite_pci_addresses(xml, {VF: OTHER_VF})
    assert OTHER_VF in str(info.value) and VF in str(info.value)


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({"c1:00.4": DVF}, "mapping source"),
        ({VF: "82:01.2"}, "mapping destination"),
        ({VF: "0000:82:01.8"}, "mapping destination"),
        ({VF: None}, "mapping destination"),
        ({VF: DVF, "0000:C1:00.4": DVF2}, "mapped twice"),
        ({VF: SRC}, "mapping destination"),
    ],
    ids=["short-key", "short-value", "function-8", "none", "twice", "uuid-value"],
)
def test_pci_malformed_mapping_refused(mapping: dict, match: str) -> None:
    with pytest.raises(exception.InvalidPciDeviceAddress, match=match):
        rewrite_pci_addresses(domain(vf_hostdev(pci_attrs(VF))), mapping)


def test_pci_key_twice_in_two_cases_with_one_target_accepted() -> None:
    result = rewrite_pci_addresses(
        domain(vf_hostdev(pci_attrs(VF))), {VF: DVF, "0000:C1:00.4": DVF.upper()}
    )
    assert list_pci_sources(result.xml) == [DVF]


@pytest.mark.parametrize(
    "attrs",
    ["bus='c1' function='4'", "xmlns:n='urn:n' n:bus='0xc1' function='4'"],
    ids=["unreadable", "namespaced"],
)
def test_pci_rewrite_refuses_an_address_libvirt_would_read_otherwise(attrs: str) -> None:
    with pytest.raises(exception.InvalidDomainXML):
        rewrite_pci_addresses(domain(vf_hostdev(attrs) + vf_hostdev(pci_attrs(VF))), {VF: DVF})


def test_pci_self_check_catches_a_wrong_splice(monkeypatch: pytest.MonkeyPatch) -> None:
    real = rewrite_mod._splice

    def shifted(parsed: parser_mod.ParsedDomain, edits: list) -> str | bytes:
        return real(parsed, [e._replace(start=e.start + 1, end=e.end + 1) for e in edits])

    monkeypatch.setattr(rewrite_mod, "_splice", shifted)
    with pytest.raises(exception.InvalidDomainXML, match="internal error"):
        rewrite_pci_addresses(domain(vf_hostdev("bus='0x0c1' function='4'")), {VF: DVF})


def test_pci_self_check_catches_an_insertion_in_the_wrong_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accel_agent.libvirt_xml import pcirewrite

    real = pcirewrite._insertion
    monkeypatch.setattr(
        pcirewrite, "_insertion", lambda parsed, index, added: real(parsed, index, added[::-1])
    )
    with pytest.raises(exception.InvalidDomainXML, match="internal error"):
        rewrite_pci_addresses(domain(vf_hostdev("bus='0xc1'")), {"0000:c1:00.0": DVF})


# --- both kinds at once ---------------------------------------------------------------


def test_rewrite_domain_xml_does_mdevs_and_pci_in_one_pass() -> None:
    xml = domain(
        mdev(SRC)
        + vf_hostdev(pci_attrs(VF), guest=guest_address(VF))
        + vf_interface(pci_attrs(VF2))
        + mdev(SRC2.upper())
        + vf_hostdev(pci_attrs(OTHER_VF))
    )
    result = rewrite_domain_xml(xml, {SRC: DST, SRC2: DST2, OTHER: OTHER_DST}, {VF: DVF, VF2: DVF2})
    assert isinstance(result, DomainRewriteResult)
    assert result.xml == splice(
        xml,
        (SRC, DST),
        (SRC2.upper(), DST2),
        (f"<source><address {pci_attrs(VF)}/>", f"<source><address {pci_attrs(DVF)}/>"),
        (f"<address type='pci' {pci_attrs(VF2)}/></source>",
         f"<address type='pci' {pci_attrs(DVF2)}/></source>"),
    )
    assert result.replaced_uuids == ((SRC, DST), (SRC2, DST2))
    assert result.unused_uuids == (OTHER,)
    assert result.replaced_pci == ((VF, DVF), (VF2, DVF2))
    assert result.unused_pci == ()


def test_rewrite_domain_xml_refuses_an_unmapped_mdev_even_with_pci_work_to_do() -> None:
    xml = domain(mdev(SRC) + vf_hostdev(pci_attrs(VF)))
    with pytest.raises(exception.UnmappedMdevUUID, match=SRC):
        rewrite_domain_xml(xml, {}, {VF: DVF})
    with pytest.raises(exception.NonInjectivePciMapping):
        rewrite_domain_xml(xml, {SRC: DST}, {VF: DVF, VF2: DVF})


def test_rewrite_domain_xml_with_empty_mappings_is_identity_on_a_vf_domain() -> None:
    xml = domain(vf_hostdev(pci_attrs(VF)))
    result = rewrite_domain_xml(xml.encode(), {}, {})
    assert result.xml == xml.encode()
    assert result[1:] == ((), (), (), ())


def test_mdev_rewrite_does_not_read_pci_sources_and_pci_rewrite_does_not_read_mdevs() -> None:
    # Each single-kind entry point keeps to its kind: rewrite_mdev_uuids behaves as it did
    # before PCI existed, even on a PCI address it could not read.
    xml = domain(mdev(SRC) + vf_hostdev("bus='zz'"))
    assert rewrite_mdev_uuids(xml, {SRC: DST}).xml == splice(xml, (SRC, DST))
    with pytest.raises(exception.InvalidDomainXML):
        rewrite_domain_xml(xml, {SRC: DST}, {})
    xml = domain(mdev("not-a-uuid") + vf_hostdev(pci_attrs(VF)))
    assert list_pci_sources(rewrite_pci_addresses(xml, {VF: DVF}).xml) == [DVF]


# --- property: arbitrary documents with VFs and mdevs -----------------------------------

_FIELDS = ("domain", "bus", "slot", "function")
_FIELD_MAX = {"domain": 0x3, "bus": 0xFF, "slot": 0x1F, "function": 0x7}
_LIBVIRT_WIDTH = {"domain": 4, "bus": 2, "slot": 2, "function": 1}


def _spell(style: str, width: int, value: int) -> str:
    if style == "decimal":
        return str(value)
    digits = format(value, f"0{width}{'X' if style == 'upper' else 'x'}")
    return "0x" + digits


def _respell(old: str, value: int) -> str:
    """The test's oracle for the spelling of a changed value, for the spellings the
    generator makes: 0x + lowercase hex, 0x + uppercase hex, decimal."""
    if not old.startswith("0x"):
        return str(value)
    digits = old[2:]
    upper = any(c.isalpha() for c in digits) and digits == digits.upper()
    return "0x" + format(value, f"0{len(digits)}{'X' if upper else 'x'}")


_pci_numbers = st.tuples(
    st.integers(0, _FIELD_MAX["domain"]),
    st.integers(0, 0xFF),
    st.integers(0, 0x1F),
    st.integers(0, 7),
)


def _canonical(numbers: tuple[int, int, int, int]) -> str:
    return f"{numbers[0]:04x}:{numbers[1]:02x}:{numbers[2]:02x}.{numbers[3]:x}"


@st.composite
def vf_documents(draw: st.DrawFn) -> tuple[list[tuple[str, object]], list[str], list[str]]:
    """A domain as pieces ``(text, marker)``: marker ``("pci", field, source address)``
    for a qualifying PCI attribute value, ``"uuid"`` for an mdev UUID, None otherwise;
    plus the pools of PCI addresses and mdev UUIDs it uses."""
    pool = [
        _canonical(n)
        for n in draw(st.lists(_pci_numbers, min_size=1, max_size=5, unique=True))
    ]
    uuids = [str(u) for u in draw(st.lists(st.uuids(), min_size=1, max_size=3, unique=True))]
    pieces: list[tuple[str, object]] = []

    def put(text: str, marker: object = None) -> None:
        pieces.append((text, marker))

    def q() -> str:
        return draw(_QUOTE)

    def attrs(address: str, kind: str) -> None:
        numbers = dict(zip(_FIELDS, (int(x, 16) for x in re.split("[:.]", address)), strict=True))
        order = draw(st.permutations(_FIELDS))
        if kind == "interface":
            quote = q()
            put(f" type={quote}pci{quote}")
        for field in order:
            style = draw(st.sampled_from(["lower", "upper", "decimal"]))
            width = draw(st.integers(1, 4)) if draw(st.booleans()) else _LIBVIRT_WIDTH[field]
            quote = q()
            put(f"{draw(st.sampled_from([' ', chr(10), '  ', chr(13) + chr(10)]))}{field}"
                f"{draw(_EQ)}{quote}")
            put(_spell(style, width, numbers[field]), ("pci", field, address))
            put(quote)

    def guest(address: str) -> str:
        # The device's guest address, with the same numbers as the host one: a decoy.
        d, b, rest = address.split(":")
        s_, f = rest.split(".")
        return (
            f"<address type='pci' domain='0x{d}' bus='0x{b}' slot='0x{s_}' function='0x{f}'/>"
        )

    put(f"<domain type='kvm'>{draw(_WS)}")
    if draw(st.booleans()):
        address = draw(st.sampled_from(pool))
        put(f"<metadata><m:x xmlns:m='urn:m'><hostdev type='pci'><source>{guest(address)}"
            f"</source></hostdev></m:x></metadata>{draw(_WS)}")
    put(f"<devices>{draw(_WS)}")
    kinds = ["hostdev", "interface", "mdev", "unrelated", "comment", "empty"]
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=8)):
        if kind in ("hostdev", "interface"):
            address = draw(st.sampled_from(pool))
            if kind == "hostdev":
                put(f"<hostdev mode='subsystem' type='pci' managed='no'>{draw(_WS)}<source>"
                    f"{draw(_WS)}<address")
            else:
                put(f"<interface type='hostdev' managed='no'><mac address='52:54:00:00:00:01'/>"
                    f"<source>{draw(_WS)}<address")
            attrs(address, kind)
            put(f"{draw(st.sampled_from(['/>', ' />', '></address>']))}{draw(_WS)}</source>")
            if draw(st.booleans()):
                put(f"<alias name='hostdev0'/>{guest(address)}")
            put(f"<!-- {address} {guest(address)} --></{kind}>{draw(_WS)}")
        elif kind == "mdev":
            put("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='")
            put(draw(st.sampled_from(uuids)), "uuid")
            put(f"'/></source>{guest(draw(st.sampled_from(pool)))}</hostdev>{draw(_WS)}")
        elif kind == "unrelated":
            # Domain 0x00ff: never a pool address nor a destination, so it stays.
            bus = draw(st.integers(0, 255))
            put(f"<hostdev type='pci'><source><address domain='0x00ff' bus='0x{bus:02x}'/>"
                f"</source></hostdev>{draw(_WS)}")
        elif kind == "comment":
            put(f"<!-- <hostdev type='pci'><source>{guest(draw(st.sampled_from(pool)))}"
                f"</source></hostdev> -->{draw(_WS)}")
        else:
            put(f"<hostdev type='pci'><source/></hostdev>{draw(_WS)}")
    put(f"</devices>{draw(_WS)}</domain>{draw(_WS)}")
    return pieces, pool, uuids


def _render_pci(
    pieces: list[tuple[str, object]],
    pci: dict[str, str] | None = None,
    uuid_map: dict[str, str] | None = None,
) -> str:
    out = []
    for text, marker in pieces:
        if marker == "uuid" and uuid_map is not None:
            out.append(uuid_map[text])
        elif isinstance(marker, tuple) and pci is not None:
            _, field, source = marker
            index = _FIELDS.index(field)
            old = int(re.split("[:.]", source)[index], 16)
            new = int(re.split("[:.]", pci[source])[index], 16)
            out.append(text if old == new else _respell(text, new))
        else:
            out.append(text)
    return "".join(out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=vf_documents(), data=st.data())
def test_property_pci_and_mdev_rewrite_in_one_pass(
    doc: tuple[list[tuple[str, object]], list[str], list[str]], data: st.DataObject
) -> None:
    pieces, pool, uuids = doc
    original = _render_pci(pieces)
    if data.draw(st.booleans(), label="permute"):
        targets = data.draw(st.permutations(pool), label="perm")
    else:
        fresh = data.draw(
            st.lists(
                st.tuples(st.integers(4, 7), st.integers(0, 255), st.integers(0, 31),
                          st.integers(0, 7)),
                min_size=len(pool), max_size=len(pool), unique=True,
            ),
            label="fresh",
        )
        targets = [_canonical(t) for t in fresh]
    forward = dict(zip(pool, targets, strict=True))
    upper_keys = data.draw(st.booleans(), label="upper keys")
    given_pci = {(k.upper() if upper_keys else k): v for k, v in forward.items()}
    uuid_map = {u: str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, u)) for u in uuids}
    as_bytes = data.draw(st.sampled_from([None, "utf-8", "utf-16"]), label="bytes")

    def encode(text: str) -> str | bytes:
        return text if as_bytes is None else text.encode(as_bytes)

    result = rewrite_domain_xml(encode(original), uuid_map, given_pci)

    expected = _render_pci(pieces, forward, uuid_map)
    assert result.xml == encode(expected)
    sources = [m[2] for _, m in pieces if isinstance(m, tuple) and m[1] == "domain"]
    assert [s for s, _ in result.replaced_pci] == sources
    assert set(result.unused_pci) == set(pool) - set(sources)
    assert [s for s, _ in result.replaced_uuids] == [t for t, m in pieces if m == "uuid"]
    assert [a for a in list_pci_sources(result.xml) if not a.startswith("00ff")] == [
        forward[s] for s in sources
    ]

    # And back: the numbers return, each changed value in the oracle's spelling.
    inverse = {v: k for k, v in forward.items()}
    back = rewrite_pci_addresses(result.xml, inverse)
    assert list_pci_sources(back.xml) == list_pci_sources(original)
    forwarded: list[tuple[str, object]] = []
    for text, marker in pieces:
        if isinstance(marker, tuple):
            moved = ("pci", marker[1], forward[marker[2]])
            forwarded.append((_render_pci([(text, marker)], forward), moved))
        else:
            forwarded.append((uuid_map[text] if marker == "uuid" else text, None))
    assert back.xml == encode(_render_pci(forwarded, inverse))
