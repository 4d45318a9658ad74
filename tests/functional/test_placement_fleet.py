"""Five agents against one Placement as production runs it, through an outage.

Five real daemons (each its own static host of two M60 GPUs, state and
socket: fleet_agents.py) report to one Placement under gunicorn (two worker
processes) on a PostgreSQL server from Debian (placement_pg.py).  Every host
changes its type while Placement is away (killed, then started again on the
same port and database), and again while it answers 503 (a load balancer
with no backend up).  Afterwards Placement holds exactly every host's
inventory, no provider twice and none left over, each provider under the
UUID its name gives (so that a create whose answer an outage swallowed is
found again as the agent's, not made a second time or refused), and every
agent says ``ok``.  Rules, not timings: every wait is generous and only
there to fail instead of hang.

This tier must run in CI (``ACCEL_REALKERNEL=1``, set by .ci/run): a
machine without PostgreSQL (the Makefile's Debian packages install it) or
root fails it instead of skipping it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.functional.daemon_fixture import wait_for
from tests.functional.fleet_agents import FleetAgent, fleet, wait_exact
from tests.functional.placement_fixture import placement_available
from tests.functional.placement_pg import PlacementService, PostgresServer, postgres_missing
from tests.functional.test_placement_sync import Admin

pytestmark = [pytest.mark.privsep]

AGENTS = 5
# Written out, not the reporter's helper: a change of how providers are named
# into UUIDs must fail here.
NAMESPACE = uuid.UUID("6b0d1c1e-3f5a-5d8e-9c47-acce1a9e0001")
# Generous: only there to fail instead of hang (max_backoff is 4 s).
CONVERGE = 180.0


def _must_run() -> bool:
    return os.environ.get("ACCEL_REALKERNEL") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def placement(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlacementService]:
    missing = postgres_missing()
    if missing is None and not placement_available():
        missing = "openstack-placement is not installed"
    if missing:
        if _must_run():
            pytest.fail(f"the fleet test cannot run and must (CI): {missing}")
        pytest.skip(missing)
    with PostgresServer() as database, PlacementService(
        database, tmp_path_factory.mktemp("placement-pg"), workers=2
    ) as service:
        yield service


def _reporting(agents: list[FleetAgent], state: str) -> bool:
    return all(agent.reporting()["state"] == state for agent in agents)


def _providers(admin: Admin) -> list[dict]:
    return admin.call("GET", "/resource_providers")["resource_providers"]


def test_five_agents_through_an_outage_and_a_503_end_exact_without_duplicates(
    placement: PlacementService, tmp_path: Path
) -> None:
    admin = Admin(placement.endpoint)
    with fleet(AGENTS, tmp_path, placement.endpoint) as agents:
        wait_exact(admin, agents, CONVERGE)
        wait_for(lambda: _reporting(agents, "ok"), CONVERGE, what="every agent ok")

        # Placement dies; every host changes meanwhile.  Each agent tries (the
        # reload wakes its sync), fails, says so, and backs off.
        placement.stop()
        for agent in agents:
            agent.set_type("nvidia-15")
        wait_for(lambda: _reporting(agents, "failing"), CONVERGE, what="every agent failing")
        for agent in agents:
            reporting = agent.reporting()
            assert reporting["consecutive_failures"] >= 1
            assert reporting["next_attempt_at"] is not None
            assert "Placement unavailable" in reporting["last_error"]
            assert agent.daemon.health()["status"] == "degraded"
            # Nothing lost: the agent's own inventory has the change.
            assert {p["mdev_type"] for p in agent.daemon.client().inventory()["providers"]} == {
                "nvidia-15"}

        placement.start()  # the same port and database
        wait_exact(admin, agents, CONVERGE)
        wait_for(lambda: _reporting(agents, "ok"), CONVERGE, what="every agent ok again")

        # A load balancer answering 503 (no backend up) while every host changes again.
        placement.set_unavailable(True)
        for agent in agents:
            agent.set_type("nvidia-35")
        wait_for(lambda: _reporting(agents, "failing"), CONVERGE, what="503s seen")
        assert all("returned 503" in a.reporting()["last_error"] for a in agents)
        placement.set_unavailable(False)
        wait_exact(admin, agents, CONVERGE)
        wait_for(lambda: _reporting(agents, "ok"), CONVERGE, what="every agent ok at last")

        # No provider twice, none left over, each under the UUID of its name.
        providers = _providers(admin)
        names = [rp["name"] for rp in providers]
        expected = {a.name for a in agents} | {n for a in agents for n in a.expected()}
        assert sorted(names) == sorted(expected)
        roots = {rp["uuid"]: rp["name"] for rp in providers if rp["parent_provider_uuid"] is None}
        assert sorted(roots.values()) == sorted(a.name for a in agents)
        for rp in providers:
            assert rp["uuid"] == str(uuid.uuid5(NAMESPACE, rp["name"])), rp
            if rp["parent_provider_uuid"] is not None:
                assert rp["name"].startswith(roots[rp["parent_provider_uuid"]] + "_pci_"), rp
        for agent in agents:
            assert agent.reporting()["providers"] == agent.gpus
