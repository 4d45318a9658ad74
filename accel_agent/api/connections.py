"""What a client connection may cost the API server: bounded, whatever it sends.

cheroot serves each request in a worker thread, reading it with blocking
socket calls.  Left as they are, a handful of clients that connect and say
nothing, or send a byte every few seconds, hold every worker for as long as
they like and ``/v1/health`` waits behind them.  So:

* a new connection waits in cheroot's selector (no worker) until it has
  sent something; one that stays silent is closed after the server's
  ``timeout`` like any idle keep-alive connection;
* once a worker reads a request, the whole of it (request line, headers and
  body) must arrive within ``request_timeout`` seconds, however it trickles
  in: a deadline over every ``recv``, not just a timeout per ``recv``.  The
  client gets ``408`` and the connection is closed;
* the request head is bounded by cheroot's ``max_request_header_size``
  (set by :class:`accel_agent.api.server.ApiServer`);
* running out of file descriptors while accepting (``EMFILE``) closes the
  idle connections instead of ending the server (cheroot would re-raise it).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any

from cheroot import connections as cheroot_connections
from cheroot import makefile as cheroot_makefile
from cheroot import server as cheroot_server

LOG = logging.getLogger(__name__)

# cheroot tells a read timeout from other socket errors by this text.
_TIMED_OUT = "timed out"


class DeadlineSocketIO(socket.SocketIO):
    """A socket's raw reader whose reads all end by one deadline."""

    def __init__(self, sock: socket.socket, mode: str) -> None:
        super().__init__(sock, mode)
        self.deadline: float | None = None

    def readinto(self, buffer: Any) -> int | None:
        deadline = self.deadline
        if deadline is None:
            return super().readinto(buffer)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(_TIMED_OUT)
        sock = self._sock  # type: ignore[attr-defined]
        per_read = sock.gettimeout()
        if per_read is not None and per_read <= remaining:
            return super().readinto(buffer)
        sock.settimeout(remaining)
        try:
            return super().readinto(buffer)
        finally:
            sock.settimeout(per_read)  # writes keep the server's own timeout


class DeadlineReader(cheroot_makefile.StreamReader):
    """cheroot's reader over a :class:`DeadlineSocketIO`."""

    def __init__(self, sock: socket.socket, mode: str = "rb", bufsize: int = 8192) -> None:
        # io.BufferedReader.__init__ directly: StreamReader's would wrap a plain SocketIO.
        super(cheroot_makefile.StreamReader, self).__init__(DeadlineSocketIO(sock, mode), bufsize)
        self.bytes_read = 0

    def set_deadline(self, deadline: float | None) -> None:
        self.raw.deadline = deadline  # type: ignore[attr-defined]


def make_file(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> Any:
    if "r" in mode:
        return DeadlineReader(sock, mode, bufsize)
    return cheroot_makefile.MakeFile(sock, mode, bufsize)


class DeadlineConnection(cheroot_server.HTTPConnection):
    """A connection whose every request must be received within
    ``server.request_timeout`` seconds."""

    def __init__(self, server: Any, sock: socket.socket, makefile: Any = None) -> None:
        super().__init__(server, sock, make_file)
        # False until it has been seen by the selector once (see ApiServer.process_conn).
        self.watched = False

    def communicate(self) -> bool:
        self.rfile.set_deadline(time.monotonic() + self.server.request_timeout)
        try:
            return bool(super().communicate())
        finally:
            self.rfile.set_deadline(None)


class BoundedConnectionManager(cheroot_connections.ConnectionManager):
    """cheroot's selector loop, surviving a full file descriptor table."""

    _last_warning = 0.0

    def _from_server_socket(self, server_socket: socket.socket) -> Any:
        try:
            return super()._from_server_socket(server_socket)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        now = time.monotonic()
        if now - self._last_warning > 10:
            self._last_warning = now
            LOG.warning(
                "API server: out of file descriptors (%d connections open); closing the "
                "idle ones",
                self._num_connections,
            )
        # Make room: the idle ones are the cheapest to lose (clients reconnect).
        self._expire(threshold=time.time())
        # The listening socket stays readable: without a pause, this loop
        # would spin on accept() until a worker lets a connection go.
        time.sleep(0.05)
        return None
