"""Every call the agent makes to libvirt, with a deadline.

libvirt-python's calls have no timeout.  A libvirtd that accepts a
connection and never answers (wedged on a driver lock, stopped with
SIGSTOP, a socket some other process holds) kept the calling thread for
ever: an mdev listing in an API worker, a release holding the manager's
lock (and with it every allocation), ``accelctl adopt --from-libvirt``.
So every call goes through the one :class:`LibvirtChannel` of its URI
(:func:`channel_for`), which opens the connection, runs the call and closes
it on a thread of its own, and waits at most ``[libvirt] call_timeout``:

* a call that libvirt answers, with its result or with one of its errors,
  leaves the state ``ok``; the caller gets the result, or the error as
  libvirt-python raised it;
* a connection that cannot be opened (libvirtd not running, the socket
  missing, libvirt-python not installed) is ``unreachable``: the caller gets
  :class:`Unreachable` at once, as before any deadline existed;
* a call past its deadline is abandoned: the caller gets
  :class:`~accel_agent.exception.LibvirtStalled`, the state is ``stalled``
  from then on, and every later call fails at once with the same error
  instead of waiting (whoever holds the manager's lock or an API worker
  holds it at most one deadline, once per stall).  A C call cannot be
  interrupted: the abandoned thread stays blocked in libvirt until libvirt
  answers it or drops the connection;
* while libvirt is stalled (or unreachable, or not asked yet), a probe (a
  fresh connection asking libvirt's version) runs on its own thread, at most
  one at a time and at most once per deadline, started by the next call or
  by a look at :meth:`LibvirtChannel.status` (``/v1/health``).  When the
  probe or an abandoned call is answered, the state is ``ok`` again.

Threads are bounded: at most :data:`MAX_CALLS` calls of one URI are in libvirt
at once, abandoned ones included (an abandoned call keeps its place until
libvirt lets it go), plus one probe.  A call that finds no free place waits
for one within its own deadline, so a wedged libvirt can never pile up
threads, however many callers keep trying.

The C library's default error handler prints every error to stderr
(``libvirt: XML-RPC error : ...``) besides raising it; the channel installs
a quiet one when it imports libvirt, so each error is said once, by the
agent, in its own words.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, TypeVar

from accel_agent import exception

LOG = logging.getLogger(__name__)

T = TypeVar("T")

# [libvirt] call_timeout's default: a node-device listing of a host with
# hundreds of mdevs (four RPCs each) or an undefine through mdevctl takes a
# second or two; a libvirtd that has not answered in 20 s is not coming back soon.
DEFAULT_TIMEOUT = 20.0
# Calls of one URI in libvirt at once, abandoned ones included.
MAX_CALLS = 4

# The states (GET /v1/health's libvirt.state; "not_configured" is health's own).
UNKNOWN = "unknown"  # not asked yet
OK = "ok"
UNREACHABLE = "unreachable"
STALLED = "stalled"


class Unreachable(Exception):
    """libvirt's connection could not be opened (or libvirt-python is not
    installed); ``str()`` says why.  The adaptors (domains, nodedevs) raise
    it as their own exception."""


def import_libvirt() -> ModuleType:
    """libvirt-python, with the C library's printing of errors turned off."""
    import libvirt  # imported here: the CLI's listings must not pay for it

    # Each error is raised as an exception and said once by whoever handles it.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


@dataclass(frozen=True)
class Status:
    """What health shows of one URI's libvirt."""

    uri: str
    state: str
    since: float | None  # wall-clock time the state began
    last_error: str | None
    timeout: float
    blocked: int  # abandoned calls still blocked in libvirt

    def to_dict(self, iso: Callable[[float | None], str | None]) -> dict[str, Any]:
        return {
            "state": self.state,
            "uri": self.uri,
            "since": iso(self.since),
            "last_error": self.last_error,
            "call_timeout": self.timeout,
            "blocked_calls": self.blocked,
        }


