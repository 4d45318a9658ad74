"""A real live migration of a VM with an mdev, through the agent (issue 13).

Runs in lab 2's guest (conftest.py): Debian's 6.12 kernel with mtty, trixie's
QEMU 10 and libvirt 11, two libvirtds and two agents ("host" A and "host" B)
sharing the one mtty parent.  Everything goes through the agents' own
interfaces: ``accelctl`` (the wheel installed in the lab's venv), their APIs,
and ``MigrationSource`` driven the way a compute service would
(migrationlab.migrate_through_agents).

Deliberate faults each test was seen to catch are listed in tests/realkernel/README.md.
"""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from accel_agent import exception, privileged
from accel_agent.api.client import ApiClient
from accel_agent.devices.ledger import OwnerKind
from accel_agent.migration import versions
from tests.realkernel import mdevlab
from tests.realkernel.migration import migrationlab
from tests.realkernel.migration.migrationlab import MDEV_TYPE, Agent, Hosts

INSTANCE = "vm1"
DOMAIN_UUID = "0f0f0f0f-1111-4222-8333-444444444444"
# What the bookworm host around the lab runs: too old for mdev live migration.
BOOKWORM = {"libvirt": "9.0.0", "qemu": "7.2.0", "kernel": "6.1.0"}
SOURCE_MDEV = "5a5a5a5a-0000-4000-8000-000000000001"


def allocate(agent: Agent, instance: str) -> str:
    answer = mdevlab.ok_json(agent.ctl("allocate", instance, "--count", "1", "--json"))
    (mdev,) = answer["mdevs"]
    return mdev["uuid"]


def listed(agent: Agent) -> dict[str, dict]:
    """``accelctl mdevs --json`` of one agent, by UUID."""
    return {m["uuid"]: m for m in mdevlab.ok_json(agent.ctl("mdevs", "--json"))["mdevs"]}


def assert_ledgers_agree_with_sysfs(hosts: Hosts) -> None:
    """Read independently: every recorded mdev is in sysfs on its parent with its
    type, no UUID is recorded by both agents, and every mdev in sysfs is one
    agent's (none leaked)."""
    in_sysfs = mdevlab.mdevs()
    recorded: dict[str, str] = {}
    for agent in hosts.agents:
        for record in agent.ledger():
            assert record.uuid not in recorded, f"{record.uuid} recorded by two agents"
            recorded[record.uuid] = agent.name
            assert in_sysfs.get(record.uuid) == record.device_type, (agent.name, record)
            assert record.parent == mdevlab.PARENT
    leaked = set(in_sysfs) - set(recorded)
    assert not leaked, f"in sysfs, owned by neither agent: {leaked}"
    assert set(recorded) <= set(in_sysfs)


def start_vm(hosts: Hosts, qemu_settings: bool) -> tuple[str, object]:
    """``accelctl allocate vm1`` on A, a domain from ``accelctl domain-xml``, started."""
    source_mdev = allocate(hosts.a, INSTANCE)
    parts = mdevlab.ok(hosts.a.ctl("domain-xml", INSTANCE)).stdout
    # A's [libvirt] qemu_globals: the two settings Debian's kernels need.
    assert all(setting in parts for setting in migrationlab.QEMU_GLOBALS), parts
    xml = migrationlab.compose_domain(INSTANCE, DOMAIN_UUID, parts, qemu_settings)
    conn = hosts.libvirt_a.open()
    domain = conn.defineXML(xml)
    domain.create()
    return source_mdev, domain


# --- 5. version gates, for real ---------------------------------------------------------


