"""Live migration with mdevs: destination claims on a simulated host, the
source's rewrite handed to a libvirt test-driver domain whose
migrateToURI3 records what it was given (the test driver cannot migrate)."""

import time

import libvirt
import pytest

from accel_agent import exception
from accel_agent.libvirt_xml import domain_hostdevs_xml, list_mdev_uuids
from accel_agent.migration import source as source_mod
from accel_agent.migration import versions
from accel_agent.migration.destination import MigrationDestination
from accel_agent.migration.source import MigrationSource
from tests.functional.simhost import simulated_host

pytestmark = pytest.mark.fuse

CONF = (
    "[devices]\nenabled_mdev_types = nvidia-18, mtty-2\n[mdev_nvidia-18]\n"
    "[mdev_mtty-2]\ndevice_addresses = mtty\n"
)
RECENT = versions.HostVersions.from_dict({"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1"})
SRC = [f"5a5a5a5a-0000-4000-8000-00000000000{i}" for i in range(1, 4)]
# libvirt's test driver reports QEMU "0.0.2": let it pass the gates where the
# test is about something else.
TEST_DRIVER_OK = versions.Minimums(libvirt=(0, 0, 1), qemu=(0, 0, 1), kernel=(0, 0, 1))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with simulated_host(tmp_path_factory.mktemp("dst"), ["nvidia-pf", "mtty"], gpus=1) as host:
        yield host


@pytest.fixture
def host(sim):
    sim.reset()
    return sim


def destination(host, **kwargs):
    return MigrationDestination(host.manager(CONF), lambda: RECENT, **kwargs)


def test_claim_maps_each_source_mdev_to_one_of_the_same_type_and_survives_restart(host):
    dest = destination(host)
    mapping = dest.claim("vm-1", {SRC[0]: "nvidia-18", SRC[1]: "nvidia-18", SRC[2]: "mtty-2"})
    assert set(mapping) == set(SRC)
    assert len(set(mapping.values())) == 3
    snapshot = dest.manager.scan()
    assert snapshot.mdevs[mapping[SRC[2]]].mdev_type == "mtty-2"
    assert snapshot.mdevs[mapping[SRC[0]]].mdev_type == "nvidia-18"
    # claimed mdevs are assigned: nobody else gets them
    others = dest.manager.allocate("other", 2).uuids
    assert not set(others) & set(mapping.values())
    # a restart (new manager, same ledger) answers the same claim the same way
    restarted = destination(host)
    assert (
        restarted.claim(
            "vm-1",
            {s.upper(): t for s, t in zip(SRC, ["nvidia-18", "nvidia-18", "mtty-2"], strict=True)},
        )
        == mapping
    )
    assert restarted.claims("vm-1")["mapping"] == mapping
    allocation = restarted.commit("vm-1")
    assert sorted(allocation.uuids) == sorted(mapping.values())
    with pytest.raises(exception.MigrationClaimNotFound):
        restarted.commit("vm-1")


def test_abort_frees_and_expiry_frees(host):
    dest = destination(host)
    mapping = dest.claim("vm-1", {SRC[0]: "nvidia-18"})
    assert dest.abort("vm-1") == list(mapping.values())
    assert dest.abort("vm-1") == []
    free = {r.uuid for r in dest.manager.ledger.all() if r.free}
    assert set(mapping.values()) <= free
    # abort --remove: the claimed mdevs leave sysfs and the ledger (a failed incoming
    # migration may have left them in a state nobody should inherit)
    removed = dest.claim("vm-4", {SRC[2]: "mtty-2"})
    assert set(removed.values()) <= host.sysfs_uuids()
    assert dest.abort("vm-4", remove=True) == list(removed.values())
    assert not set(removed.values()) & host.sysfs_uuids()
    assert {r.uuid for r in dest.manager.ledger.all()}.isdisjoint(removed.values())
    assert dest.abort("vm-4", remove=True) == []
    # A claim made "long ago" (clock in the past) has expired by now.
    old = destination(host, claim_timeout=60, clock=lambda: time.time() - 3600)
    stale = old.claim("vm-2", {SRC[1]: "nvidia-18"})
    assert old.manager.release_expired_claims() == list(stale.values())
    assert old.manager.ledger.by_owner("vm-2") == []


def test_missing_types_are_named_and_nothing_is_claimed(host):
    dest = destination(host)
    with pytest.raises(exception.MigrationTypesUnsupported) as info:
        dest.claim("vm-1", {SRC[0]: "nvidia-18", SRC[1]: "nvidia-999", SRC[2]: "i915-x"})
    assert "i915-x, nvidia-999" in str(info.value) and "nvidia-18" in str(info.value)
    assert host.sysfs_uuids() == set()


