"""Lifecycle manager on a FUSE-simulated host: allocate, release, recover, adopt."""

import concurrent.futures
import os
import threading

import pytest

from accel_agent import exception
from accel_agent.devices import domains as domains_mod
from tests import ledger_sql
from tests.functional.simhost import simulated_host

pytestmark = pytest.mark.fuse

PF_CONF = "[devices]\nenabled_mdev_types = nvidia-18\n"  # GRID M60-2Q: 4 per GPU
FOREIGN = "f0f0f0f0-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def pf_host(tmp_path_factory):
    with simulated_host(tmp_path_factory.mktemp("pf"), ["nvidia-pf", "mtty"], gpus=2) as host:
        yield host


@pytest.fixture
def host(pf_host):
    pf_host.reset()
    return pf_host


def test_allocate_creates_on_one_gpu_and_counters_move(host):
    manager = host.manager(PF_CONF)
    allocation = manager.allocate("vm-1", 2)
    assert len(allocation.mdevs) == 2
    assert {m.parent for m in allocation.mdevs} == {"0000:84:00.0"}
    assert set(allocation.uuids) <= host.sysfs_uuids()
    assert host.available("0000:84:00.0", "nvidia-18") == 2
    # The next instance goes to the least used GPU.
    assert {m.parent for m in manager.allocate("vm-2", 1).mdevs} == {"0000:85:00.0"}
    records = {r.uuid: r for r in manager.ledger.all()}
    assert all(records[u].owner == "vm-1" for u in allocation.uuids)


def test_reuse_before_create(host):
    manager = host.manager(PF_CONF)
    first = manager.allocate("vm-1", 2)
    assert manager.release("vm-1") == first.uuids
    before = host.sysfs_uuids()
    second = manager.allocate("vm-2", 2)
    assert sorted(second.uuids) == sorted(first.uuids)
    assert host.sysfs_uuids() == before
    used = {p.name: p.used for p in manager.inventory().providers}
    assert used["testhost_pci_0000_84_00_0"] == 2


def test_count_larger_than_one_gpu_spreads(host):
    manager = host.manager(PF_CONF)
    allocation = manager.allocate("vm-big", 6)
    parents = [m.parent for m in allocation.mdevs]
    assert parents.count("0000:84:00.0") == 4 and parents.count("0000:85:00.0") == 2


def test_insufficient_capacity_names_type_and_parents_and_creates_nothing(host):
    manager = host.manager(PF_CONF)
    with pytest.raises(exception.InsufficientCapacity) as info:
        manager.allocate("vm-1", 9)
    message = str(info.value)
    assert "nvidia-18" in message and "0000:84:00.0" in message and "0000:85:00.0" in message
    assert "9 requested, 8 available" in message
    assert host.sysfs_uuids() == set() and manager.ledger.all() == []


def test_failure_mid_way_leaves_no_mdev_created_by_that_call(host):
    manager = host.manager(PF_CONF)
    kept = manager.allocate("vm-0", 1)
    manager.release("vm-0")  # one free owned mdev, reused by the next call
    host.sim.fail_next_create("ENOSPC", parent="0000:84:00.0")
    before = host.sysfs_uuids()
    with pytest.raises(exception.InsufficientCapacity):
        manager.allocate("vm-1", 3)
    assert host.sysfs_uuids() == before
    (record,) = manager.ledger.all()
    assert record.uuid == kept.uuids[0] and record.free
    assert manager.ledger.pending_intents() == []


def test_allocate_is_idempotent_and_a_different_request_is_refused(host):
    manager = host.manager(PF_CONF)
    first = manager.allocate("vm-1", 2)
    assert manager.allocate("vm-1", 2).uuids == first.uuids
    with pytest.raises(exception.InstanceAlreadyAllocated):
        manager.allocate("vm-1", 3)
    assert len(host.sysfs_uuids()) == 2


