"""Generated and rewritten domain XML against the real libvirt: its RNG schema and
its ``test:///default`` driver (which accepts mdev hostdevs without the device
existing; see docs/design.md §7.1, §8.2).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from accel_agent.libvirt_xml import (
    MdevDevice,
    NetworkVf,
    PciHostdev,
    domain_hostdevs_xml,
    hostdev_interface_xml,
    instance_devices_xml,
    instance_domain_xml,
    list_mdev_uuids,
    list_pci_sources,
    pci_hostdev_xml,
    rewrite_domain_xml,
    rewrite_mdev_uuids,
)

SCHEMA = Path("/usr/share/libvirt/schemas/domain.rng")

SRC = "c2177883-f1bb-47f0-914d-32a22e3a8804"
SRC2 = "6f1c7e0a-58a1-4b3e-9c39-2a4f1f0c1d2e"
DST = "0b2ff7c4-4fd4-4a6b-8bf5-d0e1f2a3b4c5"
DST2 = "9d8e7f60-1a2b-4c3d-8e4f-5a6b7c8d9e0f"


@pytest.fixture(scope="module")
def rng() -> etree.RelaxNG:
    if not SCHEMA.is_file():
        pytest.skip(f"libvirt RNG schemas not installed ({SCHEMA} missing)")
    # By file path: domain.rng includes domaincommon.rng etc. relative to itself.
    return etree.RelaxNG(file=str(SCHEMA))


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python not installed")
    try:
        connection = libvirt.open("test:///default")
    except libvirt.libvirtError as exc:
        pytest.skip(f"libvirt test:///default driver unavailable: {exc}")
    yield connection
    connection.close()


def minimal_domain(devices: str, name: str | None = None, extra: str = "") -> str:
    name = name or f"accel-xml-{uuidlib.uuid4().hex[:12]}"
    return (
        f"<domain type='test'>\n  <name>{name}</name>\n  <memory>1048576</memory>\n"
        f"  <os><type>hvm</type></os>\n{extra}  <devices>\n{devices}\n  </devices>\n</domain>\n"
    )


def assert_valid(rng: etree.RelaxNG, xml: str | bytes) -> None:
    document = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
    assert rng.validate(document), str(rng.error_log)


def define(conn: Any, xml: str | bytes) -> Any:
    return conn.defineXML(xml)


HOSTDEV_VARIANTS = [
    pytest.param({}, id="plain"),
    pytest.param({"display": True}, id="display"),
    pytest.param({"display": True, "ramfb": True}, id="display-ramfb"),
    pytest.param({"display": False, "ramfb": False}, id="off-off"),
]


def test_schema_rejects_a_hostdev_without_model(rng: etree.RelaxNG) -> None:
    # Proves the validation below has teeth: the RNG really checks mdev hostdevs.
    bad = minimal_domain(
        f"<hostdev mode='subsystem' type='mdev'><source><address uuid='{SRC}'/></source></hostdev>"
    )
    assert not rng.validate(etree.fromstring(bad.encode()))


@pytest.mark.parametrize("kwargs", HOSTDEV_VARIANTS)
def test_generated_hostdev_validates_against_rng(rng: etree.RelaxNG, kwargs: dict) -> None:
    assert_valid(rng, minimal_domain(domain_hostdevs_xml([SRC], **kwargs)))


def test_domain_xml_with_qemu_globals_validates_in_its_two_places(rng: etree.RelaxNG) -> None:
    # What `accelctl domain-xml` prints with [libvirt] qemu_globals: the hostdevs go
    # into <devices>, the <qemu:commandline> (namespace on itself) into <domain>.
    hostdevs, commandline = instance_domain_xml(
        [SRC], ["vfio-pci.x-device-dirty-page-tracking=off", "vfio-pci.enable-migration=on"]
    ).split("\n")
    assert_valid(rng, minimal_domain(hostdevs, extra=f"  {commandline}\n"))
    # ... and only there: libvirt's schema refuses it inside <devices>.
    assert not rng.validate(etree.fromstring(minimal_domain(f"{hostdevs}{commandline}").encode()))


def test_generated_hostdevs_for_other_models_validate(rng: etree.RelaxNG) -> None:
    for model in ("vfio-ccw", "vfio-ap"):
        assert_valid(rng, minimal_domain(domain_hostdevs_xml([SRC, SRC2], model=model)))


@pytest.mark.parametrize("kwargs", HOSTDEV_VARIANTS)
def test_generated_hostdev_is_accepted_by_libvirt(conn: Any, kwargs: dict) -> None:
    # libvirt allows ramfb='on' on one mdev only.
    uuids = [SRC] if kwargs.get("ramfb") else [SRC, SRC2]
    dom = define(conn, minimal_domain(domain_hostdevs_xml(uuids, **kwargs)))
    try:
        described = dom.XMLDesc(0)
        hostdevs = etree.fromstring(described.encode()).findall("devices/hostdev")
        assert len(hostdevs) == len(uuids)
        assert all(h.get("type") == "mdev" for h in hostdevs)
        assert all(h.get("managed") == "no" and h.get("model") == "vfio-pci" for h in hostdevs)
        if "display" in kwargs:
            assert hostdevs[0].get("display") == ("on" if kwargs["display"] else "off")
        assert list_mdev_uuids(described) == uuids
    finally:
        dom.undefine()


RICH_EXTRA = f"""  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:name>has {SRC} in it</nova:name>
      <nova:owner><nova:user uuid="{SRC}">admin</nova:user></nova:owner>
    </nova:instance>
  </metadata>
  <!-- the mdev {SRC} is ours -->
