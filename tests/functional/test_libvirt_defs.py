"""libvirt's persistent mdev definitions (issue 24 part 1) on a FUSE-simulated
host: the takeover undefines what it takes, all or nothing; a remove undefines,
crash-safe; the boot race (EEXIST for the same UUID, parent and type) is the
agent's device; ``[libvirt] define_mdevs`` defines with autostart off.

libvirt's test:/// driver cannot define, undefine, autostart or list inactive
node devices, so the node-device calls go to tests/fake_nodedevs.py; the
domains come from the real test driver (as in test_takeover.py)."""

from __future__ import annotations

import logging
import os

import pytest

from accel_agent import exception
from accel_agent.devices import domains as domains_mod
from accel_agent.devices.nodedevs import LibvirtNodeDevices
from tests.fake_nodedevs import Definition, FakeLibvirt
from tests.functional.simhost import simulated_host
from tests.functional.test_takeover import libvirt_node

pytestmark = pytest.mark.fuse

GPU = "0000:84:00.0"
CONF = "[devices]\nenabled_mdev_types = nvidia-35\n"
VM1 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f01"
M1 = "a0000000-0000-4000-8000-000000000001"
M2 = "a0000000-0000-4000-8000-000000000002"
SPARE = "a0000000-0000-4000-8000-0000000000f1"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with simulated_host(tmp_path_factory.mktemp("defs"), ["nvidia-pf"], gpus=2) as host:
        yield host


@pytest.fixture
def host(sim):
    sim.reset()
    return sim


def sysfs(host) -> dict[str, tuple[str, str]]:
    found = {}
    bus = os.path.join(host.root, "bus", "mdev", "devices")
    for uuid in os.listdir(bus):
        device = os.path.realpath(os.path.join(bus, uuid))
        mdev_type = os.path.basename(os.path.realpath(os.path.join(device, "mdev_type")))
        found[uuid] = (os.path.basename(os.path.dirname(device)), mdev_type)
    return found


def wired(host, tmp_path, fake: FakeLibvirt, domains=(), **kwargs):
    """A manager whose node devices are the fake's, its domains the test driver's."""
    fake.sysfs = lambda: sysfs(host)
    uri = libvirt_node(tmp_path / "node.xml", list(domains))
    manager = host.manager(CONF, **kwargs)
    manager.domains = domains_mod.LibvirtDomains(uri)
    manager.nodedevs = LibvirtNodeDevices(uri, opener=lambda: fake)
    return manager


def nova_host(host) -> FakeLibvirt:
    """Nova's way: M1, M2 created, defined, autostart on; SPARE transient."""
    for uuid in (M1, M2, SPARE):
        host.create_foreign(GPU, "nvidia-35", uuid)
    return FakeLibvirt(defined={u: Definition(GPU, "nvidia-35", True) for u in (M1, M2)})


NOVA = [("instance-00000001", VM1, [M1, M2])]


def gone_vm(manager, tmp_path) -> None:
    """The instance is deleted: no domain references its mdevs any more."""
    manager.domains = domains_mod.LibvirtDomains(libvirt_node(tmp_path / "empty.xml", []))


def actions(plan) -> dict[str, str | None]:
    entries = [e for d in plan.domains for e in d["mdevs"]] + plan.unused
    return {e["uuid"]: e["libvirt"] for e in entries}


def test_takeover_undefines_what_it_takes_and_dry_run_shows_it(host, tmp_path):
    fake = nova_host(host)
    manager = wired(host, tmp_path, fake, NOVA)
    plan = manager.takeover(dry_run=True)
    assert actions(plan) == {M1: "undefine", M2: "undefine", SPARE: None}
    assert fake.calls == [] and set(fake.defined) == {M1, M2}
    plan = manager.takeover()
    assert plan.applied and fake.defined == {}
    assert sorted(fake.calls) == [("undefine", M1), ("undefine", M2)]
    assert {r.uuid: r.owner for r in manager.ledger.all()} == {M1: VM1, M2: VM1}
    assert set(sysfs(host)) == {M1, M2, SPARE}  # undefined, still running
    # idempotent: nothing more to undefine
    assert actions(manager.takeover()) == {M1: None, M2: None, SPARE: None}


def test_takeover_failing_half_way_defines_again_and_changes_nothing(host, tmp_path):
    fake = nova_host(host)
    fake.fail["undefine"] = {M2}
    manager = wired(host, tmp_path, fake, NOVA)
    with pytest.raises(exception.NodeDeviceWriteFailed):
        manager.takeover()
    # M1 was undefined, then defined again with its autostart
    assert ("undefine", M1) in fake.calls and ("define", M1) in fake.calls
    assert {u: d.autostart for u, d in fake.defined.items()} == {M1: True, M2: True}
    assert manager.ledger.all() == []


def test_takeover_whose_ledger_commit_fails_defines_again(host, tmp_path, monkeypatch):
    fake = nova_host(host)
    manager = wired(host, tmp_path, fake, NOVA)

    def broken(*args, **kwargs):
        raise exception.LedgerError(reason="disk full (test)")

    monkeypatch.setattr(manager.ledger, "assign", broken)
    with pytest.raises(exception.LedgerError):
        manager.takeover()
    assert {u: d.autostart for u, d in fake.defined.items()} == {M1: True, M2: True}
    assert manager.ledger.all() == []