def test_concurrent_allocations_never_share_an_mdev(host):
    """Eight allocations at once, four managers (as the daemon's threads and
    an offline accelctl would be), over a pool of free owned mdevs: what is
    raced is the reuse of the same free mdevs, and the same instance asked
    for twice at once.  Every call must succeed with distinct mdevs, all
    reused (no create), and an instance must end with what it asked for."""
    seed = host.manager(PF_CONF)
    pool_uuids = set(seed.allocate("seed-a", 4).uuids) | set(seed.allocate("seed-b", 4).uuids)
    seed.release("seed-a")
    seed.release("seed-b")
    seed.ledger.close()
    managers = [host.manager(PF_CONF) for _ in range(4)]
    barrier = threading.Barrier(8)

    def allocate(i):
        barrier.wait()
        # vm-0..vm-5 once each, vm-6 twice (an idempotent retry racing itself).
        return managers[i % 4].allocate(f"vm-{min(i, 6)}", 1).uuids

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(allocate, range(8)))
    assert results[6] == results[7]  # the same answer to the same request
    uuids = [u for r in results[:7] for u in r]
    assert len(uuids) == len(set(uuids)) == 7
    assert set(uuids) <= pool_uuids and host.sysfs_uuids() == pool_uuids
    owners = ledger_sql.owners(host.state_dir)
    assert {owners[u] for u in uuids} == {f"vm-{i}" for i in range(7)}
    assert sum(1 for owner in owners.values() if owner == "vm-6") == 1


def test_release_is_idempotent_and_remove_restores_counters(host):
    manager = host.manager(PF_CONF)
    manager.allocate("vm-1", 3)
    assert host.available("0000:84:00.0", "nvidia-18") == 1
    assert len(manager.release("vm-1", remove=True)) == 3
    assert host.available("0000:84:00.0", "nvidia-18") == 4
    assert host.sysfs_uuids() == set() and manager.ledger.all() == []
    assert manager.release("vm-1", remove=True) == []
    assert manager.release("never-seen") == []


def test_remove_refuses_an_mdev_a_libvirt_domain_references(host, tmp_path):
    manager = host.manager(PF_CONF)
    (uuid,) = manager.allocate("vm-1", 1).uuids
    node = tmp_path / "node.xml"
    node.write_text(
        "<node><domain type='test'><name>guest</name><memory>1024</memory>"
        "<os><type>hvm</type></os><devices>"
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci' managed='no'>"
        f"<source><address uuid='{uuid}'/></source></hostdev>"
        "</devices></domain></node>"
    )
    manager.domains = domains_mod.LibvirtDomains(f"test://{node}")
    assert manager.domains.referenced_uuids() == {uuid}
    with pytest.raises(exception.MdevInUse):
        manager.release("vm-1", remove=True)
    assert uuid in host.sysfs_uuids()
    (record,) = manager.ledger.all()
    assert record.free  # released, kept for reuse


def group_node(host, uuid):
    """The simulator's stand-in for /dev/vfio/<group> of an mdev."""
    group = os.path.basename(
        os.readlink(os.path.join(host.root, "bus", "mdev", "devices", uuid, "iommu_group"))
    )
    return os.path.join(host.root, "vfio", group)


def blocked_removes(host):
    """Remove writes that blocked on a held device (the simulator keeps them
    across its reboots, so tests compare before and after)."""
    return [b["uuid"] for b in host.sim.status()["blocked_removes"]]


@pytest.mark.parametrize("holder", ["open group node", "VM"])
def test_an_mdev_in_use_is_kept_and_no_remove_is_written(host, holder):
    """The in-use probe: EBUSY on the VFIO group keeps the mdev (free, owned,
    counted) and the kernel never sees a remove write that would block."""
    kept: list[str] = []
    manager = host.manager(PF_CONF, remove_timeout=60, on_kept_in_use=kept.append)
    (uuid, other) = manager.allocate("vm-1", 2).uuids
    node = group_node(host, uuid)
    blocked_before = blocked_removes(host)
    fd = None
    if holder == "VM":
        host.sim.hold(uuid)
    else:
        fd = os.open(node, os.O_RDONLY)  # as QEMU holds /dev/vfio/<group>
    try:
        with pytest.raises(exception.MdevInUse) as info:
            manager.release("vm-1", remove=True)
        assert uuid in info.value.message and other not in info.value.message
        assert blocked_removes(host) == blocked_before  # no write reached the kernel
        assert uuid in host.sysfs_uuids() and other not in host.sysfs_uuids()
        (record,) = manager.ledger.all()
        assert record.uuid == uuid and record.free and record.state == "present"
        assert kept == [uuid]
    finally:
        if fd is not None:
            os.close(fd)
        host.sim.release(uuid)
    # Once the holder let go, the kept mdev is reused like any free one.
    assert manager.allocate("vm-2", 1).uuids == [uuid]


