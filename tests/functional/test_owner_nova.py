"""Nova 34's ``owner_nova_filter`` against the agent's providers, in a real Placement.

What Nova 34.0.0 does (read from its code, issue 24 part 3):

* every provider Nova creates carries ``OWNER_NOVA`` (os-traits 3.9.0): the
  compute-node root (``resource_tracker.py``), its pGPU children
  (``virt/libvirt/driver.py`` ``_ensure_pgpu_providers``), its PCI providers
  (``compute/pci_placement_translator.py``);
* ``scheduler/request_filter.py`` ``owner_nova_filter``, once every
  nova-compute is at service version 73, adds ``OWNER_NOVA`` to
  ``root_required`` and to the required traits of the PCI request groups
  (``requester_id`` ``<pci request_id>-<n>``, present only with
  ``[filter_scheduler] pci_in_placement``) and of no other group;
* ``compute_status_filter`` always forbids ``COMPUTE_STATUS_DISABLED`` on the
  root; ``ResourceRequest.to_querystring`` writes the root's traits as
  ``root_required=<required, sorted>,!<forbidden, sorted>``, a group as
  ``resources<suffix>=RC:n,...`` (sorted) and ``required<suffix>=...``, adds
  ``limit`` (``[scheduler] max_placement_results``, 1000), and the report
  client sends ``GET /allocation_candidates`` at microversion 1.36.

A flavor's ``resources:VGPU=1`` lands in the unsuffixed group beside VCPU,
MEMORY_MB and DISK_GB (no ``group_policy``: Nova sets one only for two or
more numbered groups).  The queries below are written out as Nova builds
them, not derived from anything of the agent's;
tests/nova/test_nova_owner_filter.py checks them against Nova 34.0.0's own
code in the Nova-code tier (which must run in CI).
"""

from __future__ import annotations

import itertools
import textwrap
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oslo_config import cfg

from accel_agent.config import registry
from accel_agent.devices.inventory import Inventory
from accel_agent.reporting.placement import PlacementReporter
from tests.functional.placement_fixture import PlacementServer, placement_available
from tests.functional.test_placement_sync import Admin

pytestmark = pytest.mark.skipif(
    not placement_available(),
    reason="openstack-placement is not installed (pip install openstack-placement)",
)

_hosts = itertools.count()

# The release whose code the queries below are read from.
NOVA_VERSION = "34.0.0"

# Nova's scheduler report client: SAME_SUBTREE_VERSION.
NOVA_MICROVERSION = "1.36"
# What resource_tracker gives every compute node (COMPUTE_NODE, OWNER_NOVA),
# beside a few capability traits the libvirt driver reports.
NOVA_ROOT_TRAITS = sorted(
    ["COMPUTE_NODE", "OWNER_NOVA", "COMPUTE_ACCELERATORS", "COMPUTE_IMAGE_TYPE_QCOW2",
     "COMPUTE_NET_VIF_MODEL_VIRTIO", "HW_CPU_X86_AVX2"]
)
# The flavor: 2 vCPUs, 4 GiB, 20 GB disk, extra spec resources:VGPU=1.
FLAVOR = "DISK_GB:20,MEMORY_MB:4096,VCPU:2"
# compute_status_filter alone (nova-computes not all at version 73 yet) ...
ROOT_UNFILTERED = "!COMPUTE_STATUS_DISABLED"
# ... and with owner_nova_filter's root trait.
ROOT_FILTERED = "OWNER_NOVA,!COMPUTE_STATUS_DISABLED"
# The PCI request id of a flavor's pci_passthrough:alias (a UUID); its one
# device's group is suffixed "<request_id>-0".
PCI_GROUP = f"{uuid.UUID(int=0x24)}-0"

# The simulated host (the same as test_placement_sync's vendor-VFIO test):
# an mdev GPU at 84 (VGPU) and two vendor-VFIO GPUs at c1, c2 (CUSTOM_L40S_4Q).
MDEV_GPU, VFIO_GPUS = "pci_0000_84_00_0", ("pci_0000_c1_00_0", "pci_0000_c2_00_0")


