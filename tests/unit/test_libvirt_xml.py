"""hostdev builder, mdev listing, hardened parser/tokeniser and the ``xml`` CLI."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree
from oslo_config import cfg

from accel_agent import exception
from accel_agent.libvirt_xml import (
    build_hostdev,
    canonical_uuid,
    domain_hostdevs_xml,
    hostdev_xml,
    instance_domain_xml,
    list_mdev_uuids,
    parse_domain,
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