def test_a_holder_arriving_after_the_probe_times_out_and_is_kept(host):
    kept: list[str] = []
    manager = host.manager(PF_CONF, remove_timeout=0.5, on_kept_in_use=kept.append)
    (uuid,) = manager.allocate("vm-1", 1).uuids
    blocked_before = blocked_removes(host)
    host.sim.hold(uuid, after_probe=True)
    try:
        with pytest.raises(exception.MdevInUse):
            manager.release("vm-1", remove=True)
        # The write happened and blocked (the race the timeout is for) ...
        assert blocked_removes(host) == [*blocked_before, uuid]
        (record,) = manager.ledger.all()
        assert record.free and record.state == "present"  # ... and nothing was lost
        assert kept == [uuid]
    finally:
        host.sim.release(uuid)


def test_recover_keeps_an_interrupted_remove_whose_mdev_is_in_use(host):
    manager = host.manager(PF_CONF)
    (uuid,) = manager.allocate("vm-1", 1).uuids
    manager.release("vm-1")
    manager.ledger.record_remove_intent(uuid)  # a crash after the intent, before the write
    blocked_before = blocked_removes(host)
    fd = os.open(group_node(host, uuid), os.O_RDONLY)
    try:
        report = manager.recover()
    finally:
        os.close(fd)
    assert report.kept_in_use == [uuid] and report.removed == []
    assert blocked_removes(host) == blocked_before
    (record,) = manager.ledger.all()
    assert record.free and record.state == "present" and uuid in host.sysfs_uuids()
    # Free again: the next recover finds nothing to do, the next release removes it.
    assert manager.recover().kept_in_use == []


def test_foreign_mdevs_are_never_touched_until_adopted(host):
    host.create_foreign("0000:84:00.0", "nvidia-18", FOREIGN)
    manager = host.manager(PF_CONF)
    allocation = manager.allocate("vm-1", 3)
    assert FOREIGN not in allocation.uuids
    manager.release("vm-1", remove=True)
    report = manager.recover()
    assert report.foreign == [FOREIGN] and FOREIGN in host.sysfs_uuids()
    # It counts as used capacity on its GPU.
    used = {p.name: p.used for p in manager.inventory().providers}
    assert used["testhost_pci_0000_84_00_0"] == 1
    record = manager.adopt(FOREIGN)
    assert record.adopted and record.free
    assert manager.allocate("vm-2", 1).uuids == [FOREIGN]
    manager.release("vm-2", remove=True)
    assert FOREIGN not in host.sysfs_uuids()


def test_reboot_recovery_recreates_same_uuid_parent_and_type(host):
    manager = host.manager(PF_CONF)
    one = manager.allocate("vm-1", 2)
    two = manager.allocate("vm-2", 1)
    manager.allocate("vm-3", 1)
    manager.release("vm-3")  # free owned: recreated too
    host.sim.reboot()
    assert host.sysfs_uuids() == set()
    report = manager.recover()
    assert len(report.recreated) == 4
    snapshot = manager.scan()
    for record in [*one.mdevs, *two.mdevs]:
        mdev = snapshot.mdevs[record.uuid]
        assert (mdev.parent, mdev.mdev_type) == (record.parent, "nvidia-18")
    assert manager.allocation("vm-1").uuids == one.uuids
    assert manager.recover().recreated == []  # idempotent


