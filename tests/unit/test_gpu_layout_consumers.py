"""What a mixed-size layout's GPU looks like to its consumers (issue 36,
item 6): with ``reported_by = agent`` the inventory has one provider per
GPU per type, its total the layout's count; ``nova-pci-config`` gives each VF
its own type's resource class, several on one GPU (Nova 34 cannot take
those: tests/nova/test_nova_mixed_layout.py, so ``reported_by = nova`` is for
a layout of one type); with ``reported_by = nova`` the agent reports none of
them; recovery's owner rule takes a layout device an instance holds as
configured.  Over a simulated L4 whose
VFs were typed with three types (as the start makes the layout), in
process."""

from __future__ import annotations

import time

import pytest

from accel_agent import backends
from accel_agent.backends.host import scan_host
from accel_agent.devices import inventory, recovery
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.ledger.records import DeviceRecord, DeviceState, OwnerKind
from accel_agent.devices.protocol import Existing
from accel_agent.reporting import nova_pci
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise
from tests.configutil import make_conf

L4 = "0000:21:00.0"
L4_12Q, L4_6Q, L4_3Q = "nvidia-1188", "nvidia-1186", "nvidia-1184"
# The layout as the start makes it: 12Q, 6Q and two 3Q on four VFs.
TYPED = {"0000:21:00.4": 1188, "0000:21:00.5": 1186, "0000:21:00.6": 1184,
         "0000:21:00.7": 1184}


@pytest.fixture
def snapshot(tmp_path):
    host = SimulatedHost(profiles.build_spec(["nvidia-l4", "nvidia-vfio"], vfs=6))
    SimulatedNvml(host).set_heterogeneous_mode(L4, True)
    for vf, type_id in TYPED.items():
        host.write(f"bus/pci/devices/{vf}/nvidia/current_vgpu_type", str(type_id))
    return scan_host(materialise(host, tmp_path / "sys"), backends.builtin())


def policy(reported_by: str, vgpus: str = f"{L4_12Q}:1, {L4_6Q}:1, {L4_3Q}:2",
           extra: str = "") -> policy_mod.DevicePolicy:
    return policy_mod.build_policy(make_conf(
        f"[devices]\nenabled_mdev_types = {L4_12Q}, {L4_6Q}, {L4_3Q}\n"
        f"enabled_gpu_layouts = mixed\n[gpu_layout_mixed]\ngpus = {L4}\nvgpus = {vgpus}\n"
        f"reported_by = {reported_by}\n{extra}", sysfs_root="/nonexistent"))


def uuid_on(snapshot, vf: str) -> str:
    (found,) = [m.uuid for m in snapshot.mdevs.values() if m.parent == vf]
    return found


def layout_providers(found: inventory.Inventory) -> dict[str, tuple[str, int, int, tuple]]:
    return {p.name: (p.device_type, p.total, p.used, p.parent_devices)
            for p in found.providers if p.physical_gpu == L4}


def test_an_agent_layout_is_reported_per_gpu_per_type_with_the_layout_s_count(snapshot):
    chosen = policy("agent")
    # One 3Q is free (the layout's, unused); every other device an instance holds.
    free = {uuid_on(snapshot, "0000:21:00.7")}
    found = inventory.reported(
        inventory.compute_inventory(snapshot, chosen, "h", free_uuids=free), chosen)
    assert layout_providers(found) == {
        "h_pci_0000_21_00_0_nvidia-1188": (L4_12Q, 1, 1, ("0000:21:00.4",)),
        "h_pci_0000_21_00_0_nvidia-1186": (L4_6Q, 1, 1, ("0000:21:00.5",)),
        "h_pci_0000_21_00_0_nvidia-1184": (L4_3Q, 2, 1, ("0000:21:00.6", "0000:21:00.7")),
    }
    # The default type (nvidia-1188) never reaches the layout's GPU; the
    # L40S offers none of the types: no other provider.
    assert [p for p in found.providers if p.physical_gpu != L4] == []
    (three_q,) = [p for p in found.providers if p.device_type == L4_3Q]
    assert three_q.inventory_record()["max_unit"] == 2
    assert three_q.traits == ("CUSTOM_MDEV_NVIDIA_1184", inventory.OWNER_TRAIT)


def test_a_layout_lowered_below_what_exists_never_reports_less_than_exists(snapshot):
    found = inventory.compute_inventory(snapshot, policy("agent", f"{L4_12Q}:1, {L4_3Q}:1"),
                                        "h")
    # The 6Q is no longer the layout's (it drains: not reported); two 3Q exist.
    assert {p.device_type: p.total for p in found.providers} == {L4_12Q: 1, L4_3Q: 2}


