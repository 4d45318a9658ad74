"""One deadline for the whole of a Placement answer: status line, headers and body.

keystoneauth's ``timeout`` reaches requests and urllib3 as a timeout per
socket operation: a Placement (or anything in front of it) that sends a byte
every few seconds never trips it.  One that sent its headers at once and
then its body at a byte a second held a sync for 801 s: the reader's own
deadline was checked between two 64 KiB reads, and one read waits for 64 KiB.
Headers at a byte a second took 35 s to fail (http.client's limits on a line).

So each request of :class:`~.client.PlacementClient` runs :func:`within` a
deadline (``[placement] timeout``), and when it passes a watchdog thread shuts
the request's socket down (``shutdown(SHUT_RDWR)``): the read blocked on it
returns at once, whatever it was reading, and the client says the answer
missed its deadline.  Why this and not a per-read timeout set to what is left:
that needs a hook before every ``recv`` of every layer that reads (http.client
for the status line and headers, urllib3 for the body, ssl below both), in
code this module does not own; a shutdown needs only the socket, reaches a
read blocked anywhere (TLS included), and cannot be undone by a layer that
sets its own timeout.  ``shutdown``, never ``close``: another thread is
inside a call on that descriptor, and a closed number could be reused.

The socket is found by a connection class that registers itself with the
thread's current deadline when it connects and when it sends a request
(:func:`watch`, installed on the session's connection pools, whatever their
kind: plain, TLS, through a proxy).  After the deadline is disarmed the
watchdog never touches the connection again, so a kept-alive connection is
safe to reuse.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


class AnswerWatch:
    """The deadline of one request (and the redirects or token fetch it
    needs); ``fired`` once its socket was shut down for missing it."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.fired = False
        self._done = False
        self._conn: Any = None
        self._lock = threading.Lock()

    @property
    def message(self) -> str:
        return (f"no whole answer within {self.seconds:g} s (status line, headers and body "
                "together; [placement] timeout): the connection was closed")

    def why(self, failure: BaseException) -> str:
        """What to say of ``failure``: the deadline when it caused it."""
        return self.message if self.fired else str(failure)

    def attach(self, conn: Any) -> None:
        """``conn`` (a urllib3 connection) is the one this request uses now."""
        with self._lock:
            if self._done:
                return
            self._conn = conn
            late = self.deadline is not None and time.monotonic() >= self.deadline
        if late:
            self.fire()

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return  # answered in time: the connection is someone else's now
            self.fired = True
            sock = getattr(self._conn, "sock", None)
            if sock is None:
                return
            with contextlib.suppress(OSError):
                # The plain socket's shutdown, also under an SSLSocket (whose
                # own would unwrap TLS in this thread while another reads).
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def disarm(self) -> None:
        with self._lock:
            self._done = True
            self._conn = None


class _Watchdog:
    """One thread for every deadline of the process, started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: list[tuple[float, int, AnswerWatch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, watch: AnswerWatch) -> None:
        if watch.deadline is None:
            return
        with self._cond:
            heapq.heappush(self._armed, (watch.deadline, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="placement-deadline", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._armed:
                    self._cond.wait()
                deadline, _, watch = self._armed[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._armed)
            watch.fire()  # a no-op for one disarmed in time


_WATCHDOG = _Watchdog()
_current = threading.local()


@contextlib.contextmanager
def within(seconds: float | None) -> Iterator[AnswerWatch]:
    """Everything this thread sends and reads through a watched session in
    this block ends by ``seconds`` from now (None: no deadline)."""
    watch = AnswerWatch(seconds)
    _WATCHDOG.arm(watch)
    previous = getattr(_current, "watch", None)
    _current.watch = watch
    try:
        yield watch
    finally:
        _current.watch = previous
        watch.disarm()


class _Registers:
    """Mixed into a urllib3 connection class: the connection tells the
    thread's current deadline that it is the one in use."""

    def connect(self) -> None:
        _register(self)
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> Any:
        _register(self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


def _register(conn: Any) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


_watched_pools: dict[type, type] = {}
_watched_lock = threading.Lock()


def _watched_pool(pool_cls: type) -> type:
    """``pool_cls`` whose connections register (a subclass of each, so a
    SOCKS or TLS pool keeps what it is)."""
    with _watched_lock:
        found = _watched_pools.get(pool_cls)
        if found is None:
            conn_cls = pool_cls.ConnectionCls  # type: ignore[attr-defined]
            watched_conn = type(f"Watched{conn_cls.__name__}", (_Registers, conn_cls), {})
            found = type(
                f"Watched{pool_cls.__name__}", (pool_cls,), {"ConnectionCls": watched_conn}
            )
            _watched_pools[pool_cls] = found
        return found


def _watch_manager(manager: Any) -> Any:
    if not getattr(manager, "_accel_watched", False):
        manager.pool_classes_by_scheme = {
            scheme: _watched_pool(cls) for scheme, cls in manager.pool_classes_by_scheme.items()
        }
        manager.clear()  # pools made before keep their plain connections: drop them
        manager._accel_watched = True
    return manager


def watch(adapter: Any) -> None:
    """Install the registering connections on every connection pool of
    ``adapter``'s session (a keystoneauth Adapter or Session over requests);
    idempotent.  Nothing to do for a session that is not requests'."""
    ks_session = getattr(adapter, "session", adapter)
    mounts = getattr(getattr(ks_session, "session", None), "adapters", None)
    if not isinstance(mounts, dict):
        return  # not requests' session (a test's stand-in): nothing to watch
    for mounted in mounts.values():
        manager = getattr(mounted, "poolmanager", None)
        if manager is None or getattr(mounted, "_accel_watched", False):
            continue
        _watch_manager(manager)
        for proxy_manager in getattr(mounted, "proxy_manager", {}).values():
            _watch_manager(proxy_manager)
        make_proxy_manager = mounted.proxy_manager_for

        def proxy_manager_for(proxy: str, _make: Any = make_proxy_manager, **kwargs: Any) -> Any:
            return _watch_manager(_make(proxy, **kwargs))

        mounted.proxy_manager_for = proxy_manager_for
        mounted._accel_watched = True
