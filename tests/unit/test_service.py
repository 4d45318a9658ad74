"""Pure parts of the daemon: orphan check, mdev counts, Placement signature, sd_notify, health."""

from __future__ import annotations

import logging
import socket
import threading
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from accel_agent import service
from accel_agent.daemon.core import AgentCore
from accel_agent.daemon.counts import count_mdevs, mdev_infos, placement_signature
from accel_agent.daemon.reloads import orphaned
from accel_agent.devices.inventory import Inventory, Provider
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.devices.policy import DevicePolicy, TypeConfig
from accel_agent.devices.protocol import Existing
from accel_agent.reporting.metrics import AgentMetrics
from accel_agent.sysfs.model import HostSnapshot, Mdev

U1 = "11111111-1111-4111-8111-111111111111"
U2 = "22222222-2222-4222-8222-222222222222"
U3 = "33333333-3333-4333-8333-333333333333"
U4 = "44444444-4444-4444-8444-444444444444"
FOREIGN = "ffffffff-ffff-4fff-8fff-ffffffffffff"


def rec(
    uuid: str,
    owner: str | None = None,
    state: DeviceState = DeviceState.PRESENT,
    kind: OwnerKind | None = None,
    parent: str = "0000:84:00.0",
    mdev_type: str = "nvidia-35",
    intent: int | None = None,
) -> DeviceRecord:
    return DeviceRecord(
        uuid=uuid,
        parent=parent,
        device_type=mdev_type,
        state=state,
        owner=owner,
        owner_kind=kind or (OwnerKind.INSTANCE if owner else None),
        claim_expires_at=None,
        intent_id=intent,
        adopted=False,
        created_at=0.0,
        updated_at=0.0,
    )


def policy(parent_types: dict[str, str], default: str | None = None) -> DevicePolicy:
    types = {*parent_types.values(), *([default] if default else [])}
    return DevicePolicy(
        types=tuple(TypeConfig(t, (), "VGPU", None) for t in sorted(types)),
        parent_types=MappingProxyType(parent_types),
        default_type=default,
    )


def snapshot(*uuids: str) -> HostSnapshot:
    mdevs = {u: Mdev(u, "0000:84:00.0", "nvidia-35", 1) for u in uuids}
    return HostSnapshot(root="/x", parents=MappingProxyType({}), mdevs=MappingProxyType(mdevs))


def test_orphaned_names_every_assigned_mdev_whose_parent_changes_type():
    assigned = [rec(U1, "vm-1"), rec(U2, "vm-2", parent="mtty", mdev_type="mtty-2")]
    existing = Existing(snapshot(U1, U2), {})
    assert orphaned(assigned, policy({"mtty": "mtty-2"}, default="nvidia-35"), existing) == []
    reasons = orphaned(assigned, policy({"0000:84:00.0": "nvidia-36"}), existing)
    assert len(reasons) == 2
    assert U1 in reasons[0] and "vm-1" in reasons[0] and "type nvidia-36" in reasons[0]
    assert U2 in reasons[1] and "no type" in reasons[1]


def test_orphaned_names_a_device_of_a_type_nova_would_report_and_skips_the_layout_s():
    """Issue 33 item 12: ``reported_by = nova`` for the type of a device an
    instance holds hands it to Nova too; a layout's device nobody holds is
    Nova's to hand out, and a device gone with its parent gives the type it
    needs to be re-created with."""
    nova = DevicePolicy(
        types=(TypeConfig("nvidia-35", (), "VGPU", None, standing=1, reported_by="nova"),),
        default_type="nvidia-35",
    )
    held, layout = rec(U1, "vm-1"), rec(U2, "layout", kind=OwnerKind.STANDING)
    (reason,) = orphaned([held, layout], nova, Existing(snapshot(U1, U2), {}))
    assert reason == (
        f"mdev {U1} of instance vm-1 is nvidia-35 on parent 0000:84:00.0, and "
        "[mdev_nvidia-35] reported_by = nova would hand it to Nova too (nova-pci-config lists "
        "it): release it first, or keep reported_by = agent")
    (gone,) = orphaned([held], policy({}, default="nvidia-36"), Existing(snapshot(), {}))
    assert gone == (f"cannot recreate mdev {U1} of instance vm-1: type nvidia-35 is no longer "
                    "configured for parent 0000:84:00.0")


def test_count_mdevs_puts_each_mdev_in_one_state():
    layout_held = "66666666-6666-4666-8666-666666666666"
    records = [
        rec(U1, "vm-1"),
        rec(U2),
        rec(U3, "claim-1", kind=OwnerKind.CLAIM),
        rec(U4, "vm-4"),  # missing from sysfs
        rec("55555555-5555-4555-8555-555555555555", state=DeviceState.CREATING, intent=3),
        rec(layout_held, "layout", kind=OwnerKind.STANDING),  # no instance holds it
    ]
    counts = count_mdevs(records, snapshot(U1, U2, U3, FOREIGN, layout_held))
    assert counts == {
        "assigned": 1,
        "claimed": 1,
        "free": 1,
        "foreign": 1,
        "missing": 1,
        "transient": 1,
        "standing": 1,
    }
    # A standing layout's device is no instance: no instance_id to join on.
    (info,) = [i for i in mdev_infos(records, snapshot(layout_held)) if i.uuid == layout_held]
    assert (info.instance, info.state) == ("", "standing")


def provider(name: str, total: int, used: int) -> Provider:
    return Provider(
        name=name,
        parent_provider="h",
        parent_device="0000:84:00.0",
        parent_devices=("0000:84:00.0",),
        pci_address="0000:84:00.0",
        physical_gpu="0000:84:00.0",
        numa_node=0,
        device_type="nvidia-35",
        resource_class="VGPU",
        total=total,
        used=used,
        traits=("CUSTOM_MDEV_NVIDIA_35",),
    )


