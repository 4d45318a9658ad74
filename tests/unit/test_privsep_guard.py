"""What accel_agent.privileged.guard uses of oslo.privsep beyond its documented
API, pinned against the installed version: an upgrade that renames one of
these fails here by name, not as a hang in production."""

from __future__ import annotations

import inspect
import socket

from oslo_privsep import comm, priv_context

from accel_agent import privileged
from accel_agent.privileged import context, guard, wire


def test_an_entrypoint_takes_the_timeout_keyword_and_names_its_context():
    assert "_wrap_timeout" in inspect.signature(priv_context.PrivContext._wrap).parameters
    sysfs = getattr(context._priv_sysfs_pid, priv_context._ENTRYPOINT_ATTR)
    assert sysfs is privileged.sysfs_admin
    assert privileged.guard_of(sysfs).name == "sysfs"
    net = getattr(context._priv_net_pid, priv_context._ENTRYPOINT_ATTR)
    assert net is privileged.net_admin
    assert privileged.guard_of(net).name == "net"


def test_the_client_channel_has_what_the_monitor_reads():
    ours, theirs = socket.socketpair()
    try:
        channel = comm.ClientChannel(ours)
        assert channel.reader_thread.is_alive()
        assert isinstance(channel.outstanding_msgs, dict)
        assert channel.writer.writesock is ours
        with channel.lock:
            future = comm.Future(channel.lock)
            assert (future.error, future.data) == (None, None)
            future.set_exception(OSError("gone"))
            assert isinstance(future.error, OSError)
        # What the guard's abandon does: the reader ends at once.
        ours.shutdown(socket.SHUT_RDWR)
        channel.reader_thread.join(5)
        assert not channel.reader_thread.is_alive()
    finally:
        ours.close()
        theirs.close()


def test_a_timeout_and_a_dead_channel_are_channel_failures_other_errors_are_not():
    assert guard._is_channel_failure(comm.PrivsepTimeout())
    assert guard._is_channel_failure(OSError("Premature eof"))
    assert guard._is_channel_failure(BrokenPipeError())
    assert not guard._is_channel_failure(wire.WireError("X", "y", {}))
    assert not guard._is_channel_failure(ValueError())


def test_health_says_ok_only_when_nothing_is_wrong():
    def health(state: str) -> guard.HelperHealth:
        return guard.HelperHealth("sysfs", state, None, 0, None, None)

    assert [s for s in ("ok", "starting", "restarting", "failed", "stopped") if health(s).ok] == [
        "ok", "starting", "stopped"
    ]
