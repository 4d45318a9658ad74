"""``[mdev_<type>] reported_by = nova`` against a real OpenStack Placement
(issue 23): "the agent creates no Placement provider for them. It takes its
existing provider for them back out of Placement only when it holds no
allocation."

The real daemon on the FUSE simulator's two NVIDIA vGPU 17+ GPUs: GPU1's
type is reported by the agent, GPU2's by Nova from the start.  A consumer
(as Nova's scheduler would, through Placement's API) holds a VGPU of GPU1's
provider when GPU1's type is handed to Nova by a reload: the provider stays,
drained (reserved = total), until the allocation goes; the next sync then
deletes it.  GPU2 never gets a provider.  Every outcome is read from
Placement's own API, never from the agent's view of it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from accel_agent.reporting.placement.plan import provider_uuid
from tests.functional.daemon_fixture import AgentDaemon, sim_agent, wait_for
from tests.functional.placement_fixture import PlacementServer, placement_available
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host
from tests.functional.test_daemon_placement import placement_section
from tests.functional.test_placement_sync import Admin, record

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.privsep,
    pytest.mark.skipif(not placement_available(), reason="openstack-placement is not installed"),
]

HOST = "testhost"
GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
# Written out, not derived with the agent's helpers: the names Placement sees.
RP1, RP2 = f"{HOST}_pci_0000_c1_00_0", f"{HOST}_pci_0000_c2_00_0"
OWNER = "CUSTOM_OWNER_ACCEL_AGENT"
VFS = 4  # per GPU: GPU1's provider offers one VGPU per VF


def body(gpu1_by: str, gpu1_standing: int) -> str:
    """GPU1 carries nvidia-1150 (reported by ``gpu1_by``); GPU2 carries
    nvidia-1151, reported by Nova from the start."""
    return (
        "[devices]\nenabled_mdev_types = nvidia-1150, nvidia-1151\nstanding_vf_wait = 60\n"
        f"[mdev_nvidia-1150]\ndevice_addresses = {GPU1}\n"
        f"standing = {gpu1_standing}\nreported_by = {gpu1_by}\n"
        f"[mdev_nvidia-1151]\ndevice_addresses = {GPU2}\nstanding = 1\nreported_by = nova\n"
    )


def children(admin: Admin) -> dict[str, dict[str, Any]] | None:
    """The root's children in Placement, by name: uuid, inventories, traits
    (None when the daemon changed the tree while we read it)."""
    try:
        root = admin.provider(HOST)
        if root is None:
            return {}
        tree = admin.call("GET", f"/resource_providers?in_tree={root['uuid']}")
        found = {}
        for rp in tree["resource_providers"]:
            if rp["uuid"] == root["uuid"]:
                continue
            base = f"/resource_providers/{rp['uuid']}"
            found[rp["name"]] = {
                "uuid": rp["uuid"],
                "parent": rp["parent_provider_uuid"] == root["uuid"],
                "inventories": admin.call("GET", f"{base}/inventories")["inventories"],
                "traits": sorted(admin.call("GET", f"{base}/traits")["traits"]),
            }
        return found
    except AssertionError:  # a provider deleted between the listing and its details
        return None


def absent(admin: Admin, name: str) -> bool:
    """Placement has no provider of that name, nor of the UUID the agent
    would give it."""
    by_name = admin.call("GET", f"/resource_providers?name={name}")["resource_providers"]
    admin.call("GET", f"/resource_providers/{provider_uuid(name)}", ok=(404,))
    return by_name == []


def synced_after(daemon: AgentDaemon, moment: datetime | None) -> datetime | None:
    """The agent's last successful sync (its health) if later than ``moment``."""
    reporting = daemon.health()["reporting"]
    if reporting["state"] != "ok" or reporting["last_success"] is None:
        return None
    last = datetime.fromisoformat(reporting["last_success"])
    return last if moment is None or last > moment else None


