"""libvirt's persistent mdev definitions (issue 24 part 1) on a FUSE-simulated
host: the takeover undefines what it takes, all or nothing; a remove undefines,
crash-safe; the boot race (EEXIST for the same UUID, parent and type) is the
agent's device; ``[libvirt] define_mdevs`` defines with autostart off.

libvirt's test:/// driver cannot define, undefine, autostart or list inactive
node devices, so the node-device calls go to tests/fake_nodedevs.py; the
domains come from the real test driver (as in test_takeover.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from accel_agent import exception
from accel_agent.devices import domains as domains_mod
from accel_agent.devices.nodedevs import LibvirtNodeDevices
from tests.fake_nodedevs import Definition, FakeLibvirt
from tests.functional.simhost import simulated_host
from tests.functional.test_takeover import libvirt_node
from tests.wedged_libvirt import GUARD, WedgedLibvirtd, guarded, wait_for

pytestmark = pytest.mark.fuse

GPU = "0000:84:00.0"
CONF = "[devices]\nenabled_mdev_types = nvidia-35\n"
VM1 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f01"
M1 = "a0000000-0000-4000-8000-000000000001"
M2 = "a0000000-0000-4000-8000-000000000002"
VM2 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f02"
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


# --- a wedged libvirtd (issue 33 item 2): every call with a deadline ------------------------

DEADLINE = 1.0  # [libvirt] call_timeout of these tests


@pytest.fixture
def wedged():
    with WedgedLibvirtd() as server:
        yield server


def wedged_manager(host, wedged: WedgedLibvirtd):
    """A manager whose libvirt (domains and node devices: one URI, one
    channel) accepts and never answers."""
    manager = host.manager(CONF)
    manager.domains = domains_mod.LibvirtDomains(wedged.uri, timeout=DEADLINE)
    return manager


def test_a_listing_beside_a_wedged_libvirt_answers_with_libvirt_null_saying_why(host, wedged):
    from accel_agent.daemon.listings import Listings

    manager = wedged_manager(host, wedged)
    manager.allocate(VM1, 1)
    listings = Listings(manager)
    body, error = guarded(listings.mdevs_json)
    assert error is None, error
    document = json.loads(body)
    assert document["mdevs"] and all(m["libvirt"] is None for m in document["mdevs"])
    assert "is not answering" in document["libvirt_error"]
    assert "did not answer within 1 s" in document["libvirt_error"]
    # A new snapshot asks again: not tried while libvirt is stalled.
    host.create_foreign(GPU, "nvidia-35", SPARE)
    body, error = guarded(listings.mdevs_json)
    assert "was not tried" in json.loads(body)["libvirt_error"]


def test_an_allocate_beside_a_release_stuck_on_libvirt_completes(host, wedged, tmp_path):
    """The release holds the manager's lock while it asks libvirt: at most
    the deadline.  Its removes are done; the undefine is left to recovery
    with the remove intent kept, as when a helper fails."""
    from accel_agent.daemon.core import AgentCore
    from accel_agent.reporting.placement import PlacementReporter
    from tests.configutil import make_conf

    manager = wedged_manager(host, wedged)
    held = manager.allocate(VM1, 2).uuids
    release: dict[str, BaseException | None] = {}

    def release_vm1() -> None:
        release["error"] = guarded(lambda: manager.release(VM1, remove=True))[1]

    releasing = threading.Thread(target=release_vm1, daemon=True)
    releasing.start()
    wait_for(lambda: wedged.accepted >= 1, "the release asks libvirt, under the lock")
    allocated, error = guarded(lambda: manager.allocate(VM2, 1))
    assert error is None and len(allocated.uuids) == 1
    releasing.join(GUARD)
    assert isinstance(release["error"], exception.LibvirtStalled), release
    # Nothing holds the manager's lock past the deadline.
    assert manager.thread_lock.acquire(blocking=False)
    manager.thread_lock.release()
    # Removed from sysfs; the rows and the intent wait for recovery.
    assert not set(held) & set(sysfs(host))
    assert {r.uuid: r.state.value for r in manager.ledger.all() if r.uuid in held} == {
        u: "removing" for u in held
    }
    assert manager.ledger.pending_intents()
    # Health says so.
    core = AgentCore(make_conf(CONF, sysfs_root=host.root), manager=manager,
                     reporter=PlacementReporter(None, "testhost"))
    health = core.health()
    assert health["libvirt"]["state"] == "stalled" and health["libvirt"]["blocked_calls"] >= 1
    assert "libvirt_stalled" in health["problem_kinds"] and health["status"] == "degraded"
    # While stalled, recovery keeps the rows (whether libvirt defines them is not known).
    assert manager.recover().forgotten == []
    # libvirt answers again (here: another one): recovery undefines and forgets.
    fake = FakeLibvirt(defined={held[0]: Definition(GPU, "nvidia-35", True)})
    manager.domains = domains_mod.LibvirtDomains(libvirt_node(tmp_path / "n.xml", []))
    manager.nodedevs = LibvirtNodeDevices(manager.domains.uri, opener=lambda: fake)
    assert sorted(manager.recover().forgotten) == sorted(held)
    assert fake.defined == {} and manager.ledger.pending_intents() == []


def test_a_takeover_beside_a_wedged_libvirt_is_refused_dry_run_too(host, wedged):
    manager = wedged_manager(host, wedged)
    host.create_foreign(GPU, "nvidia-35", M1)
    for dry_run in (True, False):
        _, error = guarded(lambda dry_run=dry_run: manager.takeover(dry_run=dry_run))
        assert isinstance(error, exception.LibvirtStalled), error
        assert "takeover from libvirt" in error.message and "refused, nothing changed" in \
            error.message
    assert manager.ledger.all() == []


def test_accelctl_adopt_from_a_wedged_libvirt_exits_1_saying_why(host, wedged):
    config = host.config(CONF + f"\n[libvirt]\nuri = {wedged.uri}\ncall_timeout = {DEADLINE}\n"
                         f"[api]\nsocket_path = {host.work}/none.sock\n")
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--offline", "--config-file", config,
         "adopt", "--from-libvirt", "--dry-run"],
        capture_output=True, text=True, timeout=GUARD,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: takeover from libvirt (dry run) refused, nothing "
                                  "changed: libvirt at "), proc.stderr
    assert "did not answer within 1 s" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1  # that one line, nothing else
