"""The optional HTTP endpoint of the metrics (``[metrics] listen``).

Prometheus scrapes HTTP over TCP; the API is a unix socket on purpose (it
also takes mutations).  With ``[metrics] listen`` set, the daemon also serves
``GET /metrics`` (and ``HEAD``) on that address, with cheroot, the WSGI server
the API already uses: a thread pool, per-connection timeouts, a bound on the
request head.  It answers nothing else (404, 405), reads no body, and never
reaches the API's handlers: only the registry's rendering.

Life cycle (accel_agent.service): bound before the daemon's recovery and
layouts, so that a port already in use refuses the start with a clear message
and nothing changed on the host; served from then on, while the agent starts
(the health gauges say so); stopped with the API on SIGTERM.
The address is read at start only: a reload does not move it.  Before that,
the start's check (``check-config``, ``accel-agent --check``, a reload:
accel_agent/config/startchecks.py) binds it and lets go with :func:`check_bind`,
which the start's own bind calls first: one message for both.

What a client may cost it (issue 33: two connections sending a request head
at a byte per 5 s held both workers, and 2,000 idle ones filled a listen
backlog of 5; every scrape timed out meanwhile): a worker is handed a
connection only once its whole request head has arrived, so no client can
hold one by sending slowly or not at all.  Until then the connection waits
in cheroot's selector loop, which reads what it sent without blocking
(:meth:`_MetricsServer.process_conn`):

* the head must arrive within :data:`HEAD_TIMEOUT` of the connect, however
  it trickles in; one that has not is closed;
* at most :data:`MAX_WAITING` connections wait for their head (each holds
  a descriptor of the daemon's): a new one beyond closes the one that has
  waited longest (a scraper sends its head at once, so it is never it);
* the listen backlog is :data:`LISTEN_BACKLOG`, and a failing ``accept``
  (out of descriptors) never ends the server (the API's connection manager,
  accel_agent/api/connections.py);
* a worker then has the request within :data:`REQUEST_TIMEOUT` and must have
  its answer taken within :data:`WRITE_TIMEOUT` (the API's deadline reader and
  writer), and every answer closes its connection (no keep-alive: a scrape
  every few seconds reconnects for nothing, and nothing waits unread behind it).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cheroot import makefile as cheroot_makefile
from cheroot import wsgi

from accel_agent import exception
from accel_agent.api import connections
from accel_agent.config.types import Listen, parse_listen

if TYPE_CHECKING:
    from accel_agent.reporting.metrics import AgentMetrics

LOG = logging.getLogger(__name__)

PATH = "/metrics"
# Scrapes at a time (Prometheus servers of an HA pair, a curl); a worker never
# waits for a request, only for a client to take its answer (WRITE_TIMEOUT).
THREADS = 4
MAX_HEADER_BYTES = 64 * 1024
IDLE_TIMEOUT = 10.0  # cheroot's per-recv/send timeout
HEAD_TIMEOUT = 5.0  # from the connect to the request head's end
REQUEST_TIMEOUT = 2.0  # the whole request, read by a worker (the head is there already)
WRITE_TIMEOUT = 5.0  # each write of an answer, taken by the client
MAX_WAITING = 256  # connections waiting for their head
LISTEN_BACKLOG = 1024
SHUTDOWN_TIMEOUT = 2.0  # a scrape renders in milliseconds


Answer = tuple[str, list[tuple[str, str]], bytes]  # status, headers, body


def _plain(status: str, text: str, extra: Iterable[tuple[str, str]] = ()) -> Answer:
    body = (text + "\n").encode()
    return status, [("Content-Type", "text/plain; charset=utf-8"), *extra], body


class _PrefixedSocketIO(connections.DeadlineSocketIO):
    """A socket's reader that first gives what the selector loop already
    read of the request (``pending``)."""

    def __init__(self, sock: socket.socket, mode: str) -> None:
        super().__init__(sock, mode)
        self.pending = bytearray()

    def readinto(self, buffer: Any) -> int | None:
        if self.pending:
            count = min(len(buffer), len(self.pending))
            buffer[:count] = self.pending[:count]
            del self.pending[:count]
            return count
        return super().readinto(buffer)


class _PrefixedReader(cheroot_makefile.StreamReader):
    """cheroot's reader over a :class:`_PrefixedSocketIO` (with the API's deadline)."""

    def __init__(self, sock: socket.socket, mode: str = "rb", bufsize: int = 8192) -> None:
        # io.BufferedReader.__init__ directly: StreamReader's would wrap a plain SocketIO.
        super(cheroot_makefile.StreamReader, self).__init__(_PrefixedSocketIO(sock, mode), bufsize)
        self.bytes_read = 0

    def set_deadline(self, deadline: float | None) -> None:
        self.raw.deadline = deadline  # type: ignore[attr-defined]


class _HeadFirstConnection(connections.DeadlineConnection):
    """A connection handed to a worker only with its whole request head."""

    def __init__(self, server: Any, sock: socket.socket, makefile: Any = None) -> None:
        super().__init__(server, sock, makefile)
        self.rfile = _PrefixedReader(sock, "rb", self.rbufsize)
        self.head_deadline = time.monotonic() + HEAD_TIMEOUT
        self.head_complete = False
        self.evicted = False  # shut down to make room (_HeadWaitManager)

    @property
    def pending(self) -> bytearray:
        return self.rfile.raw.pending  # type: ignore[attr-defined,no-any-return]

    def read_waiting(self) -> bool | None:
        """Read what the client sent, without blocking: True once the head is
        whole (or too long: the worker refuses it), False while it is not,
        None when the client is gone."""
        sock = self.socket
        timeout = sock.gettimeout()
        # Non-blocking for this read only: with a timeout set, Python's recv
        # first polls for that long, MSG_DONTWAIT or not.
        sock.setblocking(False)
        try:
            data = sock.recv(MAX_HEADER_BYTES)
        except (BlockingIOError, InterruptedError):
            return False  # a new connection that has sent nothing yet
        except OSError:
            return None
        finally:
            sock.settimeout(timeout)
        if not data:
            return None
        start = max(0, len(self.pending) - 3)
        self.pending.extend(data)
        self.head_complete = (
            self.pending.find(b"\r\n\r\n", start) >= 0 or len(self.pending) > MAX_HEADER_BYTES
        )
        return self.head_complete


class _HeadWaitManager(connections.BoundedConnectionManager):
    """The API's selector loop (it survives failing accepts), which also
    closes connections past their head deadline and keeps at most
    MAX_WAITING of them."""

    def _waiting(self) -> list[tuple[int, Any]]:
        return [(fd, conn) for fd, conn in self._selector.connections if conn is not self.server]

    def _from_server_socket(self, server_socket: socket.socket) -> Any:
        conn = super()._from_server_socket(server_socket)
        if conn is not None and len(self._selector) > MAX_WAITING:
            waiting = [c for _, c in self._waiting() if not c.evicted]
            if len(waiting) >= MAX_WAITING:
                # The one that has waited longest goes (a scraper sends its head at
                # once: never it).  Shut down, not closed: the selector holds its
                # descriptor, and may be in the middle of its list of ready ones;
                # the socket turns readable (EOF) and the loop closes it as any other.
                oldest = min(waiting, key=lambda c: c.head_deadline)
                oldest.evicted = True
                with contextlib.suppress(OSError):
                    oldest.socket.shutdown(socket.SHUT_RDWR)
                self.server.dropped.note(
                    f"more than {MAX_WAITING} connections waiting for their request head; "
                    "the oldest closed"
                )
        return conn

    def _expire(self, threshold: float) -> None:
        # Here, after the loop's list of ready connections, never while it
        # runs through it: closing one of those under it fails the loop
        # (connections.BoundedConnectionManager._from_server_socket says how).
        now = time.monotonic()
        for fd, conn in self._waiting():
            if now >= conn.head_deadline:
                self._selector.unregister(fd)
                conn.close()
                self.server.dropped.note(
                    f"no whole request head within {HEAD_TIMEOUT:g} s; connection closed"
                )
        super()._expire(threshold)


class _MetricsServer(wsgi.Server):
    """cheroot's WSGI server, handing a worker only whole request heads."""

    ConnectionClass = _HeadFirstConnection
    max_request_header_size = MAX_HEADER_BYTES
    max_request_body_size = 1  # a scrape sends none
    keep_alive_conn_limit = 0  # every answer closes its connection

    def __init__(self, address: tuple[str, int], app: Any) -> None:
        super().__init__(
            address,
            app,
            numthreads=THREADS,
            server_name="accel-agent-metrics",
            timeout=IDLE_TIMEOUT,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            request_queue_size=LISTEN_BACKLOG,
        )
        self.request_timeout = REQUEST_TIMEOUT
        self.write_timeout = WRITE_TIMEOUT
        self.unread_answers = connections.OncePerInterval(
            "metrics server", connections.WARNING_INTERVAL
        )
        self.dropped = connections.OncePerInterval(
            "metrics server", connections.WARNING_INTERVAL
        )

    def prepare(self) -> None:
        super().prepare()
        plain = self._connections
        self._connections = _HeadWaitManager(self)
        plain._selector.close()

    def process_conn(self, conn: Any) -> None:
        """From the selector loop: a connection goes to a worker once its head
        is whole; until then it waits in the selector, read without blocking."""
        if not conn.head_complete:
            outcome = conn.read_waiting()
            if outcome is None:
                conn.close()
                return
            if not outcome:
                self._connections.put(conn)
                return
        super().process_conn(conn)

    def error_log(self, msg: str = "", level: int = 20, traceback: bool = False) -> None:
        LOG.log(level, "metrics server: %s", msg, exc_info=traceback)