def settle(read: Callable[[], Any], expected: Any, what: str) -> None:
    """Until ``read()`` gives ``expected``; on time-out, the difference."""
    try:
        wait_for(lambda: read() == expected, interval=0.2, what=what)
    except AssertionError:
        assert read() == expected, f"timed out waiting for {what}"


def test_a_provider_handed_to_nova_drains_until_free_and_a_nova_type_never_gets_one(tmp_path):
    skip_unless_root()
    (tmp_path / "host").mkdir()
    with PlacementServer(tmp_path / "placement") as server, simulated_host(
        tmp_path / "host", ["nvidia-vfio"], gpus=2, vfs=VFS
    ) as sim, sim_agent(sim, tmp_path, body("agent", 0)) as agent:
        admin = Admin(server.endpoint)
        extra = placement_section(server.endpoint)
        agent.write(extra)
        agent.daemon.start()

        # GPU1 (reported_by = agent) has its provider; GPU2 (nova) none.
        full = {
            RP1: {"parent": True, "inventories": {"VGPU": record(VFS)},
                  "traits": ["CUSTOM_MDEV_NVIDIA_1150", OWNER]},
        }

        def without_uuids() -> dict[str, Any] | None:
            found = children(admin)
            return None if found is None else {
                n: {k: v for k, v in p.items() if k != "uuid"} for n, p in found.items()
            }

        # After a whole sync (not while the first one is still writing).
        wait_for(lambda: synced_after(agent.daemon, None), what="the first sync")
        settle(without_uuids, full, "GPU1's provider in Placement")
        assert absent(admin, RP2)
        rp1 = children(admin)[RP1]["uuid"]

        # A consumer holds one VGPU of it, as Nova's scheduler would claim it.
        consumer = admin.allocate(rp1, {"VGPU": 1})

        # GPU1's type goes to Nova (reload): the provider stays, drained,
        # with its UUID, its inventory and its allocation.
        agent.body = body("nova", 2)
        agent.write(extra)
        agent.daemon.sighup()
        drained = {RP1: {**full[RP1], "uuid": rp1,
                         "inventories": {"VGPU": record(VFS, reserved=VFS)}}}
        settle(lambda: children(admin), drained, "GPU1's provider drained")
        # Named as any drain is: a warning in the log (written just after the PUT).
        wait_for(lambda: f"drained {RP1}: 1 allocated, reserved = total" in agent.daemon.log(),
                 what="the drain in the log")
        # A whole sync after the drain leaves it as it is while the allocation holds.
        moment = synced_after(agent.daemon, None)
        moment = wait_for(lambda: synced_after(agent.daemon, moment), what="a sync")
        wait_for(lambda: synced_after(agent.daemon, moment), what="another sync")
        assert children(admin) == drained
        held = admin.call("GET", f"/allocations/{consumer}")["allocations"]
        assert {u: a["resources"] for u, a in held.items()} == {rp1: {"VGPU": 1}}
        # Drained means the scheduler can place nothing more on it.
        admin.call("PUT", f"/allocations/{uuid.uuid4()}", {
            "allocations": {rp1: {"resources": {"VGPU": 1}}}, "consumer_generation": None,
            "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
            "consumer_type": "INSTANCE",
        }, ok=(409,))
        assert absent(admin, RP2)
        health = agent.daemon.health()
        assert health["reporting"]["state"] == "ok" and health["reporting"]["providers"] == 1

        # The allocation goes: the next sync deletes the provider.
        admin.free(consumer)
        settle(lambda: children(admin), {}, "GPU1's provider deleted")
        assert absent(admin, RP1) and absent(admin, RP2)
        wait_for(lambda: f"deleted provider {RP1} ({rp1})" in agent.daemon.log(),
                 what="the deletion in the log")
        wait_for(lambda: agent.daemon.health()["reporting"]["providers"] == 0,
                 what="health counting no provider")
        assert agent.daemon.health()["reporting"]["state"] == "ok"
