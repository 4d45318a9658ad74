"""``[metrics] listen``: the address forms it takes and refuses, and the HTTP
endpoint that serves the registry (in process, on a port the kernel picks)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time

import pytest
from oslo_config import cfg
from prometheus_client.parser import text_string_to_metric_families

from accel_agent import exception
from accel_agent.config import options as agent_conf
from accel_agent.config.types import Listen, parse_listen
from accel_agent.reporting import metrics_server
from accel_agent.reporting.metrics import AgentMetrics
from accel_agent.reporting.metrics_server import MetricsHttpServer, from_conf


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("  ", None),
        ("9464", Listen("127.0.0.1", 9464)),  # a bare port: loopback
        ("127.0.0.1:9464", Listen("127.0.0.1", 9464)),
        ("10.0.0.12:9464", Listen("10.0.0.12", 9464)),
        ("0.0.0.0:9464", Listen("0.0.0.0", 9464)),
        ("[::1]:9464", Listen("::1", 9464)),
        ("[::]:65535", Listen("::", 65535)),
    ],
)
def test_listen_forms(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("localhost:9464", "not an IP address"),  # no name resolution at start
        ("9464x", "PORT, ADDRESS:PORT"),
        ("1.2.3.4", "PORT, ADDRESS:PORT"),
        ("[::1]", "PORT, ADDRESS:PORT"),
        ("1.2.3.4:0", "from 1 to 65535"),
        ("1.2.3.4:65536", "from 1 to 65535"),
        ("70000", "from 1 to 65535"),
        ("::1:9464", "in brackets"),
        ("[10.0.0.1]:9464", "brackets are for an IPv6"),
        ("\u0669\u0664\u0666\u0664", "PORT, ADDRESS:PORT"),  # Arabic-Indic digits
    ],
)
def test_listen_refusals_say_why(value, says):
    with pytest.raises(ValueError, match=says):
        parse_listen(value)


def load(tmp_path, text: str) -> cfg.ConfigOpts:
    path = tmp_path / "agent.conf"
    path.write_text(text)
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf(["--config-file", str(path)], project="accel-agent-test", default_config_files=[])
    return conf


def test_the_option_is_off_by_default_and_refuses_a_bad_address_when_read(tmp_path):
    assert load(tmp_path, "").metrics.listen == ""
    assert from_conf("", AgentMetrics()) is None
    assert load(tmp_path, "[metrics]\nlisten = 9464\n").metrics.listen == "9464"
    conf = load(tmp_path, "[metrics]\nlisten = localhost:9464\n")
    with pytest.raises(ValueError, match="not an IP address"):
        conf.metrics.listen  # noqa: B018  (oslo.config converts on access)


@pytest.fixture
def served():
    metrics = AgentMetrics()
    server = MetricsHttpServer(Listen("127.0.0.1", 0), metrics)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server, metrics
    finally:
        server.stop()
        thread.join(10)


def families(body: bytes) -> set[str]:
    return {f.name for f in text_string_to_metric_families(body.decode())}


def request(server: MetricsHttpServer, method: str, path: str) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection(*server.address, timeout=10)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def test_the_endpoint_serves_the_registry_and_nothing_else(served):
    server, metrics = served
    metrics.allocations.inc()
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"accel_agent_allocations_total 1.0" in body
    # The same registry as GET /metrics on the API socket (process_* values move).
    assert families(body) == families(metrics.render()[0])
    # HEAD: the headers of GET, no body (read raw: http.client reads none anyway).
    with socket.create_connection(server.address, timeout=10) as raw:
        raw.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: " in head
    assert rest == b""
    assert request(server, "GET", "/")[0] == 404
    assert request(server, "GET", "/v1/health")[0] == 404
    assert request(server, "GET", "/metrics/x")[0] == 404
    status, headers, _ = request(server, "POST", "/metrics")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert request(server, "DELETE", "/metrics")[0] == 405


def test_a_stopped_endpoint_refuses_connections(served):
    server, _ = served
    host, port = server.address
    server.stop()
    with pytest.raises(OSError), socket.create_connection((host, port), timeout=5):
        pass


def test_a_port_in_use_is_refused_naming_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsHttpServer(Listen("127.0.0.1", port), AgentMetrics())
        with pytest.raises(exception.AccelAgentException,
                           match=f"listen = 127.0.0.1:{port}: .*in use"):
            server.prepare()


# --- slow and idle clients (issue 33 item 8) ----------------------------------------------

HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def closed_by_server(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); False while it is open and silent."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # with a timeout, recv would first wait for that long
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


def wait_until(predicate, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_slow_request_heads_hold_no_worker_and_a_scrape_answers(served):
    """Twice as many connections as workers, each sending its request head a
    byte at a time (the issue's slowloris: before, each held a worker for as
    long as it trickled and every scrape timed out)."""
    server, _ = served
    slow = [socket.create_connection(server.address, timeout=10)
            for _ in range(2 * metrics_server.THREADS)]
    stop = threading.Event()

    def trickle() -> None:
        for byte in HEAD[:-1]:  # never the head's last byte
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(bytes([byte]))
            if stop.wait(0.1):
                return

    dripping = threading.Thread(target=trickle, daemon=True)
    dripping.start()
    try:
        time.sleep(0.5)  # every slow connection has started its head
        status, _, body = request(server, "GET", "/metrics")
        assert status == 200 and b"accel_agent_" in body
        # Served while every slow connection was open, none of them answered.
        assert not any(closed_by_server(sock) for sock in slow)
    finally:
        stop.set()
        dripping.join(10)
        for sock in slow:
            sock.close()


def test_a_head_that_never_ends_is_closed_at_its_deadline(served, monkeypatch):
    server, _ = served
    monkeypatch.setattr(metrics_server, "HEAD_TIMEOUT", 0.5)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(HEAD[:10])
        wait_until(lambda: closed_by_server(sock), "the slow head closed")


def test_idle_connections_are_capped_and_a_scrape_answers(served, monkeypatch):
    """Idle connections wait without a worker, and at most MAX_WAITING of
    them (before: 2,000 idle ones, a listen backlog of 5, no cap: every
    scrape timed out, and each one held a descriptor of the daemon's)."""
    server, _ = served
    monkeypatch.setattr(metrics_server, "MAX_WAITING", 20)
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(100)]
    try:
        wait_until(lambda: sum(not closed_by_server(s) for s in idle) <= 20,
                   "the idle connections beyond the cap closed")
        status, _, _ = request(server, "GET", "/metrics")
        assert status == 200
        # The newest were kept, the oldest closed.
        assert not closed_by_server(idle[-1]) and closed_by_server(idle[0])
    finally:
        for sock in idle:
            sock.close()


def test_every_answer_closes_its_connection(served):
    server, _ = served
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(HEAD + HEAD)  # a second request behind the first: not served
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.1 200 ") == 1 and b"Connection: close" in answer
