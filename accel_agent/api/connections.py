"""What a client connection may cost the API server: bounded, whatever it sends
or fails to read.

cheroot serves each request in a worker thread, reading and writing it with
blocking socket calls.  Left as they are, a handful of clients that connect
and say nothing, send a byte every few seconds, or pipeline requests and never
read the answers, hold every worker for as long as they like and
``/v1/health`` waits behind them.  So:

* a new connection waits in cheroot's selector (no worker) until it has
  sent something; one that stays silent is closed after the server's
  ``timeout`` like any idle keep-alive connection;
* once a worker reads a request, the whole of it (request line, headers and
  body) must arrive within ``request_timeout`` seconds, however it trickles
  in: a deadline over every ``recv``, not just a timeout per ``recv``.  The
  client gets ``408`` and the connection is closed;
* the request head is bounded by cheroot's ``max_request_header_size``
  (set by :class:`accel_agent.api.server.ApiServer`);
* an answer must be taken by the client within ``write_timeout`` seconds
  (a deadline over every ``send`` of one write: cheroot writes an answer's
  head, then its body).  A worker whose client does not read gives up then
  and the connection is closed;
* output is bounded to one answer a connection: a request the client sent
  before it had read the answers to its earlier ones (pipelining) is not
  served until it has read them.  The connection waits meanwhile without a
  worker (:meth:`BoundedConnectionManager.park`), looked at every
  ``expiration_interval``, and is closed if its answers are still unread
  ``write_timeout`` seconds later;
* failures to accept a connection (``EMFILE`` when the daemon runs out of file
  descriptors, or any other ``OSError`` from ``accept``) never end the
  server nor log a traceback: one warning per ``WARNING_INTERVAL``
  seconds, counting the ones not logged; running out of descriptors closes
  the idle connections to make room.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from cheroot import connections as cheroot_connections
from cheroot import makefile as cheroot_makefile
from cheroot import server as cheroot_server

LOG = logging.getLogger(__name__)

# cheroot tells a read timeout from other socket errors by this text.
_TIMED_OUT = "timed out"
# One warning per this many seconds for failing accepts and for clients that
# do not read their answers, however many there are.
WARNING_INTERVAL = 10.0
# After a failed accept: the listening socket stays readable, so without a
# pause the selector loop would spin on accept() until a descriptor is free.
ACCEPT_ERROR_PAUSE = 0.05
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class OncePerInterval:
    """Logs an event that may repeat thousands of times a second at most once
    per ``interval`` seconds; the ones not logged are counted and the count is
    given with the next line, or by :meth:`flush` once the interval is over
    (so the last burst is not lost when the event stops).  Thread-safe."""

    def __init__(
        self, what: str, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what = what
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._unlogged = 0
        self._detail = ""
        self._lock = threading.Lock()

    def note(self, detail: str) -> None:
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last < self.interval:
                self._unlogged += 1
                self._detail = detail
                return
            unlogged = self._unlogged
            since = 0.0 if self._last is None else now - self._last
            self._last, self._unlogged = now, 0
        if unlogged:
            LOG.warning(
                "%s: %s (and %d more in the last %.0f s, not logged)",
                self.what, detail, unlogged, since,
            )
        else:
            LOG.warning("%s: %s", self.what, detail)

    def flush(self) -> None:
        with self._lock:
            now = self.clock()
            if not self._unlogged or self._last is None or now - self._last < self.interval:
                return
            unlogged, detail, since = self._unlogged, self._detail, now - self._last
            self._last, self._unlogged = now, 0
        LOG.warning(
            "%s: %d more in the last %.0f s, not logged (the last: %s)",
            self.what, unlogged, since, detail,
        )


def unread_output(sock: socket.socket) -> int:
    """How much of what was sent on ``sock`` its peer has not read yet
    (``SIOCOUTQ``; on a unix socket the kernel's accounting of it, larger
    than the bytes themselves).  0 when the socket cannot tell (closed)."""
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", answer)[0])


class DeadlineSocketIO(socket.SocketIO):
    """A socket's raw reader or writer whose calls all end by one deadline."""

    def __init__(self, sock: socket.socket, mode: str) -> None:
        super().__init__(sock, mode)
        self.deadline: float | None = None

    def readinto(self, buffer: Any) -> int | None:
        return self._by_deadline(super().readinto, buffer)

    def write(self, data: Any) -> int | None:
        return self._by_deadline(super().write, data)

    def _by_deadline(self, call: Callable[[Any], int | None], buffer: Any) -> int | None:
        deadline = self.deadline
        if deadline is None:
            return call(buffer)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(_TIMED_OUT)
        sock = self._sock  # type: ignore[attr-defined]
        per_call = sock.gettimeout()
        if per_call is not None and per_call <= remaining:
            return call(buffer)
        sock.settimeout(remaining)
        try:
            return call(buffer)
        finally:
            sock.settimeout(per_call)  # between deadlines, the server's own timeout


class DeadlineReader(cheroot_makefile.StreamReader):
    """cheroot's reader over a :class:`DeadlineSocketIO`."""

    def __init__(self, sock: socket.socket, mode: str = "rb", bufsize: int = 8192) -> None:
        # io.BufferedReader.__init__ directly: StreamReader's would wrap a plain SocketIO.
        super(cheroot_makefile.StreamReader, self).__init__(DeadlineSocketIO(sock, mode), bufsize)
        self.bytes_read = 0

    def set_deadline(self, deadline: float | None) -> None:
        self.raw.deadline = deadline  # type: ignore[attr-defined]