class MetricsHttpServer:
    """cheroot serving one registry's ``GET /metrics`` on ``listen``."""

    def __init__(self, listen: Listen, metrics: AgentMetrics) -> None:
        self.listen = listen
        self._metrics = metrics
        self._server = _MetricsServer((listen.host, listen.port), self.app)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) as bound (the port the kernel chose when given 0: tests)."""
        host, port = self._server.socket.getsockname()[:2]
        return host, port

    def prepare(self) -> None:
        """Bind; AccelAgentException naming the address when it cannot (first
        :func:`check_bind`, the start's check, so that both say the same)."""
        check_bind(self.listen)
        try:
            self._server.prepare()
        except OSError as exc:
            raise exception.AccelAgentException(cannot_serve(self.listen, exc)) from exc
        LOG.info("metrics served over HTTP on %s%s%s", self.listen, PATH,
                 "" if self.listen.loopback else " (not loopback: reachable from the network)")

    def serve(self) -> None:
        self._server.serve()

    def stop(self) -> None:
        self._server.stop()

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "")
        if environ.get("PATH_INFO") != PATH:
            status, headers, body = _plain("404 Not Found", f"only {PATH} is served here")
        elif method not in ("GET", "HEAD"):
            status, headers, body = _plain(
                "405 Method Not Allowed", "GET or HEAD", [("Allow", "GET, HEAD")]
            )
        else:
            body, content_type = self._metrics.render()
            status, headers = "200 OK", [("Content-Type", content_type)]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body] if method != "HEAD" else [b""]