def vgpu_flavor(root_required: str, rc: str = "VGPU") -> list[tuple[str, str]]:
    """``resources:<rc>=1``: one unsuffixed group, as Nova sends it."""
    return [("limit", "1000"), ("resources", f"{FLAVOR},{rc}:1"), ("root_required", root_required)]


def two_gpus_flavor(root_required: str, rc: str) -> list[tuple[str, str]]:
    """``resources1:<rc>=1``, ``resources2:<rc>=1``, ``group_policy=isolate``:
    one device from each of two GPUs, in numbered groups."""
    return [
        ("group_policy", "isolate"),
        ("limit", "1000"),
        ("resources", FLAVOR),
        ("resources1", f"{rc}:1"),
        ("resources2", f"{rc}:1"),
        ("root_required", root_required),
    ]


def pci_alias_flavor(root_required: str, group_required: str | None) -> list[tuple[str, str]]:
    """A flavor with ``pci_passthrough:alias`` of an alias whose ``resource_class``
    is CUSTOM_L40S_4Q, with ``[filter_scheduler] pci_in_placement = true``."""
    query = [
        ("limit", "1000"),
        ("resources", FLAVOR),
        (f"resources{PCI_GROUP}", "CUSTOM_L40S_4Q:1"),
        ("root_required", root_required),
    ]
    if group_required is not None:
        query.append((f"required{PCI_GROUP}", group_required))
    return sorted(query)


def candidates(admin: Admin, query: list[tuple[str, str]], rc: str, root: str) -> set[str]:
    """The providers of ``rc`` in the allocation requests Placement answers Nova
    with, on the host of ``root`` (the module's other hosts answer too)."""
    listed = admin.call("GET", f"/resource_providers?in_tree={root}")["resource_providers"]
    tree = {rp["uuid"] for rp in listed}
    url = "/allocation_candidates?" + urllib.parse.urlencode(query)
    resp = admin.adapter.get(url, microversion=NOVA_MICROVERSION, raise_exc=False)
    assert resp.status_code == 200, f"GET {url}: {resp.status_code} {resp.text}"
    return {
        rp
        for request in resp.json()["allocation_requests"]
        for rp, held in request["allocations"].items()
        if rc in held["resources"] and rp in tree
    }


class NovaHost:
    """A compute host as Nova 34 leaves it in Placement: the compute-node root
    named after the hypervisor host name, with its traits and inventory."""

    def __init__(self, admin: Admin, name: str) -> None:
        self.admin = admin
        self.name = name
        self.root = admin.create_provider(name, traits=NOVA_ROOT_TRAITS)
        self.call("PUT", "/inventories", {
            "resource_provider_generation": self.generation(self.root),
            "inventories": {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 65536},
                            "DISK_GB": {"total": 500}},
        })

    def call(self, method: str, path: str, body: Any = None, rp: str | None = None) -> Any:
        return self.admin.call(method, f"/resource_providers/{rp or self.root}{path}", body)

    def generation(self, rp: str) -> int:
        return self.admin.call("GET", f"/resource_providers/{rp}")["generation"]

    def traits(self, rp: str | None = None) -> list[str]:
        return sorted(self.call("GET", "/traits", rp=rp)["traits"])

    def child(self, suffix: str, rc: str, total: int, traits: list[str]) -> str:
        """A provider Nova made under its root (a pGPU, a PCI device)."""
        rp = self.admin.create_provider(f"{self.name}_{suffix}", self.root, traits)
        self.call("PUT", "/inventories", {
            "resource_provider_generation": self.generation(rp),
            "inventories": {rc: {"total": total, "max_unit": total}},
        }, rp=rp)
        return rp

    def uuid_of(self, suffix: str) -> str:
        found = self.admin.provider(f"{self.name}_{suffix}")
        assert found is not None, f"{self.name}_{suffix} is not in Placement"
        return str(found["uuid"])


def agent_reporter(endpoint: str, tmp_path: Path, host: str, extra: str = "") -> PlacementReporter:
    """The daemon's reporter: built from the agent's configuration file."""
    conf_file = tmp_path / f"accel-agent-{host}.conf"
    conf_file.write_text(textwrap.dedent(f"""
        [DEFAULT]
        host = {host}
        [placement]
        enabled = true
        auth_type = admin_token
        endpoint = {endpoint}
        token = admin
        """) + extra)
    conf = cfg.ConfigOpts()
    registry.register(conf)
    conf(["--config-file", str(conf_file)], project="accel-agent", default_config_files=[])
    return PlacementReporter.from_conf(conf)