def test_recovery_refuses_a_type_no_longer_configured_and_changes_nothing(host):
    manager = host.manager(PF_CONF)
    (uuid,) = manager.allocate("vm-1", 1).uuids
    host.sim.reboot()
    changed = host.manager(
        "[devices]\nenabled_mdev_types = nvidia-18, nvidia-35\n"
        "[mdev_nvidia-35]\ndevice_addresses = 0000:84:00.0, 0000:85:00.0\n"
        "[mdev_nvidia-18]\ndevice_addresses = 0000:86:00.0\n"
    )
    with pytest.raises(exception.ConfigErrors) as info:
        changed.recover()
    message = str(info.value)
    assert "vm-1" in message and "nvidia-18" in message and "0000:84:00.0" in message
    assert host.sysfs_uuids() == set()
    assert [u for u, owner in ledger_sql.owners(host.state_dir).items() if owner] == [uuid]


def test_sriov_allocation_respects_the_per_card_budget(tmp_path):
    with simulated_host(tmp_path, ["nvidia-sriov"], vfs=16) as host:
        manager = host.manager("[devices]\nenabled_mdev_types = nvidia-474\n")  # max 4
        allocation = manager.allocate("vm-1", 4)
        assert len({m.parent for m in allocation.mdevs}) == 4  # one vGPU per VF
        with pytest.raises(exception.InsufficientCapacity):
            manager.allocate("vm-2", 1)
        assert len(host.sysfs_uuids()) == 4


def test_parent_filter_and_virtual_parent(host):
    manager = host.manager(
        "[devices]\nenabled_mdev_types = nvidia-18, mtty-2\n"
        "[mdev_nvidia-18]\n[mdev_mtty-2]\ndevice_addresses = mtty\n"
    )
    assert {m.parent for m in manager.allocate("vm-1", 2, parent="85:00.0").mdevs} == {
        "0000:85:00.0"
    }
    serial = manager.allocate("vm-2", 3, parent="mtty")
    assert {(m.parent, m.device_type) for m in serial.mdevs} == {("mtty", "mtty-2")}
    assert host.available("mtty", "mtty-2") == 9
    with pytest.raises(exception.InsufficientCapacity):
        manager.allocate("vm-3", 1, parent="0000:99:00.0")


def test_bad_requests_are_refused_before_anything_happens(host):
    manager = host.manager(PF_CONF)
    for bad in ("", "x" * 300, "a\x00b"):
        with pytest.raises(exception.InvalidInstanceId):
            manager.allocate(bad, 1)
    for count in (0, -1, 65, "2", True):
        with pytest.raises(exception.InvalidAllocationRequest):
            manager.allocate("vm-1", count)
    assert host.sysfs_uuids() == set()
    assert not os.path.exists(os.path.join(host.state_dir, "ledger.sqlite3")) or (
        manager.ledger.all() == []
    )


def _commit_durability(monkeypatch, ledger) -> list[str]:
    """'FULL' or 'NORMAL' for every top-level COMMIT the ledger makes."""
    seen: list[str] = []
    real_execute = ledger._execute

    def recording(sql, params=()):
        if sql == "COMMIT":
            level = ledger._conn.execute("PRAGMA synchronous").fetchone()[0]
            seen.append({2: "FULL", 1: "NORMAL"}.get(level, str(level)))
        return real_execute(sql, params)

    monkeypatch.setattr(ledger, "_execute", recording)
    return seen


def test_one_fsync_per_operation_and_always_before_the_answer(host, monkeypatch):
    """Intents skip the fsync, the closing commit never does: what the
    caller is told survives a power cut, and a power cut also removes every
    mdev an unsettled intent could refer to."""
    manager = host.manager(PF_CONF)
    commits = _commit_durability(monkeypatch, manager.ledger)
    manager.allocate("vm-1", 2)  # creates
    assert commits == ["NORMAL", "FULL"]
    commits.clear()
    manager.release("vm-1")  # keeps them, free for reuse
    manager.allocate("vm-2", 2)  # reuses
    assert commits == ["FULL", "FULL"]
    commits.clear()
    manager.release("vm-2", remove=True)
    assert commits == ["NORMAL", "FULL"]
    # Back to FULL for every other transaction.
    assert manager.ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
