"""Live migration between two agents on this machine: two simulated hosts,
two real daemons (each with its privsep daemon), the destination's claims
through the API and accelctl."""

import json
from pathlib import Path
from unittest.mock import ANY

import pytest

from accel_agent import exception
from accel_agent.libvirt_xml import list_mdev_uuids
from accel_agent.migration.source import AgentApi
from tests.functional.daemon_fixture import AgentDaemon, agent_config, ctl, short_dir, wait_for
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

TYPES = "[devices]\nenabled_mdev_types = nvidia-35\n"
# libvirt's test driver says QEMU 0.0.2: lower the floors where the test is
# not about versions; the destination's real probe still runs.
DEST = (
    "[libvirt]\nuri = test:///default\n[migration]\nmin_libvirt_version = 0.0.1\n"
    "min_qemu_version = 0.0.1\nmin_kernel_version = 0.0.1\nclaim_timeout = {timeout}\n"
)


def daemon(host, sock_dir: Path, name: str, extra: str = "") -> AgentDaemon:
    work = host.work / name
    work.mkdir(exist_ok=True)
    config = agent_config(
        work / "agent.conf",
        host.root,
        str(work / "state"),
        str(sock_dir / f"{name}.sock"),
        TYPES,
        rescan_interval=0.5,
        extra=extra,
    )
    return AgentDaemon(config, str(sock_dir / f"{name}.sock"), work)


@pytest.fixture
def hosts(tmp_path):
    skip_unless_root()
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with (
        simulated_host(tmp_path / "src", ["nvidia-pf"], gpus=1) as src,
        simulated_host(tmp_path / "dst", ["nvidia-pf"], gpus=1) as dst,
        short_dir() as sock_dir,
    ):
        yield src, dst, sock_dir


