"""Live migration with mdevs: destination claims on a simulated host, the
source's rewrite handed to a libvirt test-driver domain whose
migrateToURI3 records what it was given (the test driver cannot migrate)."""

import time

import libvirt
import pytest

from accel_agent import exception
from accel_agent.libvirt_xml import list_mdev_uuids
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


class RecordingDomain:
    """A real test-driver domain whose migrateToURI3 records its arguments."""

    def __init__(self, domain, fail=False):
        self._domain = domain
        self.calls = []
        self.fail = fail

    def __getattr__(self, name):
        return getattr(self._domain, name)

    def migrateToURI3(self, uri, params, flags):
        self.calls.append((uri, dict(params), flags))
        if self.fail:
            raise libvirt.libvirtError("migration failed on purpose")


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

    released = source.migrate(domain, "qemu+tls://dst/system", dest_map, libvirt.VIR_MIGRATE_LIVE)
    (uri, params, flags) = domain.calls[0]
    assert uri == "qemu+tls://dst/system" and flags == libvirt.VIR_MIGRATE_LIVE
    sent = params[libvirt.VIR_MIGRATE_PARAM_DEST_XML]
    assert list_mdev_uuids(sent) == [SRC[0], SRC[1]]
    original = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
    assert sent == original.replace(source_uuids[0], SRC[0]).replace(source_uuids[1], SRC[1])
    # released only after success, kept as free mdevs
    assert sorted(released) == sorted(source_uuids)
    assert manager.allocation(instance).mdevs == ()
    conn.close()


def test_failed_migration_keeps_the_source_mdevs(host):
    manager = host.manager(CONF)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    source_uuids = manager.allocate(instance, 1).uuids
    conn = libvirt.open("test:///default")
    domain = RecordingDomain(define_guest(conn, source_uuids), fail=True)
    source = MigrationSource(manager, TEST_DRIVER_OK)
    with pytest.raises(libvirt.libvirtError):
        source.migrate(domain, "qemu://dst/system", {source_uuids[0]: SRC[0]})
    assert manager.allocation(instance).uuids == source_uuids
    with pytest.raises(exception.UnmappedMdevUUID) as info:
        source.migrate(domain, "qemu://dst/system", {SRC[2]: SRC[0]})
    assert source_uuids[0] in str(info.value)
    # the source's own versions are checked too (the test driver's QEMU is 0.0.2)
    with pytest.raises(exception.MigrationVersionTooOld) as info:
        MigrationSource(manager).prepare(domain)
    assert str(info.value).startswith("Source host")
    conn.close()