def cannot_serve(listen: Listen, why: object) -> str:
    return f"cannot serve the metrics on [metrics] listen = {listen}: {why}"


def check_bind(listen: Listen, held_by: int | None = None) -> None:
    """Bind ``listen`` as the server does (SO_REUSEADDR, a dual-stack ``::``)
    and let go at once: AccelAgentException with the start's message when the
    address cannot be had (a port in use, an address not on this host).

    ``held_by``: the pid of the running agent, whose own listener on that
    port is not in the way (``accelctl check-config`` runs beside the daemon,
    a reload runs inside it); when that cannot be told (its /proc entries
    unreadable), the port counts as the agent's."""
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, socket.AF_UNSPEC,
                                   socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except OSError as exc:
        raise exception.AccelAgentException(cannot_serve(listen, exc)) from None
    family, kind, proto, _name, address = infos[0]
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and ipaddress.ip_address(listen.host).is_unspecified:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # as cheroot does
        probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and held_by is not None and _listens_on(
            held_by, listen.port
        ) is not False:
            return
        raise exception.AccelAgentException(cannot_serve(listen, exc)) from None
    finally:
        probe.close()


def _listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (its
    descriptors against /proc/net/tcp{,6}); None when that cannot be read."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address "HEX_IP:HEX_PORT", state 0A is LISTEN, inode is field 9
            if len(fields) > 9 and fields[3] == "0A" and int(
                fields[1].rpartition(":")[2], 16
            ) == port:
                inodes.add(f"socket:[{fields[9]}]")
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def from_conf(listen: str, metrics: AgentMetrics) -> MetricsHttpServer | None:
    """The server ``[metrics] listen`` asks for; None when it is empty."""
    address = parse_listen(listen)
    return MetricsHttpServer(address, metrics) if address is not None else None
