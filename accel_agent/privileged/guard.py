"""Deadlines, death detection and restarts for the agent's privsep helpers.

oslo.privsep's client (3.x) trusts its helper completely:

* a call waits for the answer as long as the helper takes: a helper that is
  stopped (SIGSTOP, a debugger, a wedged driver) blocks the calling thread,
  and with it the manager's lock and every later mutation, forever;
* when the helper dies with a request in flight, the client's reader thread
  usually ends with ``ConnectionResetError`` instead of at EOF, so the
  callers waiting for an answer are never told, and the channel still says
  ``running``: every later call is written into a dead socket and waits
  forever too;
* nothing starts a new helper then.

Seen on a simulated host (issue 21): a SIGSTOPped helper kept
``PUT /v1/instances/x/allocation`` unanswered for 150 s with ``/v1/health``
saying ``ok``; after SIGKILL every mutation hung and SIGTERM did not stop the
agent.  So every call of the agent's privileged contexts goes through a
:class:`Guard`:

* **a deadline**: ``[DEFAULT] privileged_call_timeout`` seconds, plus what
  the call itself may wait for in the helper (a remove's own timeout).  A
  helper that misses it is killed (SIGKILL through a pidfd, so a reused pid
  is never hit), its channel is abandoned (the socket shut down, which tells
  every caller still waiting at once) and a new helper is started;
* **death detection**: a monitor thread per channel notices the end of the
  reader thread, however it ended, fails the calls still waiting and starts
  a new helper;
* **the caller's view**: :class:`~accel_agent.exception.PrivilegedHelperUnavailable`
  (HTTP 503).  The write may or may not have happened (the helper may have
  been stopped before or after it); the manager keeps the operation's intent
  in the ledger and recovery settles it from what sysfs shows, exactly as
  after a crash of the agent itself;
* **health**: :meth:`Guard.health` says ``ok``, ``restarting`` or ``failed``
  with the reason, the helper's pid and how often it was restarted; the
  daemon's ``/v1/health`` is ``degraded`` while a helper is not ``ok``.

What is used of oslo.privsep beyond its documented API (checked by
tests/unit/test_privsep_guard.py against the installed version): an
entrypoint's ``_wrap_timeout`` keyword (what ``entrypoint_with_timeout``
passes), the context's ``channel``, and the client channel's
``reader_thread``, ``lock``, ``outstanding_msgs`` and ``writer.writesock``.

Longer than the package's other modules, on purpose: :class:`Guard` is one
state machine (stopped, starting, ok, restarting, failed) whose every
transition holds one lock, and its starts, kills, monitor and deadlines
read each other's state under it; cut in two, the locking rules would be
split across files.  It writes nothing itself; lifecycle.py gives each
context its guard.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accel_agent import exception

LOG = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT = 30.0
# A new helper must answer its first call within this many call deadlines,
# and never less than START_FLOOR seconds: its start (an interpreter,
# oslo.config, dropping capabilities) takes seconds on a loaded host (seen:
# 3 s on a busy 2-core machine), far more than one sysfs write.
START_DEADLINES = 2.0
START_FLOOR = 60.0


class HelperStartFailed(Exception):
    """The helper did not start, or not in time (internal)."""


@dataclass(frozen=True)
class HelperHealth:
    name: str
    state: str  # ok | starting | restarting | failed | stopped
    pid: int | None
    restarts: int
    last_error: str | None
    failed_at: float | None

    @property
    def ok(self) -> bool:
        # "stopped": not started yet (no privileged call so far), or the agent
        # is stopping; "starting": its first start.  Nothing is wrong with it.
        return self.state in ("ok", "stopped", "starting")

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class Guard:
    """One privsep context's calls, each with a deadline; its helper restarted
    when it misses one or dies.  Thread-safe."""

    def __init__(
        self,
        context: Any,
        name: str,
        start: Callable[[], None],
        pid_entrypoint: Callable[..., int],
        call_timeout: Callable[[], float] = lambda: DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.context = context
        self.name = name
        self._start = start
        self._pid_entrypoint = pid_entrypoint
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._state = "stopped"
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._channel: Any = None  # the channel this guard watches
        self._restarts = 0
        self._last_error: str | None = None
        self._failed_at: float | None = None
        self._starter: threading.Thread | None = None
        self._started = threading.Event()
        self._stopping = False
        # Told "restart" / "failure" (metrics); never raises into the guard.
        self.on_event: Callable[[str, str], None] = lambda name, event: None

    # --- calls ----------------------------------------------------------------------

    def call(self, entrypoint: Callable[..., Any], *args: Any, wait: float = 0.0,
             **kwargs: Any) -> Any:
        """``entrypoint(*args, **kwargs)`` in the helper, answered within the
        call timeout plus ``wait`` (what the call itself may wait for in the
        helper), else PrivilegedHelperUnavailable."""
        if not self.context.client_mode:
            # Inside the helper itself (or a test running entrypoints in
            # process): nothing to guard.
            return entrypoint(*args, **kwargs)
        deadline = self._call_timeout() + wait
        channel = self._ready_channel()
        try:
            return entrypoint(*args, _wrap_timeout=deadline, **kwargs)
        except Exception as exc:
            if not _is_channel_failure(exc):
                raise
            if _is_timeout(exc):
                reason = f"no answer within {deadline:g} s"
            elif self._outlives(channel):
                raise  # an OSError raised by the entrypoint in the helper itself
            else:
                reason = f"the helper's connection ended ({type(exc).__name__}: {exc})"
            self._failed(channel, reason)
            raise exception.PrivilegedHelperUnavailable(helper=self.name, reason=reason) from None

    def _ready_channel(self) -> Any:
        """The live channel, starting a helper first (bounded) when there is none."""
        with self._lock:
            if self._stopping:
                raise exception.PrivilegedHelperUnavailable(
                    helper=self.name, reason="the agent is stopping"
                )
            channel = self.context.channel
            if channel is not None and channel is self._channel and self._channel_alive(channel):
                return channel
            if channel is not None and channel is not self._channel:
                # Started by someone else (start_privsep at the daemon's start):
                # watch it from now on.
                self._adopt_locked(channel)
                return channel
            if channel is not None:
                self._abandon_locked(channel, "its connection ended")
            starter = self._begin_start_locked()
        if not starter.join_started(self._start_budget()):
            raise exception.PrivilegedHelperUnavailable(
                helper=self.name,
                reason=f"a new helper did not answer within {self._start_budget():g} s",
            )
        with self._lock:
            channel = self.context.channel
            if channel is None or channel is not self._channel or self._state != "ok":
                raise exception.PrivilegedHelperUnavailable(
                    helper=self.name, reason=self._last_error or "it could not be started"
                )
            return channel

    def _start_budget(self) -> float:
        return max(START_FLOOR, START_DEADLINES * self._call_timeout())

    # --- starting -------------------------------------------------------------------

    def _begin_start_locked(self) -> _Starter:
        """A background start of a new helper (one at a time)."""
        starter = self._starter
        if isinstance(starter, _Starter) and starter.is_alive():
            return starter
        self._state = "restarting" if self._restarts or self._last_error else "starting"
        starter = _Starter(self)
        self._starter = starter
        starter.start()
        return starter

    def _start_now(self) -> None:
        """Run in the starter thread: start the helper and learn its pid."""
        try:
            if self.context.channel is None:
                self._start()
            channel = self.context.channel
            if channel is None:
                raise HelperStartFailed("oslo.privsep left no channel")
            pid = int(self._pid_entrypoint(_wrap_timeout=self._call_timeout()))
        except Exception as exc:  # any failure to start is reported, never raised here
            reason = f"cannot start the helper: {type(exc).__name__}: {exc}"
            with self._lock:
                if self.context.channel is not None:
                    self._abandon_locked(self.context.channel, reason)
                self._state = "failed"
                self._last_error = reason
                self._failed_at = time.time()
            LOG.error("privileged helper %s: %s", self.name, reason)
            self.on_event(self.name, "start_failed")
            return
        with self._lock:
            if self._stopping:
                self._abandon_locked(channel, "the agent is stopping")
                return
            self._watch_locked(channel, pid)
            restarted = self._restarts > 0 or self._last_error is not None
            self._state = "ok"
        if restarted:
            LOG.warning("privileged helper %s restarted (pid %d)", self.name, pid)
        else:
            LOG.info("privileged helper %s running (pid %d)", self.name, pid)

    def _adopt_locked(self, channel: Any) -> None:
        """Watch a channel started outside the guard; its pid is asked for
        in the background (the caller's own call follows)."""
        self._watch_locked(channel, None)
        self._state = "ok"
        threading.Thread(
            target=self._learn_pid, args=(channel,), name=f"privsep-pid-{self.name}",
            daemon=True,
        ).start()

    def _learn_pid(self, channel: Any) -> None:
        try:
            pid = int(self._pid_entrypoint(_wrap_timeout=self._call_timeout()))
        except Exception as exc:
            if _is_channel_failure(exc):
                self._failed(channel, f"no answer to the pid request ({type(exc).__name__})")
            return
        with self._lock:
            if self._channel is channel:
                self._set_pid_locked(pid)

    def _watch_locked(self, channel: Any, pid: int | None) -> None:
        self._channel = channel
        self._set_pid_locked(pid)
        threading.Thread(
            target=self._monitor, args=(channel,), name=f"privsep-monitor-{self.name}",
            daemon=True,
        ).start()

    def _set_pid_locked(self, pid: int | None) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None
        self._pid = pid
        if pid is not None:
            failure: OSError | None = None
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError as exc:  # gone already: the monitor will see the channel end
                failure = exc
            # Logged outside the except clause: oslo.log appends the exception
            # being handled to a WARNING, which would say it twice.
            if failure is not None:
                LOG.warning("privileged helper %s: pid %d: %s", self.name, pid, failure)

    # --- failures -------------------------------------------------------------------

    def _monitor(self, channel: Any) -> None:
        """Wait for the channel's reader thread to end, however it ends (EOF,
        ConnectionResetError), then fail every call still waiting on it."""
        channel.reader_thread.join()
        error = OSError(errno.EPIPE, f"privileged helper {self.name}: connection ended")
        with channel.lock:
            for future in list(channel.outstanding_msgs.values()):
                if future.error is None and future.data is None:
                    future.set_exception(error)
            channel.running = False
        sock = getattr(getattr(channel, "writer", None), "writesock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._failed(channel, "its connection ended (the helper died or was killed)")

    def _failed(self, channel: Any, reason: str) -> None:
        """``channel``'s helper failed: kill it, abandon the channel, start a
        new helper in the background.  Only the first report per channel acts."""
        with self._lock:
            if channel is not self._channel or self._stopping:
                return
            LOG.error("privileged helper %s (pid %s) failed: %s; killing it and starting "
                      "a new one", self.name, self._pid, reason)
            self._abandon_locked(channel, reason)
            self._restarts += 1
            self._last_error = reason
            self._failed_at = time.time()
            self._begin_start_locked()
        self.on_event(self.name, "restart")

    def _abandon_locked(self, channel: Any, reason: str) -> None:
        """Kill the helper and drop its channel without waiting for either: a
        helper stuck in the kernel (a blocked remove) cannot die at once,
        and joining its reader would block the agent with it."""
        self._kill_locked()
        sock = getattr(getattr(channel, "writer", None), "writesock", None)
        if sock is not None:
            # Wakes the reader at once (EOF), which fails the callers still waiting.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self.context.channel is channel:
            self.context.channel = None
        if self._channel is channel:
            self._channel = None
        self._set_pid_locked(None)

    def _kill_locked(self) -> None:
        failure: OSError | None = None
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            elif self._pid is not None and _is_privsep_helper(self._pid):
                # No pidfd (a seccomp filter without pidfd_open): the pid, once
                # /proc says it is still a privsep helper.
                os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it exited already
        except OSError as exc:
            failure = exc
        if failure is not None:  # outside the except clause: said once
            LOG.warning(
                "privileged helper %s: cannot kill pid %s: %s", self.name, self._pid, failure
            )

    @staticmethod
    def _channel_alive(channel: Any) -> bool:
        return bool(channel.running) and channel.reader_thread.is_alive()

    def _outlives(self, channel: Any) -> bool:
        """After an OSError: is the channel still up?  A write into a dead
        helper's socket fails before the reader has seen the end, so give
        the reader a moment to see it."""
        channel.reader_thread.join(0.5)
        return self._channel_alive(channel)

    # --- the daemon's view ------------------------------------------------------------

    def health(self) -> HelperHealth:
        with self._lock:
            return HelperHealth(
                self.name, self._state, self._pid, self._restarts, self._last_error,
                self._failed_at,
            )

    def ensure(self) -> None:
        """Start a new helper in the background if the last one failed and
        none is starting (the daemon's periodic check: health recovers without
        waiting for a caller)."""
        with self._lock:
            if self._state == "failed" and not self._stopping:
                self._begin_start_locked()

    def start(self) -> None:
        """Start the helper now and wait for it (the daemon's start-up):
        raises PrivilegedHelperUnavailable when it does not answer in time."""
        with self._lock:
            self._stopping = False
            if self._channel is not None and self._channel_alive(self._channel):
                return
            starter = self._begin_start_locked()
        if not starter.join_started(self._start_budget()):
            raise exception.PrivilegedHelperUnavailable(
                helper=self.name,
                reason=f"it did not answer within {self._start_budget():g} s of its start",
            )
        with self._lock:
            if self._state != "ok":
                raise exception.PrivilegedHelperUnavailable(
                    helper=self.name, reason=self._last_error or "it could not be started"
                )

    def kill(self) -> None:
        """Kill the helper now (SIGTERM's last step, and tests); calls still
        waiting on it fail at once."""
        with self._lock:
            channel = self._channel
            if channel is not None:
                self._abandon_locked(channel, "killed")

    def stop(self, grace: float = 2.0) -> None:
        """The agent is stopping: no new call, no restart.  The helper is told
        (EOF on its socket: it exits by itself) and killed if it has not gone
        within ``grace`` seconds."""
        with self._lock:
            self._stopping = True
            self._state = "stopped"
            channel = self._channel
        if channel is not None:
            sock = getattr(getattr(channel, "writer", None), "writesock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
            channel.reader_thread.join(grace)
        self.kill()


class _Starter(threading.Thread):
    """The background start of one helper."""

    def __init__(self, guard: Guard) -> None:
        super().__init__(name=f"privsep-start-{guard.name}", daemon=True)
        self._guard = guard

    def run(self) -> None:
        self._guard._start_now()

    def join_started(self, timeout: float) -> bool:
        self.join(timeout)
        return not self.is_alive()


def _is_privsep_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"--privsep_context" in handle.read().split(b"\0")
    except OSError:
        return False


def _is_timeout(exc: BaseException) -> bool:
    from oslo_privsep.comm import PrivsepTimeout

    return isinstance(exc, PrivsepTimeout)


def _is_channel_failure(exc: BaseException) -> bool:
    """What the client raises when the channel, not the entrypoint, failed:
    its timeout, a premature EOF (OSError), a write into a closed socket."""
    return _is_timeout(exc) or isinstance(exc, OSError)
