"""Taking over a host from Nova: ``accelctl adopt --from-libvirt`` against libvirt's
test driver (a ``test:///<file>`` node holding Nova-like domains with mdev hostdevs,
read by every process that opens it) and a FUSE-simulated host whose mdevs those
domains use; offline and through the running daemon's API."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional.daemon_fixture import AgentDaemon, short_dir, wait_for
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse]

GPU = "0000:84:00.0"
GPU2 = "0000:85:00.0"
# Nova's instances: the domain UUID is the instance UUID.
VM1 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f01"
VM2 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f02"
M1 = "a0000000-0000-4000-8000-000000000001"
M2 = "a0000000-0000-4000-8000-000000000002"
M3 = "a0000000-0000-4000-8000-000000000003"  # mtty-2 on mtty, VM2's
SPARE = "a0000000-0000-4000-8000-0000000000f1"  # nvidia-35, no domain uses it
ODD = "a0000000-0000-4000-8000-0000000000f2"  # nvidia-36 on GPU2 (configured nvidia-35)
ABSENT = "a0000000-0000-4000-8000-0000000000aa"

CONF = """
[devices]
enabled_mdev_types = nvidia-35, mtty-2
[mdev_nvidia-35]
[mdev_mtty-2]
device_addresses = mtty
"""


def domain_xml(name: str, uuid: str, mdevs: list[str]) -> str:
    hostdevs = "".join(
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
        f"<source><address uuid='{m}'/></source></hostdev>"
        for m in mdevs
    )
    return (
        f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid>"
        f"<memory>1048576</memory><os><type>hvm</type></os>"
        f"<devices>{hostdevs}</devices></domain>"
    )


def libvirt_node(path: Path, domains: list[tuple[str, str, list[str]]]) -> str:
    """A test-driver node file; its URI."""
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    plain = "<domain type='test'><name>no-mdev</name><memory>1048576</memory>" \
            "<os><type>hvm</type></os><devices/></domain>"
    path.write_text("<node>" + plain + "".join(domain_xml(*d) for d in domains) + "</node>")
    return f"test://{path}"


@pytest.fixture
def host(tmp_path):
    with simulated_host(tmp_path, ["nvidia-pf", "mtty"], gpus=2) as host:
        host.create_foreign(GPU, "nvidia-35", M1)
        host.create_foreign(GPU, "nvidia-35", M2)
        host.create_foreign("mtty", "mtty-2", M3)
        host.create_foreign(GPU, "nvidia-35", SPARE)
        host.create_foreign(GPU2, "nvidia-36", ODD)
        yield host


NOVA = [("instance-00000001", VM1, [M1, M2]), ("instance-00000002", VM2, [M3])]


def config(host, uri: str, extra: str = "") -> str:
    return host.config(CONF + f"\n[libvirt]\nuri = {uri}\n" + extra)


def ctl(config_file: str, *args: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", config_file, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == rc, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def ledger(host) -> dict[str, tuple[str | None, bool]]:
    """uuid -> (owner, adopted) straight from the ledger file."""
    path = os.path.join(host.state_dir, "ledger.sqlite3")
    if not os.path.exists(path):
        return {}
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT m.uuid, a.owner, m.adopted FROM mdevs m "
            "LEFT JOIN assignments a ON a.uuid = m.uuid"
        ).fetchall()
    return {uuid: (owner, bool(adopted)) for uuid, owner, adopted in rows}


def plan_actions(plan: dict) -> dict[str, str]:
    found = {m["uuid"]: m["action"] for d in plan["domains"] for m in d["mdevs"]}
    found.update({m["uuid"]: m["action"] for m in plan["unused"]})
    return found


def test_dry_run_prints_the_plan_and_changes_nothing(host, tmp_path):
    conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA))
    before = ledger(host)
    out = ctl(conf, "adopt", "--from-libvirt", "--dry-run").stdout
    assert f"domain instance-00000001 -> instance {VM1}" in out
    assert f"adopt   {M1}  nvidia-35 on {GPU}" in out
    assert f"foreign {SPARE}" in out and "--all adopts them" in out
    assert "dry run: nothing changed; would take over 3 mdev(s) of 2 domain(s)" in out
    plan = json.loads(ctl(conf, "adopt", "--from-libvirt", "--dry-run", "--all", "--json").stdout)
    assert plan["applied"] is False and plan["problems"] == []
    # libvirt's test driver keeps no node-device definitions: nothing to undefine
    assert {m["libvirt"] for d in plan["domains"] for m in d["mdevs"]} == {None}
    assert plan_actions(plan) == {M1: "adopt", M2: "adopt", M3: "adopt", SPARE: "adopt",
                                  ODD: "foreign"}
    assert ledger(host) == before
    assert "no (foreign)" in ctl(conf, "mdevs").stdout


def test_takeover_assigns_each_domains_mdevs_to_its_instance(host, tmp_path):
    conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA))
    out = ctl(conf, "adopt", "--from-libvirt").stdout
    assert "took over 3 mdev(s) of 2 domain(s), adopted 0 unused mdev(s)" in out
    # each mdev assigned to the instance named by its domain's UUID; unused ones stay foreign
    assert ledger(host) == {M1: (VM1, True), M2: (VM1, True), M3: (VM2, True)}
    allocation = json.loads(ctl(conf, "allocate", VM1, "--count", "2", "--json").stdout)
    assert sorted(m["uuid"] for m in allocation["mdevs"]) == [M1, M2]  # the same, not new ones
    # idempotent: a second run has nothing to do
    again = json.loads(ctl(conf, "adopt", "--from-libvirt", "--json").stdout)
    assert plan_actions(again) == {M1: "none", M2: "none", M3: "none", SPARE: "foreign",
                                   ODD: "foreign"}
    assert ledger(host) == {M1: (VM1, True), M2: (VM1, True), M3: (VM2, True)}
    assert host.sysfs_uuids() == {M1, M2, M3, SPARE, ODD}  # nothing created or removed


def test_all_adopts_the_unused_mdevs_of_the_configured_type_free(host, tmp_path):
    conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA))
    plan = json.loads(ctl(conf, "adopt", "--from-libvirt", "--all", "--json").stdout)
    assert plan["applied"] is True
    (odd,) = [m for m in plan["unused"] if m["uuid"] == ODD]
    assert odd["action"] == "foreign" and "nvidia-36 is not the one configured" in odd["reason"]
    assert ledger(host) == {
        M1: (VM1, True), M2: (VM1, True), M3: (VM2, True), SPARE: (None, True)
    }


def test_refuses_an_mdev_whose_type_the_config_does_not_give_its_parent(host, tmp_path):
    # VM3 uses the nvidia-36 mdev on a GPU configured for nvidia-35: the whole takeover
    # is refused, VM1's and VM2's valid mdevs included.
    vm3 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f03"
    conf = config(host, libvirt_node(tmp_path / "node.xml", [*NOVA, ("instance-3", vm3, [ODD])]))
    err = ctl(conf, "adopt", "--from-libvirt", "--all", rc=1).stderr
    assert "takeover from libvirt refused, nothing changed" in err
    assert (
        f"domain instance-3 ({vm3}) uses mdev {ODD} of type nvidia-36 on parent {GPU2}, "
        f"but the config gives {GPU2} type nvidia-35"
    ) in err
    assert ledger(host) == {}
    out = ctl(conf, "adopt", "--from-libvirt", "--dry-run", rc=1).stdout
    assert "problem: domain instance-3" in out and "would be refused" in out
    # The plan as JSON exits 1 too: a script reads the refusal from the status.
    plan = json.loads(ctl(conf, "adopt", "--from-libvirt", "--dry-run", "--json", rc=1).stdout)
    assert plan["applied"] is False and any("instance-3" in p for p in plan["problems"])
    assert ledger(host) == {}


def test_refuses_an_mdev_on_a_parent_no_type_is_enabled_for(host, tmp_path):
    vm3 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f03"
    conf = host.config(
        "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\n"
        f"device_addresses = {GPU}\n[libvirt]\nuri = "
        + libvirt_node(tmp_path / "node.xml", [(NOVA[0]), ("instance-3", vm3, [M3])])
    )
    err = ctl(conf, "adopt", "--from-libvirt", rc=1).stderr
    assert f"uses mdev {M3} of type mtty-2 on parent mtty, but the config gives mtty no type" in err
    assert ledger(host) == {}


def test_refuses_a_missing_mdev_and_one_used_by_two_domains(host, tmp_path):
    vm3 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f03"
    domains = [*NOVA, ("instance-3", vm3, [ABSENT, M3])]
    conf = config(host, libvirt_node(tmp_path / "node.xml", domains))
    err = ctl(conf, "adopt", "--from-libvirt", rc=1).stderr
    assert f"uses mdev {ABSENT}, which does not exist on this host" in err
    assert f"mdev {M3} is used by 2 domains" in err
    assert ledger(host) == {}


def test_refuses_an_mdev_the_agent_gave_another_instance(host, tmp_path):
    conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA))
    ctl(conf, "adopt", M1)
    ctl(conf, "allocate", "someone-else", "--count", "1", "--parent", GPU)
    assert ledger(host)[M1] == ("someone-else", True)
    err = ctl(conf, "adopt", "--from-libvirt", rc=1).stderr
    assert f"uses mdev {M1}, which the agent has assigned to instance someone-else" in err


def test_usage_and_an_unreachable_libvirt(host, tmp_path):
    conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA))
    assert "either UUID or --from-libvirt" in ctl(conf, "adopt", rc=2).stderr
    assert "either UUID or --from-libvirt" in ctl(conf, "adopt", M1, "--from-libvirt", rc=2).stderr
    assert "go with --from-libvirt" in ctl(conf, "adopt", M1, "--all", rc=2).stderr
    broken = config(host, f"test://{tmp_path}/missing.xml")
    err = ctl(broken, "adopt", "--from-libvirt", rc=1).stderr
    assert "cannot list the libvirt domains at test://" in err
    none = host.config(CONF + "\n[libvirt]\nuri =\n", name="nolibvirt.conf")
    assert "[libvirt] uri is empty" in ctl(none, "adopt", "--from-libvirt", rc=1).stderr
    assert ledger(host) == {}


def test_takeover_through_the_daemon_api(host, tmp_path):
    uri = libvirt_node(tmp_path / "node.xml", NOVA)
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        conf = config(host, uri, f"\n[api]\nsocket_path = {socket_path}\n")
        with AgentDaemon(Path(conf), socket_path, tmp_path) as daemon:
            daemon.start()
            client = daemon.client()
            plan = client.takeover(dry_run=True)
            assert plan["applied"] is False and plan_actions(plan)[M1] == "adopt"
            assert client.allocation(VM1)["mdevs"] == []
            # accelctl goes through the daemon when it runs
            out = ctl(conf, "adopt", "--from-libvirt", "--all").stdout
            assert "took over 3 mdev(s) of 2 domain(s), adopted 1 unused mdev(s)" in out
            assert sorted(m["uuid"] for m in client.allocation(VM1)["mdevs"]) == [M1, M2]
            assert [m["uuid"] for m in client.allocation(VM2)["mdevs"]] == [M3]
            owned = {m["uuid"]: m for m in client.call("GET", "/v1/mdevs")["mdevs"]}
            assert owned[SPARE]["owned"] is True and owned[ODD]["owned"] is False
            # a refused one through the API: 409 TakeoverRefused, nothing changed
            vm3 = "8e0c4a52-6f0e-4d7b-9a43-0d1c2b3a4f03"
            libvirt_node(tmp_path / "node.xml", [*NOVA, ("instance-3", vm3, [ODD])])
            status, _, data = client.request("POST", "/v1/takeover/libvirt")
            body = json.loads(data)
            assert status == 409 and body["error"]["code"] == "TakeoverRefused", body
            assert client.allocation(vm3)["mdevs"] == []


# --- Placement: Nova's providers and allocations survive the takeover ------------------


def test_nova_placement_providers_and_allocations_stay_valid(host, tmp_path):
    """A real Placement holding what Nova made: the compute node, one child provider
    per pGPU named ``<host>_<libvirt node device>`` with Nova's VGPU inventory, and
    the two instances' allocations against them.  After the takeover and the agent's
    syncs: the same providers (same UUIDs, nothing created), now the agent's, with
    the same allocations and usages, and no capacity counted twice."""
    from tests.functional.placement_fixture import PlacementServer, placement_available
    from tests.functional.test_placement_sync import Admin

    if not placement_available():
        pytest.skip("openstack-placement is not installed")
    # Nova would not have left an nvidia-36 mdev on a pGPU it reports nvidia-35 for
    # (an M60 runs one type at a time: GPU2 would offer no nvidia-35 at all)
    fd = os.open(os.path.join(host.root, "bus", "mdev", "devices", ODD, "remove"), os.O_WRONLY)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    nova_names = {
        GPU: "testhost_pci_0000_84_00_0",
        GPU2: "testhost_pci_0000_85_00_0",
        "mtty": "testhost_mtty_mtty",
    }
    with PlacementServer(tmp_path / "placement") as server, short_dir() as sockdir:
        admin = Admin(server.endpoint)
        # Nova: the compute node, then its vGPU children (random UUIDs, no owner trait)
        root = admin.call("POST", "/resource_providers", {"name": "testhost"})["uuid"]
        admin.call("PUT", f"/resource_providers/{root}/inventories", {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}},
        })
        totals = {GPU: 16, GPU2: 16, "mtty": 12}  # what Nova counted: the same pGPUs
        nova = {}
        for parent, name in nova_names.items():
            rp = admin.call("POST", "/resource_providers",
                            {"name": name, "parent_provider_uuid": root})["uuid"]
            admin.call("PUT", f"/resource_providers/{rp}/inventories", {
                "resource_provider_generation": 0,
                "inventories": {"VGPU": {"total": totals[parent], "max_unit": totals[parent]}},
            })
            nova[name] = rp

        def nova_allocation(consumer: str, rp: str, vgpus: int) -> dict:
            body = {
                "allocations": {root: {"resources": {"VCPU": 1, "MEMORY_MB": 1024}},
                                rp: {"resources": {"VGPU": vgpus}}},
                "consumer_generation": None, "project_id": "p" * 32, "user_id": "u" * 32,
                "consumer_type": "INSTANCE",
            }
            admin.call("PUT", f"/allocations/{consumer}", body, ok=(204,))
            return admin.call("GET", f"/allocations/{consumer}")["allocations"]

        allocations = {
            VM1: nova_allocation(VM1, nova[nova_names[GPU]], 2),
            VM2: nova_allocation(VM2, nova[nova_names["mtty"]], 1),
        }

        def tree() -> dict[str, str]:
            listed = admin.call("GET", f"/resource_providers?in_tree={root}")
            return {rp["name"]: rp["uuid"] for rp in listed["resource_providers"]}

        def usages(rp: str) -> dict:
            return admin.call("GET", f"/resource_providers/{rp}/usages")["usages"]

        def traits(rp: str) -> list[str]:
            return admin.call("GET", f"/resource_providers/{rp}/traits")["traits"]

        socket_path = str(sockdir / "api.sock")
        conf = config(host, libvirt_node(tmp_path / "node.xml", NOVA), f"""
