"""Scans that overlap (accel_agent.sysfs.rescan): none waits for another, what
is kept is never older than what either read, a stopping agent's scans stop,
and a cold scan made moments before seeds the first rescan.

Static trees (the simulator's, materialised); a scan is held in the middle
by a hook that waits on an event, so "while another scan is in progress" is
a fact of the test, not a matter of timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from accel_agent.backends import builtin
from accel_agent.backends.host import HostRescanner, scan_host
from accel_agent.simulator import build_spec, materialise
from accel_agent.sysfs import attributes, scan
from accel_agent.sysfs.rescan import Rescanner, ScanStopped, interruptible

NO_HANG = 30.0
# A held scan waits this long at most (the test's end sets ``go`` anyway):
# far longer than any join of the tests, so that a listing stuck behind the
# held scan is never set free by the hold giving up first.
HOLD_LIMIT = 10 * NO_HANG
CONFIGURED = "nvidia-1001"


def tree(tmp_path, parents: int = 6) -> str:
    return materialise(build_spec(["synthetic"], parents=parents, types=2), tmp_path / "sys")


def counter_path(root: str, parent: str, type_id: str) -> str:
    return os.path.join(
        root, "class/mdev_bus", parent, "mdev_supported_types", type_id, "available_instances"
    )


@contextmanager
def held_refresh(monkeypatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The next counter refresh of a steady rescan waits until ``go`` is set;
    ``inside`` is set once it waits."""
    inside, go = threading.Event(), threading.Event()
    real = Rescanner._refresh_counters
    state = {"armed": True}

    def hold(walker, parent, wanted):
        if state["armed"]:
            state["armed"] = False
            inside.set()
            assert go.wait(HOLD_LIMIT)
        return real(walker, parent, wanted)

    monkeypatch.setattr(Rescanner, "_refresh_counters", staticmethod(hold))
    try:
        yield inside, go
    finally:
        go.set()


def test_a_listing_is_answered_while_a_periodic_rescan_is_in_progress(tmp_path, monkeypatch):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    with held_refresh(monkeypatch) as (inside, go):
        periodic = threading.Thread(target=lambda: rescanner.rescan(reread_mdevs=True))
        periodic.start()
        assert inside.wait(NO_HANG)
        listed: list = []
        lister = threading.Thread(target=lambda: listed.append(rescanner.listing()))
        lister.start()
        lister.join(NO_HANG)
        # Answered while the periodic rescan still waits in its first parent.
        assert listed and not lister.is_alive()
        assert periodic.is_alive() and not go.is_set()
        go.set()
        periodic.join(NO_HANG)
    assert listed[0].parents.keys() == scan(root).parents.keys()


def test_a_scan_that_started_first_and_ended_last_keeps_the_newer_counters(
    tmp_path, monkeypatch
):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    first = rescanner.rescan()
    parent = next(iter(first.parents))
    with held_refresh(monkeypatch) as (inside, go):
        # An old steady rescan (the configured counter only) waits in its first parent ...
        old = threading.Thread(target=lambda: rescanner.rescan(lambda p: {CONFIGURED}))
        old.start()
        assert inside.wait(NO_HANG)
        # ... while the counters change and a periodic rescan reads them all.
        for type_id in first.parents[parent].types:
            with open(counter_path(root, parent, type_id), "w") as handle:
                handle.write("3\n")
        newer = rescanner.rescan(reread_mdevs=True)
        assert {t.available_instances for t in newer.parents[parent].types.values()} == {3}
        go.set()
        old.join(NO_HANG)
    # The old scan ended last; the listing still answers from the counters
    # read last (the mdev set did not change: it re-reads nothing).
    monkeypatch.setattr(attributes, "read_at", _no_counter_reads(attributes.read_at))
    listed = rescanner.listing()
    assert {t.available_instances for t in listed.parents[parent].types.values()} == {3}


def _no_counter_reads(real):
    def read_at(dir_fd, name):
        assert not name.endswith("available_instances"), f"{name} read again"
        return real(dir_fd, name)

    return read_at


def test_a_first_scan_vouches_for_its_counters(tmp_path, monkeypatch):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan(lambda p: {CONFIGURED})
    expected = scan(root)
    # The first scan listed the mdevs before it read the counters: the first
    # listing trusts them (no counter read again).
    monkeypatch.setattr(attributes, "read_at", _no_counter_reads(attributes.read_at))
    assert rescanner.listing().parents == expected.parents


def test_an_interrupted_scan_stops_only_inside_interruptible(tmp_path):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    rescanner.interrupt()
    with interruptible(), pytest.raises(ScanStopped):
        rescanner.rescan(reread_mdevs=True)
    with interruptible(), pytest.raises(ScanStopped):
        rescanner.listing()
    # An API request's scan (not interruptible) still finishes.
    assert rescanner.listing().parents.keys() == scan(root).parents.keys()


def test_a_scan_stops_between_parents_once_interrupted(tmp_path, monkeypatch):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    read: list[str] = []
    real = Rescanner._refresh_counters

    def count(walker, parent, wanted):
        read.append(parent.name)
        rescanner.interrupt()  # SIGTERM arrives while the first parent is read
        return real(walker, parent, wanted)

    monkeypatch.setattr(Rescanner, "_refresh_counters", staticmethod(count))
    with interruptible(), pytest.raises(ScanStopped):
        rescanner.rescan(reread_mdevs=True)
    assert len(read) == 1


def test_the_start_up_checks_scan_seeds_the_first_rescan(tmp_path, monkeypatch):
    root = tree(tmp_path, parents=4)
    scan_host(root, builtin())
    reads: list[str] = []
    real = attributes.read_at

    def counting(dir_fd, name):
        reads.append(name)
        return real(dir_fd, name)

    monkeypatch.setattr(attributes, "read_at", counting)
    host = HostRescanner(root, builtin())
    first = host.rescan(lambda p: {CONFIGURED})
    # Only the configured counter of each parent: no name, description,
    # device_api or vendor read again (sriov_totalvfs: the vendor-VFIO
    # discoverer's first look at each PCI function).
    assert [r for r in reads if r != "sriov_totalvfs"] == [
        f"{CONFIGURED}/available_instances"
    ] * 4
    assert first.parents == scan(root).parents
    # Once: the next rescanner of the same root reads the host itself.
    reads.clear()
    HostRescanner(root, builtin()).rescan(lambda p: {CONFIGURED})
    assert any(name.endswith("/name") for name in reads)


def test_a_kept_scan_of_another_root_is_not_used(tmp_path):
    root = tree(tmp_path / "a")
    other = tree(tmp_path / "b")
    scan_host(other, builtin())
    first = HostRescanner(root, builtin()).rescan()
    assert first.root == os.path.realpath(root)
    assert first.parents == scan(root).parents


def test_a_rescanner_that_scanned_takes_no_seed(tmp_path):
    root = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    assert rescanner.seed(scan(root), None) is False
