import pytest

from accel_agent import exception
from accel_agent.migration import versions


def test_parsing():
    assert versions.parse_version("8.6.0") == (8, 6, 0)
    assert versions.parse_version("6.1.0-56-amd64") == (6, 1, 0)
    assert versions.parse_version("5.18") == (5, 18, 0)
    assert versions.from_libvirt_int(9000000) == (9, 0, 0)
    assert versions.from_libvirt_int(8006001) == (8, 6, 1)
    with pytest.raises(exception.InvalidMigrationRequest):
        versions.parse_version("new")


def ok_host(**changes):
    data = {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0"} | changes
    return versions.HostVersions.from_dict(data)


def test_recent_host_passes():
    versions.check(ok_host(), "destination")
    versions.check(ok_host(libvirt="8.6.0", qemu="8.1.0", kernel="5.18.0"), "source")


@pytest.mark.parametrize(
    ("component", "value", "label"),
    [("libvirt", "8.5.9", "libvirt"), ("qemu", "7.2.0", "QEMU"), ("kernel", "5.17.9", "kernel")],
)
@pytest.mark.parametrize("side", ["source", "destination"])
def test_too_old_names_the_side_and_component(component, value, label, side):
    with pytest.raises(exception.MigrationVersionTooOld) as info:
        versions.check(ok_host(**{component: value}), side)
    message = str(info.value)
    assert message.startswith(side.capitalize())
    assert label in message and value in message


def test_version_documents_must_be_complete():
    with pytest.raises(exception.InvalidMigrationRequest):
        versions.HostVersions.from_dict({"libvirt": "9.0.0"})
    assert ok_host().to_dict() == {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0"}
