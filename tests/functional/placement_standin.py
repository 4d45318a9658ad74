"""A Placement that misbehaves: a loopback HTTP server in front of the real one.

Every request is forwarded to the real Placement (placement_fixture.py) and
its answer passed back, except the answers ``tamper`` replaces: for shapes a
real Placement never sends (``200 {}``, a UUID with a slash, 200 MB of body).
``tamper(method, path, status, body)`` returns None (pass the real answer
on) or an :class:`Answer`, whose ``chunks`` are sent as they come, so that a
test can send a body slowly or without end and count what it managed to send.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class Answer:
    status: int = 200
    chunks: Iterable[bytes] = ()
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


def body(data: bytes, status: int = 200) -> Answer:
    """A plain answer with its Content-Length."""
    return Answer(status, [data], {"Content-Type": "application/json",
                                   "Content-Length": str(len(data))})


Tamper = Callable[[str, str, int, bytes], "Answer | None"]


class StandIn:
    """``with StandIn(upstream, tamper) as standin: standin.endpoint``."""

    def __init__(self, upstream: str, tamper: Tamper) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.tamper = tamper
        self.sent = 0  # body bytes of tampered answers the socket accepted
        self.tampered: list[tuple[str, str]] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _forward(self, method: str, path: str, headers: dict[str, str], data: bytes
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            conn.request(method, path, body=data or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else b""
                keep = ("Content-Type", "X-Auth-Token", "OpenStack-API-Version", "Accept")
                headers = {k: v for k, v in self.headers.items() if k in keep}
                status, real_headers, real_body = standin._forward(
                    self.command, self.path, headers, data
                )
                answer = standin.tamper(self.command, self.path, status, real_body)
                if answer is None:
                    self.send_response(status)
                    for name, value in real_headers:
                        if name.lower() not in ("connection", "transfer-encoding",
                                                "content-length", "server", "date"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(real_body)))
                    self.end_headers()
                    self.wfile.write(real_body)
                    return
                standin.tampered.append((self.command, self.path))
                self._send(answer)

            def _send(self, answer: Answer) -> None:
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in answer.headers:
                    self.send_header("Connection", "close")  # the body ends with it
                    self.close_connection = True
                self.end_headers()
                try:
                    for chunk in answer.chunks:
                        self.wfile.write(chunk)
                        standin.sent += len(chunk)
                except OSError:  # the client stopped reading and hung up
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def endless(chunk: bytes, total: int) -> Iterator[bytes]:
    """``total`` bytes of ``chunk`` repeated (the last one cut)."""
    sent = 0
    while sent < total:
        piece = chunk[: total - sent]
        sent += len(piece)
        yield piece
