"""The daemon's start and signals, in-process (issue 33 items 5 and 6, issue
34 item 3): SIGHUP held from the agent process's first statement, a burst of
SIGHUPs coalesced into one reload, SIGTERM ahead of waiting reloads, and
health while the agent starts.  The daemon as a process: test_daemon_lifecycle.py
and test_standing_layout.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from accel_agent import service
from accel_agent.api.app import _validator, load_openapi
from accel_agent.daemon import starting
from accel_agent.daemon.core import AgentCore
from accel_agent.reporting.metrics import AgentMetrics

REPO = Path(__file__).resolve().parents[2]
GUARD = 30.0  # only so that a broken loop fails instead of hanging


class CountingAgent:
    """Stands for AgentService in the signal loop: counts its reloads, and
    holds the first one until ``let_go`` is set."""

    def __init__(self) -> None:
        self.reloads = 0
        self.first_started = threading.Event()
        self.let_go = threading.Event()
        self._lock = threading.Lock()

    def reload_config(self) -> None:
        with self._lock:
            self.reloads += 1
            first = self.reloads == 1
        if first:
            self.first_started.set()
            assert self.let_go.wait(GUARD)


def _pipe() -> tuple[int, int]:
    read, write = os.pipe2(os.O_CLOEXEC)
    return read, write


def _loop(agent: CountingAgent, read: int, reloads: Any = None) -> tuple[threading.Thread, list]:
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(service._signal_loop(agent, read, reloads)), daemon=True
    )
    thread.start()
    return thread, result


def test_a_burst_of_sighups_is_one_reload_after_the_one_running():
    """50 SIGHUPs while a reload runs: exactly one more reload once it is
    done (not 50 in a row, issue 33 item 6)."""
    agent = CountingAgent()
    read, write = _pipe()
    reloads = service._Reloads(agent)
    reloads.start()
    try:
        thread, result = _loop(agent, read, reloads)
        os.write(write, bytes([signal.SIGHUP]))
        assert agent.first_started.wait(GUARD)
        os.write(write, bytes([signal.SIGHUP]) * 50)
        # The loop took them all (nothing left in the pipe) while the first ran.
        deadline = threading.Event()
        for _ in range(int(GUARD / 0.01)):
            if not _readable(read):
                break
            deadline.wait(0.01)
        agent.let_go.set()
        for _ in range(int(GUARD / 0.01)):
            if reloads.runs >= 2 and not reloads.busy:
                break
            deadline.wait(0.01)
        assert agent.reloads == 2, agent.reloads
        os.write(write, bytes([signal.SIGTERM]))
        thread.join(GUARD)
        assert result == [0]
        reloads.close()
        reloads.join(GUARD)
        assert agent.reloads == 2, agent.reloads
    finally:
        os.close(read)
        os.close(write)


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def test_sigterm_behind_queued_sighups_stops_without_running_them():
    """A SIGTERM read behind 50 SIGHUPs ends the loop at once (exit 0): none
    of the reloads waiting runs, the one that ran is the only one."""
    agent = CountingAgent()
    agent.let_go.set()
    read, write = _pipe()
    try:
        os.write(write, bytes([signal.SIGHUP]) * 50 + bytes([signal.SIGTERM]))
        thread, result = _loop(agent, read)
        thread.join(GUARD)
        assert not thread.is_alive() and result == [0]
        assert agent.reloads < 50
        assert agent.reloads <= 1, agent.reloads
    finally:
        os.close(read)
        os.close(write)


def test_sigterm_while_a_reload_runs_stops_the_loop_at_once():
    """The reload runs beside the loop: a SIGTERM that comes while it runs
    is acted on without waiting for it (the stop's own deadline bounds it)."""
    agent = CountingAgent()
    read, write = _pipe()
    try:
        thread, result = _loop(agent, read)
        os.write(write, bytes([signal.SIGHUP]))
        assert agent.first_started.wait(GUARD)
        os.write(write, bytes([signal.SIGHUP]) * 10 + bytes([signal.SIGTERM]))
        thread.join(GUARD)
        assert not thread.is_alive() and result == [0]
        assert agent.reloads == 1
    finally:
        agent.let_go.set()
        os.close(read)
        os.close(write)


def _sighup_blocked_after_import(argv0: str) -> bool:
    code = (
        "import signal, sys\n"
        f"sys.argv[0] = {argv0!r}\n"
        "import accel_agent.cmd.agent\n"
        "print(signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    return done.stdout.strip() == "True"


def test_the_agent_process_blocks_sighup_before_anything_else_and_importers_do_not():
    """The console script's module blocks SIGHUP in its first statement
    (service.run unblocks it once its handler is set): a SIGHUP right after
    exec waits instead of ending the process (exit 129).  A program that
    only imports the module keeps its mask (its children would inherit it)."""
    assert _sighup_blocked_after_import("/usr/bin/accel-agent")
    assert not _sighup_blocked_after_import("/usr/bin/genman")


def test_the_wait_for_start_treats_a_burst_of_sighups_as_one_reload():
    read, write = _pipe()
    try:
        starting_thread = SimpleNamespace(reload_pending=False, join=lambda: None)
        os.write(write, bytes([signal.SIGHUP]) * 20 + bytes([service._PREPARED]))
        assert service._wait_for_start(read, starting_thread) is None  # type: ignore[arg-type]
        assert starting_thread.reload_pending is True
        os.write(write, bytes([signal.SIGHUP, signal.SIGTERM]))
        assert service._wait_for_start(read, starting_thread) == signal.SIGTERM  # type: ignore[arg-type]
    finally:
        os.close(read)
        os.close(write)


# --- health while the agent starts -----------------------------------------------------


class FakeReporter:
    enabled = False

    def health(self) -> dict[str, Any]:
        return {"enabled": False, "state": "disabled", "last_error": None}


@pytest.fixture
def core(tmp_path) -> AgentCore:
    from oslo_config import cfg

    from accel_agent.config import options as agent_conf

    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf([], project="accel-agent-test", default_config_files=[])
    ledger = SimpleNamespace(
        close=lambda: None, identity_problem=lambda: None, write_error=None,
        path=tmp_path / "ledger.sqlite3", state_dir=tmp_path,
    )
    manager = SimpleNamespace(host="h", ledger=ledger)
    return AgentCore(conf, manager=manager, reporter=FakeReporter(),  # type: ignore[arg-type]
                     metrics=AgentMetrics())


def _nullable_as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` as JSON Schema says it (the validator
    is JSON Schema's)."""
    if isinstance(node, list):
        return [_nullable_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable_as_json_schema(v) for k, v in node.items()}
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    return node


def _health_schema_errors(document: dict[str, Any]) -> list[str]:
    openapi = _nullable_as_json_schema(load_openapi())
    validator = _validator(openapi, {"$ref": "#/components/schemas/Health"})
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_health_says_starting_with_what_it_waits_for_until_the_start_ends(core):
    assert core.health()["status"] == "ok"  # a core without the daemon: ready at once
    core.starting.begin()
    core.starting.enter(starting.RECOVERY)
    health = core.health()
    assert health["status"] == "starting" and health["starting"]["phase"] == "recovery"
    core.starting.enter(starting.WAITING_FOR_VFS, ["0000:c1:00.0"], until=2e9)
    core.starting.waiting_for(["0000:c1:00.0", "0000:c2:00.0"])
    health = core.health()
    assert health["starting"]["phase"] == "waiting for VFs"
    assert health["starting"]["waiting_for"] == ["0000:c1:00.0", "0000:c2:00.0"]
    assert health["starting"]["until"].startswith("2033-05-18")
    assert _health_schema_errors(health) == []
    assert "waiting for VFs of GPU(s) 0000:c1:00.0, 0000:c2:00.0" in (
        core.starting.current().describe()  # type: ignore[union-attr]
    )
    core.starting.end()
    health = core.health()
    assert health["status"] == "ok" and "starting" not in health
    # A phase told after the end (or without a start) changes nothing.
    core.starting.enter(starting.FIRST_SCAN)
    assert core.health()["status"] == "ok"
