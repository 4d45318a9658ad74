"""The real daemon while a rescan takes long (issue 21, item 7): the API is
answered meanwhile, and SIGTERM stops the scan and the daemon cleanly.

The scan is made long deterministically with the simulator's ``stall_reads``
(a slow driver): reads of the counters of a type the config does not use
wait, and only the periodic rescan (every counter read again) reads those.
"The rescan is still in progress" is the simulator's count of readers
waiting in such a read, not a matter of timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir, wait_for
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import skip_without_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

PARENTS = 40
CONF = "[devices]\nenabled_mdev_types = nvidia-1001\n"
# nvidia-1000 is on every parent and in no config: its counters are read by
# the periodic rescan only.
UNUSED_COUNTER = "nvidia-1000/available_instances"
API_TIMEOUT = 60.0  # a request behind the stalled rescan would never finish


@pytest.fixture
def host(tmp_path) -> Iterator[sim_testing.MountedSimulator]:
    skip_unless_root()
    skip_without_fuse()
    spec = build_spec(["synthetic"], parents=PARENTS, types=2)
    with sim_testing.mounted(spec, tmp_path / "sys") as sim:
        try:
            yield sim
        finally:
            sim.unstall_reads()


@pytest.fixture
def daemon(host, tmp_path) -> Iterator[AgentDaemon]:
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(
            tmp_path / "agent.conf",
            host.root,
            str(tmp_path / "state"),
            socket_path,
            CONF,
            rescan_interval=0.5,
            # Far shorter than a stalled rescan: a stop that waited for the
            # scan would end by the hard exit (code 1) instead.
            extra="[api]\nshutdown_timeout = 8\n",
        )
        agent = AgentDaemon(Path(config), socket_path, tmp_path)
        try:
            yield agent.start()
        finally:
            # First: a process waiting in a FUSE read cannot exit, not even killed.
            host.unstall_reads()
            agent.close()


def rescan_waits(host: sim_testing.MountedSimulator) -> bool:
    return host.status(counters=False)["stalled_readers"] >= 1


def test_the_api_answers_while_a_periodic_rescan_is_stalled(host, daemon):
    host.stall_reads(UNUSED_COUNTER)  # until unstalled
    wait_for(lambda: rescan_waits(host), what="a periodic rescan reading a stalled counter")
    api = daemon.client(timeout=API_TIMEOUT)
    types = api.types()
    assert {t["type_id"] for p in types["parents"] for t in p["types"]} >= {"nvidia-1001"}
    inventory = api.inventory()
    assert len(inventory["providers"]) == PARENTS
    allocation = api.allocate("long-scan-vm", 1)
    assert len(allocation["mdevs"]) == 1
    assert api.release("long-scan-vm")["released"] == [allocation["mdevs"][0]["uuid"]]
    # All of that while the rescan still waits in its read.
    assert rescan_waits(host)
    rescans = api.health()["rescans"]
    host.unstall_reads()
    wait_for(lambda: api.health()["rescans"] > rescans, what="the stalled rescan to finish")


def test_sigterm_during_a_long_rescan_stops_the_scan_and_exits_0(host, daemon):
    # Each read of the unused counters takes 1 s: a periodic rescan of 40
    # parents takes 40 s, five times [api] shutdown_timeout.
    host.stall_reads(UNUSED_COUNTER, seconds=1.0)
    wait_for(lambda: rescan_waits(host), what="a periodic rescan reading a slow counter")
    assert daemon.stop(timeout=60) == 0
    log = daemon.log()
    assert "rescan stopped: the agent is stopping" in log
    assert "did not stop within [api] shutdown_timeout" not in log
    # It stopped between two parents: far fewer slow reads than parents.
    assert host.status(counters=False)["stalled_reads"] < PARENTS
