"""The API's unix socket and its production WSGI server (cheroot).

Whoever can connect to the socket can create and remove mdevs, so it is
created with care (docs/design.md §6.3):

* mode 0660 from the start (umask while binding, then chmod), group
  ``[api] socket_group`` when set;
* refuse when its directory is world-writable without the sticky bit
  (anyone could swap the socket for their own), or when something other
  than a socket is in the way (a regular file, a symlink: not ours to
  delete);
* a socket nobody listens on (a daemon that was killed) is stale and
  replaced; one somebody answers on means another agent runs: refuse.

cheroot would unlink whatever is at the path and chmod the socket 0777, so
the socket is bound here and handed to cheroot already bound.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import logging
import os
import socket
import stat
import struct
from typing import Any

from cheroot import server as cheroot_server
from cheroot import wsgi

from accel_agent import exception
from accel_agent.api import connections, framing, requestlog

LOG = logging.getLogger(__name__)

SOCKET_MODE = 0o660
_KINDS = {
    stat.S_IFREG: "regular file",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "file")


# The socket's directory, when the agent makes it (a start outside systemd,
# whose unit's RuntimeDirectory= makes /run/accel-agent): readable by all,
# or by [api] socket_group only when one is set; root's to write either way.
SOCKET_DIR_MODE = 0o755
SOCKET_DIR_MODE_GROUP = 0o750


def socket_dir_unmakeable(path: str) -> exception.ApiSocketUnsafe | None:
    """Why the missing directory of socket ``path`` cannot be made by the
    start (its parent is missing too), None when it can: what
    :func:`make_socket_dir` refuses and the start's check says."""
    directory = os.path.dirname(os.path.abspath(path))
    parent = os.path.dirname(directory)
    if os.path.isdir(parent):
        return None
    return exception.ApiSocketUnsafe(
        path=path, reason=f"its directory {directory} does not exist, nor its parent {parent}"
    )


def make_socket_dir(path: str, gid: int = -1) -> None:
    """Make the socket's directory when it is missing (its parent must
    exist): owned by the agent's user, group ``gid`` and mode 0750 when a
    socket group is set, else 0755.  An existing one is left as it is (never
    loosened); check_socket_path then refuses it if it is unsafe."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(directory):
        return
    unmakeable = socket_dir_unmakeable(path)
    if unmakeable is not None:
        raise unmakeable
    mode = SOCKET_DIR_MODE_GROUP if gid != -1 else SOCKET_DIR_MODE
    try:
        os.mkdir(directory, 0o700)  # narrow until its group and mode are set
    except FileExistsError:
        return  # made meanwhile by someone else: checked as any existing one
    except OSError as exc:
        raise exception.ApiSocketUnsafe(
            path=path, reason=f"cannot create its directory {directory}: {exc.strerror or exc}"
        ) from None
    try:
        if gid != -1:
            os.chown(directory, -1, gid)
        os.chmod(directory, mode)
    except OSError as exc:
        raise exception.ApiSocketUnsafe(
            path=path, reason=f"cannot set up its directory {directory}: {exc.strerror or exc}"
        ) from None
    LOG.info("created the API socket's directory %s (mode %04o%s)", directory, mode,
             f", group {gid}" if gid != -1 else "")


def socket_group_gid(group: str) -> int:
    """The gid of ``[api] socket_group`` ``group``: what :func:`bind_socket`
    gives the socket, and what ``check-config`` checks (one function, one
    message).  Raises InvalidConfig when the host has no such group."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise exception.InvalidConfig(
            reason=f"[api] socket_group {group!r} is not a group on this host"
        ) from None


