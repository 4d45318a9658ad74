"""PlacementReporter against a real OpenStack Placement (SQLite, noauth2) on 127.0.0.1.

One server serves the module; every test uses its own host name, so its own
root provider and subtree.  The outage test runs its own server, which it
kills and restarts on the same port and database.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import textwrap
import time
import tracemalloc
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
from oslo_config import cfg

from accel_agent.config import registry
from accel_agent.devices.inventory import OWNER_TRAIT, Inventory, Provider, type_trait
from accel_agent.reporting.placement import PlacementReporter
from accel_agent.reporting.placement.answers import MAX_ANSWER_BYTES
from accel_agent.reporting.placement.client import MICROVERSION, adapter_for_endpoint
from accel_agent.reporting.placement.plan import provider_uuid
from tests.functional.placement_fixture import PlacementServer, placement_available
from tests.functional.placement_standin import Answer, StandIn, body, endless

pytestmark = pytest.mark.skipif(
    not placement_available(),
    reason="openstack-placement is not installed (pip install openstack-placement)",
)

_hosts = itertools.count()


# --- helpers --------------------------------------------------------------------------


class CountingAdapter(ks_adapter.Adapter):
    """Records every request the reporter sends; ``before`` runs just before one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []
        self.before: Callable[[str, str], None] | None = None

    def request(self, url: str, method: str, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append((method, url))
        if self.before is not None:
            self.before(method, url)
        return super().request(url, method, **kwargs)

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET"]


def counting_adapter(endpoint: str, timeout: float = 10) -> CountingAdapter:
    session = ks_session.Session(auth=token_endpoint.Token(endpoint, "admin"), timeout=timeout)
    return CountingAdapter(session, service_type="placement", default_microversion=MICROVERSION)


class Admin:
    """A second, independent Placement client: Nova, an operator, a rival writer."""

    def __init__(self, endpoint: str) -> None:
        self.adapter = adapter_for_endpoint(endpoint)

    def call(self, method: str, url: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        kwargs: dict[str, Any] = {"microversion": "1.39", "raise_exc": False}
        if body is not None:
            kwargs["json"] = body
        resp = self.adapter.request(url, method, **kwargs)
        assert resp.status_code in ok, f"{method} {url}: {resp.status_code} {resp.text}"
        return resp.json() if resp.status_code == 200 else None

    def create_provider(self, name: str, parent: str | None = None, traits: list[str] = ()) -> str:
        body = {"name": name, **({"parent_provider_uuid": parent} if parent else {})}
        rp_uuid = self.call("POST", "/resource_providers", body)["uuid"]
        if traits:
            self.set_traits(rp_uuid, list(traits))
        return rp_uuid

    def provider(self, name: str) -> dict[str, Any] | None:
        found = self.call("GET", f"/resource_providers?name={name}")["resource_providers"]
        return found[0] if found else None

    def set_traits(self, rp_uuid: str, traits: list[str]) -> None:
        for trait in traits:
            if trait.startswith("CUSTOM_"):
                self.call("PUT", f"/traits/{trait}", ok=(201, 204))
        generation = self.call("GET", f"/resource_providers/{rp_uuid}")["generation"]
        self.call(
            "PUT",
            f"/resource_providers/{rp_uuid}/traits",
            {"resource_provider_generation": generation, "traits": traits},
        )

    def allocate(self, rp_uuid: str, resources: dict[str, int]) -> str:
        consumer = str(uuid.uuid4())
        self.call(
            "PUT",
            f"/allocations/{consumer}",
            {
                "allocations": {rp_uuid: {"resources": resources}},
                "consumer_generation": None,
                "project_id": str(uuid.uuid4()),
                "user_id": str(uuid.uuid4()),
                "consumer_type": "INSTANCE",
            },
            ok=(204,),
        )
        return consumer

    def free(self, consumer: str) -> None:
        self.call("DELETE", f"/allocations/{consumer}", ok=(204,))

    def view(self, host: str) -> dict[str, Any]:
        """The subtree under ``host`` in ``Inventory.to_dict()``'s vocabulary."""
        root = self.provider(host)
        assert root is not None
        tree = self.call("GET", f"/resource_providers?in_tree={root['uuid']}")
        providers = []
        for rp in sorted(tree["resource_providers"], key=lambda r: r["name"]):
            if rp["uuid"] == root["uuid"]:
                continue
            assert rp["parent_provider_uuid"] == root["uuid"]
            base = f"/resource_providers/{rp['uuid']}"
            inventories = self.call("GET", f"{base}/inventories")["inventories"]
            providers.append(
                {
                    "name": rp["name"],
                    "parent_provider": host,
                    "inventories": inventories,
                    "traits": sorted(self.call("GET", f"{base}/traits")["traits"]),
                }
            )
        return {"host": host, "providers": providers}


# Written out, not derived with the reporter's own helpers: a change of the
# names, traits or inventory fields Placement sees must fail these tests.
TRAITS = {
    "nvidia-35": ["CUSTOM_MDEV_NVIDIA_35", "CUSTOM_OWNER_ACCEL_AGENT"],
    "nvidia-36": ["CUSTOM_MDEV_NVIDIA_36", "CUSTOM_OWNER_ACCEL_AGENT"],
}


def record(total: int, reserved: int = 0) -> dict[str, Any]:
    return {"total": total, "reserved": reserved, "min_unit": 1, "max_unit": total,
            "step_size": 1, "allocation_ratio": 1.0}


def want(
    host: str, bus: str, total: int = 16, rc: str = "VGPU", mdev_type: str = "nvidia-35"
) -> dict[str, Any]:
    """One provider as Placement must show it."""
    return {
        "name": f"{host}_pci_0000_{bus}_00_0",
        "parent_provider": host,
        "inventories": {rc: record(total)},
        "traits": TRAITS[mdev_type],
    }


def expected_view(host: str, *providers: dict[str, Any]) -> dict[str, Any]:
    return {"host": host, "providers": sorted(providers, key=lambda p: p["name"])}


def gpu(
    host: str, bus: str, *, total: int = 16, rc: str = "VGPU", mdev_type: str = "nvidia-35"
) -> Provider:
    address = f"0000:{bus}:00.0"
    return Provider(
        name=f"{host}_pci_0000_{bus}_00_0",
        parent_provider=host,
        parent_device=address,
        parent_devices=(address,),
        pci_address=address,
        physical_gpu=address,
        numa_node=0,
        device_type=mdev_type,
        resource_class=rc,
        total=total,
        used=0,
        traits=tuple(sorted({type_trait(mdev_type), OWNER_TRAIT})),
    )


def inventory_of(host: str, *providers: Provider) -> Inventory:
    return Inventory(host=host, providers=tuple(sorted(providers, key=lambda p: p.name)))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlacementServer]:
    with PlacementServer(tmp_path_factory.mktemp("placement")) as running:
        yield running


@pytest.fixture
def admin(server: PlacementServer) -> Admin:
    return Admin(server.endpoint)


@pytest.fixture
def host(admin: Admin) -> str:
    """A fresh compute host whose root provider "Nova" already created."""
    name = f"compute{next(_hosts)}.example.org"
    admin.create_provider(name, traits=["COMPUTE_NODE"])
    return name


def reporter_for(
    endpoint: str, host: str, **kwargs: Any
) -> tuple[PlacementReporter, CountingAdapter]:
    adapter = counting_adapter(endpoint)
    return PlacementReporter(adapter, host, **kwargs), adapter


# --- tests ----------------------------------------------------------------------------


def test_sync_reports_exactly_the_inventory_and_then_writes_nothing(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    root = admin.provider(host)
    assert root is not None
    # Nova's own child: not ours, never touched.
    nova_child = admin.create_provider(f"{host}_nova_gpu", root["uuid"], ["HW_GPU_API_VULKAN"])
    nova_generation = admin.call("GET", f"/resource_providers/{nova_child}")["generation"]
    inventory = inventory_of(
        host,
        gpu(host, "84"),
        gpu(host, "85", total=4, rc="CUSTOM_NVIDIA_GRID", mdev_type="nvidia-36"),
    )
    clock = Clock()
    reporter, adapter = reporter_for(server.endpoint, host, clock=clock)

    result = reporter.sync(inventory)

    assert result.ok, result
    assert sorted(result.created) == [p.name for p in inventory.providers]
    view = admin.view(host)
    ours = [p for p in view["providers"] if p["name"] != f"{host}_nova_gpu"]
    assert {"host": host, "providers": ours} == expected_view(
        host,
        want(host, "84"),
        want(host, "85", total=4, rc="CUSTOM_NVIDIA_GRID", mdev_type="nvidia-36"),
    )
    assert admin.call("GET", f"/resource_providers/{nova_child}")["generation"] == nova_generation
    assert reporter.health() == {
        "enabled": True,
        "state": "ok",
        "syncing_since": None,
        "sync_deadline": 60,
        "last_success": reporter.health()["last_success"],
        "last_error": None,
        "consecutive_failures": 0,
        "providers": 2,
        "next_attempt_at": None,
    }

    adapter.calls.clear()
    again = reporter.sync(inventory)
    assert again.ok and not again.changed
    assert adapter.writes() == [] and again.writes == 0
    # Nothing changed since Placement was found exact: nothing sent at all.
    assert again.unchanged and not again.attempted and adapter.calls == []
    # Once refresh_interval has passed, Placement is read again; with unchanged
    # generations that is the tree listing under the kept root, nothing else.
    clock.now += reporter.refresh_interval
    verified = reporter.sync(inventory)
    assert verified.ok and verified.attempted and not verified.changed
    assert adapter.calls == [("GET", f"/resource_providers?in_tree={root['uuid']}")]

    # A restarted agent (empty cache) reads everything but still writes nothing.
    fresh, fresh_adapter = reporter_for(server.endpoint, host)
    assert fresh.sync(inventory).ok
    assert fresh_adapter.writes() == []


def test_an_unchanged_tree_is_read_with_one_get_whatever_its_allocations(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    """Usages are read before a write, not to find nothing changed (subtree.py)."""
    clock = Clock()
    reporter, adapter = reporter_for(server.endpoint, host, clock=clock)
    a, b = gpu(host, "84"), gpu(host, "85")
    assert reporter.sync(inventory_of(host, a, b)).ok
    root = admin.provider(host)
    assert root is not None
    tree = ("GET", f"/resource_providers?in_tree={root['uuid']}")
    admin.allocate(provider_uuid(a.name), {"VGPU": 3})  # bumps a's generation
    adapter.calls.clear()

    clock.now += reporter.refresh_interval
    assert reporter.sync(inventory_of(host, a, b)).ok
    # a changed (an allocation): its inventories and traits read again, no usages.
    base = f"/resource_providers/{provider_uuid(a.name)}"
    assert adapter.calls == [tree, ("GET", f"{base}/inventories"), ("GET", f"{base}/traits")]
    adapter.calls.clear()
    clock.now += reporter.refresh_interval
    assert reporter.sync(inventory_of(host, a, b)).ok
    assert adapter.calls == [tree]

    # A write is planned on usages as they are now: read before it.
    adapter.calls.clear()
    assert reporter.sync(inventory_of(host, gpu(host, "84", total=8), b)).ok
    assert adapter.calls.index(("GET", f"{base}/usages")) < adapter.calls.index(
        ("PUT", f"{base}/inventories"))


def test_a_reload_with_the_same_placement_settings_keeps_what_the_reporter_knew(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    inventory = inventory_of(host, gpu(host, "84"))
    before, _ = reporter_for(server.endpoint, host, settings=("endpoint", server.endpoint))
    assert before.sync(inventory).ok

    after, adapter = reporter_for(server.endpoint, host, settings=("endpoint", server.endpoint))
    assert after.carry_from(before)
    kept = after.sync(inventory)
    assert kept.ok and kept.unchanged and adapter.calls == []
    assert after.health()["providers"] == 1

    # Another Placement (or auth, or host): nothing is carried, everything read.
    other, other_adapter = reporter_for(server.endpoint, host, settings=("endpoint", "elsewhere"))
    assert not other.carry_from(before)
    assert other.sync(inventory).attempted and other_adapter.calls


def test_config_path_admin_token_against_noauth2(
    server: PlacementServer, admin: Admin, tmp_path: Path
) -> None:
    conf_file = tmp_path / "accel-agent.conf"
    conf_file.write_text(
        textwrap.dedent(
            f"""
            [placement]
            enabled = true
            create_root_provider = true
            max_conflict_retries = 2
            auth_type = admin_token
            endpoint = {server.endpoint}
            token = admin
            """
        )
    )
    conf = cfg.ConfigOpts()
    registry.register(conf)
    conf.set_default("host", "standalone.example.org")
    conf(["--config-file", str(conf_file)], project="accel-agent", default_config_files=[])
    reporter = PlacementReporter.from_conf(conf)
    host = conf.host
    inventory = inventory_of(host, gpu(host, "84", total=2))

    result = reporter.sync(inventory)

    assert result.ok, result
    assert admin.view(host) == expected_view(host, want(host, "84", total=2))
    # The root the agent created is not its to delete, nor does it carry the owner trait.
    root = admin.provider(host)
    assert root is not None and root["uuid"] == provider_uuid(host)
    assert admin.call("GET", f"/resource_providers/{root['uuid']}/traits")["traits"] == []


def test_missing_root_provider_is_reported_and_retried(
    server: PlacementServer, admin: Admin
) -> None:
    host = f"compute{next(_hosts)}.example.org"
    clock = Clock()
    reporter, _ = reporter_for(server.endpoint, host, clock=clock, sync_interval=60)
    inventory = inventory_of(host, gpu(host, "84"))

    result = reporter.sync(inventory)

    assert not result.ok and result.attempted
    assert f"root provider {host} not found" in (result.error or "")
    health = reporter.health()
    assert health["state"] == "failing" and health["consecutive_failures"] == 1
    assert f"root provider {host} not found" in health["last_error"]
    # Nova creates the compute node; the next attempt (after the back-off) succeeds.
    admin.create_provider(host)
    assert not reporter.sync(inventory).attempted
    clock.now = reporter.next_attempt_at
    assert reporter.sync(inventory).ok
    assert admin.view(host) == expected_view(host, want(host, "84"))
    assert reporter.health()["state"] == "ok"


def test_foreign_provider_with_our_name_is_refused_others_synced(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    root = admin.provider(host)
    assert root is not None
    taken = gpu(host, "84")
    foreign = admin.create_provider(taken.name, root["uuid"], ["COMPUTE_NODE"])
    inventory = inventory_of(host, taken, gpu(host, "85"))
    reporter, _ = reporter_for(server.endpoint, host)

    result = reporter.sync(inventory)

    assert not result.ok
    assert list(result.failures) == [taken.name]
    assert "not created by accel-agent" in result.failures[taken.name]
    assert result.created == (gpu(host, "85").name,)
    assert admin.call("GET", f"/resource_providers/{foreign}/inventories")["inventories"] == {}


def test_concurrent_writer_is_redriven_and_converges(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    reporter, adapter = reporter_for(server.endpoint, host)
    target = gpu(host, "84")
    assert reporter.sync(inventory_of(host, target, gpu(host, "85"))).ok
    target_uuid = provider_uuid(target.name)
    raced: list[str] = []

    def rival(method: str, url: str) -> None:
        # Between the agent's read and its first write, another client changes
        # the provider (and so its generation).
        if method == "PUT" and url.startswith(f"/resource_providers/{target_uuid}") and not raced:
            raced.append(url)
            admin.set_traits(target_uuid, [*target.traits, "CUSTOM_RIVAL"])

    adapter.before = rival
    shrunk = inventory_of(host, gpu(host, "84", total=8), gpu(host, "85"))

    result = reporter.sync(shrunk)

    assert result.ok, result
    assert raced and result.conflicts == 1
    assert result.updated == (target.name,)
    # The refetch saw the rival's trait and the agent restored its own set.
    assert admin.view(host) == expected_view(host, want(host, "84", 8), want(host, "85"))
    adapter.before = None
    adapter.calls.clear()
    assert reporter.sync(shrunk).ok and adapter.writes() == []


def test_writer_that_always_wins_fails_after_bounded_retries(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    reporter, adapter = reporter_for(server.endpoint, host, max_retries=2)
    assert reporter.sync(inventory_of(host, gpu(host, "84"), gpu(host, "85"))).ok
    contested = provider_uuid(gpu(host, "84").name)

    def rival(method: str, url: str) -> None:
        if method == "PUT" and url.startswith(f"/resource_providers/{contested}"):
            # Toggle a trait: Placement does not bump the generation for a PUT
            # that changes nothing, so the rival must really change something.
            current = admin.call("GET", f"/resource_providers/{contested}/traits")["traits"]
            admin.set_traits(contested, sorted(set(current) ^ {"CUSTOM_RIVAL"}))

    adapter.before = rival
    adapter.calls.clear()
    wanted = inventory_of(host, gpu(host, "84", total=8), gpu(host, "85", total=8))

    result = reporter.sync(wanted)

    assert not result.ok and result.attempted
    assert list(result.failures) == [gpu(host, "84").name]
    assert "gave up after 3 attempts" in result.failures[gpu(host, "84").name]
    assert result.conflicts == 2
    contested_puts = [
        c for c in adapter.writes() if c[1].startswith(f"/resource_providers/{contested}")
    ]
    assert len(contested_puts) == 3  # 1 attempt + max_retries redrives
    assert result.updated == (gpu(host, "85").name,)  # the other provider was still synced
    health = reporter.health()
    assert health["state"] == "failing" and gpu(host, "84").name in health["last_error"]

    adapter.before = None
    assert reporter.sync(wanted, force=True).ok
    assert admin.view(host) == expected_view(host, want(host, "84", 8), want(host, "85", 8))


def test_a_provider_deleted_under_the_writer_is_created_again(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    """Someone deletes the agent's provider between its read and its write:
    the write's 404 is a conflict like a 409, the provider is read again (gone)
    and created again in the same sync, under the same UUID."""
    reporter, adapter = reporter_for(server.endpoint, host)
    target = gpu(host, "84")
    assert reporter.sync(inventory_of(host, target)).ok
    target_uuid = provider_uuid(target.name)
    inventories = f"/resource_providers/{target_uuid}/inventories"
    deleted: list[str] = []

    def rival(method: str, url: str) -> None:
        if method == "PUT" and url == inventories and not deleted:
            deleted.append(url)
            admin.call("DELETE", f"/resource_providers/{target_uuid}", ok=(204,))

    adapter.before = rival

    result = reporter.sync(inventory_of(host, gpu(host, "84", total=8)))

    assert result.ok, result
    assert deleted and result.conflicts == 1
    assert result.created == (target.name,) and result.updated == ()
    assert admin.view(host) == expected_view(host, want(host, "84", 8))
    assert admin.provider(target.name)["uuid"] == target_uuid


def test_the_reporter_logs_under_one_name(
    server: PlacementServer, host: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever part of the reporter logs (the line per request, each write,
    the sync's summary) logs as accel_agent.reporting.placement, the name
    operators' log levels and filters know."""
    reporter, _ = reporter_for(server.endpoint, host)
    name = gpu(host, "84").name
    with caplog.at_level(logging.DEBUG, logger="accel_agent.reporting.placement"):
        assert reporter.sync(inventory_of(host, gpu(host, "84"))).ok
    ours = [r for r in caplog.records if r.name.startswith("accel_agent")]
    assert {r.name for r in ours} == {"accel_agent.reporting.placement"}
    messages = [r.getMessage() for r in ours]
    assert any(m.startswith(f"GET /resource_providers?name={host}: 200") for m in messages)
    assert f"created provider {name} ({provider_uuid(name)})" in messages
    assert "Placement sync: 1 created, 0 updated, 0 drained, 0 deleted (5 writes)" in messages


def test_removed_gpu_is_deleted_or_drained_until_free(
    server: PlacementServer, admin: Admin, host: str
) -> None:
    reporter, adapter = reporter_for(server.endpoint, host)
    a, b, c = gpu(host, "84"), gpu(host, "85", total=4), gpu(host, "86")
    assert reporter.sync(inventory_of(host, a, b, c)).ok
    b_uuid = provider_uuid(b.name)
    consumer = admin.allocate(b_uuid, {"VGPU": 2})

    result = reporter.sync(inventory_of(host, c))

    assert result.ok, result
    assert result.deleted == (a.name,)
    assert result.drained == (b.name,)
    # Waiting on its allocations: looked at (usages read) at every sync until freed.
    assert result.pending == (b.name,)
    names = [p["name"] for p in admin.view(host)["providers"]]
    assert names == [b.name, c.name]
    drained = admin.call("GET", f"/resource_providers/{b_uuid}/inventories")["inventories"]
    assert drained == {"VGPU": {**b.inventory_record(), "reserved": 4}}
    assert admin.call("GET", f"/allocations/{consumer}")["allocations"]  # untouched
    adapter.calls.clear()
    waiting = reporter.sync(inventory_of(host, c))
    assert waiting.ok and waiting.attempted and waiting.pending == (b.name,)
    assert adapter.writes() == []  # already drained: nothing to do while allocated
    assert ("GET", f"/resource_providers/{b_uuid}/usages") in adapter.calls

    admin.free(consumer)
    final = reporter.sync(inventory_of(host, c))

    assert final.ok and final.deleted == (b.name,)
    assert admin.view(host) == expected_view(host, want(host, "86"))
    assert reporter.health()["providers"] == 1


def test_total_and_resource_class_changes(server: PlacementServer, admin: Admin, host: str) -> None:
    reporter, _ = reporter_for(server.endpoint, host)
    assert reporter.sync(inventory_of(host, gpu(host, "84"))).ok
    rp = provider_uuid(gpu(host, "84").name)

    smaller = inventory_of(host, gpu(host, "84", total=8))
    result = reporter.sync(smaller)
    assert result.ok and result.updated == (gpu(host, "84").name,)
    assert admin.view(host) == expected_view(host, want(host, "84", total=8))

    # VGPU -> CUSTOM_ while an instance holds VGPU: the old class stays, drained.
    consumer = admin.allocate(rp, {"VGPU": 1})
    custom = inventory_of(host, gpu(host, "84", total=8, rc="CUSTOM_NVIDIA_35"))
    assert reporter.sync(custom).ok
    inventories = admin.call("GET", f"/resource_providers/{rp}/inventories")["inventories"]
    assert inventories == {"CUSTOM_NVIDIA_35": record(8), "VGPU": record(8, reserved=8)}
    admin.free(consumer)
    assert reporter.sync(custom).ok
    assert admin.view(host) == expected_view(host, want(host, "84", 8, "CUSTOM_NVIDIA_35"))


def test_placement_outage_backs_off_and_recovers_without_restart(tmp_path: Path) -> None:
    with PlacementServer(tmp_path / "placement") as server:
        admin = Admin(server.endpoint)
        host = "outage.example.org"
        admin.create_provider(host)
        clock = Clock()
        reporter, _ = reporter_for(
            server.endpoint, host, clock=clock, sync_interval=10, max_backoff=25
        )
        assert reporter.sync(inventory_of(host, gpu(host, "84"))).ok
        server.stop()  # SIGKILL, like a crash
        wanted = inventory_of(host, gpu(host, "84", total=8), gpu(host, "85"))

        failed = reporter.sync(wanted)

        assert not failed.ok and failed.attempted
        assert "Placement unavailable" in (failed.error or "")
        health = reporter.health()
        assert health["state"] == "failing" and health["consecutive_failures"] == 1
        assert health["providers"] == 1  # what Placement last held
        # Each wait drawn between half of it and all of it (health.jittered).
        assert clock.now + 5 <= reporter.next_attempt_at <= clock.now + 10
        skipped = reporter.sync(wanted)
        assert not skipped.attempted and "backing off" in (skipped.error or "")
        # Back-off doubles and is capped at max_backoff.
        clock.now = reporter.next_attempt_at
        assert not reporter.sync(wanted).ok
        assert clock.now + 10 <= reporter.next_attempt_at <= clock.now + 20
        clock.now = reporter.next_attempt_at
        assert not reporter.sync(wanted).ok
        assert clock.now + 12.5 <= reporter.next_attempt_at <= clock.now + 25
        assert reporter.health()["consecutive_failures"] == 3

        server.start()  # same port, same database
        clock.now = reporter.next_attempt_at
        recovered = reporter.sync(wanted)

        assert recovered.ok, recovered
        assert admin.view(host) == expected_view(host, want(host, "84", 8), want(host, "85"))
        health = reporter.health()
        assert health["state"] == "ok" and health["consecutive_failures"] == 0
        assert health["providers"] == 2 and health["next_attempt_at"] is None


def test_a_placement_rebuilt_from_scratch_is_filled_again_without_restart(
    tmp_path: Path,
) -> None:
    """Placement's database lost (restored empty, redeployed on the same
    endpoint): the custom traits and resource class the reporter created
    before are gone with it, and the next sync creates them again before
    using them."""
    with PlacementServer(tmp_path / "placement") as server:
        host = "rebuilt.example.org"
        wanted = inventory_of(host, gpu(host, "84", rc="CUSTOM_NVIDIA_35"))
        clock = Clock()
        reporter, _ = reporter_for(server.endpoint, host, create_root=True, clock=clock)
        assert reporter.sync(wanted).ok
        server.stop()
        server.database.unlink()
        server.start()  # same port, an empty database
        # Seen at the next read of Placement (refresh_interval), by a reporter
        # that keeps the root it knew: that root's tree is empty now, so the
        # root is looked up by name and created again.
        clock.now += reporter.refresh_interval

        result = reporter.sync(wanted)

        assert result.ok, result
        assert result.created == (gpu(host, "84").name,)
        assert Admin(server.endpoint).view(host) == expected_view(
            host, want(host, "84", rc="CUSTOM_NVIDIA_35")
        )


def test_vendor_vfio_gpus_are_one_provider_each_like_any_pci_gpu(
    server: PlacementServer, admin: Admin, host: str, tmp_path: Path
) -> None:
    """NVIDIA vGPU 17+ GPUs (no mdev: VFs typed through sysfs) reach Placement
    from a real scan as one provider per PF, total from the VFs, beside an
    mdev GPU, with the same names, traits and fields (issue 14, item 3)."""
    from accel_agent.backends import builtin
    from accel_agent.backends.host import scan_host
    from accel_agent.devices.inventory import compute_inventory
    from accel_agent.devices.policy import PolicyInputs, TypeOptions, resolve_policy
    from accel_agent.simulator import build_spec, materialise

    root = str(tmp_path / "sys")
    materialise(build_spec(["nvidia-pf", "nvidia-vfio"], gpus=2, vfs=3), root)
    inputs = PolicyInputs(
        enabled=("nvidia-35", "nvidia-1150"),
        type_options=(
            TypeOptions("nvidia-35", device_addresses=("0000:84:00.0",)),
            TypeOptions(
                "nvidia-1150",
                device_addresses=("0000:c1:00.0", "0000:c2:00.0"),
                mdev_class="CUSTOM_L40S_4Q",
            ),
        ),
    )
    policy = resolve_policy(inputs, root)
    snapshot = scan_host(root, builtin(), state_dir=str(tmp_path / "state"))
    inventory = compute_inventory(snapshot, policy, host)
    reporter, _ = reporter_for(server.endpoint, host)

    assert reporter.sync(inventory).ok
    vfio_traits = ["CUSTOM_MDEV_NVIDIA_1150", "CUSTOM_OWNER_ACCEL_AGENT"]
    assert admin.view(host) == expected_view(
        host,
        want(host, "84"),
        {"name": f"{host}_pci_0000_c1_00_0", "parent_provider": host,
         "inventories": {"CUSTOM_L40S_4Q": record(3)}, "traits": vfio_traits},
        {"name": f"{host}_pci_0000_c2_00_0", "parent_provider": host,
         "inventories": {"CUSTOM_L40S_4Q": record(3)}, "traits": vfio_traits},
    )


# --- answers a real Placement never sends (issue 21, item 5) --------------------------


@dataclass(frozen=True)
class Bad:
    """One answer of the real Placement replaced by ``mutate(its JSON)``."""

    method: str
    path: str  # a regex the request's path must match
    mutate: Callable[[Any], Any]  # the real answer's JSON -> what is sent (bytes as they are)
    reason: str  # what the reporter must say is wrong
    write: bool = False  # the tampered sync writes (its inventory changed)


def _child(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """An in_tree listing with its first child (not the root) changed."""
    providers = [dict(rp) for rp in doc["resource_providers"]]
    child = next(rp for rp in providers if rp.get("parent_provider_uuid"))
    child.update(changes)
    return {"resource_providers": providers}


def _record(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**doc, "inventories": {"VGPU": {**doc["inventories"]["VGPU"], **changes}}}


BAD_ANSWERS = {
    # The operator's case: "200 {}".
    "empty-listing": Bad("GET", r"/resource_providers\?name=", lambda doc: {},
                         "resource_providers is missing"),
    "provider-without-uuid": Bad(
        "GET", r"/resource_providers\?name=",
        lambda doc: {"resource_providers": [{"name": "x", "generation": 1}]},
        "resource_providers[0].uuid is missing"),
    # Would have become the URL the reporter writes the provider's traits to.
    "uuid-with-a-path": Bad(
        "GET", r"/resource_providers\?in_tree=",
        lambda doc: _child(doc, uuid="../../traits/CUSTOM_EVIL"),
        "uuid is a string '../../traits/CUSTOM_EVIL', not a UUID"),
    "generation-true": Bad(
        "GET", r"/resource_providers\?in_tree=", lambda doc: _child(doc, generation=True),
        "generation is a boolean true, not an integer"),
    "not-json": Bad("GET", r"/resource_providers\?in_tree=",
                    lambda doc: b"<html>502 Bad Gateway</html>",
                    "a body that is not JSON (Expecting value: line 1 column 1 (char 0))"),
    "total-as-text": Bad(
        "GET", r"/resource_providers/[^/?]+/inventories$",
        lambda doc: _record(doc, total="16"),
        "inventories.VGPU.total is a string '16', not an integer"),
    # Usages are read before a write (subtree.py): a change to write.
    "usage-as-text": Bad(
        "GET", r"/resource_providers/[^/?]+/usages$", lambda doc: {"usages": {"VGPU": "1"}},
        "usages.VGPU is a string '1', not an integer", write=True),
    "written-without-generation": Bad(
        "PUT", r"/resource_providers/[^/?]+/inventories$",
        lambda doc: {"inventories": doc["inventories"]},
        "resource_provider_generation is missing", write=True),
}


def _tampering(bad: Bad, armed: list[bool]) -> Callable[[str, str, int, bytes], Answer | None]:
    def tamper(method: str, path: str, status: int, real: bytes) -> Answer | None:
        if not (armed and method == bad.method and re.search(bad.path, path) and status == 200):
            return None
        sent = bad.mutate(json.loads(real))
        return body(sent if isinstance(sent, bytes) else json.dumps(sent).encode())

    return tamper


@pytest.mark.parametrize("case", list(BAD_ANSWERS), ids=list(BAD_ANSWERS))
def test_a_malformed_answer_fails_the_sync_with_one_line_and_is_retried(
    server: PlacementServer, admin: Admin, host: str, case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = BAD_ANSWERS[case]
    armed: list[bool] = []
    before = inventory_of(host, gpu(host, "84"))
    wanted = inventory_of(host, gpu(host, "84", total=8)) if bad.write else before
    with StandIn(server.endpoint, _tampering(bad, armed)) as standin:
        assert reporter_for(standin.endpoint, host)[0].sync(before).ok
        clock = Clock()
        # A fresh reporter: no cache hides the reads a restarted agent makes.
        reporter, adapter = reporter_for(standin.endpoint, host, clock=clock)
        armed.append(True)
        caplog.clear()

        with caplog.at_level(logging.INFO, logger="accel_agent.reporting.placement"):
            result = reporter.sync(wanted)

        assert standin.tampered, "the answer was never asked for"
        assert not result.ok and result.attempted
        method, path = standin.tampered[0]
        error = result.error or ""
        # One line: the request, what is wrong in it, the request id (none: a stand-in's).
        assert error.startswith(f"Placement's answer to {method} {path} rejected: "), error
        assert error.endswith(f"{bad.reason} (request -)"), error
        health = reporter.health()
        assert health["state"] == "failing" and health["last_error"] == result.error
        assert health["consecutive_failures"] == 1
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
        failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(failures) == 1 and bad.reason in failures[0] and "\n" not in failures[0]
        # Nothing was written through what the bad answer said.
        assert not [c for c in adapter.writes() if "EVIL" in c[1]]

        armed.clear()  # Placement is sane again: the next attempt, after the back-off, works
        clock.now = reporter.next_attempt_at
        assert reporter.sync(wanted).ok
    assert admin.view(host) == expected_view(host, want(host, "84", 8 if bad.write else 16))


def test_a_root_created_without_a_uuid_in_the_answer_fails_the_sync(
    server: PlacementServer, admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's ``KeyError: 'uuid'``: POST /resource_providers answered ``{}``."""
    host = f"compute{next(_hosts)}.example.org"
    bad = Bad("POST", r"/resource_providers$", lambda doc: {}, "uuid is missing")
    with StandIn(server.endpoint, _tampering(bad, [True])) as standin:
        reporter, _ = reporter_for(standin.endpoint, host, create_root=True)
        with caplog.at_level(logging.INFO, logger="accel_agent.reporting.placement"):
            result = reporter.sync(inventory_of(host, gpu(host, "84")))
    assert not result.ok
    assert (result.error or "").startswith(
        "Placement's answer to POST /resource_providers rejected: uuid is missing (request -)"
    ), result.error
    assert not [r for r in caplog.records if r.exc_info]


def _gzip_of_zeros(size: int) -> list[bytes]:
    """``size`` zero bytes gzipped (about size/1000), built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"0" * (1 << 20)
    out = [packer.compress(block) for _ in range(size // len(block))]
    return [b"".join(out) + packer.flush()]


HUGE = 200 * 1024 * 1024


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("streamed", f"the body exceeds the {MAX_ANSWER_BYTES} bytes an answer may have; "
                     "read stopped there"),
        ("declared", f"Content-Length {HUGE} exceeds the {MAX_ANSWER_BYTES} bytes an answer "
                     "may have; not read"),
        ("gzip-bomb", "a 'gzip'-encoded body (identity was asked for); not read"),
    ],
    ids=["streamed", "declared", "gzip-bomb"],
)
def test_a_huge_answer_is_not_read(
    server: PlacementServer, host: str, kind: str, reason: str
) -> None:
    """200 MB from "Placement": the reporter never holds more than the bound,
    and stops reading (the server could not send it all)."""
    chunk = b" " * 65536
    answers = {
        "streamed": Answer(200, endless(chunk, HUGE)),
        "declared": Answer(200, endless(chunk, HUGE),
                           {"Content-Type": "application/json", "Content-Length": str(HUGE)}),
        "gzip-bomb": Answer(200, _gzip_of_zeros(HUGE),
                            {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    }
    bad = Bad("GET", r"/resource_providers\?name=", lambda doc: None, reason)

    def tamper(method: str, path: str, status: int, real: bytes) -> Answer | None:
        return answers[kind] if method == "GET" and re.search(bad.path, path) else None

    with StandIn(server.endpoint, tamper) as standin:
        reporter, _ = reporter_for(standin.endpoint, host)
        tracemalloc.start()
        try:
            result = reporter.sync(inventory_of(host, gpu(host, "84")))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert not result.ok and reason in (result.error or ""), result.error
    assert reporter.health()["last_error"] == result.error
    # Before: the whole 200 MB (and for the bomb, inflated) in memory at once.
    assert peak < 2 * MAX_ANSWER_BYTES, f"peak {peak / 2**20:.0f} MiB"
    if kind != "gzip-bomb":
        assert standin.sent < HUGE, "the whole answer was read"


def test_an_answer_that_trickles_in_is_abandoned(server: PlacementServer, host: str) -> None:
    """A byte every 50 ms never trips a socket timeout; the whole answer gets
    the session's timeout (1 s here) and no more (reporting/placement/deadline.py;
    tests/unit/test_placement_deadline.py has the status line and headers too)."""

    def drip() -> Iterator[bytes]:
        yield b'{"resource_providers": ['
        for _ in range(400):  # 20 s, far past the 1 s
            time.sleep(0.05)
            yield b" "

    def tamper(method: str, path: str, status: int, real: bytes) -> Answer | None:
        return Answer(200, drip()) if path.startswith("/resource_providers?name=") else None

    with StandIn(server.endpoint, tamper) as standin:
        reporter = PlacementReporter(counting_adapter(standin.endpoint, timeout=1), host)
        result = reporter.sync(inventory_of(host, gpu(host, "84")))
    assert not result.ok
    assert "no whole answer within 1 s" in (result.error or ""), result.error
