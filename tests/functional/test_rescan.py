"""The steady-state rescanner agrees with a full scan after every kind of change."""

import os

import pytest

from accel_agent.sysfs import scan
from accel_agent.sysfs.rescan import Rescanner
from tests.functional.simhost import simulated_host

pytestmark = pytest.mark.fuse

U = [f"7e7e7e7e-0000-4000-8000-{i:012d}" for i in range(1, 10)]


def same(a, b):
    assert a.parents.keys() == b.parents.keys()
    for name in a.parents:
        assert a.parents[name] == b.parents[name], name
    assert dict(a.mdevs) == dict(b.mdevs)
    assert {k: tuple(v) for k, v in a.by_parent.items()} == {
        k: tuple(v) for k, v in b.by_parent.items()
    }


def test_rescan_tracks_creates_removes_counters_and_parents(tmp_path):
    with simulated_host(tmp_path, ["nvidia-pf", "mtty"], gpus=2) as host:
        rescanner = Rescanner(host.root)
        same(rescanner.rescan(), scan(host.root))

        host.create_foreign("0000:84:00.0", "nvidia-18", U[0])
        host.create_foreign("mtty", "mtty-2", U[1])
        same(rescanner.rescan(), scan(host.root))

        # Removed behind our back, and the same UUID re-created on another parent.
        with open(os.path.join(host.root, "bus/mdev/devices", U[0], "remove"), "w") as f:
            f.write("1")
        host.create_foreign("0000:85:00.0", "nvidia-35", U[0])
        same(rescanner.rescan(), scan(host.root))

        host.sim.unregister("0000:84:00.0")
        same(rescanner.rescan(), scan(host.root))
        host.sim.register("0000:84:00.0")
        same(rescanner.rescan(), scan(host.root))

        host.sim.reboot()
        same(rescanner.rescan(), scan(host.root))


def test_counter_filter_refreshes_only_what_is_asked(tmp_path):
    with simulated_host(tmp_path, ["mtty"]) as host:
        rescanner = Rescanner(host.root)
        rescanner.rescan()
        host.create_foreign("mtty", "mtty-2", U[2])
        partial = rescanner.rescan(lambda parent: {"mtty-2"})
        full = scan(host.root)
        assert partial.parents["mtty"].types["mtty-2"] == full.parents["mtty"].types["mtty-2"]
        # mtty-1 was not asked for: its counter is the cached one (24), the kernel's is 22.
        assert partial.parents["mtty"].types["mtty-1"].available_instances == 24
        assert full.parents["mtty"].types["mtty-1"].available_instances == 22
        same(rescanner.rescan(), full)
        assert set(partial.mdevs) == {U[2]}