def socket_path_state(path: str) -> tuple[str, int | None]:
    """What is at the API socket's place, changing nothing: ("free", None),
    ("stale", None) (a socket nobody listens on) or ("served", pid of the
    process that listens, None when the kernel does not say).  Raises
    ApiSocketUnsafe for a place the agent refuses.  :func:`check_socket_path`
    (the start) and the start's check (accel_agent/config/startchecks.py) both
    read it here."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    try:
        dir_stat = os.stat(directory)
    except FileNotFoundError:
        raise exception.ApiSocketUnsafe(
            path=path, reason=f"its directory {directory} does not exist"
        ) from None
    if not stat.S_ISDIR(dir_stat.st_mode):
        raise exception.ApiSocketUnsafe(path=path, reason=f"{directory} is not a directory")
    if dir_stat.st_mode & stat.S_IWOTH and not dir_stat.st_mode & stat.S_ISVTX:
        raise exception.ApiSocketUnsafe(
            path=path,
            reason=f"its directory {directory} is world-writable without the sticky bit, "
            "so anyone could replace the socket; use a private directory such as "
            "/run/accel-agent",
        )
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return "free", None
    if not stat.S_ISSOCK(found.st_mode):
        raise exception.ApiSocketUnsafe(
            path=path,
            reason=f"a {_kind(found.st_mode)} is in the way (not a socket); the agent does "
            "not delete it: remove it, or set [api] socket_path elsewhere",
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return "served", _peer_pid(probe)
    except (ConnectionRefusedError, FileNotFoundError):
        return "stale", None
    except OSError as exc:
        raise exception.ApiSocketUnsafe(
            path=path, reason=f"cannot tell whether the socket is in use: {exc}"
        ) from None
    finally:
        probe.close()


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process listening on the other end (SO_PEERCRED: the
    credentials the listener had when it called listen())."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid = struct.unpack("3i", creds)[0]
    return pid if pid > 0 else None


def check_socket_path(path: str) -> None:
    """Refuse an unsafe place; remove a stale socket.  Raises ApiSocketUnsafe,
    AgentAlreadyRunning."""
    path = os.path.abspath(path)
    state, _pid = socket_path_state(path)
    if state == "served":
        raise exception.AgentAlreadyRunning(path=path)
    if state == "stale":
        LOG.info("Replacing the stale API socket %s (nobody listens on it)", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def bind_socket(path: str, group: str | None = None, backlog: int = 128) -> socket.socket:
    """A listening AF_UNIX socket at ``path``, mode 0660, group ``group``;
    its directory made when missing (:func:`make_socket_dir`)."""
    path = os.path.abspath(path)
    gid = socket_group_gid(group) if group else -1
    make_socket_dir(path, gid)
    check_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The umask makes the socket 0660 the moment it appears: no window in
    # which another user could connect to a 0777 socket.
    old_umask = os.umask(0o117)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise exception.ApiSocketUnsafe(
                path=path, reason="something appeared at the path while binding"
            ) from None
        raise exception.ApiSocketUnsafe(path=path, reason=str(exc)) from None
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, SOCKET_MODE)
        if gid != -1:
            os.chown(path, -1, gid)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise exception.ApiSocketUnsafe(path=path, reason=str(exc)) from None
    return sock


def socket_identity(path: str) -> tuple[int, int, int]:
    """(device, inode, ctime): inode numbers alone are reused at once on tmpfs."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino, st.st_ctime_ns


def remove_socket(
    path: str, sock: socket.socket | None, identity: tuple[int, int, int] | None
) -> None:
    """Unlink ``path`` if it is still our socket (not a newer agent's)."""
    failure: OSError | None = None
    try:
        if identity is not None and socket_identity(path) == identity:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        failure = exc
    if failure is not None:
        # Outside the except clause: oslo.log would append the exception again.
        LOG.warning("could not remove the API socket %s: %s", path, failure)
    if sock is not None:
        sock.close()


_PROTOCOL_CODES = {405: "ApiMethodNotAllowed", 503: "ServiceUnavailable"}


