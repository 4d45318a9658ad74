"""The three ways a configuration meets what the start refuses (issue 34):
``accelctl check-config`` and ``accel-agent --check`` as processes, and the
daemon's own start in the calling process (``AgentService.prepare``), whose
refusal is what the daemon prints (service._refused_to_start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oslo_config import cfg

from accel_agent import service
from accel_agent.config import registry
from accel_agent.devices import writers

REPO = Path(__file__).resolve().parents[2]


Done = subprocess.CompletedProcess


def check_and_agent_check(config: Path) -> tuple[Done, Done]:
    """``accelctl check-config`` and ``accel-agent --check``, side by side."""
    commands = [
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", str(config),
         "check-config"],
        [sys.executable, "-m", "accel_agent.cmd.agent", "--config-file", str(config), "--check"],
    ]
    running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO) for c in commands]
    done = []
    for command, proc in zip(commands, running, strict=True):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    assert all("Traceback" not in p.stderr for p in done), [p.stderr for p in done]
    return done[0], done[1]


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line.removeprefix("error: ") for line in proc.stderr.splitlines()
            if line.startswith("error: ")]


def daemon_conf(config: Path) -> cfg.ConfigOpts:
    """The configuration as the daemon holds it (every option it registers)."""
    conf = cfg.ConfigOpts()
    registry.register(conf)
    conf(["--config-file", str(config)], project="accel-agent", default_config_files=[])
    return conf


def start(config: Path, root: str, writer: object | None = "direct") -> list[str]:
    """The daemon's start, in this process: what it prints when it refuses
    (service._refused_to_start), [] when it started (then stopped)."""
    conf = daemon_conf(config)
    agent = service.AgentService(
        conf, [str(config)], [],
        writer=writers.DirectWriter(root) if writer == "direct" else writer,
    )
    try:
        agent.prepare()
    except BaseException as exc:  # the start's own handling follows
        said: list[str] = []
        assert service._refused_to_start(agent, exc, said.append) == 1
        return [line for message in said for line in message.splitlines()]
    agent.close()
    return []


START_PREAMBLES = (
    "refusing to start: recovery needs a configuration change",
    "refusing to start: invalid configuration",
)


def assert_said_by_all(start_lines: list[str], check: subprocess.CompletedProcess,
                       agent_check: subprocess.CompletedProcess) -> None:
    assert start_lines, "the start was not refused"
    said = [line for line in start_lines if line not in START_PREAMBLES]
    assert check.returncode == 1, f"check-config passed what the start refuses: {said}"
    assert agent_check.returncode == 1, f"accel-agent --check passed what the start refuses: {said}"
    for line in said:
        assert line in errors(check), (
            f"check-config did not say the start's {line!r}: {check.stderr}")
        # --check says what the start says (a ledger's refusal after "refusing to start: ").
        assert line in errors(agent_check) or f"refusing to start: {line}" in errors(
            agent_check), (
            f"accel-agent --check did not say the start's {line!r}: {agent_check.stderr}")