class _Call:
    """One call handed to a thread: its outcome, once there is one."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = threading.Event()
        self.abandoned = False  # its caller stopped waiting (under the channel's lock)
        self.result: Any = None
        self.error: BaseException | None = None


class LibvirtChannel:
    """The calls to libvirt at one URI, each with a deadline.

    ``opener`` returns a libvirt-python-shaped module (tests give a fake);
    the default imports libvirt quietly (:func:`import_libvirt`)."""

    def __init__(
        self,
        uri: str,
        timeout: float = DEFAULT_TIMEOUT,
        opener: Callable[[], Any] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.uri = uri
        self.timeout = timeout
        self._opener = opener or import_libvirt
        self._wall = wall
        self._cond = threading.Condition()
        self._state = UNKNOWN
        self._since: float | None = None
        self._last_error: str | None = None
        self._running = 0  # calls in libvirt, abandoned ones included
        self._abandoned = 0
        self._probing = False
        self._last_probe = float("-inf")  # monotonic
        # Bumped at every change of state: what a listing's kept copy of
        # libvirt's answer is checked against.
        self.generation = 0

    # --- calls ---------------------------------------------------------------------------

    def call(self, what: str, run: Callable[[Any, Any], T], *, write: bool = False) -> T:
        """``run(libvirt, conn)`` on a connection opened for it (read-only
        unless ``write``), waiting at most ``timeout`` seconds in all.

        Raises LibvirtStalled (deadline, or libvirt stalled already),
        Unreachable (the connection could not be opened), or whatever
        ``run`` raised (libvirt's own errors included)."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                if self._state == STALLED:
                    self._kick_probe_locked()
                    raise self._stalled_error(what)
                if self._running < MAX_CALLS:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    # Every place is held by a call libvirt does not answer.
                    self._stall_locked(f"{self._running} calls did not return ({what} waited "
                                       f"{self.timeout:g} s for a place)")
                    raise self._stalled_error(what)
                self._cond.wait(left)
            self._running += 1
        job = _Call(what)
        thread = threading.Thread(
            target=self._run, args=(job, run, write), name="libvirt-call", daemon=True
        )
        thread.start()
        if job.done.wait(max(0.0, deadline - time.monotonic())):
            return self._outcome(job)
        with self._cond:
            if not job.done.is_set():  # (it may have been answered at the very deadline)
                job.abandoned = True
                self._abandoned += 1
                self._stall_locked(f"{what} did not answer within {self.timeout:g} s")
                raise self._stalled_error(what, fresh=True)
        return self._outcome(job)

    @staticmethod
    def _outcome(job: _Call) -> Any:
        if job.error is not None:
            raise job.error
        return job.result

    def _run(self, job: _Call, run: Callable[[Any, Any], Any], write: bool) -> None:
        state, error = OK, None
        try:
            job.result = self._connected(run, write)
        except Unreachable as exc:
            state, error = UNREACHABLE, str(exc)
            job.error = exc
        except BaseException as exc:  # libvirt answered with an error, or a bug: the caller's
            job.error = exc
        with self._cond:
            self._running -= 1
            job.done.set()
            if job.abandoned:
                self._abandoned -= 1
                LOG.info("libvirt at %s answered %s, %s after its deadline",
                         self.uri, job.what, "with an error" if job.error else "at last")
            # An abandoned call's late outcome says something only while
            # libvirt is stalled; once a newer call or probe answered, it is old news.
            if not job.abandoned or self._state == STALLED:
                self._answered_locked(state, error)
            self._cond.notify_all()

    def _connected(self, run: Callable[[Any, Any], Any], write: bool) -> Any:
        try:
            libvirt = self._opener()
        except ImportError:
            raise Unreachable("libvirt-python is not installed") from None
        try:
            conn = libvirt.open(self.uri) if write else libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            raise Unreachable(str(exc)) from None
        try:
            return run(libvirt, conn)
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    # --- the state -----------------------------------------------------------------------

    def status(self) -> Status:
        """The state now; starts a probe when libvirt is not known to answer."""
        with self._cond:
            if self._state != OK:
                self._kick_probe_locked()
            return Status(self.uri, self._state, self._since, self._last_error, self.timeout,
                          self._abandoned)

    def _set_locked(self, state: str, error: str | None) -> None:
        if state != self._state:
            self._state, self._since = state, self._wall()
            self.generation += 1
        if error != self._last_error:
            self._last_error = error
            self.generation += 1

    def _stall_locked(self, why: str) -> None:
        if self._state != STALLED:
            LOG.warning("libvirt at %s is not answering: %s; every call to it fails at once "
                        "until it answers again ([libvirt] call_timeout)", self.uri, why)
            self._set_locked(STALLED, why)
        self._cond.notify_all()  # callers waiting for a place fail now

    def _answered_locked(self, state: str, error: str | None) -> None:
        """A call or a probe came back: libvirt answered (OK) or could not be
        reached (UNREACHABLE); either way it is no longer stalled."""
        if self._state == STALLED:
            LOG.warning("libvirt at %s answers again (%s)", self.uri,
                        "reachable" if state == OK else f"but: {error}")
        self._set_locked(state, error)

    def _stalled_error(self, what: str, fresh: bool = False) -> exception.LibvirtStalled:
        if fresh:  # this very call missed its deadline
            reason = f"{what} did not answer within {self.timeout:g} s ([libvirt] call_timeout)"
        else:
            since = datetime.fromtimestamp(self._since or 0, UTC).isoformat(timespec="seconds")
            reason = (f"stalled since {since} ({self._last_error}); {what} was not tried")
        return exception.LibvirtStalled(uri=self.uri, reason=reason)

    # --- the probe -----------------------------------------------------------------------

    def _kick_probe_locked(self) -> None:
        now = time.monotonic()
        if self._probing or now - self._last_probe < self.timeout:
            return
        self._probing, self._last_probe = True, now
        threading.Thread(target=self._probe, name="libvirt-probe", daemon=True).start()

    def _probe(self) -> None:
        state, error = OK, None
        try:
            self._connected(lambda _libvirt, conn: conn.getLibVersion(), write=False)
        except Unreachable as exc:
            state, error = UNREACHABLE, str(exc)
        except BaseException as exc:  # an answer, though an error: libvirt is there
            LOG.debug("libvirt probe at %s: %s", self.uri, exc)
        with self._cond:
            self._probing = False
            if self._state == STALLED and self._running >= MAX_CALLS:
                # It answers new connections, but every place is held by a call
                # it never answered: calls would still wait, so still stalled.
                return
            self._answered_locked(state, error)
            self._cond.notify_all()


_channels: dict[str, LibvirtChannel] = {}
_channels_lock = threading.Lock()


def channel_for(uri: str, timeout: float | None = None) -> LibvirtChannel:
    """The process's one channel to ``uri`` (its state is shared by every
    user of that URI: listings, removes, takeovers, health); ``timeout``
    (``[libvirt] call_timeout``) replaces its deadline from the next call."""
    with _channels_lock:
        channel = _channels.get(uri)
        if channel is None:
            channel = _channels[uri] = LibvirtChannel(uri)
    if timeout is not None:
        channel.timeout = timeout
    return channel


def status_of(uri: str) -> Status | None:
    """The state of libvirt at ``uri`` (None: no URI, libvirt not configured)."""
    return channel_for(uri).status() if uri else None
