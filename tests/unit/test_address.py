import pytest

from accel_agent import exception
from accel_agent.sysfs import address


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("0000:84:00.0", "0000:84:00.0"),
        ("0000:AF:00.0", "0000:af:00.0"),
        ("af:00.0", "0000:af:00.0"),
        ("AF:1f.7", "0000:af:1f.7"),
        (" 0001:03:00.1 ", "0001:03:00.1"),
    ],
)
def test_parse_accepts_and_normalises(raw, canonical):
    assert address.parse_pci_address(raw) == canonical


@pytest.mark.parametrize(
    "raw", ["whoops", "0000:84:00", "0000:84:00.8", "0000:84:20.0", "00000:84:00.0", "84-00.0", ""]
)
def test_parse_refuses_malformed(raw):
    with pytest.raises(exception.InvalidPciAddress) as info:
        address.parse_pci_address(raw)
    assert repr(raw) in str(info.value)


def test_provider_suffix_matches_libvirt_names():
    assert address.provider_suffix("0000:84:00.0") == "pci_0000_84_00_0"
    assert address.provider_suffix("84:00.4") == "pci_0000_84_00_4"
    assert address.provider_suffix("mtty") == "mtty"


@pytest.mark.parametrize("name", ["../x", "a/b", ".", "..", "", "x" * 65, "a\x00b"])
def test_virtual_names_must_be_one_sane_component(name):
    assert not address.is_virtual_parent_name(name)


def test_normalise_parent_keeps_virtual_case():
    assert address.normalise_parent("mtty") == "mtty"
    assert address.normalise_parent("0000:AF:00.0") == "0000:af:00.0"