def test_too_old_versions_name_the_side(host):
    # The destination's real libvirt test driver says QEMU 0.0.2.
    real = MigrationDestination(host.manager(CONF), lambda: versions.probe_uri("test:///default"))
    with pytest.raises(exception.MigrationVersionTooOld) as info:
        real.claim("vm-1", {SRC[0]: "nvidia-18"})
    assert str(info.value).startswith("Destination host") and "QEMU 0.0.2" in str(info.value)
    with pytest.raises(exception.MigrationVersionTooOld) as info:
        destination(host).claim(
            "vm-1",
            {SRC[0]: "nvidia-18"},
            source_versions={"libvirt": "8.0.0", "qemu": "8.2.0", "kernel": "6.1"},
        )
    assert str(info.value).startswith("Source host") and "libvirt 8.0.0" in str(info.value)
    assert host.sysfs_uuids() == set()


def test_bad_claim_requests(host):
    dest = destination(host)
    for bad in ({}, [], {"nope": "nvidia-18"}, {SRC[0]: "../x"}, {SRC[0]: 5}):
        with pytest.raises((exception.InvalidMigrationRequest, exception.InvalidMdevUUID)):
            dest.claim("vm-1", bad)
    assert host.sysfs_uuids() == set()


# What libvirt 11.3 said in the real-kernel lab when QEMU lacked the two vfio-pci
# settings (the source failed), and when the destination's device could not load.
SOURCE_FAILED = (
    "operation failed: migration failed. Message from the source host: operation failed: "
    "job 'migration out' failed: ram_save_setup failed: Operation not supported. Message "
    "from the destination host: operation failed: job 'migration in' failed: load of "
    "migration failed: Input/output error"
)
DESTINATION_FAILED = (
    "operation failed: migration failed. Message from the source host: operation failed: "
    "job 'migration out' failed: Sibling indicated error 1. Message from the destination "
    "host: operation failed: job 'migration in' failed: load of migration failed: Bad file "
    "descriptor"
)


class RecordingDomain:
    """A real test-driver domain whose migrateToURI3 records its arguments and,
    like libvirt after a successful migration, stops the source domain (unless
    ``stops`` is False)."""

    def __init__(self, domain, fail=None, stops=True):
        self._domain = domain
        self.calls = []
        self.fail = fail
        self.stops = stops

    def __getattr__(self, name):
        return getattr(self._domain, name)

    def migrateToURI3(self, uri, params, flags):
        self.calls.append((uri, dict(params), flags))
        if self.fail is not None:
            raise libvirt.libvirtError(self.fail)
        if self.stops:
            self._domain.destroy()


def define_guest(conn, uuids):
    hostdevs = "".join(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci' managed='no'>"
        f"<source><address uuid='{u}'/></source><alias name='hostdev{i}'/></hostdev>"
        for i, u in enumerate(uuids)
    )
    domain = conn.defineXML(
        "<domain type='test'><name>guest</name>"
        "<uuid>0f0f0f0f-1111-4222-8333-444444444444</uuid><memory>1024</memory>"
        f"<os><type>hvm</type></os><devices>{hostdevs}"
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        "<address domain='0x0000' bus='0x06' slot='0x00' function='0x0'/></source></hostdev>"
        "</devices></domain>"
    )
    domain.create()
    return domain


def test_source_prepare_rewrite_and_migrate(host):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 2).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids))
    source = MigrationSource(manager, TEST_DRIVER_OK)
    assert source.prepare(domain) == {u: "nvidia-18" for u in source_uuids}

    dest_map = {source_uuids[0]: SRC[0], source_uuids[1]: SRC[1]}
    with pytest.raises(exception.MigrationPostCopyRefused):
        source.migrate(
            domain,
            "qemu+tls://dst/system",
            dest_map,
            libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_POSTCOPY,
        )
    assert domain.calls == []

    original = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
    released = source.migrate(domain, "qemu+tls://dst/system", dest_map, libvirt.VIR_MIGRATE_LIVE)
    (uri, params, flags) = domain.calls[0]
    assert uri == "qemu+tls://dst/system" and flags == libvirt.VIR_MIGRATE_LIVE
    sent = params[libvirt.VIR_MIGRATE_PARAM_DEST_XML]
    assert list_mdev_uuids(sent) == [SRC[0], SRC[1]]
    assert sent == original.replace(source_uuids[0], SRC[0]).replace(source_uuids[1], SRC[1])
    # no persistent destination asked for: no persistent XML sent
    assert libvirt.VIR_MIGRATE_PARAM_PERSIST_XML not in params
    # released only after success, kept as free mdevs
    assert sorted(released) == sorted(source_uuids)
    assert manager.allocation(instance).mdevs == ()
    assert set(source_uuids) <= host.sysfs_uuids()
    conn.close()


