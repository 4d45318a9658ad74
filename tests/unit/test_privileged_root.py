"""The root the privileged helper acts on comes with each call, validated."""

from __future__ import annotations

import pytest

from accel_agent import exception
from accel_agent.devices.writers import PrivsepWriter
from accel_agent.privileged import validate, wire


@pytest.mark.parametrize(
    "root", ["", "sys", "./sys", "/sys/", "/sys/../etc", "/sys/./x", "/sys\n", "/s\x00ys",
             "/" + "a" * 5000, None, 3]
)
def test_a_root_that_is_not_an_absolute_normalised_path_is_refused(root):
    with pytest.raises(exception.PrivilegedInputRejected):
        validate.validate_sysfs_root(root)


@pytest.mark.parametrize("root", ["/sys", "/run/accel-agent-demo/sysfs", "/"])
def test_absolute_normalised_roots_are_accepted(root):
    assert validate.validate_sysfs_root(root) == root


def test_the_writer_sends_the_root_normalised():
    assert PrivsepWriter("/run/demo/sysfs/").sysfs_root == "/run/demo/sysfs"
    assert PrivsepWriter(None).sysfs_root is None


def test_the_daemon_side_uses_the_root_it_is_given_and_checks_it(tmp_path):
    assert wire.daemon_sysfs_root(str(tmp_path)) == str(tmp_path)
    with pytest.raises(exception.PrivilegedInputRejected):
        wire.daemon_sysfs_root("relative/sys")


@pytest.mark.parametrize("directory", ["dev/vfio", "/dev/vfio/", "/dev/../etc", "/dev/\nx", 7])
def test_a_vfio_dir_that_is_not_an_absolute_normalised_path_is_refused(directory):
    with pytest.raises(exception.PrivilegedInputRejected):
        validate.validate_vfio_dev_dir(directory)


def test_the_writer_sends_the_vfio_dir_too():
    assert validate.validate_vfio_dev_dir("") == ""  # derived from the root
    assert validate.validate_vfio_dev_dir("/dev/vfio") == "/dev/vfio"
    assert PrivsepWriter("/sys", "/dev/vfio/").vfio_dev_dir == "/dev/vfio"
    assert PrivsepWriter("/sys", "").vfio_dev_dir == ""