def scanned_inventory(tmp_path: Path, host: str) -> Inventory:
    """The agent's inventory from a real scan of a simulated host."""
    from accel_agent.backends import builtin
    from accel_agent.backends.host import scan_host
    from accel_agent.devices.inventory import compute_inventory
    from accel_agent.devices.policy import PolicyInputs, TypeOptions, resolve_policy
    from accel_agent.simulator import build_spec, materialise

    root = str(tmp_path / f"sys-{host}")
    materialise(build_spec(["nvidia-pf", "nvidia-vfio"], gpus=2, vfs=3), root)
    inputs = PolicyInputs(
        enabled=("nvidia-35", "nvidia-1150"),
        type_options=(
            TypeOptions("nvidia-35", device_addresses=("0000:84:00.0",)),
            TypeOptions("nvidia-1150", device_addresses=("0000:c1:00.0", "0000:c2:00.0"),
                        mdev_class="CUSTOM_L40S_4Q"),
        ),
    )
    snapshot = scan_host(root, builtin(), state_dir=str(tmp_path / f"state-{host}"))
    return compute_inventory(snapshot, resolve_policy(inputs, root), host)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlacementServer]:
    with PlacementServer(tmp_path_factory.mktemp("placement")) as running:
        yield running


@pytest.fixture
def admin(server: PlacementServer) -> Admin:
    return Admin(server.endpoint)


@pytest.fixture
def nova(admin: Admin) -> NovaHost:
    return NovaHost(admin, f"compute{next(_hosts)}.example.org")


# --- tests ----------------------------------------------------------------------------


def test_the_agents_providers_stay_candidates_under_owner_nova_filter(
    server: PlacementServer, admin: Admin, nova: NovaHost, tmp_path: Path
) -> None:
    root_generation = nova.generation(nova.root)
    reporter = agent_reporter(server.endpoint, tmp_path, nova.name)

    result = reporter.sync(scanned_inventory(tmp_path, nova.name))

    assert result.ok, result
    mdev_gpu = nova.uuid_of(MDEV_GPU)
    vfio_gpus = {nova.uuid_of(name) for name in VFIO_GPUS}
    # The agent never touches Nova's root: its traits (OWNER_NOVA among them)
    # and its generation are as Nova left them.
    assert nova.traits() == NOVA_ROOT_TRAITS
    assert nova.generation(nova.root) == root_generation
    # The agent's own providers do not claim to be Nova's.
    assert "OWNER_NOVA" not in nova.traits(mdev_gpu)

    for root_required in (ROOT_UNFILTERED, ROOT_FILTERED):
        assert candidates(admin, vgpu_flavor(root_required), "VGPU", nova.root) == {mdev_gpu}
        # resources:CUSTOM_L40S_4Q=1: a vendor-VFIO vGPU through the agent.
        assert candidates(
            admin, vgpu_flavor(root_required, "CUSTOM_L40S_4Q"), "CUSTOM_L40S_4Q", nova.root
        ) == vfio_gpus
        # Numbered groups get no trait of the filter either.
        assert candidates(
            admin, two_gpus_flavor(root_required, "CUSTOM_L40S_4Q"), "CUSTOM_L40S_4Q", nova.root
        ) == vfio_gpus


