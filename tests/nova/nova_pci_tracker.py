"""Feed ``accelctl nova-pci-config`` lines to Nova 34's own PCI passthrough
code; run with the Python of Nova's venv (tests/nova/novavenv.py), never the
agent's.

stdin: {"node": the compute node's name, "sysfs_root": the simulated sysfs,
"nodedevs": [libvirt node-device XML of every PCI device of the host],
"cases": {name: {"device_spec": [values], "alias": [values], "flavor_alias":
"<alias>:<count>", "pci_in_placement": [filter_scheduler] pci_in_placement,
true unless given, "sysfs_root" and "nodedevs": another host's, in place of
the top-level ones}}}, run in order in one process (Nova's imports take
seconds).

stdout, per case: {"error": null or what Nova raised, "specs": the tags of
each parsed device_spec, "aliases": the parsed aliases, "hypervisor": the PCI
device dicts the libvirt driver built, "tracked": the tracker's devices,
"pools": its stats pools, "providers": what the Placement translator put in
the provider tree, "live_migratable_request": whether the flavor's PCI request
is one the conductor lets live-migrate, "supported": whether the tracker's
stats can meet it, "claimed": the addresses a claim for the flavor's alias
got, "claim_error": null or why none fitted, "hostdevs": the guest's
<hostdev> XML the libvirt driver writes for each claimed device, "startup":
for each (libvirt, QEMU) version pair, null or the error nova-compute's PCI
check at start raises}.

Everything Nova sees comes from Nova's own code: the device dicts are what
``LibvirtDriver._get_pci_passthrough_devices`` builds from the node devices
(Nova's fakelibvirt with the host's node-device XML, as libvirt reports it),
the config goes through Nova's ``[pci]`` options (ConfFixture), and the
tracker, stats, translator and claim are Nova's.  Nova's sysfs probes
(``nova.pci.utils``: is this address a PF, a device's netdev and MAC, a VF's
number) read the simulated sysfs, the host being simulated (Nova's
LibvirtFixture would answer them for a NIC host).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from typing import Any

# The (libvirt, QEMU) versions nova-compute is started against for the
# live_migratable check: below and at Nova 34's floor for vfio-pci variant
# devices (MIN_VFIO_PCI_VARIANT_LIBVIRT_VERSION / _QEMU_VERSION).
STARTUP_VERSIONS = {"9.0.0/8.2.2": ((9, 0, 0), (8, 2, 2)), "10.0.0/8.2.2": ((10, 0, 0), (8, 2, 2))}
COMPUTE_RP_UUID = "5c6a1c9e-0d2b-4e8f-9a7c-3b1d2e4f6a80"
INSTANCE_UUID = "7e0f8b4a-1c2d-4e3f-8a9b-0c1d2e3f4a5b"


def run_all(spec: dict[str, Any]) -> dict[str, Any]:
    import fixtures
    from nova import conf, exception, objects
    from nova.tests.fixtures import conf as conf_fixtures
    from nova.tests.fixtures import libvirt as fakelibvirt

    objects.register_all()
    host = {"sysfs_root": spec["sysfs_root"], "nodedevs": spec["nodedevs"]}  # the case's

    def device_dir(address: str, *rest: str) -> str:
        return os.path.join(host["sysfs_root"], "bus", "pci", "devices", address, *rest)

    # nova.pci.utils' sysfs probes, on the simulated sysfs.  LibvirtFixture
    # fakes a NIC host (every device a MAC, every VF number 1); this host's
    # GPUs have no netdev, so Nova must find none.
    def is_physical_function(domain: str, bus: str, slot: str, function: str) -> bool:
        try:
            with open(device_dir(f"{domain}:{bus}:{slot}.{function}", "sriov_totalvfs")) as f:
                return int(f.read()) > 0
        except (OSError, ValueError):
            return False

    def get_ifname_by_pci_address(pci_addr: str, pf_interface: bool = False) -> str:
        net = device_dir(pci_addr, *(["physfn"] if pf_interface else []), "net")
        try:
            return sorted(os.listdir(net))[-1]
        except (OSError, IndexError):
            raise exception.PciDeviceNotFoundById(id=pci_addr) from None

    def get_mac_by_pci_address(pci_addr: str, pf_interface: bool = False) -> str:
        ifname = get_ifname_by_pci_address(pci_addr, pf_interface)
        net = device_dir(pci_addr, *(["physfn"] if pf_interface else []), "net")
        try:
            with open(os.path.join(net, ifname, "address")) as f:
                return f.read().strip()
        except OSError:
            raise exception.PciDeviceNotFoundById(id=pci_addr) from None

    def get_vf_num_by_pci_address(pci_addr: str) -> int:
        physfn = device_dir(pci_addr, "physfn")
        for name in os.listdir(physfn) if os.path.isdir(physfn) else []:
            if name.startswith("virtfn") and os.readlink(
                    os.path.join(physfn, name)).endswith(pci_addr):
                return int(name[len("virtfn"):])
        raise exception.PciDeviceNotFoundById(id=pci_addr)

    probes = {f.__name__: f for f in (is_physical_function, get_ifname_by_pci_address,
                                      get_mac_by_pci_address, get_vf_num_by_pci_address)}

    class HostConnection(fakelibvirt.Connection):
        """fakelibvirt answering node-device listings with the host's PCI devices."""

        def listAllDevices(self, flags: int) -> list[Any]:
            if not flags & fakelibvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV:
                return []
            return [fakelibvirt.NodeDevice(self, xml=xml) for xml in host["nodedevs"]]

    answers = {}
    workdir = tempfile.mkdtemp(prefix="nova-pci-tier-")
    libvirt_fixture = fakelibvirt.LibvirtFixture()
    libvirt_fixture.setUp()
    try:
        with contextlib.ExitStack() as stack:
            for name, probe in probes.items():  # after the fixture's own patches
                stack.enter_context(fixtures.MonkeyPatch(f"nova.pci.utils.{name}", probe))
            for name, case in spec["cases"].items():
                host.update({key: case.get(key, spec[key]) for key in host})
                CONF = conf.CONF
                conf_fixture = conf_fixtures.ConfFixture(CONF)  # Nova's own tests' config
                conf_fixture.setUp()
                try:
                    CONF.set_override("instances_path", workdir)
                    CONF.set_override("state_path", workdir)
                    CONF.set_override("lock_path", workdir, group="oslo_concurrency")
                    CONF.set_override("virt_type", "kvm", group="libvirt")
                    CONF.set_override("device_spec", case["device_spec"], group="pci")
                    CONF.set_override("alias", case["alias"], group="pci")
                    CONF.set_override("report_in_placement", True, group="pci")
                    CONF.set_override("pci_in_placement", case.get("pci_in_placement", True),
                                      group="filter_scheduler")
                    answers[name] = run(spec["node"], case, HostConnection, objects, fakelibvirt)
                finally:
                    conf_fixture.cleanUp()
    finally:
        libvirt_fixture.cleanUp()
        shutil.rmtree(workdir, ignore_errors=True)
    return answers


