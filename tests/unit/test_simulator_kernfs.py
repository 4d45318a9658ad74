"""The simulator's file side (kernfs.py), through a real host: a read is a
seq_file snapshot, a removed node answers ENODEV to the handle that had it
open, and ``stall_reads`` holds matching reads (only those) until unstalled,
counting them."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost

U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
TYPE = "class/mdev_bus/mtty/mdev_supported_types/mtty-1"
COUNTER = f"{TYPE}/available_instances"


@pytest.fixture
def mtty() -> SimulatedHost:
    return SimulatedHost(profiles.mtty())


def wait_until(predicate) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.01)


def test_a_read_continues_in_its_snapshot_until_offset_zero(mtty):
    handle = mtty.open(COUNTER)
    assert handle.pread(1, 0) == b"2"
    mtty.create_mdev("mtty", "mtty-1", U1)  # the counter moves to 23
    assert handle.pread(10, 1) == b"4\n"  # the rest of the value read at offset 0
    assert handle.pread(10, 0) == b"23\n"  # a new read from the start is fresh


def test_a_handle_on_a_removed_node_gets_enodev(mtty):
    handle = mtty.open(f"{TYPE}/create")
    mtty.unregister_parent("mtty")
    with pytest.raises(OSError) as caught:
        handle.write(U1.encode())
    assert caught.value.errno == errno.ENODEV
    assert mtty.mdevs() == []


def read_in_thread(host: SimulatedHost, path: str, into: list[bytes]) -> threading.Thread:
    # daemon: a read that a broken model stalls for ever must not keep pytest alive.
    reader = threading.Thread(target=lambda: into.append(host.open(path).pread(4096, 0)),
                              daemon=True)
    reader.start()
    return reader


def test_a_stalled_read_waits_until_unstalled_and_only_it(mtty):
    mtty.stall_reads("available_instances")  # until unstalled
    try:
        got: list[bytes] = []
        reader = read_in_thread(mtty, COUNTER, got)
        wait_until(lambda: mtty.status()["stalled_readers"] == 1)
        # Other requests are served meanwhile, a create included.
        other: list[bytes] = []
        read_in_thread(mtty, f"{TYPE}/device_api", other).join(10)
        assert other == [b"vfio-pci\n"]
        mtty.create_mdev("mtty", "mtty-1", U1)
        assert reader.is_alive() and got == []
    finally:
        mtty.unstall_reads()
    reader.join(10)
    assert got == [b"23\n"]
    status = mtty.status()
    assert (status["stalled_reads"], status["stalled_readers"]) == (1, 0)


def test_a_timed_stall_counts_every_matching_read(mtty):
    mtty.stall_reads("mtty-1/available", seconds=0)
    for _ in range(3):
        assert mtty.open(COUNTER).pread(4096, 0) == b"24\n"
    mtty.open(f"{TYPE}/device_api").pread(4096, 0)  # does not match
    assert mtty.status()["stalled_reads"] == 3


@pytest.mark.parametrize(("match", "seconds"), [("", None), ("x", -1), ("x", 3601)])
def test_stall_reads_refuses_bad_arguments_and_changes_nothing(mtty, match, seconds):
    with pytest.raises(ValueError, match=r"path fragment and 0\.\.3600 seconds"):
        mtty.stall_reads(match, seconds)
    assert mtty.open(COUNTER).pread(4096, 0) == b"24\n"
    assert mtty.status()["stalled_reads"] == 0
