"""The daemon keeps a real OpenStack Placement in step with its inventory:
after start, after a SIGHUP that drops a provider, and after Placement was
down (without restarting the agent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.functional.daemon_fixture import (
    BOTH,
    AgentDaemon,
    agent_config,
    ctl,
    short_dir,
    wait_for,
)
from tests.functional.placement_fixture import PlacementServer, placement_available
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host
from tests.functional.test_placement_sync import Admin

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.privsep,
    pytest.mark.skipif(not placement_available(), reason="openstack-placement is not installed"),
]

HOST = "testhost"
NVIDIA_ONLY = "[devices]\nenabled_mdev_types = nvidia-35\n"
MTTY = "testhost_mtty_mtty"  # Nova's name: libvirt's node device mtty_mtty


def placement_section(endpoint: str) -> str:
    return f"""
[placement]
enabled = true
create_root_provider = true
sync_interval = 1
max_backoff = 2
# Read Placement at every sync: an outage is noticed without an inventory change.
refresh_interval = 1
timeout = 5
auth_type = admin_token
endpoint = {endpoint}
token = admin
"""


def held_by_placement(admin: Admin) -> dict | None:
    """Our subtree in Placement; None when the daemon changed it while we read."""
    try:
        if admin.provider(HOST) is None:
            return {}
        view = admin.view(HOST)
    except AssertionError:  # a provider deleted between the listing and its traits
        return None
    return {
        p["name"]: (p["inventories"], p["traits"], p["parent_provider"])
        for p in view["providers"]
    }


def reported_by_accelctl(config: Path) -> dict:
    proc = ctl(config, "inventory", "--json")
    assert proc.returncode == 0, proc.stderr
    return {
        p["name"]: (
            {p["resource_class"]: p["inventory"]},
            sorted(p["traits"]),
            p["parent_provider"],
        )
        for p in json.loads(proc.stdout)["providers"]
    }


def _record(total: int) -> dict:
    return {"total": total, "reserved": 0, "min_unit": 1, "max_unit": total, "step_size": 1,
            "allocation_ratio": 1.0}


# What Placement must hold for the nvidia-pf (2 GPUs) + mtty host under BOTH,
# written out: 16 nvidia-35 per M60 PF, 12 mtty-2 (24 ports, 2 each).
OWNER = "CUSTOM_OWNER_ACCEL_AGENT"
GPUS = {
    f"{HOST}_pci_0000_{bus}_00_0": (
        {"VGPU": _record(16)}, ["CUSTOM_MDEV_NVIDIA_35", OWNER], HOST
    )
    for bus in ("84", "85")
}
WITH_MTTY = {**GPUS, MTTY: ({"VGPU": _record(12)}, ["CUSTOM_MDEV_MTTY_2", OWNER], HOST)}


def test_placement_follows_the_daemon(tmp_path):
    skip_unless_root()
    (tmp_path / "host").mkdir()
    with PlacementServer(tmp_path / "placement") as server, simulated_host(
        tmp_path / "host", ["nvidia-pf", "mtty"], gpus=2
    ) as sim, short_dir() as sockdir:
        admin = Admin(server.endpoint)
        socket_path = str(sockdir / "api.sock")
        config = tmp_path / "agent.conf"

        def write(body: str) -> None:
            agent_config(
                config, sim.root, sim.state_dir, socket_path, body,
                extra=placement_section(server.endpoint),
            )

        write(BOTH)
        with AgentDaemon(config, socket_path, tmp_path) as daemon:
            daemon.start()
            assert reported_by_accelctl(config) == WITH_MTTY
            wait_for(lambda: held_by_placement(admin) == WITH_MTTY, what="the first sync")
            wait_for(lambda: daemon.health()["reporting"]["state"] == "ok", what="reporting ok")
            assert daemon.health()["reporting"]["providers"] == 3

            # Allocations change "used" only: nothing to tell Placement.
            daemon.client().allocate("vm-p", 2)
            assert held_by_placement(admin) == WITH_MTTY

            # SIGHUP drops mtty: its provider leaves Placement.
            write(NVIDIA_ONLY)
            daemon.sighup()
            wait_for(lambda: MTTY not in (held_by_placement(admin) or {MTTY}),
                     what="the mtty provider to go")
            assert held_by_placement(admin) == GPUS == reported_by_accelctl(config)

            # Placement goes down: the agent keeps serving, health says so...
            server.stop()
            wait_for(lambda: daemon.health()["reporting"]["state"] == "failing",
                     what="reporting to fail")
            health = daemon.health()
            assert health["status"] == "degraded"
            assert "Placement" in health["problems"][0]
            state = {"accel_agent_placement_sync_state": "failing"}
            wait_for(lambda: daemon.metric("accel_agent_placement_sync_state", **state) == 1.0,
                     what="the sync-state metric")
            # ...and the inventory changes meanwhile.
            write(BOTH)
            daemon.sighup()
            wait_for(lambda: MTTY in reported_by_accelctl(config), what="mtty back")
            # Placement comes back (same port, same database): converge, no restart.
            pid = daemon.pid
            server.start()
            wait_for(lambda: daemon.health()["reporting"]["state"] == "ok", timeout=60,
                     what="reporting ok again")
            wait_for(lambda: held_by_placement(admin) == WITH_MTTY,
                     what="Placement to converge")
            assert reported_by_accelctl(config) == WITH_MTTY
            assert daemon.pid == pid and daemon.health()["status"] == "ok"
            assert daemon.stop() == 0
