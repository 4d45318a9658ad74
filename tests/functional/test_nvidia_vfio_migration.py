"""vGPU VFs (nvidia_vfio) in guest XML and live migration, on the FUSE simulator's
``nvidia-vfio`` GPUs: ``domain-xml`` of a VF through accelctl and the daemon's API
(with the REAL privsep helper), checked against libvirt's RNG schema and defined
on its ``test:///default`` driver; a destination claim of a VF of the same type
and the source's one-pass rewrite between two agents; and ``MigrationSource``
handing libvirt the rewritten XML."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import libvirt
import pytest
from lxml import etree

from accel_agent import exception
from accel_agent.libvirt_xml import instance_devices_xml, list_mdev_uuids, list_pci_sources
from accel_agent.migration import versions
from accel_agent.migration.destination import MigrationDestination
from accel_agent.migration.source import AgentApi, AgentVf, MigrationSource, domain_vfs
from accel_agent.simulator.nvml import DRIVER_VERSION
from accel_agent.sysfs import nvidia_vfio
from tests.functional.daemon_fixture import AgentDaemon, agent_config, ctl, short_dir
from tests.functional.killharness import typed_vfs
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
VF_TYPE = "nvidia-1150"
TYPES = (
    f"[devices]\nenabled_mdev_types = nvidia-35, {VF_TYPE}\n"
    f"[mdev_nvidia-35]\n[mdev_{VF_TYPE}]\ndevice_addresses = {GPU1}, {GPU2}\n"
)
# libvirt's test driver says QEMU 0.0.2: lower the floors; the probe still runs.
DEST = (
    "[libvirt]\nuri = test:///default\n[migration]\nmin_libvirt_version = 0.0.1\n"
    "min_qemu_version = 0.0.1\nmin_kernel_version = 0.0.1\nclaim_timeout = 600\n"
)
SCHEMA = Path("/usr/share/libvirt/schemas/domain.rng")
# A PCI device of the domain that is not the agent's (a NIC the operator passes
# through): it must stay exactly as it is.
UNRELATED = (
    "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
    "<address domain='0x0000' bus='0x06' slot='0x00' function='0x0'/></source></hostdev>"
)
RECENT = versions.HostVersions.from_dict({"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1"})
TEST_DRIVER_OK = versions.Minimums(libvirt=(0, 0, 1), qemu=(0, 0, 1), kernel=(0, 0, 1))
# A source whose NVIDIA vGPU manager is the simulated destination's (vGPUs migrate
# only between equal versions).
SAME_MANAGER = RECENT.with_vgpu_manager(DRIVER_VERSION).to_dict()


def libvirt_address(vf: str) -> str:
    """The source <address> as libvirt writes it."""
    domain, bus, rest = vf.split(":")
    slot, function = rest.split(".")
    return (
        f"<address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' "
        f"function='0x{int(function, 16):x}'/>"
    )


def guest(devices: str, name: str = "guest") -> str:
    return (
        f"<domain type='test'><name>{name}</name>"
        "<uuid>0f0f0f0f-1111-4222-8333-444444444444</uuid><memory>1048576</memory>"
        f"<os><type>hvm</type></os><devices>{devices}</devices></domain>"
    )


def typed(host) -> dict[str, int]:
    """VF -> vGPU type id of every typed VF, read from the simulated sysfs."""
    return {vf: value for vf, value in typed_vfs(host.root).items() if value}


def type_by_hand(host, vf: str, type_id: int) -> None:
    path = os.path.join(host.root, "bus", "pci", "devices", vf, "nvidia", "current_vgpu_type")
    with open(path, "w") as handle:
        handle.write(str(type_id))


def assert_rng_valid(xml: str) -> None:
    if not SCHEMA.is_file():
        pytest.skip(f"libvirt RNG schemas not installed ({SCHEMA} missing)")
    rng = etree.RelaxNG(file=str(SCHEMA))
    assert rng.validate(etree.fromstring(xml.encode())), str(rng.error_log)


def define_and_describe(conn: Any, xml: str, flags: int = 0) -> str:
    dom = conn.defineXML(xml)
    try:
        return dom.XMLDesc(flags)
    finally:
        dom.undefine()


def daemon(host, sock_dir: Path, name: str, extra: str = "") -> AgentDaemon:
    work = host.work / name
    work.mkdir(exist_ok=True)
    config = agent_config(
        work / "agent.conf", host.root, str(work / "state"), str(sock_dir / f"{name}.sock"),
        TYPES, rescan_interval=0.5, extra=extra,
    )
    return AgentDaemon(config, str(sock_dir / f"{name}.sock"), work)


@pytest.fixture
def hosts(tmp_path):
    skip_unless_root()
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with (
        simulated_host(tmp_path / "src", ["nvidia-pf", "nvidia-vfio"], gpus=2, vfs=4) as src,
        simulated_host(tmp_path / "dst", ["nvidia-pf", "nvidia-vfio"], gpus=2, vfs=4) as dst,
        short_dir() as sock_dir,
    ):
        yield src, dst, sock_dir


def test_domain_xml_of_a_vf_is_a_pci_hostdev_libvirt_accepts_and_mdevs_are_unchanged(hosts):
    src_host, _, sock_dir = hosts
    config = src_host.config(TYPES + "[libvirt]\nuri =\n")
    # Offline (no daemon): accelctl builds it from the ledger's backend column.
    out = json.loads(
        ctl(config, "allocate", "vm-v", "--count", "2", "--type", VF_TYPE, "--json").stdout
    )
    vfs = [m["parent"] for m in out["mdevs"]]
    proc = ctl(config, "domain-xml", "vm-v")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        f'<hostdev mode="subsystem" type="pci" managed="no"><source>'
        f'{libvirt_address(vf).replace(chr(39), chr(34))}</source></hostdev>'
        for vf in vfs
    ]
    # --json: each VF by its address, with its element (issue 25).
    document = json.loads(ctl(config, "domain-xml", "vm-v", "--json").stdout)
    assert [(d["type"], d["address"], d["xml"]) for d in document["devices"]] == [
        ("pci", vf, line) for vf, line in zip(vfs, lines, strict=True)
    ]
    assert document["qemu_commandline"] is None and document["xml"] == "\n".join(lines)
    # An mdev instance on the same host: the mdev element, byte for byte as before.
    mdev = json.loads(
        ctl(config, "allocate", "vm-m", "--count", "1", "--type", "nvidia-35", "--json").stdout
    )["mdevs"][0]["uuid"]
    assert ctl(config, "domain-xml", "vm-m").stdout == (
        '<hostdev mode="subsystem" type="mdev" model="vfio-pci" managed="no">'
        f'<source><address uuid="{mdev}"/></source></hostdev>\n'
    )

    domain = guest("".join(lines) + UNRELATED)
    assert_rng_valid(domain)
    conn = libvirt.open("test:///default")
    try:
        described = define_and_describe(conn, domain)
    finally:
        conn.close()
    assert list_pci_sources(described) == [*vfs, "0000:06:00.0"]
    hostdevs = etree.fromstring(described.encode()).findall("devices/hostdev")
    assert [h.get("managed") for h in hostdevs] == ["no", "no", "yes"]

    # The daemon's API answers the same document.
    with daemon(src_host, sock_dir, "src") as agent:
        # (the daemon's own state dir: give it the same allocation)
        agent.start()
        api = agent.client()
        allocated = api.allocate("vm-d", 1, mdev_type=VF_TYPE)
        (vf,) = [m["parent"] for m in allocated["mdevs"]]
        assert api.domain_xml("vm-d") == (
            f'<hostdev mode="subsystem" type="pci" managed="no"><source>'
            f'{libvirt_address(vf).replace(chr(39), chr(34))}</source></hostdev>\n'
        )


def test_claim_of_a_vf_and_the_one_pass_rewrite_between_two_agents(hosts):
    src_host, dst_host, sock_dir = hosts
    with (
        daemon(src_host, sock_dir, "src") as source,
        daemon(dst_host, sock_dir, "dst", DEST) as destination,
    ):
        source.start()
        destination.start()
        src_api, dst_api = source.client(), destination.client()
        held = src_api.allocate("vm-1", 1, mdev_type=VF_TYPE)["mdevs"]
        mdev = src_api.allocate("vm-1m", 1, mdev_type="nvidia-35")["mdevs"][0]["uuid"]
        ((src_vf, src_uuid),) = [(m["parent"], m["uuid"]) for m in held]
        # The destination's first GPU is busier: the claim lands on its second one,
        # so the VF's address really changes.
        dst_api.allocate("other", 1, mdev_type=VF_TYPE)
        dst_typed = typed(dst_host)

        # Refusals change nothing: an unknown type, and a VF type the source names
        # wrongly (nvidia-999).
        with pytest.raises(exception.ApiError) as info:
            dst_api.migration_claim("vm-1", {src_uuid: "nvidia-999"})
        assert info.value.kwargs["code"] == "MigrationTypesUnsupported"
        assert "nvidia-999" in str(info.value)
        assert typed(dst_host) == dst_typed

        sources = {src_uuid: VF_TYPE, mdev: "nvidia-35"}
        # vGPUs between different NVIDIA vGPU managers, or from a source that did not
        # say its own: refused by the daemon, naming both versions, nothing typed.
        with pytest.raises(exception.ApiError) as info:
            dst_api.migration_claim("vm-1", sources, RECENT.with_vgpu_manager("535.104.05")
                                    .to_dict())
        assert info.value.kwargs["code"] == "MigrationVgpuManagerMismatch"
        assert "535.104.05" in str(info.value) and DRIVER_VERSION in str(info.value)
        with pytest.raises(exception.ApiError) as info:
            dst_api.migration_claim("vm-1", sources)
        assert info.value.kwargs["code"] == "MigrationVgpuManagerUnknown"
        assert "of the source host is unknown" in str(info.value)
        assert typed(dst_host) == dst_typed

        claim = dst_api.migration_claim("vm-1", sources, SAME_MANAGER)
        mapping, addresses = claim["mapping"], claim["pci_addresses"]
        assert set(mapping) == set(sources)
        (dst_vf,) = addresses.values()
        assert list(addresses) == [src_uuid]
        assert dst_vf.startswith("0000:c2:00.") and dst_vf != src_vf
        # A VF of the same type id, typed on the destination, owned by the claim.
        assert typed(dst_host) == {**dst_typed, dst_vf: 1150}
        assert mapping[src_uuid] == nvidia_vfio.device_uuid(dst_vf)
        listed = {m["uuid"]: m for m in dst_api.mdevs()["mdevs"]}
        claimed = listed[mapping[src_uuid]]
        assert (claimed["parent"], claimed["backend"], claimed["instance"]) == (
            dst_vf, "nvidia_vfio", "vm-1"
        )
        assert listed[mapping[mdev]]["backend"] == "mdev"
        # Idempotent, and accelctl shows the destination address.
        assert dst_api.migration_claim("vm-1", sources, SAME_MANAGER) == claim
        proc = ctl(destination.config_file, "migration", "claim", "vm-1",
                   "--mdev", f"{src_uuid}={VF_TYPE}", "--mdev", f"{mdev}=nvidia-35",
                   *(f"--source-version={k}={v}" for k, v in SAME_MANAGER.items()))
        assert proc.returncode == 0, proc.stderr
        assert "DESTINATION ADDRESS" in proc.stdout and dst_vf in proc.stdout

        # The source's domain, as libvirt describes it for migration.
        devices = src_api.domain_xml("vm-1") + src_api.domain_xml("vm-1m") + UNRELATED
        conn = libvirt.open("test:///default")
        try:
            xml = define_and_describe(
                conn, guest(devices), libvirt.VIR_DOMAIN_XML_MIGRATABLE
            )
            assert list_pci_sources(xml) == [src_vf, "0000:06:00.0"]

            rewritten = src_api.rewrite_domain_xml(xml, mapping, addresses)
            expected = xml.replace(
                f"<source>\n        {libvirt_address(src_vf)}",
                f"<source>\n        {libvirt_address(dst_vf)}",
            ).replace(f"uuid='{mdev}'", f"uuid='{mapping[mdev]}'")
            assert expected.count(libvirt_address(dst_vf)) == 1
            assert rewritten["xml"] == expected
            assert rewritten["replaced_pci"] == [[src_vf, dst_vf]]
            assert rewritten["replaced"] == [[mdev, mapping[mdev]]]
            assert rewritten["unused_keys"] == []  # the VF's UUID is not an unused key
            assert_rng_valid(rewritten["xml"])
            landed = define_and_describe(conn, rewritten["xml"])
            assert list_pci_sources(landed) == [dst_vf, "0000:06:00.0"]
            assert list_mdev_uuids(landed) == [mapping[mdev]]

            # Refused by name, nothing rewritten: the VF without its destination ...
            with pytest.raises(exception.ApiError) as info:
                src_api.rewrite_domain_xml(xml, mapping)
            assert info.value.kwargs == {"status": 400, "code": "UnmappedVf", "request_id": ANY}
            assert src_vf in str(info.value) and src_uuid in str(info.value)
            # ... and a vGPU VF the source's ledger does not own (typed by hand).
            foreign = "0000:c2:00.7"
            type_by_hand(src_host, foreign, 1150)
            with_foreign = xml.replace(
                "<hostdev mode='subsystem' type='pci' managed='yes'>",
                "<hostdev mode='subsystem' type='pci' managed='no'><source>"
                f"{libvirt_address(foreign)}</source></hostdev>"
                "<hostdev mode='subsystem' type='pci' managed='yes'>",
            )
            assert with_foreign != xml
            with pytest.raises(exception.ApiError) as info:
                src_api.rewrite_domain_xml(with_foreign, mapping, addresses)
            assert info.value.kwargs == {"status": 409, "code": "ForeignVf", "request_id": ANY}
            assert foreign in str(info.value)
            # MigrationSource beside the running daemon sees the same through its API.
            seen = AgentApi(src_api).vfs()
            assert seen[src_vf] == AgentVf(src_uuid, VF_TYPE, owned=True)
            assert seen[foreign] == AgentVf(nvidia_vfio.device_uuid(foreign), VF_TYPE, owned=False)
            with pytest.raises(exception.ForeignVf):
                domain_vfs(with_foreign, AgentApi(src_api))
        finally:
            conn.close()

        # Commit: the destination's domain-xml now names its own VF.
        dst_api.migration_commit("vm-1")
        assert dst_api.domain_xml("vm-1").splitlines()[0] == (
            f'<hostdev mode="subsystem" type="pci" managed="no"><source>'
            f'{libvirt_address(dst_vf).replace(chr(39), chr(34))}</source></hostdev>'
        )
        # The source lets its VF go: untyped.
        src_api.release("vm-1", remove=True)
        assert src_vf not in typed(src_host)


class RecordingDomain:
    """A test-driver domain whose migrateToURI3 records what it was given and then
    stops the domain, as libvirt does after a successful migration."""

    def __init__(self, domain):
        self._domain = domain
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._domain, name)

    def migrateToURI3(self, uri, params, flags):
        self.calls.append((uri, dict(params), flags))
        self._domain.destroy()


@pytest.fixture
def pair(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with (
        simulated_host(tmp_path / "src", ["nvidia-vfio"], gpus=2, vfs=4) as src,
        simulated_host(tmp_path / "dst", ["nvidia-vfio"], gpus=2, vfs=4) as dst,
    ):
        yield src, dst


def test_migration_source_prepares_and_sends_the_destination_vf(pair):
    src_host, dst_host = pair
    conf = (
        f"[devices]\nenabled_mdev_types = {VF_TYPE}\n[mdev_{VF_TYPE}]\n"
        f"device_addresses = {GPU1}, {GPU2}\n"
    )
    manager = src_host.manager(conf)
    instance = "0f0f0f0f-1111-4222-8333-444444444444"
    held = manager.allocate(instance, 1).mdevs
    ((src_vf, src_uuid),) = [(r.parent, r.uuid) for r in held]
    dest = MigrationDestination(dst_host.manager(conf), lambda: RECENT, TEST_DRIVER_OK)
    dest.manager.allocate("other", 1)  # the destination VF is not the source's address
    source = MigrationSource(manager, TEST_DRIVER_OK)

    conn = libvirt.open("test:///default")
    try:
        vf_xml = instance_devices_xml(manager.guest_devices(held))
        domain = RecordingDomain(conn.defineXML(guest(vf_xml + UNRELATED, name="vfguest")))
        domain.create()
        # prepare: the VF's UUID and type (the unrelated PCI device is not listed)
        sources = source.prepare(domain)
        assert sources == {src_uuid: VF_TYPE}
        # What the source sends: its versions, its NVIDIA vGPU manager's read from
        # its own (simulated) NVML, which the destination compares with its own.
        sent = source.versions(domain)
        assert sent["nvidia_vgpu_manager"] == DRIVER_VERSION
        mapping = dest.claim(instance, sources, sent)
        addresses = dest.pci_addresses(instance)
        (dst_vf,) = addresses.values()
        assert dst_vf != src_vf
        assert dest.claims(instance)["pci_addresses"] == addresses == {src_uuid: dst_vf}

        # Refused before libvirt is asked: no destination for the VF; post-copy.
        with pytest.raises(exception.UnmappedVf):
            source.migrate(domain, "qemu://dst/system", mapping)
        with pytest.raises(exception.MigrationPostCopyRefused) as info:
            source.migrate(domain, "qemu://dst/system", mapping,
                           libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_POSTCOPY,
                           pci_addresses=addresses)
        assert src_vf in str(info.value)
        assert domain.calls == []

        original = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        inactive = domain.XMLDesc(
            libvirt.VIR_DOMAIN_XML_MIGRATABLE | libvirt.VIR_DOMAIN_XML_INACTIVE
        )
        flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
        released = source.migrate(
            domain, "qemu://dst/system", mapping, flags, instance=instance,
            remove=True, pci_addresses=addresses,
        )
        params = domain.calls[0][1]
        move = (libvirt_address(src_vf), libvirt_address(dst_vf))
        assert params[libvirt.VIR_MIGRATE_PARAM_DEST_XML] == original.replace(*move)
        assert params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] == inactive.replace(*move)
        assert list_pci_sources(params[libvirt.VIR_MIGRATE_PARAM_DEST_XML]) == [
            dst_vf, "0000:06:00.0"
        ]
        # Released after success: the source VF is untyped.
        assert released == [src_uuid]
        assert src_vf not in typed(src_host)
        domain.undefine()
    finally:
        conn.close()