def test_claim_survives_restart_commit_abort_and_expiry(hosts):
    src_host, dst_host, sock_dir = hosts
    with (
        daemon(src_host, sock_dir, "src") as source,
        daemon(dst_host, sock_dir, "dst", DEST.format(timeout=600)) as destination,
    ):
        source.start()
        destination.start()
        src_api = source.client()
        allocated = src_api.allocate("vm-1", 2)
        sources = {m["uuid"]: m["mdev_type"] for m in allocated["mdevs"]}

        claim = destination.client().migration_claim(
            "vm-1", sources, {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0"}
        )
        mapping = claim["mapping"]
        assert set(mapping) == set(sources)
        assert set(mapping.values()) <= dst_host.sysfs_uuids()
        assert not set(mapping.values()) & set(sources)

        # The claim survives a destination restart and answers the same.
        assert destination.stop() == 0
        destination.start()
        assert destination.client().migration_claim("vm-1", sources)["mapping"] == mapping

        # The source rewrites its XML with the destination UUIDs.
        xml = (
            "<domain type='kvm'><name>vm-1</name><devices>"
            + "".join(
                "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
                f"<source><address uuid='{u}'/></source></hostdev>"
                for u in sources
            )
            + "</devices></domain>"
        )
        rewritten = src_api.rewrite_domain_xml(xml, mapping)
        assert list_mdev_uuids(rewritten["xml"]) == [mapping[u] for u in sources]

        # Commit: the claim is the instance's allocation on the destination.
        committed = destination.client().migration_commit("vm-1")
        assert sorted(m["uuid"] for m in committed["mdevs"]) == sorted(mapping.values())
        assert sorted(
            m["uuid"] for m in destination.client().allocation("vm-1")["mdevs"]
        ) == sorted(mapping.values())
        # The source's side through its daemon (what MigrationSource uses beside a
        # running agent): the types of its mdevs, then release with remove.
        source_agent = AgentApi(src_api)
        assert {u: source_agent.mdev_types()[u] for u in sources} == sources
        assert sorted(source_agent.release("vm-1", remove=True)) == sorted(sources)
        assert not set(sources) & src_host.sysfs_uuids()

        # Abort frees a second claim, and is idempotent.
        other = destination.client().migration_claim(
            "vm-2", {"0" * 8 + "-0000-4000-8000-" + "0" * 12: "nvidia-35"}
        )
        freed = destination.client().migration_abort("vm-2")["released"]
        assert freed == list(other["mapping"].values())
        assert destination.client().migration_abort("vm-2")["released"] == []
        with pytest.raises(exception.ApiError) as info:
            destination.client().migration_commit("vm-2")
        assert info.value.kwargs == {
            "status": 404, "code": "MigrationClaimNotFound", "request_id": ANY
        }

        # Abort with remove (API query and accelctl): the claimed mdevs leave the host.
        third = destination.client().migration_claim(
            "vm-4", {"4" * 8 + "-0000-4000-8000-" + "4" * 12: "nvidia-35"}
        )["mapping"]
        assert set(third.values()) <= dst_host.sysfs_uuids()
        aborted = ctl(destination.config_file, "migration", "abort", "vm-4", "--remove", "--json")
        assert aborted.returncode == 0, aborted.stderr
        assert json.loads(aborted.stdout) == {
            "instance": "vm-4", "released": list(third.values()), "removed": True
        }
        assert not set(third.values()) & dst_host.sysfs_uuids()
        assert destination.client().migration_abort("vm-4", remove=True) == {
            "instance": "vm-4", "released": [], "removed": True
        }

    # Expiry: a destination whose claims live one second frees them by itself.
    with daemon(dst_host, sock_dir, "dst-expiry", DEST.format(timeout=1)) as expiring:
        expiring.start()
        uuid = "1" * 8 + "-0000-4000-8000-" + "1" * 12
        claimed = expiring.client().migration_claim("vm-3", {uuid: "nvidia-35"})["mapping"]
        mdevs = lambda: {m["uuid"]: m for m in expiring.client().mdevs()["mdevs"]}  # noqa: E731
        assert mdevs()[claimed[uuid]]["instance"] == "vm-3"
        wait_for(
            lambda: mdevs()[claimed[uuid]]["instance"] is None,
            timeout=30,
            what="the expired claim to be freed",
        )


def test_refusals_name_missing_types_and_the_old_side(hosts):
    _, dst_host, sock_dir = hosts
    uuid = "2" * 8 + "-0000-4000-8000-" + "2" * 12
    with daemon(dst_host, sock_dir, "dst", DEST.format(timeout=600)) as destination:
        destination.start()
        api = destination.client()
        with pytest.raises(exception.ApiError) as info:
            api.migration_claim(
                "vm", {uuid: "nvidia-35", "3" * 8 + "-0000-4000-8000-" + "3" * 12: "nvidia-999"}
            )
        assert "nvidia-999" in str(info.value)
        assert info.value.kwargs == {
            "status": 409, "code": "MigrationTypesUnsupported", "request_id": ANY
        }
        # (this daemon's floors are lowered to 0.0.1 for the test driver)
        with pytest.raises(exception.ApiError) as info:
            api.migration_claim(
                "vm", {uuid: "nvidia-35"}, {"libvirt": "0.0.0", "qemu": "8.2.0", "kernel": "6.1"}
            )
        assert "Source host" in str(info.value) and "libvirt 0.0.0" in str(info.value)
        assert info.value.kwargs["code"] == "MigrationVersionTooOld"
        assert dst_host.sysfs_uuids() == set()
    # The real floors: the test driver's QEMU 0.0.2 makes the destination too old,
    # and accelctl (through the daemon's API) says so.
    with daemon(dst_host, sock_dir, "dst-old", "[libvirt]\nuri = test:///default\n") as old:
        old.start()
        proc = ctl(old.config_file, "migration", "claim", "vm", "--mdev", f"{uuid}=nvidia-35")
        assert proc.returncode == 1
        assert "Destination host" in proc.stderr and "QEMU 0.0.2" in proc.stderr
        proc = ctl(old.config_file, "migration", "abort", "vm", "--json")
        assert proc.returncode == 0 and json.loads(proc.stdout)["released"] == []
    assert dst_host.sysfs_uuids() == set()