"""

RICH_DEVICES = f"""\
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>
      <source>
        <address uuid='{SRC}'/>
      </source>
      <alias name='ua-mdev0'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid="{SRC2.upper()}"/></source>
    </hostdev>"""


def test_rewritten_handwritten_xml_is_byte_identical_valid_and_accepted(
    rng: etree.RelaxNG, conn: Any
) -> None:
    original = minimal_domain(RICH_DEVICES, extra=RICH_EXTRA)
    assert_valid(rng, original)
    result = rewrite_mdev_uuids(original, {SRC: DST, SRC2: DST2})
    expected = original.replace(f"<address uuid='{SRC}'/>", f"<address uuid='{DST}'/>").replace(
        f'<address uuid="{SRC2.upper()}"/>', f'<address uuid="{DST2}"/>'
    )
    assert result.xml == expected
    assert_valid(rng, result.xml)
    dom = define(conn, result.xml)
    try:
        described = dom.XMLDesc(0)
        assert list_mdev_uuids(described) == [DST, DST2]
        # libvirt kept the metadata (with the source UUID) we did not touch.
        assert f'uuid="{SRC}"' in described
    finally:
        dom.undefine()


@pytest.mark.parametrize("migratable", [False, True], ids=["live", "migratable"])
def test_rewrite_of_libvirt_generated_xml_round_trips(
    rng: etree.RelaxNG, conn: Any, migratable: bool
) -> None:
    import libvirt

    name = f"accel-xml-{uuidlib.uuid4().hex[:12]}"
    dom = define(
        conn, minimal_domain(domain_hostdevs_xml([SRC, SRC2]), name=name, extra=RICH_EXTRA)
    )
    try:
        dom.create()
        flags = libvirt.VIR_DOMAIN_XML_MIGRATABLE if migratable else 0
        source_xml = dom.XMLDesc(flags)
        assert list_mdev_uuids(source_xml) == [SRC, SRC2]

        result = rewrite_mdev_uuids(source_xml, {SRC: DST, SRC2: DST2, DST: SRC2})
        assert result.unused_keys == (DST,)
        # libvirt writes each mdev UUID exactly once, as <address uuid='...'/>.
        expected = source_xml.replace(f"<address uuid='{SRC}'/>", f"<address uuid='{DST}'/>")
        expected = expected.replace(f"<address uuid='{SRC2}'/>", f"<address uuid='{DST2}'/>")
        assert expected != source_xml
        assert result.xml == expected
        assert_valid(rng, result.xml)
        dom.destroy()

        # Defining the rewritten XML (same name and domain UUID) updates the definition,
        # the way the destination would take it.
        redefined = define(conn, result.xml)
        assert list_mdev_uuids(redefined.XMLDesc(0)) == [DST, DST2]
    finally:
        if dom.isActive():
            dom.destroy()
        dom.undefine()


def test_libvirt_rejects_what_our_builder_refuses(conn: Any) -> None:
    # ramfb on two devices: libvirt refuses the define, so domain_hostdevs_xml refuses to
    # build it (see test_libvirt_xml.py); check libvirt still behaves that way.
    import libvirt

    two = "\n".join(
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='on' ramfb='on'>"
        f"<source><address uuid='{u}'/></source></hostdev>"
        for u in (SRC, SRC2)
    )
    with pytest.raises(libvirt.libvirtError, match="ramfb"):
        define(conn, minimal_domain(two))


# --- PCI VFs: <hostdev type='pci'> (vGPU 17+ VF) and <interface type='hostdev'> ----------

VF = "0000:c1:00.4"
VF2 = "0000:c1:00.5"
DVF = "0000:82:01.2"
DVF2 = "0001:83:1f.7"


def test_schema_rejects_a_pci_hostdev_with_a_bus_out_of_range(rng: etree.RelaxNG) -> None:
    # Teeth for the PCI checks below: the RNG really reads PCI hostdev source addresses.
    good = pci_hostdev_xml(VF)
    assert_valid(rng, minimal_domain(good))
    bad = good.replace('bus="0xc1"', 'bus="0x1c1"')
    assert bad != good
    assert not rng.validate(etree.fromstring(minimal_domain(bad).encode()))


@pytest.mark.parametrize("vlan", [None, 100, 4095], ids=["untagged", "tagged", "max"])
def test_generated_pci_devices_validate_against_rng(rng: etree.RelaxNG, vlan: int | None) -> None:
    devices = instance_devices_xml(
        [MdevDevice(SRC), PciHostdev(VF), NetworkVf(VF2, "52:54:00:ab:cd:ef", vlan=vlan)]
    )
    assert_valid(rng, minimal_domain(devices))


def _attrs(element: etree._Element | None) -> list[tuple[str, str]]:
    assert element is not None
    return list(element.attrib.items())


def test_generated_pci_devices_are_accepted_by_libvirt_as_written(conn: Any) -> None:
    # libvirt writes back what the builders wrote (attributes, their order and spelling),
    # so the agent's XML and a defined domain's XML agree.
    hostdev = etree.fromstring(pci_hostdev_xml(VF))
    interface = etree.fromstring(hostdev_interface_xml(VF2, "52:54:00:AB:CD:EF", vlan=100))
    dom = define(
        conn,
        minimal_domain(
            instance_devices_xml([PciHostdev(VF)])
            + "\n"
            + etree.tostring(interface, encoding="unicode")
        ),
    )
    try:
        described = etree.fromstring(dom.XMLDesc(0).encode())
        got = described.find("devices/hostdev")
        assert _attrs(got) == _attrs(hostdev) == [
            ("mode", "subsystem"),
            ("type", "pci"),
            ("managed", "no"),
        ]
        assert _attrs(got.find("source/address")) == _attrs(hostdev.find("source/address"))
        # The interface: mac, source, vlan as built (managed='no' is libvirt's default,
        # which it does not write back).
        iface = described.find("devices/interface")
        assert _attrs(iface) == [("type", "hostdev")]
        assert [child.tag for child in iface][:3] == ["mac", "source", "vlan"]
        assert _attrs(iface.find("mac")) == [("address", "52:54:00:ab:cd:ef")]
        assert _attrs(iface.find("source/address")) == _attrs(interface.find("source/address"))
        assert _attrs(iface.find("vlan/tag")) == [("id", "100")]
        # libvirt lists interfaces before hostdevs.
        assert sorted(list_pci_sources(dom.XMLDesc(0))) == [VF, VF2]
    finally:
        dom.undefine()


def test_rewritten_pci_and_mdev_xml_of_libvirt_is_valid_and_accepted(
    rng: etree.RelaxNG, conn: Any
) -> None:
    import libvirt

    name = f"accel-xml-{uuidlib.uuid4().hex[:12]}"
    devices = instance_devices_xml(
        [MdevDevice(SRC), PciHostdev(VF), NetworkVf(VF2, "52:54:00:ab:cd:ef", vlan=7)]
    )
    dom = define(conn, minimal_domain(devices, name=name, extra=RICH_EXTRA))
    try:
        source_xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        assert sorted(list_pci_sources(source_xml)) == [VF, VF2]
        result = rewrite_domain_xml(source_xml, {SRC: DST}, {VF: DVF, VF2: DVF2})
        expected = source_xml.replace(f"<address uuid='{SRC}'/>", f"<address uuid='{DST}'/>")
        expected = expected.replace(
            "<address domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/>",
            "<address domain='0x0000' bus='0x82' slot='0x01' function='0x2'/>",
        ).replace(
            "<address type='pci' domain='0x0000' bus='0xc1' slot='0x00' function='0x5'/>",
            "<address type='pci' domain='0x0001' bus='0x83' slot='0x1f' function='0x7'/>",
        )
        assert expected != source_xml
        assert result.xml == expected
        assert_valid(rng, result.xml)
        redefined = define(conn, result.xml)
        described = redefined.XMLDesc(0)
        assert sorted(list_pci_sources(described)) == [DVF, DVF2]
        assert list_mdev_uuids(described) == [DST]
    finally:
        dom.undefine()