def test_a_source_with_bookworm_versions_is_refused_naming_side_and_component(
    hosts: Hosts,
) -> None:
    api = hosts.b.client()
    for source_versions, component in (
        # bookworm's libvirt 9.0.0 passes (>= 8.6.0); its QEMU 7.2 does not
        (BOOKWORM, "QEMU 7.2.0 is older than the required 8.1.0"),
        # each component is named: a kernel without the VFIO migration uAPI v2
        (
            {"libvirt": "11.3.0", "qemu": "10.0.0", "kernel": "5.10.0"},
            "Linux kernel 5.10.0 is older than the required 5.18.0",
        ),
    ):
        with pytest.raises(exception.ApiError) as info:
            api.migration_claim(INSTANCE, {SOURCE_MDEV: MDEV_TYPE}, source_versions)
        assert info.value.kwargs == {
            "status": 409, "code": "MigrationVersionTooOld", "request_id": ANY
        }
        assert str(info.value).startswith("Source host cannot live-migrate mediated devices: ")
        assert component in str(info.value)
        # changing nothing: no mdev, no claim
        assert mdevlab.mdevs() == {}
        assert hosts.b.ledger() == []
    # The same claim from this lab's own versions passes both hosts' gates.
    with hosts.libvirt_a.connect() as conn:
        lab = versions.probe(conn)
    assert lab.libvirt >= (11, 0, 0) and lab.qemu >= (10, 0, 0) and lab.kernel[:2] == (6, 12)
    mapping = api.migration_claim(INSTANCE, {SOURCE_MDEV: MDEV_TYPE}, lab.to_dict())["mapping"]
    assert mdevlab.mdevs() == {mapping[SOURCE_MDEV]: MDEV_TYPE}


# --- 2. two agents, one mtty parent ------------------------------------------------------


def test_each_agent_sees_the_other_s_mdevs_as_foreign_and_never_touches_them(
    hosts: Hosts,
) -> None:
    mine = allocate(hosts.a, "vm-a")
    theirs = allocate(hosts.b, "vm-b")
    for agent, own, other, instance in (
        (hosts.a, mine, theirs, "vm-a"),
        (hosts.b, theirs, mine, "vm-b"),
    ):
        seen = listed(agent)
        assert (seen[own]["owned"], seen[own]["instance"]) == (True, instance)
        assert (seen[other]["owned"], seen[other]["instance"]) == (False, None)

    # B frees its mdev (kept for reuse, B's): A's next allocation must not take it.
    mdevlab.ok(hosts.b.ctl("release", "vm-b"))
    second = allocate(hosts.a, "vm-a2")
    assert second not in (mine, theirs)
    # A's recovery reports B's mdev as foreign and leaves it alone.
    report = mdevlab.ok_json(hosts.a.ctl("recover", "--json"))
    assert theirs in report["foreign"]
    assert theirs not in report["removed"] + report["forgotten"]
    # A removes only what it owns.
    for instance in ("vm-a", "vm-a2"):
        mdevlab.ok(hosts.a.ctl("release", instance, "--remove"))
    assert mdevlab.mdevs() == {theirs: MDEV_TYPE}
    assert [r.uuid for r in hosts.b.ledger() if r.free] == [theirs]
    assert_ledgers_agree_with_sysfs(hosts)


# --- 4. the failure path -------------------------------------------------------------------


def test_failed_migration_keeps_the_source_and_frees_the_destination_claim(
    hosts: Hosts,
) -> None:
    # The same migration as below, without the two QEMU settings: QEMU fails it.
    source_mdev, domain = start_vm(hosts, qemu_settings=False)
    migrationlab.write_scratch(domain, 0xA5)
    run = migrationlab.MigrationRun()
    with pytest.raises(exception.MigrationFailed) as info:
        migrationlab.migrate_through_agents(domain, hosts.a, hosts.b, INSTANCE, run)

    # The agent's error names the host that failed and carries libvirt's message.
    error = info.value
    assert error.kwargs["side"] == "source"
    assert "ram_save_setup failed: Operation not supported" in error.kwargs["reason"]
    assert "failed on the source host: " in str(error)
    assert error.kwargs["libvirt_message"] in str(error)
    assert "Message from the destination host" in error.kwargs["libvirt_message"]

    # The source domain still runs, on its mdev, with its device state.
    assert domain.isActive()
    assert migrationlab.active_mdevs(domain) == [source_mdev]
    assert migrationlab.read_scratch(domain) == 0xA5
    # A keeps the allocation: nothing released, nothing removed.
    assert [m["uuid"] for m in hosts.a.client().allocation(INSTANCE)["mdevs"]] == [source_mdev]
    (record,) = hosts.a.ledger()
    assert (record.uuid, record.owner, record.owner_kind) == (
        source_mdev, INSTANCE, OwnerKind.INSTANCE
    )
    # B's claim was aborted and its mdev removed; B runs no domain.
    (claimed,) = run.mapping.values()
    assert claimed not in mdevlab.mdevs()
    assert hosts.b.ledger() == []
    with hosts.libvirt_b.connect() as conn:
        assert conn.listAllDomains(0) == []
    assert mdevlab.mdevs() == {source_mdev: MDEV_TYPE}
    assert_ledgers_agree_with_sysfs(hosts)

    # Never remove an mdev in use, never hang (issue 11, item 6): the source QEMU
    # holds the mdev's VFIO group, and the agent's in-use probe sees it ...
    with pytest.raises(exception.MdevInUse):
        privileged.check_not_in_use(mdevlab.SYSFS, source_mdev)
    # ... so a release --remove while the VM runs returns (accelctl's own timeout
    # would fail the test otherwise) and keeps the mdev, free and A's.
    kept = hosts.a.ctl("release", INSTANCE, "--remove")
    assert kept.returncode == 1 and source_mdev in kept.stderr, mdevlab.describe(kept)
    assert mdevlab.mdevs() == {source_mdev: MDEV_TYPE}
    assert [r.uuid for r in hosts.a.ledger() if r.free] == [source_mdev]
    assert migrationlab.read_scratch(domain) == 0xA5