def test_a_root_the_agent_made_itself_is_dropped_by_the_filter(
    server: PlacementServer, admin: Admin, nova: NovaHost, tmp_path: Path
) -> None:
    """``[DEFAULT] host`` not Nova's hypervisor host name (a short name where
    Nova has the FQDN) with ``create_root_provider``: the agent's providers sit
    under a root of its own, without OWNER_NOVA and without Nova's VCPU, so
    Nova never places a VGPU there; the filter makes that certain."""
    short = nova.name.split(".")[0]
    reporter = agent_reporter(
        server.endpoint, tmp_path, short, "[placement]\ncreate_root_provider = true\n"
    )
    assert reporter.sync(scanned_inventory(tmp_path, short)).ok
    stray = admin.provider(f"{short}_{MDEV_GPU}")
    assert stray is not None and stray["root_provider_uuid"] != nova.root
    # Without CPU, memory and disk of its own the stray tree answers no flavor
    # at all; give its root some, so that only the filter keeps Nova away.
    own_root = stray["root_provider_uuid"]
    nova.call("PUT", "/inventories", {
        "resource_provider_generation": nova.generation(own_root),
        "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192},
                        "DISK_GB": {"total": 100}},
    }, rp=own_root)

    assert stray["uuid"] in candidates(admin, vgpu_flavor(ROOT_UNFILTERED), "VGPU", own_root)
    assert stray["uuid"] not in candidates(admin, vgpu_flavor(ROOT_FILTERED), "VGPU", own_root)


def test_a_pci_alias_group_under_the_filter_leaves_the_agents_providers_out(
    server: PlacementServer, admin: Admin, nova: NovaHost, tmp_path: Path
) -> None:
    """Nova's PCI-in-Placement groups are for Nova's PCI tracker: a device
    there must be one of Nova's PCI providers (it maps the allocation back to
    a PCI device of that provider).  The agent's per-GPU providers are not:
    without the filter a PCI group of the same class matches them (a match
    Nova's PCI tracker cannot serve: pci/stats.py keeps only the pools of the
    allocated provider), with it only Nova's own match."""
    # Nova's PCI provider of another GPU's VFs (pci_placement_translator's
    # name: <hypervisor host name>_<PF address, upper case>).
    nova_pci = nova.child("0000:C3:00.0", "CUSTOM_L40S_4Q", 3, ["OWNER_NOVA"])
    assert agent_reporter(server.endpoint, tmp_path, nova.name).sync(
        scanned_inventory(tmp_path, nova.name)
    ).ok
    agents = {nova.uuid_of(name) for name in VFIO_GPUS}

    unfiltered = pci_alias_flavor(ROOT_UNFILTERED, None)
    assert candidates(admin, unfiltered, "CUSTOM_L40S_4Q", nova.root) == {nova_pci, *agents}
    filtered = pci_alias_flavor(ROOT_FILTERED, "OWNER_NOVA")
    assert candidates(admin, filtered, "CUSTOM_L40S_4Q", nova.root) == {nova_pci}


def test_take_over_of_novas_pgpu_provider_keeps_it_a_candidate(
    server: PlacementServer, admin: Admin, nova: NovaHost, tmp_path: Path
) -> None:
    """``[placement] take_over_providers = true`` on a host taken over from
    Nova: Nova's pGPU provider (``<host>_pci_0000_84_00_0``, VGPU, OWNER_NOVA,
    a VM's allocation on it) becomes the agent's in place."""
    pgpu = nova.child(MDEV_GPU, "VGPU", 16, ["OWNER_NOVA"])
    vm = admin.allocate(pgpu, {"VGPU": 1})
    assert candidates(admin, vgpu_flavor(ROOT_FILTERED), "VGPU", nova.root) == {pgpu}
    reporter = agent_reporter(
        server.endpoint, tmp_path, nova.name, "[placement]\ntake_over_providers = true\n"
    )

    result = reporter.sync(scanned_inventory(tmp_path, nova.name))

    assert result.ok, result
    assert nova.uuid_of(MDEV_GPU) == pgpu  # same provider: the VM's allocation holds
    assert admin.call("GET", f"/allocations/{vm}")["allocations"][pgpu]["resources"] == {
        "VGPU": 1
    }
    # The root keeps OWNER_NOVA (the filter's root_required): never touched.
    assert nova.traits() == NOVA_ROOT_TRAITS
    # The taken-over child is the agent's now and says so; it drops OWNER_NOVA,
    # which no VGPU group asks of a child (plan.py keeps the desired set).
    assert nova.traits(pgpu) == ["CUSTOM_MDEV_NVIDIA_35", "CUSTOM_OWNER_ACCEL_AGENT"]
    assert candidates(admin, vgpu_flavor(ROOT_FILTERED), "VGPU", nova.root) == {pgpu}
    assert candidates(admin, vgpu_flavor(ROOT_UNFILTERED), "VGPU", nova.root) == {pgpu}