[api]
socket_path = {socket_path}
[placement]
enabled = true
take_over_providers = true
sync_interval = 1
max_backoff = 2
timeout = 5
auth_type = admin_token
endpoint = {server.endpoint}
token = admin
""")
        with AgentDaemon(Path(conf), socket_path, tmp_path) as daemon:
            daemon.start()
            assert "took over 3 mdev(s)" in ctl(conf, "adopt", "--from-libvirt").stdout
            daemon.client().call("POST", "/v1/recover")  # any write wakes the reporter too
            # every Nova provider becomes the agent's: owner trait, same UUID
            wait_for(
                lambda: all("CUSTOM_OWNER_ACCEL_AGENT" in traits(rp) for rp in nova.values()),
                what="the agent to take over Nova's providers",
            )
            wait_for(lambda: daemon.health()["reporting"]["state"] == "ok", what="sync ok")
            # and a further sync changes nothing
            daemon.client().call("POST", "/v1/recover")
            wait_for(lambda: daemon.health()["reporting"]["state"] == "ok", what="sync ok")

        assert tree() == {"testhost": root, **nova}  # no provider created, none recreated
        for consumer, held in allocations.items():
            assert admin.call("GET", f"/allocations/{consumer}")["allocations"] == {
                rp: {**record, "generation": admin.call("GET", f"/resource_providers/{rp}")[
                    "generation"]}
                for rp, record in held.items()
            }
        assert usages(nova[nova_names[GPU]]) == {"VGPU": 2}
        assert usages(nova[nova_names["mtty"]]) == {"VGPU": 1}
        assert usages(nova[nova_names[GPU2]]) == {"VGPU": 0}
        # capacity counted once: the tree's VGPU totals are the agent's own inventory
        reported = json.loads(ctl(conf, "inventory", "--json").stdout)["providers"]
        assert {p["name"]: p["inventory"]["total"] for p in reported} == {
            name: admin.call("GET", f"/resource_providers/{rp}/inventories")["inventories"][
                "VGPU"]["total"]
            for name, rp in nova.items()
        }
        # and the VGPUs Placement holds allocated are the mdevs the agent holds assigned
        assigned = sorted(u for u, (owner, _) in ledger(host).items() if owner)
        assert assigned == sorted([M1, M2, M3])
        assert sum(usages(rp).get("VGPU", 0) for rp in nova.values()) == len(assigned)