def test_takeover_refused_when_libvirt_cannot_be_read(host, tmp_path):
    fake = nova_host(host)
    fake.fail["list"] = True
    manager = wired(host, tmp_path, fake, NOVA)
    with pytest.raises(exception.NodeDevicesUnavailable):
        manager.takeover()
    assert manager.ledger.all() == [] and set(fake.defined) == {M1, M2}


def test_adopt_one_undefines_it(host, tmp_path):
    fake = nova_host(host)
    manager = wired(host, tmp_path, fake)
    manager.adopt(M1)
    assert set(fake.defined) == {M2}


def test_remove_undefines_an_owned_mdev_and_never_a_foreign_one(host, tmp_path):
    fake = nova_host(host)
    fake.defined[SPARE] = Definition(GPU, "nvidia-35", True)  # libvirt's, never adopted
    manager = wired(host, tmp_path, fake, NOVA)
    manager.takeover()
    gone_vm(manager, tmp_path)
    fake.defined[M1] = Definition(GPU, "nvidia-35", True)  # defined again meanwhile
    removed = manager.release(VM1, remove=True)
    assert sorted(removed) == [M1, M2] and set(sysfs(host)) == {SPARE}
    assert ("undefine", M1) in fake.calls
    assert set(fake.defined) == {SPARE}  # the foreign one's definition is kept


def test_recovery_undefines_what_an_interrupted_remove_left(host, tmp_path):
    fake = nova_host(host)
    manager = wired(host, tmp_path, fake, NOVA)
    manager.takeover()
    gone_vm(manager, tmp_path)
    fake.defined[M1] = Definition(GPU, "nvidia-35", True)
    fake.fail["undefine"] = {M1}  # the remove's undefine fails, as a crash there would
    with pytest.raises(exception.NodeDeviceWriteFailed):
        manager.release(VM1, remove=True)
    assert M1 not in sysfs(host) and M1 in fake.defined
    states = {r.uuid: r.state.value for r in manager.ledger.all()}
    assert states == {M1: "removing", M2: "removing"}  # the intent is kept for recovery
    fake.fail.clear()
    report = manager.recover()
    assert sorted(report.forgotten) == [M1, M2] and manager.ledger.all() == []
    assert fake.defined == {}
    assert manager.recover().forgotten == []  # idempotent


def test_boot_race_same_uuid_parent_and_type_is_the_agents(host, tmp_path, caplog):
    caplog.set_level(logging.INFO, "accel_agent.backends.mdev")
    manager = host.manager(CONF)
    (uuid,) = manager.allocate(VM1, 1).uuids
    host.sim.reboot()
    # libvirt's autostart came first
    host.create_foreign(GPU, "nvidia-35", uuid)
    # recovery sees it existing; a create racing with it meets EEXIST: success
    manager.backend("mdev").create(manager.writer, GPU, "nvidia-35", uuid)
    assert "created it first" in caplog.text
    assert manager.recover().recreated == []


def test_boot_race_another_parent_or_type_stays_refused(host):
    manager = host.manager(CONF)
    host.create_foreign(GPU, "nvidia-35", M1)
    mdev = manager.backend("mdev")
    with pytest.raises(exception.MdevAlreadyExists):
        mdev.create(manager.writer, "0000:85:00.0", "nvidia-35", M1)
    with pytest.raises(exception.MdevAlreadyExists):
        mdev.create(manager.writer, GPU, "nvidia-36", M1)


def test_define_mdevs_defines_with_autostart_off_and_recovery_catches_up(host, tmp_path):
    fake = FakeLibvirt()
    manager = wired(host, tmp_path, fake, define_mdevs=True)
    (uuid,) = manager.allocate(VM1, 1).uuids
    assert fake.nodedev(uuid) == {"defined": True, "autostart": False}
    assert ("autostart-", uuid) in fake.calls  # not libvirt's default
    # libvirt down at the next create: the device is made, recovery defines it
    fake.fail["open"] = True
    (second,) = manager.allocate("8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f02", 1).uuids
    assert second in sysfs(host) and second not in fake.defined
    fake.fail.clear()
    manager.recover()
    assert fake.nodedev(second) == {"defined": True, "autostart": False}
    manager.release(VM1, remove=True)
    assert uuid not in fake.defined


def test_daemon_listing_reads_libvirt_once_per_snapshot_and_after_an_operation(host, tmp_path):
    import json

    from accel_agent.daemon.listings import Listings

    fake = nova_host(host)
    manager = wired(host, tmp_path, fake)
    listings = Listings(manager)

    def shown() -> dict[str, object]:
        return {m["uuid"]: m["libvirt"] for m in json.loads(listings.mdevs_json())["mdevs"]}

    assert shown() == {M1: {"defined": True, "autostart": True},
                       M2: {"defined": True, "autostart": True},
                       SPARE: {"defined": False, "autostart": False}}
    reads = fake.lists
    shown()
    shown()
    assert fake.lists == reads  # the same snapshot: libvirt is not asked again
    manager.adopt(M1)  # an operation (it undefines M1)
    assert shown()[M1] == {"defined": False, "autostart": False}
    # libvirt unreachable: null, the listing still answers
    fake.fail["list"] = True
    manager.recover()  # an operation: read again
    assert set(shown().values()) == {None}
