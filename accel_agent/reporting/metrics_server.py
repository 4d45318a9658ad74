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
accel_agent/startchecks.py) binds it and lets go with :func:`check_bind`,
which the start's own bind calls first: one message for both.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cheroot import wsgi

from accel_agent import exception
from accel_agent.listen_address import Listen, parse

if TYPE_CHECKING:
    from accel_agent.reporting.metrics import AgentMetrics

LOG = logging.getLogger(__name__)

PATH = "/metrics"
THREADS = 2  # a scrape or two at a time: Prometheus servers of an HA pair
MAX_HEADER_BYTES = 64 * 1024
IDLE_TIMEOUT = 10.0
SHUTDOWN_TIMEOUT = 2.0  # a scrape renders in milliseconds


Answer = tuple[str, list[tuple[str, str]], bytes]  # status, headers, body


def _plain(status: str, text: str, extra: Iterable[tuple[str, str]] = ()) -> Answer:
    body = (text + "\n").encode()
    return status, [("Content-Type", "text/plain; charset=utf-8"), *extra], body


class MetricsHttpServer:
    """cheroot serving one registry's ``GET /metrics`` on ``listen``."""

    def __init__(self, listen: Listen, metrics: AgentMetrics) -> None:
        self.listen = listen
        self._metrics = metrics
        self._server = wsgi.Server(
            (listen.host, listen.port),
            self.app,
            numthreads=THREADS,
            server_name="accel-agent-metrics",
            timeout=IDLE_TIMEOUT,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
        self._server.max_request_header_size = MAX_HEADER_BYTES
        self._server.max_request_body_size = 1  # a scrape sends none

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
    address = parse(listen)
    return MetricsHttpServer(address, metrics) if address is not None else None
