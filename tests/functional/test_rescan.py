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


VF0, VF1 = "0000:41:00.4", "0000:41:00.5"  # two VFs of the A100-like PF 0000:41:00.0
OTHER_CARD_VF = "0000:42:00.4"
M60 = "0000:84:00.0"


def opened_types_dirs(monkeypatch) -> list[str]:
    """Record which parents' mdev_supported_types a rescan opens to read counters."""
    from accel_agent.sysfs import scanner

    opened: list[str] = []
    real = scanner.open_dir

    def spy(name, dir_fd=None, follow=True):
        if str(name).endswith(scanner.SUPPORTED_TYPES):
            where = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else ""
            opened.append(os.path.basename(os.path.dirname(os.path.join(where, str(name)))))
        return real(name, dir_fd, follow)

    monkeypatch.setattr(scanner, "open_dir", spy)
    return opened


def test_listing_rereads_the_counters_of_the_card_whose_mdevs_changed_and_no_other(
    tmp_path, monkeypatch
):
    with simulated_host(tmp_path, ["nvidia-sriov", "nvidia-pf"], gpus=2, vfs=4) as host:
        rescanner = Rescanner(host.root)
        rescanner.rescan()
        first = rescanner.listing()  # the first listing reads every counter
        same(first, scan(host.root))
        opened = opened_types_dirs(monkeypatch)
        # Nothing changed: the same snapshot object, and no counter read.
        assert rescanner.listing() is first
        assert opened == []

        # Another process creates an mdev on one VF: its siblings' counters
        # drop too (one type per card), so the whole card is read again.
        host.create_foreign(VF0, "nvidia-474", U[3])
        after = rescanner.listing()
        assert set(opened) == {VF0, VF1, "0000:41:00.6", "0000:41:00.7"}
        same(after, scan(host.root))
        assert after.parents[VF1].types["nvidia-471"].available_instances == 0
        assert first.parents[VF1].types["nvidia-471"].available_instances == 1
        assert after.parents[OTHER_CARD_VF] is first.parents[OTHER_CARD_VF]
        assert after.parents[M60] is first.parents[M60]

        # Removed behind the agent's back: read again, and right again.
        opened.clear()
        with open(os.path.join(host.root, "bus/mdev/devices", U[3], "remove"), "w") as f:
            f.write("1")
        again = rescanner.listing()
        assert VF1 in opened and M60 not in opened
        same(again, scan(host.root))


def test_listing_after_a_configured_counter_rescan_still_rereads_the_other_types(tmp_path):
    with simulated_host(tmp_path, ["mtty"]) as host:
        rescanner = Rescanner(host.root)
        rescanner.listing()
        host.create_foreign("mtty", "mtty-2", U[4])
        # The manager's rescan refreshes the configured type only...
        partial = rescanner.rescan(lambda parent: {"mtty-2"})
        assert partial.parents["mtty"].types["mtty-1"].available_instances == 24
        # ... and the listing knows the other counters are older than the mdev list.
        same(rescanner.listing(), scan(host.root))


def test_virtual_parents_share_their_driver_room_pci_parents_their_card():
    from accel_agent.sysfs.model import Parent
    from accel_agent.sysfs.rescan import _room

    def parent(name, pci, physical, driver):
        return Parent(name, "devices/x", pci, physical, None, None, driver, None, None, {})

    assert _room(parent("mtty", None, "mtty", "mtty")) == _room(
        parent("mtty2", None, "mtty2", "mtty")
    )
    vf = parent(VF0, VF0, "0000:41:00.0", "nvidia")
    assert _room(vf) == _room(parent(VF1, VF1, "0000:41:00.0", "nvidia"))
    assert _room(vf) != _room(parent(OTHER_CARD_VF, OTHER_CARD_VF, "0000:42:00.0", "nvidia"))


def test_a_create_during_a_first_scan_is_not_missed_by_the_next_listing(tmp_path, monkeypatch):
    from accel_agent.sysfs import scanner

    with simulated_host(tmp_path, ["mtty"]) as host:
        real = scanner._Scan.parent

        def create_after(walker, name):
            # Another process creates an mdev once the mdev list and the
            # parent's counters were read: the snapshot misses it whole.
            monkeypatch.setattr(scanner._Scan, "parent", real)
            found = real(walker, name)
            host.create_foreign("mtty", "mtty-1", U[5])
            return found

        monkeypatch.setattr(scanner._Scan, "parent", create_after)
        rescanner = Rescanner(host.root)
        racy = rescanner.rescan()
        assert U[5] not in racy.mdevs
        assert racy.parents["mtty"].types["mtty-1"].available_instances == 24
        # The listing finds the mdev list changed since the one its counters
        # were read after, and reads them again.
        listed = rescanner.listing()
        assert listed.parents["mtty"].types["mtty-1"].available_instances == 23
        same(listed, scan(host.root))