class DeadlineWriter(cheroot_makefile.StreamWriter):
    """cheroot's writer over a :class:`DeadlineSocketIO`: each ``write`` must
    be taken by the client within :attr:`timeout` seconds.  Once one was not,
    the connection is done for: what is left is dropped, and so are later
    writes (cheroot's attempt at a ``408``), so that nothing blocks again on a
    client that does not read.  :attr:`timed_out` tells the connection."""

    def __init__(self, sock: socket.socket, mode: str = "wb", bufsize: int = 8192) -> None:
        # io.BufferedWriter.__init__ directly: StreamWriter's would wrap a plain SocketIO.
        super(cheroot_makefile.StreamWriter, self).__init__(DeadlineSocketIO(sock, mode), bufsize)
        self.bytes_written = 0
        self.timeout: float | None = None
        self.timed_out = False

    def write(self, data: Any) -> int:
        if self.timed_out:
            return len(data)
        raw: DeadlineSocketIO = self.raw  # type: ignore[assignment]
        if self.timeout is not None:
            raw.deadline = time.monotonic() + self.timeout
        try:
            return int(super().write(data))
        except TimeoutError:
            self.timed_out = True
            self._write_buf.clear()  # type: ignore[attr-defined]  # _pyio's buffer
            raise
        finally:
            raw.deadline = None


def make_file(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> Any:
    if "r" in mode:
        return DeadlineReader(sock, mode, bufsize)
    return DeadlineWriter(sock, mode, bufsize)


class DeadlineConnection(cheroot_server.HTTPConnection):
    """A connection whose every request must be received within
    ``server.request_timeout`` seconds, and every answer taken by the client
    within ``server.write_timeout`` seconds."""

    def __init__(self, server: Any, sock: socket.socket, makefile: Any = None) -> None:
        super().__init__(server, sock, make_file)
        self.wfile.timeout = getattr(server, "write_timeout", None)
        # False until it has been seen by the selector once (see ApiServer.process_conn).
        self.watched = False

    def communicate(self) -> bool:
        self.rfile.set_deadline(time.monotonic() + self.server.request_timeout)
        try:
            keep = bool(super().communicate())
        finally:
            self.rfile.set_deadline(None)
        if self.wfile.timed_out:
            # cheroot took it for a read timeout and said nothing: say it here.
            self.server.unread_answers.note(
                f"a client did not take its answer within {self.wfile.timeout:g} s; "
                "connection closed"
            )
            return False
        return keep


class BoundedConnectionManager(cheroot_connections.ConnectionManager):
    """cheroot's selector loop, which also holds the connections whose
    answers are unread (:meth:`park`) and survives failing accepts."""

    def __init__(self, server: Any) -> None:
        super().__init__(server)
        self._parked: dict[Any, float] = {}  # connection -> monotonic deadline
        self._parked_lock = threading.Lock()
        self._make_room = False
        self.accept_errors = OncePerInterval(
            "API server: cannot accept a connection", WARNING_INTERVAL
        )

    # --- connections whose answers are unread ------------------------------------------

    def park(self, conn: Any) -> None:
        """Hold ``conn`` without a worker until its client has read every
        answer sent on it; closed if it has not within ``write_timeout``."""
        with self._parked_lock:
            self._parked[conn] = time.monotonic() + self.server.write_timeout

    def _settle_parked(self, close_all: bool = False) -> None:
        now = time.monotonic()
        with self._parked_lock:
            parked = list(self._parked.items())
        for conn, deadline in parked:
            if close_all or now >= deadline:
                outcome = "closed"
            elif unread_output(conn.socket) == 0:
                outcome = "read"
            else:
                continue
            with self._parked_lock:
                self._parked.pop(conn, None)
            if outcome == "read":
                self.put(conn)  # its next request, if any, goes to a worker now
                continue
            if not close_all:
                self.server.unread_answers.note(
                    f"a client did not read its answers within {self.server.write_timeout:g} s "
                    "while sending more requests; connection closed"
                )
            conn.close()

    @property
    def _num_connections(self) -> int:
        # The parked count as kept-alive ones: cheroot stops keeping
        # connections alive past keep_alive_conn_limit.
        with self._parked_lock:
            parked = len(self._parked)
        return int(super()._num_connections) + parked

    # --- accepting ---------------------------------------------------------------------

    def _from_server_socket(self, server_socket: socket.socket) -> Any:
        try:
            return super()._from_server_socket(server_socket)
        except OSError as exc:
            failure = exc
        out_of_descriptors = failure.errno in _OUT_OF_DESCRIPTORS
        self.accept_errors.note(
            f"{failure} ({self._num_connections} connections open"
            + ("; closing the idle ones)" if out_of_descriptors else ")")
        )
        if out_of_descriptors:
            # Make room: the idle ones are the cheapest to lose (clients
            # reconnect).  Not here: this runs in the middle of the selector's
            # list of ready connections, and closing one of those under it
            # made cheroot's loop fail (KeyError) on every turn.
            self._make_room = True
        time.sleep(ACCEPT_ERROR_PAUSE)
        return None

    # --- every expiration_interval, after the ready connections were handled -----------

    def _expire(self, threshold: float) -> None:
        make_room, self._make_room = self._make_room, False
        super()._expire(time.time() if make_room else threshold)
        self._settle_parked(close_all=make_room)
        self.accept_errors.flush()

    def close(self) -> None:
        super().close()
        self._settle_parked(close_all=True)
