"""The udev path, in-process: the service's own watcher is fed synthetic
uevents (no udev here, and a simulated tree sends none), and each relevant
one triggers a rescan that repairs what changed behind the agent's back."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from accel_agent import events
from accel_agent.devices import writers
from accel_agent.service import AgentService
from tests.configutil import make_conf
from tests.functional.daemon_fixture import short_dir, wait_for
from tests.functional.simhost import simulated_host

pytestmark = pytest.mark.fuse

GPU = "0000:84:00.0"


@dataclass
class FakeDevice:
    """The attributes a pyudev Device offers that the watcher reads."""

    subsystem: str
    action: str
    sys_path: str
    properties: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def service(tmp_path, monkeypatch) -> Iterator[tuple[AgentService, Any]]:
    # The service listens to udev only on the real /sys; make it listen here,
    # without a netlink socket: the test is the kernel.
    monkeypatch.setattr(events, "wants_udev", lambda root, enabled: enabled)
    monkeypatch.setattr(events.UdevWatcher, "start", lambda self: True)
    with simulated_host(tmp_path, ["nvidia-pf"], gpus=1) as host, short_dir() as sockdir:
        conf = make_conf(
            f"""
            [DEFAULT]
            state_dir = {host.state_dir}
            rescan_interval = 3600
            event_debounce = 0.05
            [devices]
            enabled_mdev_types = nvidia-35
            [api]
            socket_path = {sockdir}/api.sock
            [libvirt]
            uri =
            """,
            sysfs_root=host.root,
        )
        agent = AgentService(conf, writer=writers.DirectWriter(host.root))
        agent.prepare()
        agent.start()
        try:
            yield agent, host
        finally:
            agent.stop()


def remove_behind_the_back(host, uuid: str) -> None:
    fd = os.open(os.path.join(host.root, "bus", "mdev", "devices", uuid, "remove"), os.O_WRONLY)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)


def test_uevents_trigger_rescans_that_recreate_vanished_mdevs(service, monkeypatch):
    agent, host = service
    core, metrics = agent.core, agent.core.metrics
    assert agent.udev is not None  # the service wired its watcher
    scheduler = agent.scheduler
    assert scheduler is not None
    # Each run the scheduler makes, with its reasons and how many mdevs it
    # re-created.  How many "api" runs an allocation causes depends on the
    # machine's speed (every manager operation asks for one, and a slow
    # machine lets the debounce window close between them), so the test
    # follows which run re-created the mdev, not how many ran.
    runs: list[tuple[frozenset[str], float]] = []
    inner = scheduler._rescan

    def recording(reasons: frozenset[str]) -> Any:
        before = metrics.value("accel_agent_recreated_mdevs_total")
        try:
            return inner(reasons)
        finally:
            runs.append((reasons, metrics.value("accel_agent_recreated_mdevs_total") - before))

    monkeypatch.setattr(scheduler, "_rescan", recording)
    uuid = core.devices.allocate("vm-u", 1).uuids[0]
    # The allocation's rescans must have *finished* before the mdev vanishes:
    # a rescan still running would see it missing and re-create it itself,
    # and the udev path would prove nothing.  With the periodic timer at an
    # hour, nothing else starts one until the test's uevent.
    wait_for(lambda: runs and not scheduler.busy, what="the post-allocate rescans to finish")
    assert {reason for reasons, _ in runs for reason in reasons} == {"api"}
    assert metrics.value("accel_agent_rescans_total", {"reason": "udev"}) == 0
    assert metrics.value("accel_agent_recreated_mdevs_total") == 0
    before_uevent = len(runs)

    remove_behind_the_back(host, uuid)
    agent.udev.handle(FakeDevice("net", "add", "/sys/devices/virtual/net/tap0"))
    assert agent.udev.events == 0  # not ours: ignored
    assert not scheduler.busy  # and no rescan asked for
    agent.udev.handle(FakeDevice("mdev", "remove", f"/sys/devices/x/{GPU}/{uuid}"))
    wait_for(lambda: any("udev" in reasons for reasons, _ in runs), what="the uevent's rescan")
    # The uevent's rescan, and no other, saw the mdev missing and re-created it.
    recreating = [reasons for reasons, recreated in runs if recreated]
    assert recreating == [frozenset({"udev"})]
    assert runs[before_uevent][0] == frozenset({"udev"})
    assert metrics.value("accel_agent_rescans_total", {"reason": "udev"}) == 1
    assert metrics.value("accel_agent_recreated_mdevs_total") == 1
    assert uuid in host.sysfs_uuids()
    assert core.devices.allocation("vm-u").uuids == [uuid]
    wait_for(lambda: not scheduler.busy, what="the rescans after the re-creation")

    # A parent unregistering (driver unloaded) announces MDEV_STATE on itself.
    host.sim.unregister(GPU)
    agent.udev.handle(FakeDevice("pci", "change", f"/sys/devices/x/{GPU}",
                                 {"MDEV_STATE": "unregistered"}))
    wait_for(lambda: core.health()["recovery"]["waiting_for_parent"] == [uuid],
             what="the mdev waiting for its parent")
    assert core.health()["providers"] == 0
    host.sim.register(GPU)
    agent.udev.handle(FakeDevice("pci", "change", f"/sys/devices/x/{GPU}",
                                 {"MDEV_STATE": "registered"}))
    wait_for(lambda: uuid in host.sysfs_uuids(), what="re-created after the parent came back")
    wait_for(lambda: core.health()["status"] == "ok", what="health ok")
    assert metrics.value("accel_agent_rescans_total", {"reason": "udev"}) == 3
    assert metrics.value("accel_agent_rescans_total", {"reason": "periodic"}) == 0


def test_a_rescan_frees_expired_migration_claims(service):
    agent, host = service
    core = agent.core
    source = "5a5a5a5a-0000-4000-8000-000000000001"
    now = time.time()
    kept = core.devices.claim("mig-live", {source: "nvidia-35"}, expires_at=now + 3600)[source]
    expired = core.devices.claim("mig-dead", {source: "nvidia-35"}, expires_at=now - 1)[source]
    core.rescan({"periodic"})
    assert [r.uuid for r in core.devices.ledger.by_owner("mig-live")] == [kept]
    assert core.devices.ledger.by_owner("mig-dead") == []
    freed = core.devices.ledger.get(expired)
    assert freed is not None and freed.owner is None  # kept for reuse, not removed
    assert expired in host.sysfs_uuids()
    assert core.health()["mdevs"]["claimed"] == 1 and core.health()["mdevs"]["free"] == 1


def test_a_failed_recreation_is_reported_and_retried(service):
    agent, host = service
    core = agent.core
    uuid = core.devices.allocate("vm-f", 1).uuids[0]
    host.sim.fail_next_create("ENOSPC", parent=GPU)
    remove_behind_the_back(host, uuid)
    agent.udev.handle(FakeDevice("mdev", "remove", f"/sys/devices/x/{GPU}/{uuid}"))
    wait_for(lambda: core.health()["recovery"]["missing"] == [uuid], what="the failed recovery")
    health = core.health()
    assert health["status"] == "degraded"
    assert "insufficient capacity" in health["recovery"]["error"]
    assert uuid not in host.sysfs_uuids()
    # The fault was one-shot: the next event's rescan re-creates it.
    agent.udev.handle(FakeDevice("mdev", "remove", f"/sys/devices/x/{GPU}/{uuid}"))
    wait_for(lambda: uuid in host.sysfs_uuids(), what="the retry")
    wait_for(lambda: core.health()["status"] == "ok", what="health ok")
    assert core.devices.allocation("vm-f").uuids == [uuid]