def run(node: str, case: dict[str, Any], connection_class: Any, objects: Any,
        fakelibvirt: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {"error": None}
    try:
        _run(node, case, connection_class, objects, fakelibvirt, answer)
    except Exception as e:  # what Nova raised: the caller judges it
        answer["error"] = {"type": type(e).__name__, "message": str(e),
                           "traceback": traceback.format_exc()}
    return answer


def _run(node: str, case: dict[str, Any], connection_class: Any, objects: Any,
         fakelibvirt: Any, answer: dict[str, Any]) -> None:
    import fixtures
    from nova import context as nova_context
    from nova import exception
    from nova.compute import pci_placement_translator, provider_tree
    from nova.compute import utils as compute_utils
    from nova.conf import CONF
    from nova.pci import manager, request, whitelist
    from nova.virt import fake
    from nova.virt.libvirt import driver as libvirt_driver

    # [pci] parsing, as nova-compute and nova-api do it (the alias parse is
    # cached per process: each case has its own config).
    request.get_alias_from_config.cache_clear()
    answer["specs"] = [dict(s.get_tags()) for s in whitelist.Whitelist(CONF.pci.device_spec).specs]
    answer["aliases"] = {
        name: {"numa_policy": policy, "specs": specs}
        for name, (policy, specs) in request.get_alias_from_config().items()
    }

    # The host's PCI devices as the libvirt driver reports them; and the
    # check nova-compute's init_host makes of the device_spec, per version.
    connection = connection_class("qemu:///system", False)
    with fixtures.MonkeyPatch("nova.virt.libvirt.host.Host.get_connection",
                              lambda self: connection):
        driver = libvirt_driver.LibvirtDriver(fake.FakeVirtAPI(), False)
        devices_json = driver._get_pci_passthrough_devices()
        answer["startup"] = {}
        for label, (lv, qemu) in STARTUP_VERSIONS.items():
            connection.fakeLibVersion = lv[0] * 1_000_000 + lv[1] * 1_000 + lv[2]
            connection.fakeVersion = qemu[0] * 1_000_000 + qemu[1] * 1_000 + qemu[2]
            try:
                driver._check_pci_whitelist()
                answer["startup"][label] = None
            except exception.InvalidConfiguration as e:
                answer["startup"][label] = str(e)
    answer["hypervisor"] = json.loads(devices_json)

    # The PCI tracker of the compute node, as Nova's unit tests build it
    # (no device in the database yet: a new compute node).
    ctx = nova_context.get_admin_context()
    with fixtures.MonkeyPatch("nova.db.main.api.pci_device_get_all_by_node",
                              lambda ctxt, node_id: []):
        tracker = manager.PciDevTracker(ctx, objects.ComputeNode(id=1, numa_topology=None))
    tracker.update_devices_from_hypervisor_resources(devices_json)

    # Placement: the translator's view of the tracker, under the compute
    # node's root provider (what the resource tracker does each period).
    tree = provider_tree.ProviderTree()
    tree.new_root(node, COMPUTE_RP_UUID)
    pci_placement_translator.update_provider_tree_for_pci(tree, node, tracker, {}, [])
    tracker.stats.populate_pools_metadata_from_assigned_devices()
    answer["tracked"] = [
        {"address": d.address, "dev_type": d.dev_type, "parent_addr": d.parent_addr,
         "vendor_id": d.vendor_id, "product_id": d.product_id, "status": d.status,
         "extra_info": dict(d.extra_info),
         "spec_tags": dict(tracker.dev_filter.get_devspec(d).get_tags())}
        for d in sorted(tracker.pci_devs, key=lambda d: d.address)
    ]
    answer["pools"] = [
        {k: v for k, v in pool.items() if k != "devices"} for pool in tracker.stats.pools
    ]
    providers = []
    for uuid in sorted(tree.get_provider_uuids()):
        data = tree.data(uuid)
        providers.append({
            "uuid": uuid, "name": data.name, "parent_uuid": data.parent_uuid,
            "inventory": {rc: dict(inv) for rc, inv in data.inventory.items()},
            "traits": sorted(data.traits),
        })
    answer["providers"] = providers

    # A flavor asking for the alias, scheduled the way Placement-backed PCI
    # scheduling does it: the request group is given the provider holding
    # that resource class, and the compute node claims from it.
    flavor = objects.Flavor(extra_specs={"pci_passthrough:alias": case["flavor_alias"]})
    requests = request.get_pci_requests_from_flavor(flavor)
    requests.instance_uuid = INSTANCE_UUID
    answer["live_migratable_request"] = all(r.is_live_migratable() for r in requests.requests)
    mapping = {}
    for pci_request in requests.requests:
        wanted = {s.get("resource_class") for s in pci_request.spec}
        holders = [p["uuid"] for p in providers if wanted & set(p["inventory"])]
        for index in range(pci_request.count):
            if holders:
                mapping[f"{pci_request.request_id}-{index}"] = holders[:1]
    compute_utils.update_pci_request_with_placement_allocations(
        ctx, None, requests.requests, mapping)
    answer["supported"] = tracker.stats.support_requests(requests.requests, mapping)
    answer["claimed"], answer["claim_error"], answer["hostdevs"] = [], None, []
    try:
        claimed = tracker.claim_instance(ctx, requests, None)
        answer["claimed"] = sorted(d.address for d in claimed)
    except exception.PciDeviceRequestFailed as e:  # no device fits: the test says so
        answer["claim_error"] = str(e)
    else:
        # The <hostdev> the libvirt driver writes into the guest for each
        # claimed device (its managed mode from the device's spec tags).
        answer["hostdevs"] = [driver._get_guest_pci_device(d).to_xml() for d in claimed]


if __name__ == "__main__":
    json.dump(run_all(json.load(sys.stdin)), sys.stdout)
