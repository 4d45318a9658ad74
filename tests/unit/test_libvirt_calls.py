"""Every call to libvirt with a deadline (accel_agent/devices/libvirt_calls.py),
against a wedged libvirtd (tests/wedged_libvirt.py: a socket that accepts and
never answers, on which libvirt-python's client really blocks) and libvirt's
test:/// driver for one that answers.

The rules, not timings: a call libvirt does not answer returns (an error,
the thread guard only fails a hang), the state says stalled, later calls are
not tried, the threads in libvirt stay bounded, and a probe brings the state
back once libvirt answers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from accel_agent import exception
from accel_agent.devices import libvirt_calls
from accel_agent.devices.libvirt_calls import LibvirtChannel
from tests.wedged_libvirt import GUARD, WedgedLibvirtd, guarded, wait_for

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")

def versions(_libvirt: Any, conn: Any) -> int:
    return int(conn.getLibVersion())


@pytest.fixture
def wedged():
    with WedgedLibvirtd() as server:
        yield server


def test_a_call_libvirt_does_not_answer_ends_at_its_deadline_and_later_ones_at_once(wedged):
    channel = LibvirtChannel(wedged.uri, timeout=0.5)
    _, error = guarded(lambda: channel.call("listing the domains", versions))
    assert isinstance(error, exception.LibvirtStalled)
    assert "listing the domains did not answer within 0.5 s" in error.message
    status = channel.status()
    assert (status.state, status.blocked) == (libvirt_calls.STALLED, 1)
    assert "did not answer within 0.5 s" in (status.last_error or "")
    # Later calls are not tried: no thread waits, whoever asks.
    for _ in range(20):
        _, error = guarded(lambda: channel.call("an undefine", versions, write=True))
        assert isinstance(error, exception.LibvirtStalled)
        assert "an undefine was not tried" in error.message
    # The first call, plus at most one probe of whether libvirt answers again.
    assert wedged.accepted <= 2


def test_the_threads_in_libvirt_stay_bounded_however_many_callers(wedged):
    channel = LibvirtChannel(wedged.uri, timeout=1)
    outcomes: list[BaseException | None] = []
    callers = [
        threading.Thread(target=lambda: outcomes.append(guarded(
            lambda: channel.call("a listing", versions))[1]))
        for _ in range(3 * libvirt_calls.MAX_CALLS)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(GUARD)
    assert len(outcomes) == len(callers)
    assert all(isinstance(e, exception.LibvirtStalled) for e in outcomes), outcomes
    # Calls waiting for a place failed when libvirt was found stalled; at most
    # MAX_CALLS connections were ever made for calls, one more for the probe.
    assert wedged.accepted <= libvirt_calls.MAX_CALLS + 1
    assert channel.status().blocked <= libvirt_calls.MAX_CALLS


class Switch:
    """libvirt-python, but the URI opened is the wedged one until ``answer``
    is set, then the test driver's (a libvirtd that answers again)."""

    def __init__(self, wedged_uri: str) -> None:
        self.wedged_uri = wedged_uri
        self.answer = threading.Event()
        self.libvirtError = libvirt.libvirtError

    def __call__(self) -> Switch:
        return libvirt_calls.import_libvirt() and self

    def _uri(self) -> str:
        return "test:///default" if self.answer.is_set() else self.wedged_uri

    def open(self, uri: str) -> Any:
        return libvirt.open(self._uri())

    def openReadOnly(self, uri: str) -> Any:
        return libvirt.openReadOnly(self._uri())


def test_a_probe_brings_it_back_once_libvirt_answers_again(wedged):
    switch = Switch(wedged.uri)
    channel = LibvirtChannel(wedged.uri, timeout=0.5, opener=switch)
    _, error = guarded(lambda: channel.call("listing", versions))
    assert isinstance(error, exception.LibvirtStalled)
    generation = channel.generation
    switch.answer.set()
    # health's look (status) starts the probe; the state comes back to ok
    wait_for(lambda: channel.status().state == libvirt_calls.OK, "libvirt ok again")
    assert channel.generation > generation  # a listing's kept "stalled" is dropped
    assert channel.status().blocked == 1  # the abandoned call is still blocked
    result, error = guarded(lambda: channel.call("listing", versions))
    assert error is None and result > 0
    # The wedged libvirtd goes: the abandoned call returns, nothing is left blocked.
    wedged.close()
    wait_for(lambda: channel.status().blocked == 0, "the abandoned call returned")
    assert channel.status().state == libvirt_calls.OK


def test_libvirt_not_running_is_unreachable_at_once(tmp_path):
    channel = LibvirtChannel(f"qemu+unix:///system?socket={tmp_path}/none", timeout=30)
    _, error = guarded(lambda: channel.call("listing", versions))
    assert isinstance(error, libvirt_calls.Unreachable)
    assert "Failed to connect socket" in str(error)
    status = channel.status()
    assert status.state == libvirt_calls.UNREACHABLE and status.blocked == 0


def test_libvirts_own_error_is_an_answer_raised_as_it_is():
    channel = LibvirtChannel("test:///default", timeout=30)

    def missing(_libvirt: Any, conn: Any) -> Any:
        return conn.lookupByName("no-such-domain")

    _, error = guarded(lambda: channel.call("a lookup", missing))
    assert isinstance(error, libvirt.libvirtError)
    assert channel.status().state == libvirt_calls.OK


def test_the_migration_version_probe_has_the_deadline_too(wedged):
    from accel_agent.migration import versions as versions_mod

    _, error = guarded(lambda: versions_mod.probe_uri(wedged.uri, timeout=0.5))
    assert isinstance(error, exception.LibvirtStalled)
    assert "asking its libvirt and QEMU versions did not answer" in error.message
