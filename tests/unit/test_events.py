"""Rescan scheduling (debounce, periodic safety net) and the udev event filter."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from accel_agent import events


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


class Recorder:
    def __init__(self) -> None:
        self.batches: list[frozenset[str]] = []
        self.lock = threading.Lock()

    def __call__(self, reasons: frozenset[str]) -> None:
        with self.lock:
            self.batches.append(reasons)


def running(scheduler: events.RescanScheduler) -> threading.Thread:
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    return thread


def test_a_burst_of_requests_is_one_rescan_with_every_reason():
    recorder = Recorder()
    scheduler = events.RescanScheduler(recorder, interval=3600, debounce=0.05)
    for reason in ("udev", "api", "udev", "reload"):
        scheduler.request(reason)  # before the loop runs: one pending batch
    thread = running(scheduler)
    wait_until(lambda: recorder.batches)
    scheduler.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert recorder.batches == [frozenset({"udev", "api", "reload"})]


def test_periodic_rescans_without_any_request():
    recorder = Recorder()
    scheduler = events.RescanScheduler(recorder, interval=0.02, debounce=0)
    thread = running(scheduler)
    wait_until(lambda: len(recorder.batches) >= 3)
    scheduler.stop()
    thread.join(5)
    assert set(recorder.batches[:3]) == {frozenset({events.PERIODIC})}


def test_configure_shortens_a_long_wait():
    recorder = Recorder()
    scheduler = events.RescanScheduler(recorder, interval=3600, debounce=0)
    thread = running(scheduler)
    scheduler.configure(interval=0.01, debounce=0)
    wait_until(lambda: frozenset({events.PERIODIC}) in recorder.batches)
    scheduler.stop()
    thread.join(5)
    assert scheduler.interval == 0.01


def test_a_failing_rescan_does_not_end_the_loop():
    calls: list[frozenset[str]] = []

    def rescan(reasons: frozenset[str]) -> None:
        calls.append(reasons)
        raise RuntimeError("boom")

    scheduler = events.RescanScheduler(rescan, interval=3600, debounce=0)
    thread = running(scheduler)
    scheduler.request("a")
    wait_until(lambda: len(calls) == 1)
    scheduler.request("b")
    wait_until(lambda: len(calls) == 2)
    scheduler.stop()
    thread.join(5)
    assert calls == [frozenset({"a"}), frozenset({"b"})]


def test_stop_interrupts_the_debounce():
    recorder = Recorder()
    scheduler = events.RescanScheduler(recorder, interval=3600, debounce=3600)
    thread = running(scheduler)
    scheduler.request("udev")
    scheduler.stop()
    thread.join(5)
    assert not thread.is_alive() and recorder.batches == []


# --- uevents --------------------------------------------------------------------------


@dataclass
class FakeDevice:
    """What pyudev hands the observer's callback: the attributes we read."""

    subsystem: str | None
    action: str = "change"
    sys_path: str = "/sys/devices/x"
    properties: dict[str, Any] = field(default_factory=dict)


@pytest.mark.parametrize(
    "device, relevant",
    [
        (FakeDevice("mdev", "add", "/sys/devices/pci0000:00/0000:00:02.0/u"), True),
        (FakeDevice("mdev", "remove"), True),
        (FakeDevice("pci", properties={"MDEV_STATE": "registered"}), True),
        (FakeDevice("mtty", properties={"MDEV_STATE": "unregistered"}), True),
        (FakeDevice("pci", properties={"DRIVER": "nvidia"}), False),
        (FakeDevice("net", "add"), False),
        (FakeDevice(None), False),
    ],
)
def test_which_uevents_matter(device, relevant):
    assert events.is_relevant(device) is relevant


def test_watcher_turns_relevant_events_into_rescan_requests():
    recorder = Recorder()
    scheduler = events.RescanScheduler(recorder, interval=3600, debounce=0.01)
    watcher = events.UdevWatcher(scheduler.request)
    watcher.handle(FakeDevice("net", "add"))
    watcher.handle(FakeDevice("mdev", "remove"))
    watcher.handle(FakeDevice("pci", properties={"MDEV_STATE": "registered"}))
    assert watcher.events == 2
    thread = running(scheduler)
    wait_until(lambda: recorder.batches)
    scheduler.stop()
    thread.join(5)
    assert recorder.batches == [frozenset({events.UDEV})]


def test_udev_only_for_the_real_sysfs(tmp_path):
    assert events.wants_udev("/sys", True)
    assert not events.wants_udev("/sys", False)
    assert not events.wants_udev(str(tmp_path), True)


def test_the_real_monitor_starts_and_stops_where_netlink_works():
    watcher = events.UdevWatcher(lambda reason: None)
    if not watcher.start():
        pytest.skip("no uevent netlink socket here")
    try:
        assert watcher.running and watcher.source in ("udev", "kernel")
    finally:
        watcher.stop()
    assert not watcher.running