def test_persistent_destination_gets_the_rewritten_persistent_xml(host):
    # Without VIR_MIGRATE_PARAM_PERSIST_XML, libvirt 11.3 defined the domain on the
    # destination with the source's mdev UUIDs (seen in the real-kernel lab).
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 2).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids))
    inactive = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_MIGRATABLE)
    dest_map = {source_uuids[0]: SRC[0], source_uuids[1]: SRC[1]}
    source = MigrationSource(manager, TEST_DRIVER_OK)
    flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
    source.migrate(domain, "qemu+tls://dst/system", dest_map, flags)
    params = domain.calls[0][1]
    persistent = params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML]
    assert persistent == inactive.replace(source_uuids[0], SRC[0]).replace(source_uuids[1], SRC[1])
    assert list_mdev_uuids(params[libvirt.VIR_MIGRATE_PARAM_DEST_XML]) == [SRC[0], SRC[1]]

    # A persistent XML the caller gives is rewritten too, not sent with source UUIDs.
    again = manager.allocate("vm-2", 1).uuids
    domain = RecordingDomain(define_guest(conn, again))
    given = f"<domain><devices>{domain_hostdevs_xml(again)}</devices></domain>"
    source.migrate(
        domain, "qemu://dst/system", {again[0]: SRC[2]}, flags,
        {libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: given}, instance="vm-2",
    )
    assert list_mdev_uuids(domain.calls[0][1][libvirt.VIR_MIGRATE_PARAM_PERSIST_XML]) == [SRC[2]]
    conn.close()


def test_after_success_the_source_stops_then_the_destination_commits_then_the_source_removes(
    host,
):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 2).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids))
    seen = []

    def commit():
        # the destination's commit: libvirt reported success, the source stopped,
        # and the source has released nothing yet
        seen.append((bool(domain.isActive()), manager.allocation(instance).uuids))

    released = MigrationSource(manager, TEST_DRIVER_OK).migrate(
        domain,
        "qemu://dst/system",
        {source_uuids[0]: SRC[0], source_uuids[1]: SRC[1]},
        remove=True,
        before_release=commit,
    )
    assert seen == [(False, source_uuids)]
    assert sorted(released) == sorted(source_uuids)
    assert not set(source_uuids) & host.sysfs_uuids()
    assert {r.uuid for r in manager.ledger.all()}.isdisjoint(source_uuids)
    conn.close()


def test_a_commit_that_fails_keeps_the_source_allocation(host):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 1).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids))

    def commit():
        raise exception.MigrationClaimNotFound(instance=instance)

    with pytest.raises(exception.MigrationClaimNotFound):
        MigrationSource(manager, TEST_DRIVER_OK).migrate(
            domain, "qemu://dst/system", {source_uuids[0]: SRC[0]}, remove=True,
            before_release=commit,
        )
    assert manager.allocation(instance).uuids == source_uuids
    assert set(source_uuids) <= host.sysfs_uuids()
    conn.close()


def test_a_source_still_active_after_success_is_freed_not_removed(host):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 1).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids), stops=False)
    now = [0.0]
    source = MigrationSource(
        manager, TEST_DRIVER_OK, clock=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    released = source.migrate(domain, "qemu://dst/system", {source_uuids[0]: SRC[0]}, remove=True)
    assert released == source_uuids
    assert now[0] >= source_mod.STOP_TIMEOUT
    # never a remove under a QEMU that may still hold it: free, owned, in sysfs
    assert set(source_uuids) <= host.sysfs_uuids()
    assert {r.uuid for r in manager.ledger.all() if r.free} >= set(source_uuids)
    domain.destroy()
    conn.close()


def test_failed_migration_keeps_the_source_mdevs(host):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 1).uuids
    conn = libvirt.open("test:///default")
    source = MigrationSource(manager, TEST_DRIVER_OK)
    guest = define_guest(conn, source_uuids)
    for message, side, own in (
        (SOURCE_FAILED, "source", "ram_save_setup failed: Operation not supported"),
        (DESTINATION_FAILED, "destination", "load of migration failed: Bad file descriptor"),
        ("unable to connect to server at '127.0.0.1:49152': Connection refused", "source",
         "Connection refused"),
    ):
        domain = RecordingDomain(guest, fail=message)
        committed = []
        with pytest.raises(exception.MigrationFailed) as info:
            source.migrate(
                domain, "qemu://dst/system", {source_uuids[0]: SRC[0]}, remove=True,
                before_release=lambda: committed.append(1),  # noqa: B023
            )
        assert info.value.kwargs["side"] == side
        assert own in info.value.kwargs["reason"]
        assert f"failed on the {side} host: " in str(info.value)
        assert message in str(info.value)  # libvirt's whole message
        assert isinstance(info.value.__cause__, libvirt.libvirtError)
        assert committed == []
        assert domain.isActive()
        assert manager.allocation(instance).uuids == source_uuids
        assert set(source_uuids) <= host.sysfs_uuids()
    with pytest.raises(exception.UnmappedMdevUUID) as info:
        source.migrate(domain, "qemu://dst/system", {SRC[2]: SRC[0]})
    assert source_uuids[0] in str(info.value)
    # the source's own versions are checked too (the test driver's QEMU is 0.0.2)
    with pytest.raises(exception.MigrationVersionTooOld) as info:
        MigrationSource(manager).prepare(domain)
    assert str(info.value).startswith("Source host")
    conn.close()
