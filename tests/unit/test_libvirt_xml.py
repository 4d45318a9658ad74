"""hostdev builder, mdev listing, hardened parser/tokeniser and the ``xml`` CLI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree
from oslo_config import cfg

from accel_agent import exception
from accel_agent.libvirt_xml import (
    MdevDevice,
    NetworkVf,
    PciHostdev,
    build_hostdev,
    build_hostdev_interface,
    build_pci_hostdev,
    canonical_mac,
    canonical_pci_address,
    canonical_uuid,
    device_xml,
    domain_hostdevs_xml,
    hostdev_interface_xml,
    hostdev_xml,
    instance_devices_xml,
    instance_domain_xml,
    list_mdev_uuids,
    list_pci_sources,
    parse_domain,
    pci_hostdev_xml,
    qemu_commandline_xml,
)
from accel_agent.libvirt_xml import cli as xml_cli
from accel_agent.libvirt_xml.parser import decode_attr_value, tokenise
from tests.configutil import make_conf

SRC = "c2177883-f1bb-47f0-914d-32a22e3a8804"
DST = "0b2ff7c4-4fd4-4a6b-8bf5-d0e1f2a3b4c5"
SRC2 = "6f1c7e0a-58a1-4b3e-9c39-2a4f1f0c1d2e"
REPO = Path(__file__).resolve().parents[2]


def mdev(uuid: str) -> str:
    return (
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
        f"<source><address uuid='{uuid}'/></source></hostdev>"
    )


def domain(devices: str) -> str:
    return f"<domain type='kvm'><devices>{devices}</devices></domain>"


# --- canonical_uuid ---------------------------------------------------------------------


def test_canonical_uuid_lowercases() -> None:
    assert canonical_uuid(SRC.upper()) == SRC


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x",
        SRC[:-1],
        SRC + "0",
        SRC.replace("-", ""),
        f"{{{SRC}}}",
        f" {SRC}",
        f"urn:uuid:{SRC}",
        SRC.replace("c", "g"),
        None,
        42,
    ],
)
def test_canonical_uuid_rejects(bad: object) -> None:
    with pytest.raises(exception.InvalidMdevUUID) as info:
        canonical_uuid(bad, where=" (somewhere)")
    assert "(somewhere)" in str(info.value)


# --- hostdev builder --------------------------------------------------------------------


def test_hostdev_xml_exact_shape() -> None:
    assert hostdev_xml(SRC.upper()) == (
        '<hostdev mode="subsystem" type="mdev" model="vfio-pci" managed="no">'
        f'<source><address uuid="{SRC}"/></source></hostdev>'
    )


def test_build_hostdev_element_tree() -> None:
    element = build_hostdev(SRC, model="vfio-ccw")
    assert element.tag == "hostdev"
    assert dict(element.attrib) == {
        "mode": "subsystem",
        "type": "mdev",
        "model": "vfio-ccw",
        "managed": "no",
    }
    assert [child.tag for child in element] == ["source"]
    assert element.find("source/address").attrib == {"uuid": SRC}


@pytest.mark.parametrize(
    ("display", "ramfb", "expected"),
    [
        (True, None, {"display": "on"}),
        (False, None, {"display": "off"}),
        ("on", "on", {"display": "on", "ramfb": "on"}),
        (True, False, {"display": "on", "ramfb": "off"}),
        (None, "off", {"ramfb": "off"}),
    ],
)
def test_build_hostdev_display_and_ramfb(display: object, ramfb: object, expected: dict) -> None:
    element = build_hostdev(SRC, display=display, ramfb=ramfb)
    got = {k: v for k, v in element.attrib.items() if k in ("display", "ramfb")}
    assert got == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "vfio-mdev"},
        {"model": "vfio-ccw", "display": True},
        {"model": "vfio-ap", "ramfb": False},
        {"ramfb": True},
        {"display": False, "ramfb": True},
        {"display": "yes"},
        {"ramfb": 1},
    ],
)
def test_build_hostdev_refuses_combinations_libvirt_or_qemu_reject(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        build_hostdev(SRC, **kwargs)


def test_build_hostdev_refuses_bad_uuid() -> None:
    with pytest.raises(exception.InvalidMdevUUID):
        build_hostdev("nope")


def test_domain_hostdevs_xml_one_per_uuid_in_order() -> None:
    snippet = domain_hostdevs_xml([SRC, SRC2.upper()], display=True)
    elements = etree.fromstring(f"<devices>{snippet}</devices>")
    assert [e.find("source/address").get("uuid") for e in elements] == [SRC, SRC2]
    assert all(e.get("display") == "on" for e in elements)
    assert domain_hostdevs_xml([]) == ""


def test_domain_hostdevs_xml_refuses_duplicates_any_case() -> None:
    with pytest.raises(exception.InvalidMdevUUID, match="twice"):
        domain_hostdevs_xml([SRC, SRC.upper()])


def test_domain_hostdevs_xml_refuses_ramfb_on_two_devices() -> None:
    assert "ramfb" in domain_hostdevs_xml([SRC], display=True, ramfb=True)
    with pytest.raises(ValueError, match="only one"):
        domain_hostdevs_xml([SRC, SRC2], display=True, ramfb=True)


def test_built_hostdev_is_listed_back() -> None:
    xml = domain(domain_hostdevs_xml([SRC2, SRC]))
    assert list_mdev_uuids(xml) == [SRC2, SRC]


# --- list_mdev_uuids --------------------------------------------------------------------


def test_list_mdev_uuids_selection_order_and_case() -> None:
    xml = (
        "<domain type='kvm'><metadata><m:x xmlns:m='urn:m'>"
        f"<address uuid='{DST}'/></m:x></metadata>"
        f"<!-- <address uuid='{DST}'/> -->"
        "<devices>"
        f"{mdev(SRC2.upper())}"
        f"<hostdev mode='subsystem' type='pci'><source><address uuid='{DST}'/></source></hostdev>"
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source/></hostdev>"
        f"<hub>{mdev(DST)}</hub>"
        f"{mdev(SRC)}"
        "</devices></domain>"
    )
    assert list_mdev_uuids(xml) == [SRC2, SRC]
    assert list_mdev_uuids(xml.encode()) == [SRC2, SRC]


def test_list_mdev_uuids_reports_malformed_values_as_written() -> None:
    assert list_mdev_uuids(domain(mdev("Not-A-UUID"))) == ["not-a-uuid"]


def test_list_mdev_uuids_empty_domain() -> None:
    assert list_mdev_uuids("<domain type='kvm'/>") == []


@pytest.mark.parametrize(
    "xml",
    ["<network/>", "<domain xmlns='urn:x'/>", "<!DOCTYPE domain><domain/>", "<domain>"],
)
def test_list_mdev_uuids_refuses(xml: str) -> None:
    with pytest.raises(exception.InvalidDomainXML):
        list_mdev_uuids(xml)


# --- hardened parser --------------------------------------------------------------------


def test_parser_never_reads_external_entities(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    xml = (
        f'<!DOCTYPE domain [<!ENTITY x SYSTEM "{secret.as_uri()}">]>'
        "<domain><title>&x;</title></domain>"
    )
    with pytest.raises(exception.InvalidDomainXML) as info:
        parse_domain(xml)
    assert "TOPSECRET" not in str(info.value)


def test_parser_configuration_is_hardened() -> None:
    from accel_agent.libvirt_xml.parser import make_parser

    # lxml does not expose parser options for reading back, so check behaviour: an
    # internal entity is not expanded even when a DTD slips through make_parser().
    parser = make_parser()
    root = etree.fromstring(b'<!DOCTYPE d [<!ENTITY e "EXPANDED">]><d>&e;</d>', parser)
    assert "EXPANDED" not in etree.tostring(root).decode()


def test_billion_laughs_refused_quickly() -> None:
    levels = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    xml = f'<!DOCTYPE domain [<!ENTITY l0 "ha">{levels}]><domain><title>&l9;</title></domain>'
    with pytest.raises(exception.InvalidDomainXML, match="not allowed"):
        parse_domain(xml)


def test_doctype_refused_before_libxml2_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tokeniser must refuse on its own; libxml2 is never handed the DTD.
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("libxml2 was called")

    monkeypatch.setattr(etree, "fromstring", fail)
    with pytest.raises(exception.InvalidDomainXML, match="DOCTYPE"):
        parse_domain("<!DOCTYPE domain><domain/>")


def test_parse_domain_keeps_source_and_decoded_text() -> None:
    data = "<?xml version='1.0' encoding='UTF-8'?><domain><title>é</title></domain>".encode()
    parsed = parse_domain(data)
    assert parsed.source is data
    assert parsed.text == data.decode()
    assert parsed.codec == "utf-8" and parsed.bom == b""
    assert [t.name for t in parsed.start_tags] == ["domain", "title"]


def test_str_with_encoding_declaration_is_accepted() -> None:
    # lxml alone refuses this str ("Unicode strings with encoding declaration").
    parsed = parse_domain("<?xml version='1.0' encoding='ISO-8859-1'?><domain>é</domain>")
    assert parsed.root.text == "é"


# --- tokeniser --------------------------------------------------------------------------


def test_tokenise_offsets_and_quotes() -> None:
    text = "<a x='1' y = \"t>w\"><!-- <b z='no'/> --><![CDATA[<c/>]]><?p <d/>?><e\nu='v'/></a>"
    tags = tokenise(text)
    assert [t.name for t in tags] == ["a", "e"]
    a, e = tags
    assert [(x.name, text[x.value_start : x.value_end], x.quote) for x in a.attrs] == [
        ("x", "1", "'"),
        ("y", "t>w", '"'),
    ]
    assert text[e.start : e.end] == "<e\nu='v'/>"
    assert e.attr("u") is not None and e.attr("missing") is None


@pytest.mark.parametrize("decl", ["<!DOCTYPE a>", "<!ENTITY x 'y'>", "<!ELEMENT a ANY>"])
def test_tokenise_refuses_declarations(decl: str) -> None:
    with pytest.raises(exception.InvalidDomainXML, match="not allowed"):
        tokenise(f"{decl}<a/>")


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("abc", "abc"),
        ("a\tb\nc\r\nd\re", "a b c d e"),
        ("&#x63;&#99;&lt;&gt;&amp;&apos;&quot;", "cc<>&'\""),
        ("&#10;", "\n"),
    ],
)
def test_decode_attr_value_matches_libxml2(raw: str, value: str) -> None:
    assert decode_attr_value(raw) == value
    assert etree.fromstring(f'<a v="{raw}"/>'.encode()).get("v") == value


# --- CLI --------------------------------------------------------------------------------


def run_cli(argv: list[str], stdin: bytes = b"") -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    code = xml_cli.main(argv, io.BytesIO(stdin), out, err)
    return code, out.getvalue(), err.getvalue()


CLI_INPUT = (
    b"<?xml version='1.0' encoding='UTF-8'?>\n<domain type='kvm'>\n  <!-- "
    + SRC.encode()
    + b" -->\n  <devices>\n    "
    + mdev(SRC.upper()).encode()
    + b"\n  </devices>\n</domain>\n"
)


def test_cli_rewrite_writes_identical_bytes_except_uuid() -> None:
    code, out, err = run_cli(["xml", "rewrite", "--map", f"{SRC}={DST.upper()}"], CLI_INPUT)
    assert (code, err) == (0, "")
    assert out == CLI_INPUT.replace(SRC.upper().encode(), DST.encode())


def test_cli_rewrite_warns_about_unused_keys() -> None:
    code, out, err = run_cli(
        ["xml", "rewrite", "--map", f"{SRC}={DST}", "--map", f"{SRC2}={SRC}"], CLI_INPUT
    )
    assert code == 0
    assert out == CLI_INPUT.replace(SRC.upper().encode(), DST.encode())
    assert "warning" in err and SRC2 in err and DST not in err


def test_cli_rewrite_refusal_writes_nothing_to_stdout() -> None:
    code, out, err = run_cli(["xml", "rewrite", "--map", f"{SRC2}={DST}"], CLI_INPUT)
    assert (code, out) == (1, b"")
    assert "Unable to find the destination mediated device UUID" in err
    assert SRC.upper() in err


def test_cli_rewrite_non_injective_is_a_refusal() -> None:
    code, out, err = run_cli(
        ["xml", "rewrite", "--map", f"{SRC}={DST}", "--map", f"{SRC2}={DST}"], CLI_INPUT
    )
    assert (code, out) == (1, b"")
    assert "not injective" in err


@pytest.mark.parametrize("stdin", [b"<network/>", b"<!DOCTYPE domain><domain/>", b"garbage"])
def test_cli_rewrite_bad_xml_is_a_refusal(stdin: bytes) -> None:
    code, out, err = run_cli(["xml", "rewrite"], stdin)
    assert (code, out) == (1, b"")
    assert "Invalid domain XML" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["xml", "rewrite", "--map", SRC],
        ["xml", "rewrite", "--map", f"{SRC}=nope"],
        ["xml", "rewrite", "--map", f"{SRC}={DST}", "--map", f"{SRC.upper()}={SRC2}"],
        ["xml", "rewrite", "--map"],
        ["xml"],
        ["xml", "frobnicate"],
    ],
    ids=["no-equals", "bad-uuid", "key-twice", "missing-value", "no-subcommand", "unknown"],
)
def test_cli_usage_errors_exit_2_without_output(argv: list[str]) -> None:
    code, out, err = run_cli(argv, CLI_INPUT)
    assert (code, out) == (2, b"")
    assert "error" in err


def test_cli_help_exits_0_on_stdout() -> None:
    code, out, _ = run_cli(["xml", "rewrite", "--help"])
    assert code == 0 and b"--map SRC=DST" in out


def test_cli_list() -> None:
    code, out, err = run_cli(["xml", "list"], CLI_INPUT)
    assert (code, out, err) == (0, f"{SRC}\n".encode(), "")
    code, out, err = run_cli(["xml", "list"], b"<nope/>")
    assert (code, out) == (1, b"")


def test_cli_list_json() -> None:
    two = CLI_INPUT.replace(b"</devices>", mdev(SRC2).encode() + b"\n  </devices>")
    code, out, err = run_cli(["xml", "list", "--json"], two)
    assert (code, err) == (0, "")
    assert json.loads(out) == {"mdevs": [{"uuid": SRC}, {"uuid": SRC2}]}
    code, out, err = run_cli(["xml", "list", "--json"], b"<nope/>")
    assert (code, out) == (1, b"") and "error:" in err


def test_register_sets_func_for_accelctl_style_dispatch() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="accelctl")
    subparsers = parser.add_subparsers(dest="command")
    xml_cli.register(subparsers)
    args = parser.parse_args(["xml", "rewrite", "--map", f"{SRC.upper()}={DST}"])
    assert args.command == "xml" and args.mappings == [(SRC, DST)]
    out = io.BytesIO()
    streams = xml_cli.Streams(io.BytesIO(CLI_INPUT), out, io.StringIO())
    assert args.func(args, streams) == 0
    assert out.getvalue() == CLI_INPUT.replace(SRC.upper().encode(), DST.encode())


def test_cli_as_a_process_keeps_bytes_and_imports_no_lxml_up_front() -> None:
    env_python = sys.executable
    light = subprocess.run(
        [env_python, "-c", "import sys, accel_agent.libvirt_xml.cli; print('lxml' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert light.stdout.strip() == "False"

    proc = subprocess.run(
        [
            env_python,
            "-m",
            "accel_agent.libvirt_xml.cli",
            "xml",
            "rewrite",
            "--map",
            f"{SRC}={DST}",
        ],
        cwd=REPO,
        input=CLI_INPUT,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == CLI_INPUT.replace(SRC.upper().encode(), DST.encode())

    refused = subprocess.run(
        [env_python, "-m", "accel_agent.libvirt_xml.cli", "xml", "rewrite"],
        cwd=REPO,
        input=CLI_INPUT,
        capture_output=True,
        check=False,
    )
    assert (refused.returncode, refused.stdout) == (1, b"")
    assert SRC.upper().encode() in refused.stderr


# --- [libvirt] qemu_globals: the <qemu:commandline> of `accelctl domain-xml` -------------

MIGRATION_GLOBALS = ["vfio-pci.x-device-dirty-page-tracking=off", "vfio-pci.enable-migration=on"]


def test_qemu_commandline_passes_each_setting_as_one_global() -> None:
    element = etree.fromstring(qemu_commandline_xml(MIGRATION_GLOBALS))
    assert element.tag == "{http://libvirt.org/schemas/domain/qemu/1.0}commandline"
    assert [(arg.tag.split("}")[1], arg.get("value")) for arg in element] == [
        ("arg", "-global"),
        ("arg", "vfio-pci.x-device-dirty-page-tracking=off"),
        ("arg", "-global"),
        ("arg", "vfio-pci.enable-migration=on"),
    ]


def test_instance_domain_xml_adds_the_commandline_only_when_configured() -> None:
    assert instance_domain_xml([SRC, SRC2]) == domain_hostdevs_xml([SRC, SRC2])
    lines = instance_domain_xml([SRC, SRC2], MIGRATION_GLOBALS).split("\n")
    assert lines[:2] == domain_hostdevs_xml([SRC, SRC2]).split("\n")
    assert lines[2:] == [qemu_commandline_xml(MIGRATION_GLOBALS)]
    # the hostdevs stay plain, namespace-free elements for <devices>
    assert "qemu" not in "".join(lines[:2])


def test_qemu_globals_option_refuses_what_is_not_driver_property_value() -> None:
    conf = make_conf(
        "[libvirt]\nqemu_globals = vfio-pci.enable-migration=on, "
        "vfio-pci.x-device-dirty-page-tracking=off\n"
    )
    assert conf.libvirt.qemu_globals == [
        "vfio-pci.enable-migration=on", "vfio-pci.x-device-dirty-page-tracking=off"
    ]
    assert make_conf("[libvirt]\n").libvirt.qemu_globals == []
    for bad in ("enable-migration=on", "vfio-pci.enable-migration", "-device vfio-pci.x=1"):
        with pytest.raises(cfg.ConfigFileValueError):
            _ = make_conf(f"[libvirt]\nqemu_globals = {bad}\n").libvirt.qemu_globals


def test_instance_domain_xml_output_is_pinned_byte_for_byte() -> None:
    # Written out by hand from the output before instance_devices_xml existed: the
    # contract of `accelctl domain-xml` and the API, unchanged by the generalisation.
    hostdev = (
        '<hostdev mode="subsystem" type="mdev" model="vfio-pci" managed="no">'
        '<source><address uuid="{}"/></source></hostdev>'
    )
    commandline = (
        '<qemu:commandline xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0">'
        '<qemu:arg value="-global"/><qemu:arg value="vfio-pci.enable-migration=on"/>'
        "</qemu:commandline>"
    )
    two = hostdev.format(SRC) + "\n" + hostdev.format(SRC2)
    assert instance_domain_xml([SRC.upper(), SRC2]) == two
    assert instance_domain_xml([SRC, SRC2], ["vfio-pci.enable-migration=on"]) == (
        two + "\n" + commandline
    )
    assert instance_domain_xml([]) == ""
    assert instance_domain_xml([], ["vfio-pci.enable-migration=on"]) == "\n" + commandline
    with pytest.raises(exception.InvalidMdevUUID, match="twice"):
        instance_domain_xml([SRC, SRC.upper()])
    with pytest.raises(exception.InvalidMdevUUID):
        instance_domain_xml(["nope"])


# --- PCI VFs: addresses, <hostdev type='pci'>, <interface type='hostdev'> ---------------

VF = "0000:c1:00.4"
VF2 = "0000:c1:00.5"
MAC = "52:54:00:ab:cd:ef"


def test_canonical_pci_address_lowercases_the_full_form() -> None:
    assert canonical_pci_address("0000:C1:1F.7") == "0000:c1:1f.7"
    assert canonical_pci_address(VF) == VF


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "c1:00.4",  # short form: sysfs.address accepts it for config, a VF name must not
        "0000:c1:00.8",
        "0000:c1:20.0",  # slot > 0x1f
        "0000:c1:00.4\n",
        " 0000:c1:00.4",
        "0x0000:c1:00.4",
        "00000:c1:00.4",
        "0000:c1:0.4",
        "0000:g1:00.4",
        "0000-c1-00.4",
        "0000:c1:00.4.0",
        None,
        42,
    ],
)
def test_canonical_pci_address_rejects_with_a_named_error(bad: object) -> None:
    with pytest.raises(exception.InvalidPciDeviceAddress) as info:
        canonical_pci_address(bad, where=" (somewhere)")
    # Whoever handles InvalidPciAddress (the API's 400) handles this too.
    assert isinstance(info.value, exception.InvalidPciAddress)
    assert "(somewhere)" in str(info.value) and info.value.kwargs["address"] == bad


def test_pci_hostdev_xml_exact_shape_is_libvirts() -> None:
    # What libvirt 9.0 writes back for this device (functional test checks it live).
    assert pci_hostdev_xml("0000:C1:00.4") == (
        '<hostdev mode="subsystem" type="pci" managed="no"><source>'
        '<address domain="0x0000" bus="0xc1" slot="0x00" function="0x4"/>'
        "</source></hostdev>"
    )
    assert 'managed="yes"' in pci_hostdev_xml(VF, managed=True)
    assert pci_hostdev_xml("ffff:ff:1f.7").endswith(
        '<address domain="0xffff" bus="0xff" slot="0x1f" function="0x7"/></source></hostdev>'
    )


def test_build_pci_hostdev_element_tree() -> None:
    element = build_pci_hostdev("0001:02:03.1")
    assert element.tag == "hostdev"
    assert list(element.attrib.items()) == [
        ("mode", "subsystem"),
        ("type", "pci"),
        ("managed", "no"),
    ]
    assert [child.tag for child in element] == ["source"]
    assert list(element.find("source/address").attrib.items()) == [
        ("domain", "0x0001"),
        ("bus", "0x02"),
        ("slot", "0x03"),
        ("function", "0x1"),
    ]


@pytest.mark.parametrize("managed", ["no", "yes", 0, None])
def test_pci_builders_want_a_real_bool_for_managed(managed: object) -> None:
    with pytest.raises(TypeError):
        build_pci_hostdev(VF, managed=managed)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        build_hostdev_interface(VF, MAC, managed=managed)  # type: ignore[arg-type]


def test_build_pci_hostdev_refuses_a_non_canonical_address() -> None:
    with pytest.raises(exception.InvalidPciDeviceAddress):
        build_pci_hostdev("c1:00.4")


def test_hostdev_interface_xml_exact_shape_in_libvirts_element_order() -> None:
    assert hostdev_interface_xml("0000:C1:00.4", MAC.upper(), vlan=100) == (
        '<interface type="hostdev" managed="no">'
        f'<mac address="{MAC}"/>'
        '<source><address type="pci" domain="0x0000" bus="0xc1" slot="0x00" function="0x4"/>'
        "</source>"
        '<vlan><tag id="100"/></vlan>'
        "</interface>"
    )


@pytest.mark.parametrize("vlan", [None, 0])
def test_untagged_interface_has_no_vlan_element(vlan: int | None) -> None:
    element = build_hostdev_interface(VF, MAC, vlan=vlan)
    assert [child.tag for child in element] == ["mac", "source"]


@pytest.mark.parametrize("vlan", [1, 100, 4095])
def test_vlan_ids_in_range_are_tagged(vlan: int) -> None:
    element = build_hostdev_interface(VF, MAC, vlan=vlan)
    assert [child.tag for child in element] == ["mac", "source", "vlan"]
    assert [tag.get("id") for tag in element.findall("vlan/tag")] == [str(vlan)]


@pytest.mark.parametrize("vlan", [-1, 4096, 65536, True, False, "100", 100.0])
def test_bad_vlan_is_refused_by_name(vlan: object) -> None:
    with pytest.raises(exception.InvalidVlanId) as info:
        build_hostdev_interface(VF, MAC, vlan=vlan)  # type: ignore[arg-type]
    assert info.value.kwargs["vlan"] == vlan and repr(vlan) in str(info.value)


@pytest.mark.parametrize(
    "mac",
    ["02:00:00:00:00:01", "52:54:00:AB:CD:EF", "fe:ff:ff:ff:ff:ff", "00:00:00:00:00:01"],
    ids=["locally-administered", "upper", "high-even", "low"],
)
def test_unicast_macs_are_accepted_and_lowercased(mac: str) -> None:
    assert canonical_mac(mac) == mac.lower()


@pytest.mark.parametrize(
    ("mac", "reason"),
    [
        ("01:00:5e:00:00:01", "multicast"),
        ("33:33:00:00:00:01", "multicast"),
        ("ff:ff:ff:ff:ff:ff", "multicast"),
        ("53:54:00:12:34:56", "multicast"),
        ("00:00:00:00:00:00", "all-zero"),
        ("52:54:0:1:2:3", "hexadecimal pairs"),
        ("52-54-00-12-34-56", "hexadecimal pairs"),
        ("5254.0012.3456", "hexadecimal pairs"),
        ("52:54:00:12:34:56 ", "hexadecimal pairs"),
        ("52:54:00:12:34", "hexadecimal pairs"),
        ("52:54:00:12:34:5g", "hexadecimal pairs"),
        (None, "hexadecimal pairs"),
    ],
)
def test_bad_mac_is_refused_with_the_reason(mac: object, reason: str) -> None:
    with pytest.raises(exception.InvalidMacAddress, match=reason) as info:
        build_hostdev_interface(VF, mac, vlan=None)  # type: ignore[arg-type]
    assert info.value.kwargs["mac"] == mac


# --- device descriptions and instance_devices_xml ---------------------------------------


def test_descriptions_canonicalise_so_equal_devices_compare_equal() -> None:
    assert MdevDevice(SRC.upper()) == MdevDevice(SRC)
    assert PciHostdev("0000:C1:00.4") == PciHostdev(VF)
    assert NetworkVf("0000:C1:00.4", MAC.upper(), 0) == NetworkVf(VF, MAC, None)
    assert NetworkVf(VF, MAC, 0).vlan is None
    assert NetworkVf(VF, MAC, 7) != NetworkVf(VF, MAC, 8)
    assert len({PciHostdev(VF), PciHostdev("0000:C1:00.4")}) == 1


def test_descriptions_are_frozen() -> None:
    import dataclasses

    device = NetworkVf(VF, MAC, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.vlan = 11  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: MdevDevice("nope"), exception.InvalidMdevUUID),
        (lambda: PciHostdev("c1:00.4"), exception.InvalidPciDeviceAddress),
        (lambda: PciHostdev(VF, managed="no"), TypeError),
        (lambda: NetworkVf("0000:c1:00.9", MAC), exception.InvalidPciDeviceAddress),
        (lambda: NetworkVf(VF, "01:00:00:00:00:01"), exception.InvalidMacAddress),
        (lambda: NetworkVf(VF, MAC, 4096), exception.InvalidVlanId),
        (lambda: NetworkVf(VF, MAC, managed=1), TypeError),
    ],
)
def test_descriptions_refuse_bad_values_when_made(make: object, error: type) -> None:
    with pytest.raises(error):
        make()  # type: ignore[operator]


def test_device_xml_per_kind() -> None:
    assert device_xml(MdevDevice(SRC)) == hostdev_xml(SRC)
    assert device_xml(PciHostdev(VF, managed=True)) == pci_hostdev_xml(VF, managed=True)
    assert device_xml(NetworkVf(VF, MAC, 5)) == hostdev_interface_xml(VF, MAC, 5)
    with pytest.raises(TypeError):
        device_xml(SRC)  # type: ignore[arg-type]


def test_instance_devices_xml_keeps_order_one_a_line_then_the_commandline() -> None:
    devices = [PciHostdev(VF2), MdevDevice(SRC), NetworkVf(VF, MAC, 100), MdevDevice(SRC2)]
    lines = instance_devices_xml(devices, MIGRATION_GLOBALS).split("\n")
    assert lines == [
        pci_hostdev_xml(VF2),
        hostdev_xml(SRC),
        hostdev_interface_xml(VF, MAC, 100),
        hostdev_xml(SRC2),
        qemu_commandline_xml(MIGRATION_GLOBALS),
    ]
    assert instance_devices_xml(devices) == "\n".join(lines[:4])


@pytest.mark.parametrize(
    ("devices", "error", "named"),
    [
        ([MdevDevice(SRC), MdevDevice(SRC.upper())], exception.InvalidMdevUUID, SRC),
        ([PciHostdev(VF), PciHostdev("0000:C1:00.4")], exception.InvalidPciDeviceAddress, VF),
        ([PciHostdev(VF), NetworkVf(VF, MAC)], exception.InvalidPciDeviceAddress, VF),
        (
            [NetworkVf(VF, MAC), NetworkVf(VF, "52:54:00:00:00:02")],
            exception.InvalidPciDeviceAddress,
            VF,
        ),
    ],
    ids=["mdev", "hostdev", "hostdev-and-interface", "interface"],
)
def test_instance_devices_xml_refuses_a_device_given_twice(
    devices: list, error: type, named: str
) -> None:
    with pytest.raises(error, match="twice") as info:
        instance_devices_xml(devices)
    assert named in str(info.value)


def test_instance_devices_xml_refuses_what_is_not_a_description() -> None:
    with pytest.raises(TypeError):
        instance_devices_xml([MdevDevice(SRC), SRC])  # type: ignore[list-item]


@settings(max_examples=60, deadline=None)
@given(
    uuids=st.lists(st.uuids().map(str), max_size=5, unique=True),
    globals_=st.lists(st.sampled_from(MIGRATION_GLOBALS), max_size=2),
    upper=st.booleans(),
)
def test_property_instance_domain_xml_is_instance_devices_xml_of_mdevs(
    uuids: list[str], globals_: list[str], upper: bool
) -> None:
    given_uuids = [u.upper() for u in uuids] if upper else uuids
    # The old composition, spelled out: hostdevs one a line, then the commandline.
    old = domain_hostdevs_xml(given_uuids)
    if globals_:
        old += "\n" + qemu_commandline_xml(globals_)
    assert instance_domain_xml(given_uuids, globals_) == old
    assert instance_devices_xml([MdevDevice(u) for u in given_uuids], globals_) == old


# --- list_pci_sources: which addresses, read as libvirt reads them -----------------------


def pci_hostdev(address_attrs: str, extra: str = "") -> str:
    return (
        f"<hostdev mode='subsystem' type='pci' managed='no'><source>"
        f"<address {address_attrs}/></source>{extra}</hostdev>"
    )


def test_list_pci_sources_selection_and_document_order() -> None:
    guest = "<address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>"
    xml = (
        "<domain type='kvm'><metadata><m:x xmlns:m='urn:m'>"
        + pci_hostdev("domain='0' bus='0x01' slot='0' function='0'")
        + "</m:x></metadata><devices>"
        + pci_hostdev("domain='0x0000' bus='0xc1' slot='0x00' function='0x5'", extra=guest)
        + "<!-- "
        + pci_hostdev("domain='0' bus='0x02' slot='0' function='0'")
        + " -->"
        + "<interface type='hostdev' managed='no'><source>"
        "<address type='pci' domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/>"
        f"</source>{guest}</interface>"
        "<interface type='hostdev'><source><address type='usb' bus='1' device='2'/></source>"
        "</interface>"
        "<interface type='network'><source network='default'/>"
        "<address type='pci' domain='0' bus='3' slot='0' function='0'/></interface>"
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{SRC}'/>"
        "</source></hostdev>"
        + "<hub>"
        + pci_hostdev("bus='4'")
        + "</hub>"
        + "<x:hostdev xmlns:x='urn:x' type='pci'><x:source><x:address bus='5'/></x:source>"
        "</x:hostdev>"
        + pci_hostdev("bus='0x06' slot='0x1f' function='0x7'")
        + "</devices></domain>"
    )
    assert list_pci_sources(xml) == [VF2, VF, "0000:06:1f.7"]
    assert list_pci_sources(xml.encode("utf-16")) == [VF2, VF, "0000:06:1f.7"]


@pytest.mark.parametrize(
    ("attrs", "address"),
    [
        ("domain='0x0000' bus='0xc1' slot='0x00' function='0x4'", VF),
        ("domain='0X0' bus='0XC1' slot='0x0' function='0x04'", VF),
        ("domain='0' bus='193' slot='0' function='4'", VF),
        ("domain='00' bus='0301' slot='00' function='04'", VF),  # strtoul base 0: octal
        ("domain=' 0' bus='\t0xc1' slot='+0' function='+4'", VF),
        ("bus='0xc1' function='4'", VF),  # absent attributes are 0
        ("", "0000:00:00.0"),
        ("domain='0x10000' bus='0xc1' slot='0x00' function='0x4'", "10000:c1:00.4"),
        ("domain='&#x30;x0000' bus='0x&#99;1' slot='0x00' function='0x4'", VF),
        ("domain='4294967295' bus='255' slot='31' function='7'", "ffffffff:ff:1f.7"),
    ],
    ids=[
        "libvirt", "upper", "decimal", "octal", "space-and-plus", "absent", "empty",
        "wide-domain", "char-refs", "maxima",
    ],
)
def test_list_pci_sources_reads_numbers_as_libvirt_does(attrs: str, address: str) -> None:
    assert list_pci_sources(domain(pci_hostdev(attrs))) == [address]


@pytest.mark.parametrize(
    ("attrs", "named"),
    [
        ("bus='c1'", "bus='c1'"),
        ("bus='0xc1 '", "bus='0xc1 '"),
        ("bus='-1'", "bus='-1'"),
        ("bus='256'", "bus='256'"),
        ("slot='32'", "slot='32'"),
        ("function='8'", "function='8'"),
        ("function='0x'", "function='0x'"),
        ("domain=''", "domain=''"),
        ("domain='4294967296'", "domain='4294967296'"),
        ("bus='08'", "bus='08'"),
        ("bus='\uff11'", "bus='\uff11'"),  # FULLWIDTH DIGIT ONE: strtoul does not read it
    ],
)
def test_list_pci_sources_refuses_values_libvirt_refuses(attrs: str, named: str) -> None:
    with pytest.raises(exception.InvalidDomainXML, match="libvirt refuses") as info:
        list_pci_sources(domain(pci_hostdev(attrs)))
    assert named in str(info.value)


@pytest.mark.parametrize("kind", ["hostdev", "interface"])
def test_namespaced_pci_attribute_on_a_source_address_is_refused(kind: str) -> None:
    # libvirt's xmlGetProp ignores namespaces: it would read n:bus as the bus
    # (checked on the test driver in the functional tests).
    attrs = "xmlns:n='urn:n' n:bus='0xc2' domain='0' slot='0' function='0'"
    device = (
        pci_hostdev(attrs)
        if kind == "hostdev"
        else f"<interface type='hostdev'><source><address type='pci' {attrs}/></source></interface>"
    )
    with pytest.raises(exception.InvalidDomainXML, match=r"n:bus|urn:n"):
        list_pci_sources(domain(device))


def test_list_pci_sources_empty_and_refusals() -> None:
    assert list_pci_sources("<domain type='kvm'/>") == []
    assert list_pci_sources(domain(mdev(SRC))) == []
    for bad in ("<network/>", "<!DOCTYPE domain><domain/>", "<domain>"):
        with pytest.raises(exception.InvalidDomainXML):
            list_pci_sources(bad)