def test_a_layout_s_gpu_without_its_vgpus_yet_is_reported_at_the_layout_s_count(tmp_path):
    host = SimulatedHost(profiles.build_spec(["nvidia-l4"], vfs=4))
    snapshot = scan_host(materialise(host, tmp_path / "sys"), backends.builtin())
    found = inventory.compute_inventory(snapshot, policy("agent"), "h")
    assert {p.device_type: (p.total, p.used) for p in found.providers} == {
        L4_12Q: (1, 0), L4_6Q: (1, 0), L4_3Q: (2, 0)}


def test_a_nova_layout_is_reported_by_the_agent_not_at_all(snapshot):
    chosen = policy("nova", f"{L4_3Q}:2")
    assert layout_providers(inventory.compute_inventory(snapshot, chosen, "h"))
    assert layout_providers(inventory.reported(
        inventory.compute_inventory(snapshot, chosen, "h"), chosen)) == {}


def test_nova_pci_config_gives_each_vf_of_a_mixed_gpu_its_own_type_s_class(snapshot):
    chosen = policy("agent")
    owned = [m.uuid for m in snapshot.mdevs.values()]
    specs = nova_pci.plan(snapshot, chosen, owned, per_gpu=8)
    assert [(s.address, s.mdev_type, s.resource_class, s.typed) for s in specs] == [
        ("0000:21:00.4", L4_12Q, "CUSTOM_NVIDIA_1188", True),
        ("0000:21:00.5", L4_6Q, "CUSTOM_NVIDIA_1186", True),
        ("0000:21:00.6", L4_3Q, "CUSTOM_NVIDIA_1184", True),
        ("0000:21:00.7", L4_3Q, "CUSTOM_NVIDIA_1184", True),
    ]  # per_gpu adds no untyped VF: the layout types its VFs at start
    assert [a["resource_class"] for a in nova_pci.aliases(specs)] == [
        "CUSTOM_NVIDIA_1184", "CUSTOM_NVIDIA_1186", "CUSTOM_NVIDIA_1188"]
    # A VF typed by someone else is never offered.
    assert len(nova_pci.plan(snapshot, chosen, owned[1:])) == 3


def test_nova_pci_config_for_a_nova_layout_matches_what_it_prints(snapshot):
    chosen = policy("nova", f"{L4_3Q}:2")
    owned = [m.uuid for m in snapshot.mdevs.values()]
    specs = nova_pci.plan(snapshot, chosen, owned, per_gpu=8)
    # The layout's type only: the 12Q and 6Q are no longer the layout's (they drain).
    assert [(s.address, s.resource_class) for s in specs] == [
        ("0000:21:00.6", "CUSTOM_NVIDIA_1184"), ("0000:21:00.7", "CUSTOM_NVIDIA_1184")]
    found = nova_pci.parse_nova_conf(nova_pci.render(specs, "h", live_migratable=False))
    assert nova_pci.drift(specs, found, nova_pci.host_vfs(snapshot),
                          nova_pci.agent_reported(snapshot, chosen)) == []


def test_nova_told_about_an_agent_layout_s_gpu_counts_it_twice_naming_the_layout(snapshot):
    chosen = policy("agent")
    text = '[pci]\ndevice_spec = {"address": "0000:21:00.4", "managed": "no", ' \
           '"resource_class": "CUSTOM_NVIDIA_1188"}\n'
    problems = nova_pci.drift([], nova_pci.parse_nova_conf(text, "nova.conf"),
                              nova_pci.host_vfs(snapshot),
                              nova_pci.agent_reported(snapshot, chosen))
    assert (f"GPU {L4} ({L4_12Q}) would be counted twice: [pci] device_spec gives Nova its "
            "VF(s) 0000:21:00.4, and the agent reports the GPU to Placement too; set "
            "[gpu_layout_mixed] reported_by = nova") in "\n".join(problems)


def record(snapshot, vf: str, device_type: str) -> DeviceRecord:
    now = time.time()
    return DeviceRecord(uuid_on(snapshot, vf), vf, device_type, DeviceState.PRESENT, "vm-1",
                        OwnerKind.INSTANCE, None, None, False, now, now,
                        backend="nvidia_vfio")


def test_a_layout_device_an_instance_holds_is_configured_for_recovery(snapshot):
    devices = Existing(snapshot, {})
    held = [record(snapshot, "0000:21:00.5", L4_6Q)]
    assert recovery.owner_refusals(held, policy("agent"), devices) == []
    # Nova's layout would list it for its own guests too: refused, as for a type.
    (refusal,) = recovery.owner_refusals(held, policy("nova", f"{L4_6Q}:1"), devices)
    assert type(refusal).__name__ == "AssignedDeviceToNova"
    # A layout without the device's type retypes it: refused.
    (refusal,) = recovery.owner_refusals(held, policy("agent", f"{L4_12Q}:1, {L4_3Q}:2"),
                                         devices)
    assert type(refusal).__name__ == "AssignedDeviceRetyped"