def test_placement_signature_ignores_usage_only():
    base = placement_signature(Inventory("h", (provider("a", 16, 0),)))
    assert placement_signature(Inventory("h", (provider("a", 16, 5),))) == base
    assert placement_signature(Inventory("h", (provider("a", 8, 0),))) != base
    assert placement_signature(Inventory("h", ())) != base


def test_sd_notify(tmp_path, monkeypatch):
    assert service.sd_notify("READY=1") is False  # not under systemd: nothing to do
    path = str(tmp_path / "notify")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert service.sd_notify("READY=1", "STATUS=serving") is True
        assert receiver.recv(1024) == b"READY=1\nSTATUS=serving"
    finally:
        receiver.close()


def test_sd_notify_gives_up_on_a_manager_that_stopped_reading(tmp_path, monkeypatch, caplog):
    """A full notify queue (nobody reads it) costs a bounded wait, then the
    notification is dropped with a warning: the signal loop, which notifies
    around every SIGHUP, must never block on it (a daemon that did stopped
    applying reloads after a handful of them)."""
    path = str(tmp_path / "notify")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setattr(service, "NOTIFY_TIMEOUT", 0.05)
    results: list[bool] = []
    # More datagrams than any queue holds (net.unix.max_dgram_qlen is 10 by default).
    sender = threading.Thread(
        target=lambda: results.extend(service.sd_notify(f"STATUS={n}") for n in range(30)),
        daemon=True,
    )
    try:
        with caplog.at_level(logging.WARNING, logger=service.LOG.name):
            sender.start()
            sender.join(60)
            assert not sender.is_alive(), "sd_notify blocked on a full queue"
        assert results[0] is True and results[-1] is False
        assert "took no notification" in caplog.text
        assert receiver.recv(64) == b"STATUS=0"  # what was queued is intact
    finally:
        receiver.close()


def test_sd_notify_abstract_socket(monkeypatch):
    name = f"accel-agent-test-{id(monkeypatch)}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert service.sd_notify("STOPPING=1")
        assert receiver.recv(64) == b"STOPPING=1"
    finally:
        receiver.close()


class FakeReporter:
    enabled = True
    sync_interval = 60
    next_attempt_at = 0.0

    def __init__(self, state: str = "ok") -> None:
        self.state = state

    def health(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "state": self.state,
            "last_error": "Placement unavailable: connection refused"
            if self.state == "failing"
            else None,
            "consecutive_failures": 1 if self.state == "failing" else 0,
        }


@pytest.fixture
def core(tmp_path) -> AgentCore:
    from oslo_config import cfg

    from accel_agent.config import options as agent_conf

    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf([], project="accel-agent-test", default_config_files=[])
    ledger = SimpleNamespace(
        close=lambda: None,
        identity_problem=lambda: None,
        write_error=None,
        path=tmp_path / "ledger.sqlite3",
        state_dir=tmp_path,
    )
    manager = SimpleNamespace(host="h", ledger=ledger)
    return AgentCore(
        conf,
        manager=manager,  # type: ignore[arg-type]
        reporter=FakeReporter(),  # type: ignore[arg-type]
        metrics=AgentMetrics(),
    )


def test_health_is_ok_until_placement_fails(core):
    health = core.health()
    assert health["status"] == "ok" and health["problems"] == []
    assert health["reporting"]["state"] == "ok"
    core.reporter.state = "failing"  # type: ignore[attr-defined]
    health = core.health()
    assert health["status"] == "degraded"
    assert "connection refused" in health["problems"][0]


def test_placement_delay_follows_the_reporter(core):
    assert core.placement_delay() == 60.0
    core.reporter.enabled = False  # type: ignore[misc]
    assert core.placement_delay() is None


def _service_around(core, tmp_path, monkeypatch) -> service.AgentService:
    """An AgentService around ``core`` (no threads started): its reload path."""
    config = tmp_path / "agent.conf"
    config.write_text("[DEFAULT]\nrescan_interval = 5\n")
    agent = service.AgentService(core.conf, [str(config)], [], writer=object())
    agent.core = core
    agent.scheduler = SimpleNamespace(configure=lambda interval, debounce: None)
    monkeypatch.setattr(service.values, "value_errors", lambda conf: [])
    return agent


def test_a_bug_in_a_reload_is_a_refused_reload_never_an_exception(core, tmp_path, monkeypatch):
    """Whatever goes wrong in a reload, the daemon's signal loop gets an
    outcome back, never an exception (one escaping would end the daemon)."""
    agent = _service_around(core, tmp_path, monkeypatch)

    def broken(new_conf):
        raise RuntimeError("a bug")

    monkeypatch.setattr(core, "reload", broken)
    outcome = agent.reload_config()
    assert not outcome.applied
    assert "RuntimeError" in (outcome.reason or "")
    health = core.health()
    assert health["status"] == "degraded"
    assert health["config"]["last_reload_result"] == "refused"
    assert core.metrics.value("accel_agent_config_reloads_total", {"result": "refused"}) == 1


def test_a_value_oslo_config_refuses_late_is_a_refused_reload(core, tmp_path, monkeypatch):
    agent = _service_around(core, tmp_path, monkeypatch)
    (tmp_path / "agent.conf").write_text("[DEFAULT]\nevent_debounce = 50\n")
    outcome = agent.reload_config()
    assert not outcome.applied and "event_debounce" in (outcome.reason or "")
    assert core.health()["config"]["last_reload_result"] == "refused"
