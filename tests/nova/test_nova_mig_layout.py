"""Nova 34's own PCI passthrough code on the ``nova-pci-config`` lines of a
MIG-backed layout's GPU (issue 37, item 5), and the real Placement on what
Nova's translator reports for it.

Two simulated hosts, each one H200 (``0000:61:00.0``, 8 VFs) with MIG mode
on, laid out as the agent's start leaves it (a static tree of the
simulator: no daemon is needed; the GPU instances planned by the agent's own
planner, ``gpu_layout_fit.mig_fit``, created through the simulator's NVML,
then each MIG-backed type written to the first untyped VF, which the
simulated driver puts on a free instance of its profile):

* one type: ``mig = 1g.18gb:4``, an H200X-1-18C on each instance, the other
  four VFs untyped;
* two types: ``mig = 1g.18gb:3, 3g.71gb:1``, an H200X-1-18C on each 1g.18gb
  instance and an H200X-3-71C on the 3g.71gb.

The lines are ``reporting/nova_pci.py``'s, the code ``accelctl
nova-pci-config`` prints with.  nova_pci_tracker.py runs Nova's [pci]
parsing, libvirt driver, PCI tracker, Placement translator and claim on
them.  Checked: the one-type GPU is tracked, reported (one child provider,
its inventory under the type's resource class: ``[mdev_<type>] mdev_class``,
or ``CUSTOM_NVIDIA_<id>`` by default) and claimed; the two-type GPU's lines
are refused by Nova's translator, which is why ``check-config`` refuses
``reported_by = nova`` for a MIG layout of several types too.  Nova's
provider tree then goes into a real Placement (tests/functional's
placement_fixture), which offers the MIG type's class exactly: 4, not 5,
and no ``VGPU``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from accel_agent import backends
from accel_agent.backends.host import scan_host
from accel_agent.devices import gpu_layout_fit
from accel_agent.devices import policy as policy_mod
from accel_agent.reporting import nova_pci
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise
from tests.configutil import make_conf
from tests.functional.placement_fixture import PlacementServer, placement_available
from tests.nova.conftest import run_in_nova
from tests.nova.test_nova_pci_passthrough import nodedev_xml, option_values, pci_addresses

HERE = Path(__file__).resolve().parent
NODE = "testhost"
GPU = "0000:61:00.0"
# The layouts, each on an H200 of its own (one GPU per simulated host).
TWO_TYPES, ONE_TYPE = "two", "one"
G1, G3 = "nvidia-1414", "nvidia-1418"  # NVIDIA H200X-1-18C, H200X-3-71C
CLASS_1G = "CUSTOM_VGPU_H200X_1_18C"  # docs/operations.md's example
LAYOUTS = {
    TWO_TYPES: (f"{G1}:3, {G3}:1", "1g.18gb:3, 3g.71gb:1"),
    ONE_TYPE: (f"{G1}:4", "1g.18gb:4"),
}


def ini(layout: str, reported_by: str, mdev_class: str | None = None) -> str:
    vgpus, mig = LAYOUTS[layout]
    types = ", ".join(item.split(":")[0] for item in vgpus.split(", "))
    return (f"[devices]\nenabled_mdev_types = {types}\nenabled_gpu_layouts = mig\n"
            f"[gpu_layout_mig]\ngpus = {GPU}\nvgpus = {vgpus}\nmig = {mig}\n"
            f"reported_by = {reported_by}\n"
            + (f"[mdev_{G1}]\nmdev_class = {mdev_class}\n" if mdev_class else ""))


def policy(text: str) -> policy_mod.DevicePolicy:
    return policy_mod.build_policy(make_conf(text, sysfs_root="/nonexistent"))


def lay_out(host: SimulatedHost, name: str) -> dict[str, tuple[str, int]]:
    """The GPU as the agent's converge leaves it (MIG mode on, the planned
    instances created, each vGPU typed on a VF in VF order): {VF: (type,
    its GPU instance id)}, read back from the simulator."""
    gpu, nvml = GPU, SimulatedNvml(host)
    (layout,) = policy(ini(name, "agent")).gpu_layouts
    nvml.set_mig_mode(gpu, True)
    for planned in gpu_layout_fit.mig_fit(nvml, gpu, layout).new:
        nvml.create_gpu_instance(gpu, planned.profile_id, planned.placement)
    for device_type, count in layout.vgpus:
        for _ in range(count):
            with host.lock:  # the first untyped VF, as the agent picks it
                vf = host.nvidia.free_vf(gpu).fn.address
            host.write(f"bus/pci/devices/{vf}/nvidia/current_vgpu_type",
                       device_type.removeprefix("nvidia-"))
    return {v.vf: (f"nvidia-{v.type_id}", v.gpu_instance_id) for v in nvml.vgpu_instances(gpu)}


def lines(snapshot, text: str) -> str:
    owned = [m.uuid for m in snapshot.mdevs.values()]
    return nova_pci.render(nova_pci.plan(snapshot, policy(text), owned), NODE,
                           live_migratable=False)


def case(text: str, flavor_alias: str) -> dict[str, Any]:
    return {"device_spec": option_values(text, "device_spec"),
            "alias": option_values(text, "alias"), "flavor_alias": flavor_alias}


def laid_out_host(directory: Path, layout: str) -> tuple[Any, str, dict[str, tuple[str, int]]]:
    """One H200 laid out as ``layout`` (a key of LAYOUTS): its snapshot,
    its static tree and its vGPUs."""
    host = SimulatedHost(profiles.build_spec(["nvidia-h200"], vfs=8))
    typed = lay_out(host, layout)
    root = materialise(host, directory / "sys")
    return scan_host(root, backends.builtin()), root, typed


@pytest.fixture(scope="module")
def nova(nova_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    hosts = {name: laid_out_host(tmp_path_factory.mktemp(f"mig-{name}"), name)
             for name in LAYOUTS}
    # case: (its host, reported_by, [mdev_nvidia-1414] mdev_class)
    how = {
        # One type, its class as docs/operations.md sets it, and by default.
        "one_type": (ONE_TYPE, "nova", CLASS_1G),
        "one_type_default_class": (ONE_TYPE, "nova", None),
        # Two types: what nova-pci-config prints for them (the agent's layout).
        "two_types": (TWO_TYPES, "agent", None),
    }
    printed = {name: lines(hosts[layout][0], ini(layout, by, mdev_class))
               for name, (layout, by, mdev_class) in how.items()}
    cases = {}
    for name, (layout, _, _) in how.items():
        _, root, _ = hosts[layout]
        cases[name] = {**case(printed[name], f"{G1}:1"), "sysfs_root": root,
                       "nodedevs": [nodedev_xml(root, a) for a in pci_addresses(root)]}
    first = cases["one_type"]
    answer = run_in_nova(nova_python, HERE / "nova_pci_tracker.py", {
        "node": NODE, "sysfs_root": first["sysfs_root"], "nodedevs": first["nodedevs"],
        "cases": cases})
    return {"answer": answer, "printed": printed,
            "typed": {name: typed for name, (_, _, typed) in hosts.items()}}


def test_the_gpus_are_laid_out_on_their_gpu_instances(nova):
    """The fixture's hosts: every vGPU of the layout typed, each on a GPU
    instance of its own."""
    assert sorted(t for t, _ in nova["typed"][ONE_TYPE].values()) == [G1] * 4
    assert sorted(t for t, _ in nova["typed"][TWO_TYPES].values()) == [G1] * 3 + [G3]
    for on_gpu in nova["typed"].values():
        instances = [gi for _, gi in on_gpu.values()]
        assert None not in instances and len(set(instances)) == len(instances)


def test_the_lines_give_each_mig_backed_vf_its_type_s_class(nova):
    text = nova["printed"]["one_type"]
    specs = option_values(text, "device_spec")
    assert sorted(json.loads(s)["address"] for s in specs) == sorted(
        nova["typed"][ONE_TYPE])
    assert all(json.loads(s)["resource_class"] == CLASS_1G for s in specs)
    assert all(json.loads(s)["managed"] == "no" for s in specs)
    (alias,) = option_values(text, "alias")
    assert json.loads(alias) == {"name": G1, "device_type": "type-VF",
                                          "resource_class": CLASS_1G}


@pytest.mark.parametrize(("name", "resource_class"), [
    ("one_type", CLASS_1G), ("one_type_default_class", "CUSTOM_NVIDIA_1414")])
def test_nova_tracks_reports_and_claims_a_mig_layout_of_one_type(nova, name, resource_class):
    answer = nova["answer"][name]
    assert answer["error"] is None, answer["error"]["traceback"]
    vfs = sorted(nova["typed"][ONE_TYPE])
    # Exactly the typed VFs: not the untyped siblings, the PF or the other GPU.
    assert [d["address"] for d in answer["tracked"]] == vfs
    assert {d["dev_type"] for d in answer["tracked"]} == {"type-VF"}
    assert {d["parent_addr"] for d in answer["tracked"]} == {GPU}
    [child] = [p for p in answer["providers"] if p["parent_uuid"]]
    assert child["name"] == f"{NODE}_{GPU.upper()}"
    assert child["inventory"] == {resource_class: {**child["inventory"][resource_class],
                                                   "total": 4}}
    assert answer["claim_error"] is None and answer["claimed"][0] in vfs
    # The guest gets the VF unmanaged: libvirt leaves it on nvidia, the vGPU lives.
    [hostdev] = [etree.fromstring(x) for x in answer["hostdevs"]]
    assert (hostdev.get("type"), hostdev.get("managed")) == ("pci", "no")


def test_nova_refuses_a_mig_gpu_s_vfs_of_two_types(nova):
    """Why ``reported_by = nova`` is refused for a MIG layout of two types."""
    error = nova["answer"]["two_types"]["error"]
    assert error is not None, "Nova took a PF whose VFs carry two resource classes"
    assert error["type"] == "PlacementPciMixedResourceClassException"


def check_config(tmp_path: Path, layout: str) -> subprocess.CompletedProcess[str]:
    """``accelctl check-config`` on an H200 laid out as ``layout``, the
    layout given to Nova."""
    _, root, _ = laid_out_host(tmp_path, layout)
    conf = tmp_path / "agent.conf"
    conf.write_text(f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\n"
                    + ini(layout, "nova") + "[libvirt]\nuri =\n")
    return subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", str(conf),
         "check-config"], capture_output=True, text=True, timeout=120,
        env={"ACCEL_AGENT_CACHE_DIR": "", "PATH": "/usr/bin:/bin"})


def test_check_config_refuses_a_mig_layout_of_two_types_for_nova(tmp_path):
    """The several-types refusal covers MIG layouts (what Nova refuses above)."""
    done = check_config(tmp_path / "two", TWO_TYPES)
    assert done.returncode == 1, done.stderr
    assert "[gpu_layout_mig] reported_by = nova with several types" in done.stderr
    done = check_config(tmp_path / "one", ONE_TYPE)
    assert done.returncode == 0, done.stderr
    # Nova reports the GPU, so the agent counts no provider for it (once, not twice).
    assert "0 provider(s)" in done.stdout


@pytest.mark.skipif(not placement_available(), reason="openstack-placement is not installed")
def test_the_real_placement_offers_nova_s_mig_inventory_exactly(nova, tmp_path):
    """Nova's provider tree for the one-type GPU, written to a real Placement
    as nova-compute's report client would (root, child, inventory, traits):
    a flavor of 4 fits, one of 5 does not, and ``VGPU`` finds nothing."""
    from tests.functional.test_placement_sync import Admin

    providers = nova["answer"]["one_type"]["providers"]
    server = PlacementServer(tmp_path / "placement")
    server.start()
    try:
        admin = Admin(server.endpoint)
        made: dict[str, str] = {}
        for p in sorted(providers, key=lambda p: p["parent_uuid"] is not None):
            made[p["uuid"]] = admin.create_provider(
                p["name"], made.get(p["parent_uuid"]), traits=p["traits"])
            if p["inventory"]:
                for resource_class in p["inventory"]:
                    if resource_class.startswith("CUSTOM_"):
                        admin.call("PUT", f"/resource_classes/{resource_class}", ok=(201, 204))
                generation = admin.call("GET", f"/resource_providers/{made[p['uuid']]}")[
                    "generation"]
                admin.call("PUT", f"/resource_providers/{made[p['uuid']]}/inventories", {
                    "resource_provider_generation": generation,
                    "inventories": {rc: {k: v for k, v in inv.items()
                                         if k in ("total", "reserved", "min_unit", "max_unit",
                                                  "step_size", "allocation_ratio")}
                                    for rc, inv in p["inventory"].items()}})

        def candidates(resources: str) -> list[str]:
            found = admin.call("GET", f"/allocation_candidates?resources={resources}")
            return sorted({rp for request in found["allocation_requests"]
                           for rp in request["allocations"]})

        [child] = [made[p["uuid"]] for p in providers if p["parent_uuid"]]
        assert candidates(f"{CLASS_1G}:4") == [child]
        assert candidates(f"{CLASS_1G}:5") == []
        assert candidates("VGPU:1") == []
        # Four guests take the four vGPUs: Placement has no fifth to offer.
        for _ in range(4):
            assert candidates(f"{CLASS_1G}:1") == [child]
            admin.allocate(child, {CLASS_1G: 1})
        assert candidates(f"{CLASS_1G}:1") == []
    finally:
        server.stop()
