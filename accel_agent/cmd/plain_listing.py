"""``accelctl [--offline] LISTING --json`` into a pipe, with as little
imported as the answer needs.

A listing's cost is mostly fixed: the interpreter, then what accelctl
imports.  argparse and the building of accelctl's whole parser, http.client,
the inventory and the XML and simulator commands cost ~15 ms together
(BENCHMARKS.md (a)), more than the running daemon takes to answer.  This
path needs none of them:

* from the running daemon (it keeps each listing encoded, accel_agent.service):
  the socket path comes from the config cache (config/cache.py, standard
  library only), the request is one HTTP/1.1 GET written on a unix socket
  with ``_socket``, the body is printed as it came;
* without a daemon (or ``--offline``, ``--sysfs-root``): the scan and the
  document of accel_agent.cmd.listings, exactly as accelctl's parser path.

It handles only that plain form (the options may also follow the listing, as
the parser path takes them) and *declines* (returns None) on anything
else, so that accelctl's ordinary path runs and behaves exactly as before:
options other than ``--config-file``, ``--config-dir``, ``--offline`` and
``--sysfs-root`` (``-v``, abbreviations, ``-h``), a terminal on stdout (a
table or indented JSON), no cached config (the first run after a config
change, which the ordinary path loads and caches), no configuration at all
(the ordinary path's error), and a daemon that is
there but does not give a complete ``200`` with JSON (busy, forbidden,
failing: the ordinary path says which).  Declining after a request costs a
second request; this path never reports an error of the daemon itself.
"""

from __future__ import annotations

import errno
import os
import sys

LISTINGS = frozenset({"types", "mdevs", "inventory"})
_VALUED = ("--config-file", "--config-dir", "--sysfs-root")
_READ_TIMEOUT = 60.0  # the ordinary client's (api.client.READ_TIMEOUT)
# The daemon is not there: act directly (api.client._NOT_RUNNING).
_NOT_RUNNING = (errno.ENOENT, errno.ECONNREFUSED)


class Request:
    # A plain class: dataclasses costs ~5 ms of imports the daemon path
    # does not otherwise need.
    def __init__(self) -> None:
        self.listing = ""
        self.config_files: list[str] = []
        self.config_dirs: list[str] = []
        self.offline = False
        self.sysfs_root: str | None = None


def parse(argv: list[str]) -> Request | None:
    """The request when ``argv`` is exactly ``[--config-file F]
    [--config-dir D] [--offline] [--sysfs-root DIR] LISTING --json``, where
    those options may also come after LISTING (before or after ``--json``),
    as accelctl's parser takes them (in any order, the valued ones
    repeatable), else None."""
    request = Request()
    as_json = False
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        i += 1
        if not name.startswith("-"):
            if request.listing or name not in LISTINGS or eq:
                return None
            request.listing = name
            continue
        if name == "--json" and not eq and request.listing and not as_json:
            as_json = True
            continue
        if name == "--offline" and not eq:
            request.offline = True
            continue
        if name not in _VALUED:
            return None
        if not eq:
            if i == len(argv):
                return None
            value = argv[i]
            i += 1
        if not value or value.startswith("-"):
            return None  # argparse's business (an error, or an odd value)
        if name == "--config-file":
            request.config_files.append(value)
        elif name == "--config-dir":
            request.config_dirs.append(value)
        else:
            request.sysfs_root = value  # the last one wins, as argparse's store
    if not as_json:
        return None
    return request


class _Decline(Exception):
    """The ordinary path must handle this command."""


def _get(socket_path: str, path: str) -> bytes | None:
    """The body of a ``200`` JSON answer to GET ``path``; None when no
    daemon listens there; _Decline for anything else."""
    # _socket, not socket: socket.py builds its IntEnums on import (~2 ms).
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(_READ_TIMEOUT)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            if exc.errno in _NOT_RUNNING:
                return None
            raise _Decline from exc  # busy (EAGAIN), forbidden, ...
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
            "Connection: close\r\n\r\n".encode("ascii")
        )
        chunks = []
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    except OSError as exc:
        raise _Decline from exc
    finally:
        sock.close()
    return _body(b"".join(chunks))


def _body(answer: bytes) -> bytes:
    head, sep, body = answer.partition(b"\r\n\r\n")
    status, *fields = head.split(b"\r\n")
    if not sep or status.split(b" ", 2)[1:2] != [b"200"]:
        raise _Decline
    headers = {}
    for line in fields:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"json" not in headers.get(b"content-type", b""):
        raise _Decline
    if headers.get(b"content-length") != str(len(body)).encode():
        raise _Decline  # chunked or cut short: not the plain answer expected here
    return body


def _offline(request: Request, cached: dict[str, object]) -> int | None:
    import dataclasses
    import logging

    from accel_agent import wiring
    from accel_agent.cmd import listings, output

    try:
        listing = wiring.ListingConfig.from_dict(cached)
    except (KeyError, TypeError, ValueError):
        return None  # an entry of another shape: the ordinary path reloads it
    if request.sysfs_root:
        listing = dataclasses.replace(listing, sysfs_root=request.sysfs_root)
    # As accelctl's parser path (ctl.main): library warnings stay quiet, the
    # listing prints its own.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")

    def run() -> int:
        with listings.collector_paused():
            output.emit_json(listings.offline_document(request.listing, listing))
        return output.EXIT_OK

    status = output.exit_status(run)
    # As ctl.run: no final collection over what is still alive at exit.
    import gc

    gc.freeze()
    return status


def _print(body: bytes) -> int:
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(body.rstrip(b"\n") + b"\n")
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        # The reader went away (accelctl types --json | head): as ctl.main.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def answer(argv: list[str]) -> int | None:
    """Print the listing ``argv`` asks for and return the exit status, or
    None to let accelctl's ordinary path handle the command."""
    request = parse(argv)
    if request is None or sys.stdout.isatty():
        return None
    from accel_agent.config import cache as config_cache
    from accel_agent.config.files import config_sources

    files, dirs = config_sources(request.config_files, request.config_dirs)
    if not files and not dirs and not request.sysfs_root:
        return None  # no configuration at all: the parser path says so (exit 1)
    cached = config_cache.load(files, dirs)
    if cached is None:
        return None
    if not request.offline and not request.sysfs_root:
        socket_path = cached["api_socket_path"]
        if os.path.lexists(socket_path):
            try:
                body = _get(socket_path, f"/v1/{request.listing}")
            except _Decline:
                return None
            if body is not None:
                return _print(body)
    return _offline(request, cached)