def _text(value: Any) -> str:
    """A request's method or URI as cheroot holds it (bytes, or None before it was read)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return "-" if value is None else str(value)


class _JsonErrorRequest(cheroot_server.HTTPRequest):
    """cheroot's request, with the framing rules of :mod:`accel_agent.api.framing`;
    the answers cheroot gives itself (before the application) are in the API's
    error format too."""

    def __init__(self, server: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(server, conn, *args, **kwargs)
        # One per request: it keeps what it found wrong with this request's framing.
        self.header_reader = framing.StrictHeaderReader()

    def respond(self) -> None:
        refusal = self.header_reader.refusal
        if refusal is not None:
            # Before the body is read, and never reaching the application.
            self.simple_response("400 Bad Request", refusal)
            return
        super().respond()

    def simple_response(self, status: Any, msg: Any = "") -> None:
        status = str(status)
        code = int(status[:3]) if status[:3].isdigit() else 500
        if code < 400:
            super().simple_response(status, msg)
            return
        text = msg.decode("latin-1") if isinstance(msg, bytes) else str(msg or status)
        error_code = _PROTOCOL_CODES.get(code, "ApiRequestInvalid")
        body = json.dumps({"error": {"code": error_code, "message": text}}).encode("utf-8")
        # Refused before the application: its own request id, logged here.
        with requestlog.request_context() as context:
            overloaded = getattr(self.server, "overloaded", None)
            if code == 503 and overloaded is not None:
                # Every worker busy and the queue full: one line per interval,
                # not one per refused connection (that would flood the log
                # exactly when the agent is overloaded).
                overloaded.note(f"{text}: refused (503 ServiceUnavailable)")
            else:
                requestlog.log_refusal(
                    {}, _text(getattr(self, "method", None)), _text(getattr(self, "uri", None)),
                    code, error_code, text,
                )
        request_id = context.request_id
        # An answer the server gives itself ends the connection: a request it
        # refused may have a body it did not read (or whose end it cannot
        # know), and nothing after that can be trusted to be a request.
        self.close_connection = True
        lines = [
            f"{self.server.protocol} {status}",
            f"Content-Length: {len(body)}",
            "Content-Type: application/json",
            "Connection: close",
            f"{requestlog.HEADER}: {request_id}",
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.conn.wfile.write(head + body)
        except OSError as exc:
            if exc.args[0] not in cheroot_server.errors.socket_errors_to_ignore:
                raise


class _ApiConnection(connections.DeadlineConnection):
    RequestHandlerClass = _JsonErrorRequest


# Request line and headers together: our clients send a few hundred bytes;
# unbounded, a 200 MB header is held in memory (cheroot's default is 0: no limit).
MAX_REQUEST_HEADER = 64 * 1024
# How long a client may take to read one answer (each of its head and its
# body) before the connection is closed; also how long a pipelining client's
# next request waits for it to read the answers it has.  Our clients read at
# once: a local answer of megabytes takes milliseconds.
WRITE_TIMEOUT = 10.0
# Connections waiting to be accepted: enough for a burst of clients (a listen
# backlog that is full makes a unix-socket connect() fail with EAGAIN).
LISTEN_BACKLOG = 1024


class ApiServer(wsgi.Server):
    """cheroot's WSGI server on a socket we bound ourselves.

    ``stop()`` is cheroot's graceful stop: the listening socket closes, every
    worker finishes the request it is serving (up to ``shutdown_timeout``),
    idle keep-alive connections are closed.
    """

    def __init__(
        self,
        sock: socket.socket,
        app: Any,
        *,
        threads: int = 16,
        shutdown_timeout: float = 30.0,
        request_timeout: float = 3.0,
        idle_timeout: float = 10.0,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        path = sock.getsockname()
        super().__init__(
            path,
            app,
            numthreads=threads,
            server_name="accel-agent",
            shutdown_timeout=shutdown_timeout,
            # listen() backlog: cheroot's default of 5 makes concurrent clients
            # get EAGAIN on connect() while the workers are busy.
            request_queue_size=LISTEN_BACKLOG,
            # cheroot's per-recv/send timeout, and how long an idle connection
            # (new, or kept alive between requests) may wait in the selector.
            timeout=idle_timeout,
            # Clients' uid/gid/pid land in the WSGI environ (X_REMOTE_*), for the logs.
            peercreds_enabled=True,
        )
        # The whole of one request must arrive within this (DeadlineConnection).
        self.request_timeout = request_timeout
        # Each answer must be taken by the client within this (DeadlineConnection).
        self.write_timeout = write_timeout
        self.unread_answers = connections.OncePerInterval(
            "API server", connections.WARNING_INTERVAL
        )
        self.overloaded = connections.OncePerInterval(
            "API server: overloaded", connections.WARNING_INTERVAL
        )
        self.path = path
        self._bound = sock
        self.identity = socket_identity(path)

    ConnectionClass = _ApiConnection
    # cheroot's own limit (a class attribute, no constructor argument): 413 beyond it.
    max_request_header_size = MAX_REQUEST_HEADER

    def bind_unix_socket(self, bind_addr: Any) -> socket.socket:  # cheroot hook
        self.bind_addr = bind_addr
        self.socket = self._bound
        return self._bound

    def prepare(self) -> None:
        # cheroot treats LISTEN_PID as systemd socket activation on fd 3; the
        # unit does not use that, so an inherited variable must not fool it.
        os.environ.pop("LISTEN_PID", None)
        os.environ.pop("LISTEN_FDS", None)
        super().prepare()
        # cheroot builds its selector loop in prepare(); ours survives EMFILE.
        plain = self._connections
        self._connections = connections.BoundedConnectionManager(self)
        plain._selector.close()

    def process_conn(self, conn: Any) -> None:
        """A new connection waits in the selector (no worker) until it sends
        something; one that has, goes to a worker (cheroot's way), unless its
        client has not read the answers it was sent: then its next request
        waits for that, without a worker (BoundedConnectionManager.park)."""
        if not conn.watched:
            conn.watched = True
            self._connections.put(conn)
            return
        if connections.unread_output(conn.socket):
            self._connections.park(conn)
            return
        super().process_conn(conn)

    def error_log(self, msg: str = "", level: int = 20, traceback: bool = False) -> None:
        LOG.log(level, "API server: %s", msg, exc_info=traceback)