# --- 3. the happy path ---------------------------------------------------------------------


def test_live_migration_through_the_agents(hosts: Hosts) -> None:
    source_mdev, domain = start_vm(hosts, qemu_settings=True)
    migrationlab.write_scratch(domain, 0x5A)
    assert migrationlab.read_scratch(domain) == 0x5A

    run = migrationlab.migrate_through_agents(domain, hosts.a, hosts.b, INSTANCE)

    (destination_mdev,) = run.mapping.values()
    assert run.mapping == {source_mdev: destination_mdev}
    assert destination_mdev != source_mdev
    # The domain runs on B, with B's claimed mdev, live and in its persistent definition.
    with hosts.libvirt_b.connect() as conn:
        landed = conn.lookupByName(INSTANCE)
        assert landed.isActive() and landed.UUIDString() == DOMAIN_UUID
        assert migrationlab.active_mdevs(landed) == [destination_mdev]
        assert migrationlab.persistent_mdevs(landed) == [destination_mdev]
        # The device state arrived: the scratch register written on A reads back on B.
        assert migrationlab.read_scratch(landed) == 0x5A
    with hosts.libvirt_a.connect() as conn:
        assert conn.listAllDomains(0) == []  # undefined on the source
    # B committed: the claim is vm1's allocation.
    assert [m["uuid"] for m in hosts.b.client().allocation(INSTANCE)["mdevs"]] == [
        destination_mdev
    ]
    (record,) = hosts.b.ledger()
    assert (record.uuid, record.owner, record.owner_kind) == (
        destination_mdev, INSTANCE, OwnerKind.INSTANCE
    )
    # A released with remove, after libvirt's success: its mdev is gone.
    assert run.released == [source_mdev]
    assert hosts.a.client().allocation(INSTANCE)["mdevs"] == []
    assert hosts.a.ledger() == []
    assert mdevlab.mdevs() == {destination_mdev: MDEV_TYPE}
    assert_ledgers_agree_with_sysfs(hosts)
    # What benchmark (l) reports, for the record (no assertion on times).
    (migrationlab.LOG_DIR / "migration-run.json").write_text(
        json.dumps({"timings": run.timings, "job": run.job}, indent=1, default=str)
    )


def test_the_api_socket_of_each_agent_is_its_own(hosts: Hosts) -> None:
    # Own state_dir, API socket and libvirt URI per agent (the premise of the rest).
    answers = [ApiClient(str(agent.socket)).health() for agent in hosts.agents]
    assert all(answer["status"] == "ok" for answer in answers)
    assert hosts.a.socket != hosts.b.socket and hosts.a.state_dir != hosts.b.state_dir
    assert hosts.a.libvirtd.uri != hosts.b.libvirtd.uri
    with hosts.libvirt_a.connect() as conn_a, hosts.libvirt_b.connect() as conn_b:
        uuid_a = conn_a.getCapabilities().split("<uuid>")[1].split("</uuid>")[0]
        uuid_b = conn_b.getCapabilities().split("<uuid>")[1].split("</uuid>")[0]
    # libvirt refuses a migration to the host it runs on: two host UUIDs in one guest
    assert (uuid_a, uuid_b) == (hosts.libvirt_a.host_uuid, hosts.libvirt_b.host_uuid)
