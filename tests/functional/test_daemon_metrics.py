"""The real daemon's metrics as a fleet scrapes them: ``[metrics] listen``
served over HTTP (urllib, as Prometheus would), every counter present from
the first scrape, ``accel_agent_healthy`` and ``accel_agent_health_problem``
agreeing with ``GET /v1/health`` of the same daemon."""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accel_agent.reporting.health_kinds import PROBLEM_KINDS
from tests.functional.daemon_fixture import (
    MTTY,
    AgentDaemon,
    agent_config,
    ctl,
    short_dir,
    wait_for,
)
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("metrics"), ["mtty"]) as host:
        yield host


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def daemon_with(sim, tmp_path: Path, extra: str) -> Iterator[AgentDaemon]:
    sim.reset()
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(tmp_path / "agent.conf", sim.root, sim.state_dir, socket_path,
                              MTTY, extra=extra)
        with AgentDaemon(config, socket_path, tmp_path) as daemon:
            yield daemon


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_listen_serves_the_metrics_over_http_with_every_counter_from_the_start(sim, tmp_path):
    port = free_port()
    # A bare port: loopback.
    with daemon_with(sim, tmp_path, f"[metrics]\nlisten = {port}\n") as daemon:
        daemon.start()
        status, content_type, text = scrape(port)
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4"), text
        over_http = families(text)
        over_socket = families(daemon.client().call("GET", "/metrics"))
        assert set(over_http) == set(over_socket)
        # Every counter family of a fresh daemon has its samples: rate() works
        # from the first scrape, before any event.
        counters = [f for f in over_http.values() if f.type == "counter"]
        assert len(counters) >= 10
        for family in counters:
            assert family.samples, f"{family.name} has no sample on a fresh daemon"
        assert daemon.metric("accel_agent_errors_total", code="InsufficientCapacity") == 0.0
        assert any(s.labels == {"code": "LedgerError"}
                   for s in over_http["accel_agent_errors"].samples)
        # process_* of the daemon's own process.
        pid_start = over_http["process_start_time_seconds"].samples[0].value
        assert pid_start > 0 and over_http["process_resident_memory_bytes"].samples[0].value > 0
        assert daemon.health()["status"] == "ok"
        assert over_http["accel_agent_healthy"].samples[0].value == 1.0
        # Nothing else is served there, and nothing that changes anything.
        assert scrape(port, "/v1/health")[0] == 404
        assert scrape(port, "/metrics", "POST")[0] == 405
        assert scrape(port, "/metrics", "HEAD")[0] == 200
        # A reload does not move it: the note says when the new address applies.
        other = free_port()
        agent_config(daemon.config_file, sim.root, sim.state_dir, daemon.socket_path, MTTY,
                     extra=f"[metrics]\nlisten = {other}\n")
        daemon.sighup()
        wait_for(lambda: daemon.health()["config"]["last_reload_result"] == "applied",
                 what="the reload")
        assert "[metrics] listen changed; it applies at the next restart" in daemon.log()
        assert scrape(port)[0] == 200
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", other), timeout=5):
            pass
        assert daemon.stop() == 0
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # stopped with the daemon


def test_healthy_and_the_problem_series_agree_with_v1_health(sim, tmp_path):
    dead = free_port()  # a Placement nobody serves: syncs fail, health degrades
    placement = f"""
[placement]
enabled = true
sync_interval = 1
max_backoff = 2
timeout = 2
auth_type = admin_token
endpoint = http://127.0.0.1:{dead}
token = admin
"""
    with daemon_with(sim, tmp_path, placement) as daemon:
        daemon.start()
        wait_for(lambda: daemon.health()["status"] == "degraded", what="a degraded health")

        def agreeing() -> tuple[dict, dict[str, object]] | None:
            """The metrics read between two equal health answers (a problem
            may come or go between two requests)."""
            before = daemon.health()["problem_kinds"]
            found = families(daemon.client().call("GET", "/metrics"))
            after = daemon.health()
            return (after, found) if after["problem_kinds"] == before else None

        health, found = wait_for(agreeing, what="two equal health answers")
        assert health["status"] == "degraded"
        assert "placement_sync_failing" in health["problem_kinds"]
        assert len(health["problem_kinds"]) == len(health["problems"])
        assert found["accel_agent_healthy"].samples[0].value == 0.0
        on = {s.labels["problem"] for s in found["accel_agent_health_problem"].samples
              if s.value == 1.0}
        assert on == set(health["problem_kinds"])
        assert {s.labels["problem"] for s in found["accel_agent_health_problem"].samples} == set(
            PROBLEM_KINDS
        )


def test_a_listen_port_in_use_refuses_the_start_naming_it(sim, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with daemon_with(sim, tmp_path, f"[metrics]\nlisten = 127.0.0.1:{port}\n") as daemon:
            daemon.spawn()
            assert daemon.wait_exit() == 1
            assert f"cannot serve the metrics on [metrics] listen = 127.0.0.1:{port}" in (
                daemon.log()
            )
            assert "READY=1" not in daemon.read_notifications()


@pytest.mark.parametrize("value", ["localhost:9464", "9464x", "127.0.0.1:70000", "::1:9464"])
def test_check_config_names_a_bad_listen_address(sim, tmp_path, value):
    config = agent_config(tmp_path / "agent.conf", sim.root, sim.state_dir,
                          str(tmp_path / "api.sock"), MTTY, extra=f"[metrics]\nlisten = {value}\n")
    proc = ctl(config, "check-config")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "listen" in proc.stdout + proc.stderr
