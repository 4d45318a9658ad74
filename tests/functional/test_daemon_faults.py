"""The real daemon when what it stands on changes under it: its privileged
helper restarted after the config file was edited, its ledger deleted,
replaced, corrupted or on a full disk, a reload that fails.  Nothing is
lost silently: the daemon refuses, says so in /v1/health, and its log and
accelctl say what is wrong."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.functional.daemon_fixture import BOTH, AgentDaemon, agent_config, short_dir, wait_for
from tests.functional.privsep_fixture import _find_daemon_pid, skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("faults"), ["nvidia-pf", "mtty"], gpus=2) as host:
        yield host


class Agent:
    def __init__(self, host, workdir: Path, sockdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.socket_path = str(sockdir / "api.sock")
        self.config = workdir / "agent.conf"
        self.write(host.root)
        self.daemon = AgentDaemon(self.config, self.socket_path, workdir)

    def write(self, sysfs_root: str, extra: str = "") -> None:
        agent_config(self.config, sysfs_root, self.host.state_dir, self.socket_path, BOTH,
                     extra=extra)


@pytest.fixture
def agent(sim, tmp_path) -> Iterator[Agent]:
    sim.reset()
    with short_dir() as sockdir:
        setup = Agent(sim, tmp_path, sockdir)
        try:
            yield setup
        finally:
            setup.daemon.close()


# --- 4. the privileged helper acts on the agent's view ------------------------------------


def test_a_restarted_privsep_helper_acts_on_the_agents_sysfs_root(agent):
    other = agent.workdir / "other-sys"
    materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty"], gpus=2)), str(other))
    creates = sorted(other.glob("devices/**/create"))
    assert creates
    daemon = agent.daemon.start()
    first = daemon.client().allocate("vm-1", 1)
    assert first["mdevs"][0]["uuid"] in agent.host.sysfs_uuids()
    # An operator points the config file elsewhere (a restart would apply it)...
    agent.write(str(other))
    # ...and the helper dies; oslo.privsep starts a new one on the next call,
    # which reads the edited file.
    os.kill(_find_daemon_pid(agent.config.resolve()), signal.SIGKILL)
    second = daemon.client().allocate("vm-2", 1)
    uuid = second["mdevs"][0]["uuid"]
    assert uuid in agent.host.sysfs_uuids()
    assert all(path.read_bytes() == b"" for path in creates), "wrote into the other tree"
    # The new helper really is another process, reading the edited file.
    assert "sysfs_root = " + str(other) in agent.config.read_text()
    wait_for(lambda: _find_daemon_pid(agent.config.resolve()), what="the new helper")
