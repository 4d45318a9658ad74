"""Nova 34's own PCI passthrough code on the ``nova-pci-config`` lines of a
mixed-size layout's GPU (issue 36, item 6).

An L4 in mixed-size mode whose four VFs carry an L4-12Q, an L4-6Q and two
L4-3Q, as a layout's start leaves them (a static tree of the simulator: no
daemon is needed, the lines are ``reporting/nova_pci.py``'s, the code
``accelctl nova-pci-config`` prints with).  nova_pci_tracker.py runs Nova's
[pci] parsing, libvirt driver, PCI tracker, Placement translator and claim
on them.  Checked: the lines of a GPU carrying several types, each VF under
its own type's resource class, are refused by Nova's Placement translator
(one resource class per PF), which is why the agent refuses ``reported_by =
nova`` for a layout of several types; the lines of a layout of one type are
tracked, reported and claimed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accel_agent import backends
from accel_agent.backends.host import scan_host
from accel_agent.devices import policy as policy_mod
from accel_agent.reporting import nova_pci
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise
from tests.configutil import make_conf
from tests.nova.conftest import run_in_nova
from tests.nova.test_nova_pci_passthrough import nodedev_xml, option_values, pci_addresses

HERE = Path(__file__).resolve().parent
L4 = "0000:21:00.0"
NODE = "testhost"
TYPED = {"0000:21:00.4": 1188, "0000:21:00.5": 1186, "0000:21:00.6": 1184,
         "0000:21:00.7": 1184}
THREE_Q = ("0000:21:00.6", "0000:21:00.7")


def lines(snapshot, vgpus: str, reported_by: str) -> str:
    policy = policy_mod.build_policy(make_conf(
        "[devices]\nenabled_mdev_types = nvidia-1188, nvidia-1186, nvidia-1184\n"
        f"enabled_gpu_layouts = mixed\n[gpu_layout_mixed]\ngpus = {L4}\nvgpus = {vgpus}\n"
        f"reported_by = {reported_by}\n", sysfs_root="/nonexistent"))
    owned = [m.uuid for m in snapshot.mdevs.values()]
    return nova_pci.render(nova_pci.plan(snapshot, policy, owned), NODE, live_migratable=False)


@pytest.fixture(scope="module")
def nova(nova_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    host = SimulatedHost(profiles.build_spec(["nvidia-l4"], vfs=6))
    SimulatedNvml(host).set_heterogeneous_mode(L4, True)
    for vf, type_id in TYPED.items():
        host.write(f"bus/pci/devices/{vf}/nvidia/current_vgpu_type", str(type_id))
    root = materialise(host, tmp_path_factory.mktemp("mixed") / "sys")
    snapshot = scan_host(root, backends.builtin())
    # Several types: what nova-pci-config prints for them (the agent's layout).
    mixed = lines(snapshot, "nvidia-1188:1, nvidia-1186:1, nvidia-1184:2", "agent")
    # One type: a layout Nova may report.
    one = lines(snapshot, "nvidia-1184:2", "nova")
    cases = {
        "mixed": {"device_spec": option_values(mixed, "device_spec"),
                  "alias": option_values(mixed, "alias"), "flavor_alias": "nvidia-1186:1"},
        "one_type": {"device_spec": option_values(one, "device_spec"),
                     "alias": option_values(one, "alias"), "flavor_alias": "nvidia-1184:1"},
    }
    answer = run_in_nova(nova_python, HERE / "nova_pci_tracker.py", {
        "node": NODE, "sysfs_root": root, "cases": cases,
        "nodedevs": [nodedev_xml(root, a) for a in pci_addresses(root)],
    })
    return {"answer": answer, "mixed": mixed, "one": one}


def test_the_lines_give_each_vf_its_own_type_s_class(nova):
    specs = [line for line in nova["mixed"].splitlines() if line.startswith("device_spec")]
    assert len(specs) == 4
    for vf, type_id in TYPED.items():
        assert any(vf in s and f"CUSTOM_NVIDIA_{type_id}" in s for s in specs), vf


def test_nova_refuses_one_gpu_s_vfs_under_several_resource_classes(nova):
    error = nova["answer"]["mixed"]["error"]
    assert error is not None, "Nova took a PF whose VFs carry several resource classes"
    assert error["type"] == "PlacementPciMixedResourceClassException"
    assert "VFs from the same PF cannot be configured with different 'resource_class'" in (
        error["message"])


def test_nova_tracks_reports_and_claims_a_layout_of_one_type(nova):
    answer = nova["answer"]["one_type"]
    assert answer["error"] is None, answer["error"]["traceback"]
    assert sorted(d["address"] for d in answer["tracked"]) == list(THREE_Q)
    [child] = [p for p in answer["providers"] if p["parent_uuid"]]
    assert child["inventory"]["CUSTOM_NVIDIA_1184"]["total"] == 2
    assert answer["claim_error"] is None and answer["claimed"][0] in THREE_Q
