"""Placement's answers against tiny misbehaving HTTP servers on loopback
(issue 33 item 7): one deadline for the whole answer (status line, headers,
body), the state of a sync that runs past its own in health at once, and no
token sent to another origin by a redirect.

The servers are raw sockets, so that a test decides every byte and when it
is sent; the client is the reporter's own (keystoneauth1 over requests).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from accel_agent import exception
from accel_agent.devices.inventory import Inventory
from accel_agent.reporting.placement import PlacementReporter
from accel_agent.reporting.placement.client import PlacementClient, adapter_for_endpoint
from tests.wedged_libvirt import guarded, wait_for

DRIP = 0.1  # seconds between two bytes of a trickling answer
BODY = b'{"resource_providers": []}'


@dataclass
class Seen:
    """What one server received and sent."""

    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    sent: int = 0


Handler = Callable[[socket.socket, bytes, Seen], None]


@contextlib.contextmanager
def server(handle: Handler) -> Iterator[tuple[str, Seen]]:
    """A loopback server calling ``handle(conn, request head, seen)`` for each
    request of each connection (keep-alive: the next head on the same one)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    seen = Seen()
    stop = threading.Event()

    def connection(conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while not stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                        while len(buffer) < length:
                            buffer += conn.recv(65536)
                        buffer = buffer[length:]
                seen.requests.append(head)
                try:
                    handle(conn, head, seen)
                except OSError:
                    return  # the client shut the connection down

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            seen.connections += 1
            threading.Thread(target=connection, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        stop.set()
        listener.close()


def answer(conn: socket.socket, status: str = "200 OK", body: bytes = BODY,
           extra: str = "") -> None:
    conn.sendall((f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body)


def drip(conn: socket.socket, data: bytes, seen: Seen) -> None:
    """``data`` a byte at a time: no socket timeout ever trips."""
    for byte in data:
        conn.sendall(bytes([byte]))
        seen.sent += 1
        time.sleep(DRIP)


def client(endpoint: str, timeout: float = 1) -> PlacementClient:
    return PlacementClient(adapter_for_endpoint(endpoint, token="secret-token", timeout=timeout))


def get(placement: PlacementClient) -> tuple[object, BaseException | None]:
    return guarded(lambda: placement.get("/resource_providers", lambda doc: doc))


def test_a_body_that_trickles_in_is_cut_at_the_deadline() -> None:
    """Headers at once, then the body a byte at a time (with its
    Content-Length: one read of 64 KiB waits for it all): the issue's 801 s."""
    body = b" " * 150 + BODY  # 15 s of dripping, then a whole answer

    def handle(conn: socket.socket, head: bytes, seen: Seen) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode())
        drip(conn, body, seen)

    with server(handle) as (endpoint, seen):
        _, error = get(client(endpoint))
    assert isinstance(error, exception.PlacementUnavailable), error
    assert "no whole answer within 1 s" in error.message
    assert seen.sent < len(body)  # the client stopped reading, it did not wait it out


def test_a_status_line_and_headers_that_trickle_in_are_cut_at_the_deadline() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + b"X-Padding: " + b"x" * 500 + b"\r\n"
            + f"Content-Length: {len(BODY)}\r\n\r\n".encode())

    def handle(conn: socket.socket, request: bytes, seen: Seen) -> None:
        drip(conn, head + BODY, seen)

    with server(handle) as (endpoint, seen):
        _, error = get(client(endpoint))
    assert isinstance(error, exception.PlacementUnavailable), error
    assert "no whole answer within 1 s" in error.message
    assert seen.sent < len(head)


def test_an_answer_in_time_keeps_its_connection_for_the_next() -> None:
    """The deadline is disarmed once an answer is read: a kept-alive
    connection is not shut down later under the next request."""

    def handle(conn: socket.socket, head: bytes, seen: Seen) -> None:
        answer(conn)

    with server(handle) as (endpoint, seen):
        placement = client(endpoint, timeout=0.5)
        first, error = get(placement)
        assert error is None and first == {"resource_providers": []}
        time.sleep(1)  # past the first request's deadline
        second, error = get(placement)
    assert error is None and second == first
    assert seen.connections == 1 and len(seen.requests) == 2


@pytest.mark.parametrize("status", ["307 Temporary Redirect", "308 Permanent Redirect",
                                    "302 Found", "301 Moved Permanently"])
def test_a_redirect_to_another_origin_is_refused_and_gets_no_token(status: str) -> None:
    def elsewhere(conn: socket.socket, head: bytes, seen: Seen) -> None:
        answer(conn)

    with server(elsewhere) as (other, taken):

        def redirect(conn: socket.socket, head: bytes, seen: Seen) -> None:
            answer(conn, status, b"", f"Location: {other}/resource_providers\r\n")

        with server(redirect) as (endpoint, seen):
            _, error = get(client(endpoint))
    assert isinstance(error, exception.PlacementUnavailable), error
    assert "a redirect to another origin (http://127.0.0.1:" in error.message
    assert "not followed" in error.message
    assert b"x-auth-token: secret-token" in seen.requests[0].lower()  # Placement's own
    assert taken.requests == []  # nothing at all went to the other origin


def test_a_redirect_within_the_origin_is_followed_with_the_token() -> None:
    def handle(conn: socket.socket, head: bytes, seen: Seen) -> None:
        if head.startswith(b"GET /resource_providers "):
            answer(conn, "307 Temporary Redirect", b"", "Location: /placement/rps\r\n")
        else:
            answer(conn)

    with server(handle) as (endpoint, seen):
        found, error = get(client(endpoint))
    assert error is None and found == {"resource_providers": []}
    assert [h.split(b" ")[1] for h in seen.requests] == [b"/resource_providers",
                                                        b"/placement/rps"]
    assert all(b"x-auth-token: secret-token" in h.lower() for h in seen.requests)


def test_a_sync_past_its_deadline_says_syncing_in_health_at_once() -> None:
    """Each answer within its deadline does not bound a sync of many; one that
    runs past its own (the longer of sync_interval and timeout) is "syncing"
    while it runs, not "ok" with last_success frozen."""
    now = [1000.0]
    release = threading.Event()

    def handle(conn: socket.socket, head: bytes, seen: Seen) -> None:
        release.wait(60)
        answer(conn)

    with server(handle) as (endpoint, seen):
        reporter = PlacementReporter(
            adapter_for_endpoint(endpoint, timeout=30), "h1", sync_interval=60,
            clock=lambda: now[0],
        )
        assert reporter.health()["state"] == "ok"
        syncing = threading.Thread(
            target=lambda: reporter.sync(Inventory(host="h1", providers=())), daemon=True
        )
        syncing.start()
        wait_for(lambda: len(seen.requests) == 1, "the sync's first request")
        health = reporter.health()
        assert health["state"] == "ok" and health["syncing_since"] is not None
        now[0] += 61  # past the sync's deadline, still waiting for Placement
        health = reporter.health()
        assert health["state"] == "syncing" and health["sync_deadline"] == 60
        release.set()
        syncing.join(60)
    # It ended (the root provider is missing): failing, and no longer syncing.
    health = reporter.health()
    assert health["state"] == "failing" and health["syncing_since"] is None
