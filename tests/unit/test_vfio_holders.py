"""What the listings read of the VFIO groups processes hold (issue 23's
``in_use``): from /proc, never by opening a group."""

from __future__ import annotations

import os

from accel_agent.privileged import inuse
from accel_agent.sysfs import vfio_holders


def test_the_group_directory_rule_is_the_privileged_probes():
    for root, configured in (("/sys", ""), ("/tmp/sim", ""), ("/tmp/sim", "/dev/vfio2")):
        assert vfio_holders.vfio_dev_dir(root, configured) == inuse.vfio_dev_dir(root, configured)


def test_a_descriptor_held_on_a_group_node_is_seen_and_nothing_else(tmp_path):
    groups = tmp_path / "vfio"
    groups.mkdir()
    (groups / "7").write_text("")
    (groups / "8").write_text("")
    fd = os.open(groups / "7", os.O_RDONLY)
    try:
        held = vfio_holders.held_groups(str(groups))
    finally:
        os.close(fd)
    if os.geteuid() != 0:
        assert held is None  # other processes' descriptors cannot be read
        return
    assert held == frozenset({"7"})
    assert vfio_holders.held_groups(str(groups)) == frozenset()