def test_explain_names_the_gpu_s_layout_never_the_default_type(snapshot):
    from accel_agent import explain
    from accel_agent.explain import render

    document = explain.explain(snapshot, explain.Asks.of(policy("agent"), None), L4, "h", None)
    (gpu,) = document["devices"]
    assert gpu["config"]["mdev_type"] is None and gpu["config"]["source"] == "gpu_layout"
    assert gpu["config"]["gpu_layout"] == {
        "name": "mixed", "reported_by": "agent",
        "vgpus": [{"mdev_type": L4_12Q, "count": 1}, {"mdev_type": L4_6Q, "count": 1},
                  {"mdev_type": L4_3Q, "count": 2}]}
    assert gpu["verdict"]["summary"].startswith(
        "ready: its VFs are laid out by its mixed-size layout [gpu_layout_mixed]")
    assert ("mixed-size layout [gpu_layout_mixed]: nvidia-1188:1, nvidia-1186:1, "
            "nvidia-1184:2") in render.text(document).replace("\n", " ").replace("  ", " ")


def test_types_configured_keeps_every_type_of_the_layout_on_its_gpu(tmp_path):
    import argparse

    from accel_agent.cmd import ctl_listings
    from accel_agent.reporting import views

    host = SimulatedHost(profiles.build_spec(["nvidia-l4"], vfs=2))
    snapshot = scan_host(materialise(host, tmp_path / "sys"), backends.builtin())
    document = views.types_document(snapshot, policy("agent"), "h")
    vf = next(p for p in document["parents"] if p["physical_gpu"] == L4)
    assert vf["configured_type"] is None  # several types: no one type
    assert vf["configured_types"] == [L4_12Q, L4_6Q, L4_3Q]
    keep = ctl_listings._type_filter(argparse.Namespace(configured=True))
    kept = {(p["name"], t["type_id"]) for p in keep(document)["parents"] for t in p["types"]}
    assert {t for _vf, t in kept} == {L4_12Q, L4_6Q, L4_3Q}
    assert {vf for vf, _t in kept} == {"0000:21:00.4", "0000:21:00.5"}
    # The table's "configured" column says so for each of them.
    _head, rows = ctl_listings._types_table(document)
    assert {(r[0], r[1]) for r in rows if r[-1] == "yes"} == kept


def _takeover_plan(snapshot, chosen, domains=()):
    """takeover's plan (``--adopt-unused``, dry run) over the snapshot with
    an empty ledger: the manager's policy and ledger are all it reads."""
    from types import SimpleNamespace

    from accel_agent.devices import takeover

    m = SimpleNamespace(policy=chosen, ledger=SimpleNamespace(get=lambda uuid: None))
    return takeover._plan_takeover(m, snapshot, list(domains), adopt_unused=True,
                                   dry_run=True, defined={})


def test_a_foreign_vgpu_of_a_layout_s_type_on_its_gpu_is_adoptable(snapshot):
    # Every vGPU on the L4 is of one of its layout's three types (the GPU has
    # no single configured type: policy.type_for is None there).
    plan = _takeover_plan(snapshot, policy("agent"))
    on_l4 = {e["parent"]: e for e in plan.unused if e["parent"].startswith("0000:21:")}
    assert {vf: e["action"] for vf, e in on_l4.items()} == dict.fromkeys(TYPED, "adopt")


def test_a_foreign_vgpu_of_another_type_on_a_layout_s_gpu_is_refused_naming_the_layout(
    snapshot,
):
    from types import SimpleNamespace

    chosen = policy("agent", f"{L4_12Q}:1, {L4_6Q}:1")  # no 3Q in the layout any more
    plan = _takeover_plan(snapshot, chosen)
    entry = next(e for e in plan.unused if e["parent"] == "0000:21:00.6")
    assert entry["action"] == "foreign"
    assert entry["reason"] == (
        f"its type {L4_3Q} is none of the types [gpu_layout_mixed] gives 0000:21:00.6's "
        f"GPU ({L4_12Q}, {L4_6Q})")
    # A domain (Nova's guest) on it: the takeover is refused, naming the layout.
    uuid = uuid_on(snapshot, "0000:21:00.6")
    domain = SimpleNamespace(name="guest", uuid="6f0a2c8e-4c1b-4f7e-9a43-0d2b5c1e8f10",
                             mdevs=[uuid])
    plan = _takeover_plan(snapshot, chosen, [domain])
    assert plan.problems == [
        f"domain guest ({domain.uuid}) uses mdev {uuid} of type {L4_3Q} on parent "
        f"0000:21:00.6, but 0000:21:00.6's GPU has the mixed-size layout [gpu_layout_mixed], "
        f"whose types are {L4_12Q}, {L4_6Q} (add {L4_3Q} to its vgpus, or move the GPU out "
        "of it)"]
    # ... and one of the layout's types is taken over.
    ok = SimpleNamespace(name="ok", uuid=domain.uuid, mdevs=[uuid_on(snapshot, "0000:21:00.5")])
    assert _takeover_plan(snapshot, chosen, [ok]).problems == []
