"""MIG-backed vGPU layouts (``[gpu_layout_<name>]`` with ``mig``, issue 37)
brought up in the driver's order by the daemon's core, in process, over the
FUSE simulator's NVIDIA H200 and its NVML (the simulator's control socket).

Every outcome is read from the simulator's own state (MIG mode, the GPU
instances, each VF's type and ``gpu_instance_id``, every
``current_vgpu_type`` write) and the ledger file (plain SQL).  The layout:
``mig = 1g.18gb:3, 3g.71gb:1`` with an H200X-1-18C on each 1g.18gb instance
and an H200X-3-71C on the 3g.71gb one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import pytest

from accel_agent import nvml as nvml_mod
from accel_agent.daemon.core import AgentCore
from accel_agent.devices.gpu_layouts import GpuLayout
from tests import ledger_sql
from tests.configutil import make_conf
from tests.functional.crash_points import (
    Point,
    assert_nothing_leaked_and_settled,
    kill_bring_up_at,
    points_of_a_bring_up,
    recover_in_child,
)
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse]

GPU = "0000:61:00.0"
G1, G3, SLICED = "nvidia-1414", "nvidia-1418", "nvidia-1421"
VGPUS = ((G1, 3), (G3, 1))
MIG = (("1g.18gb", 3), ("3g.71gb", 1))
PROFILE = {G1: "1g.18gb", G3: "3g.71gb"}
INI = (f"[devices]\nstanding_vf_wait = 5\nenabled_mdev_types = {G1}, {G3}\n"
       f"enabled_gpu_layouts = mig\n[gpu_layout_mig]\ngpus = {GPU}\n"
       f"vgpus = {G1}:3, {G3}:1\nmig = 1g.18gb:3, 3g.71gb:1\n"
       # Each MIG-backed type its own resource class (docs/operations.md).
       f"[mdev_{G1}]\nmdev_class = CUSTOM_VGPU_1G\n[mdev_{G3}]\nmdev_class = CUSTOM_VGPU_3G\n")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("mig"), ["nvidia-h200"], gpus=1,
                        vfs=8) as host:
        yield host


@contextlib.contextmanager
def agent(host) -> Iterator[AgentCore]:
    """The daemon's core over a manager on a clean simulated host, its
    policy read from the MIG layout's sections."""
    host.reset()
    with agent_on(host) as core:
        yield core


@contextlib.contextmanager
def agent_on(host) -> Iterator[AgentCore]:
    """:func:`agent` on the host as it is (its ledger, its devices)."""
    manager = host.manager(INI)
    assert manager.policy.gpu_layouts == (GpuLayout("mig", (GPU,), VGPUS, "agent", MIG),)
    conf = make_conf(INI + f"\n[DEFAULT]\nstate_dir = {host.state_dir}\n", sysfs_root=host.root)
    try:
        yield AgentCore(conf, manager=manager)
    finally:
        manager.ledger.close()


def gpu_state(host) -> dict:
    (gpu,) = [g for g in host.sim.status()["nvidia_gpus"] if g["address"] == GPU]
    return gpu


def on_host(host) -> dict[str, tuple[str, int | None]]:
    """VF -> (type, GPU instance id) as the simulated driver holds them."""
    return {v["vf"]: (f"nvidia-{v['type_id']}", v["gpu_instance_id"])
            for v in gpu_state(host)["vgpus"]}


def assert_complete(host, core) -> None:
    """MIG mode on, the layout's instances at their planned placements, one
    vGPU of the right type on each, each vGPU recorded in the ledger."""
    state = gpu_state(host)
    assert state["mig"] == {"current": True, "pending": True}
    instances = {g["gpu_instance_id"]: (g["name"], *g["placement"])
                 for g in state["gpu_instances"]}
    assert sorted(instances.values()) == [("1g.18gb", 4, 1), ("1g.18gb", 5, 1),
                                          ("1g.18gb", 6, 1), ("3g.71gb", 0, 4)]
    placed = on_host(host)
    assert sorted(t for t, _ in placed.values()) == [G1, G1, G1, G3]
    assert sorted(gi for _, gi in placed.values()) == sorted(instances)  # one each
    for device_type, gi in placed.values():
        assert instances[gi][0] == PROFILE[device_type]
    # The ledger records each instance as the layout's (schema 7).
    assert sorted(ledger_sql.query(host.state_dir, "SELECT gpu, start, size, owner FROM "
                                   "gpu_instances")) == sorted(
        (GPU, start, size, "gpu_layout_mig") for _, start, size in instances.values())
    # The agent's scan reads each VF's nvidia/gpu_instance_id as the driver has it.
    assert {m.parent: m.gpu_instance_id for m in core.devices.scan().mdevs.values()} == {
        vf: gi for vf, (_, gi) in placed.items()}
    assert {parent: t for parent, t in ledger_sql.query(
        host.state_dir, "SELECT parent, mdev_type FROM mdevs")} == {
        vf: t for vf, (t, _) in placed.items()}


def test_a_mig_layout_comes_up_complete_and_again_after_reboot_reload_and_vf_enable(sim):
    with agent(sim) as core:
        assert gpu_state(sim)["mig"]["current"] is False
        core.startup()
        assert_complete(sim, core)
        assert core.health()["layout"]["short"] == {}
        # Each MIG-backed type is its own provider on the GPU, exact: its
        # total the layout's count, all of it free, its type's trait.
        layout_providers = {p.device_type: (p.resource_class, p.total, p.used, p.traits)
                            for p in core.devices.inventory().providers if p.physical_gpu == GPU}
        assert layout_providers == {
            G1: ("CUSTOM_VGPU_1G", 3, 0, ("CUSTOM_MDEV_NVIDIA_1414", "CUSTOM_OWNER_ACCEL_AGENT")),
            G3: ("CUSTOM_VGPU_3G", 1, 0, ("CUSTOM_MDEV_NVIDIA_1418", "CUSTOM_OWNER_ACCEL_AGENT"))}
        first = {vf: t for vf, (t, _) in on_host(sim).items()}

        # A reboot: MIG mode, instances and types gone (an H200 keeps no
        # mode); recovery sets the mode and makes the instances before it
        # re-types the same VFs.
        sim.sim.reboot()
        assert gpu_state(sim)["mig"]["current"] is False
        core.rescan()
        assert_complete(sim, core)
        assert {vf: t for vf, (t, _) in on_host(sim).items()} == first

        # A driver reload: no VF until they are enabled again, which wipes
        # the instances: none is made before the VFs.
        sim.sim.driver_reload()
        core.rescan()
        assert gpu_state(sim)["gpu_instances"] == []  # not before the VFs
        sim.sim.enable_vfs("ALL")
        core.rescan()
        assert_complete(sim, core)
        assert {vf: t for vf, (t, _) in on_host(sim).items()} == first

        # A reboot with the VFs disabled, then sriov-manage -e.
        sim.sim.reboot(vfs_disabled=True)
        core.rescan()
        assert gpu_state(sim)["gpu_instances"] == []
        sim.sim.enable_vfs("ALL")
        core.rescan()
        assert_complete(sim, core)
        assert core.health()["layout"]["short"] == {}


def _write_type(host, vf: str, type_id: str) -> None:
    with open(os.path.join(host.root, "bus/pci/devices", vf, "nvidia/current_vgpu_type"),
              "w") as handle:
        handle.write(type_id)


def test_a_gpu_whose_mig_mode_is_pending_is_short_and_nothing_on_it_is_touched(sim):
    with agent(sim) as core:
        # MIG asked while a (foreign) vGPU was on the GPU: pending; the vGPU
        # then went, and only a GPU reset would apply the mode.
        vf = "0000:61:00.4"
        _write_type(sim, vf, SLICED.removeprefix("nvidia-"))
        change = nvml_mod.for_sysfs_root(sim.root).set_mig_mode(GPU, True)
        assert (change.activation, change.mode.current) == ("IN_USE", False)
        _write_type(sim, vf, "0")
        writes = len(sim.sim.status()["vgpu_writes"])
        core.startup()
        assert gpu_state(sim)["mig"] == {"current": False, "pending": True}
        assert gpu_state(sim)["gpu_instances"] == []
        assert sim.sim.status()["vgpu_writes"][writes:] == []  # no type written
        short = core.health()["layout"]["short"][GPU]
        assert short["reason"].startswith("needs a GPU reset: MIG mode is pending"), short
        assert core.health()["status"] == "degraded"


@contextlib.contextmanager
def held_open(host, vf: str):
    """A guest holds the VF (its VFIO group node open, as QEMU does)."""
    group = os.path.basename(os.readlink(os.path.join(host.root, "bus/pci/devices", vf,
                                                      "iommu_group")))
    fd = os.open(os.path.join(host.root, "vfio", group), os.O_RDONLY)
    try:
        yield
    finally:
        os.close(fd)


def test_a_layout_change_drains_and_never_destroys_an_instance_in_use(sim):
    with agent(sim) as core:
        core.startup()
        assert_complete(sim, core)
        vf, (_, gi) = next((v, p) for v, p in on_host(sim).items() if p[0] == G3)
        held = next(u for u, p in ledger_sql.query(sim.state_dir,
                                                   "SELECT uuid, parent FROM mdevs") if p == vf)
        smaller = GpuLayout("mig", (GPU,), ((G1, 3),), "agent", (("1g.18gb", 3),))
        with held_open(sim, vf):
            core.devices.set_policy(dataclasses.replace(core.devices.policy,
                                                        gpu_layouts=(smaller,)))
            core.rescan()
            core.rescan()
            # The guest's 3-71C and its instance stay: it drains, nothing fails.
            assert on_host(sim)[vf] == (G3, gi)
            assert gi in {g["gpu_instance_id"] for g in gpu_state(sim)["gpu_instances"]}
            assert core.health()["layout"]["draining"] == [held]
            assert core.health()["layout"]["short"] == {}
        # The guest let go: the vGPU goes, then its instance (no use for it).
        core.rescan()
        assert sorted(t for t, _ in on_host(sim).values()) == [G1, G1, G1]
        assert sorted(g["name"] for g in gpu_state(sim)["gpu_instances"]) == ["1g.18gb"] * 3
        assert core.health()["layout"]["draining"] == []
        assert core.health()["layout"]["short"] == {}


def test_a_shrink_keeps_the_instances_vgpus_use_not_the_first_free_ones(sim):
    """1g.18gb:3 -> 1g.18gb:1 while a guest holds the 1g vGPU on the last
    of the three instances: it drains, the layout keeps one of its own, the
    third vGPU goes, then its instance: the two instances kept are the two
    the vGPUs use.  Keeping the lowest numbered would mean destroying the
    guest's, which NVML refuses, and the GPU would stay short."""
    smaller = GpuLayout("mig", (GPU,), ((G1, 1), (G3, 1)), "agent",
                        (("1g.18gb", 1), ("3g.71gb", 1)))
    with agent(sim) as core:
        core.startup()
        vf, gi = max(((v, p[1]) for v, p in on_host(sim).items() if p[0] == G1),
                     key=lambda item: item[1])
        with held_open(sim, vf):
            core.devices.set_policy(dataclasses.replace(core.devices.policy,
                                                        gpu_layouts=(smaller,)))
            core.rescan()
            core.rescan()
            assert on_host(sim)[vf] == (G1, gi)
            used = sorted(p[1] for p in on_host(sim).values() if p[0] == G1)
            assert len(used) == 2 and gi in used
            ones = [g["gpu_instance_id"] for g in gpu_state(sim)["gpu_instances"]
                    if g["name"] == "1g.18gb"]
            assert sorted(ones) == used
            assert core.health()["layout"]["short"] == {}


def test_held_vgpus_beyond_a_shrunk_layout_get_their_instances_back_after_a_reboot(sim):
    """An instance holds two H200X-1-18C, the layout shrinks to one (they
    drain), the host reboots: recovery rebuilds a GPU instance for every
    recorded vGPU and re-types them all, instead of rebuilding only the
    layout's one 1g.18gb and failing on the others (found by the
    random-kill harness's MIG model)."""
    smaller = GpuLayout("mig", (GPU,), ((G1, 1), (G3, 1)), "agent",
                        (("1g.18gb", 1), ("3g.71gb", 1)))
    with agent(sim) as core:
        core.startup()
        held = core.devices.allocate("vm-1", 2, device_type=G1).uuids
        core.devices.set_policy(dataclasses.replace(core.devices.policy, gpu_layouts=(smaller,)))
        core.rescan()
        vfs = {u: p for u, p in ledger_sql.query(sim.state_dir, "SELECT uuid, parent FROM mdevs")}
        sim.sim.reboot()
        core.rescan()
        placed = on_host(sim)
        assert [placed.get(vfs[u], ("missing",))[0] for u in held] == [G1, G1], placed
        # Every recorded vGPU back on its VF, each on its own instance of its profile.
        assert set(placed) == set(vfs.values())
        instances = {g["gpu_instance_id"]: g["name"] for g in gpu_state(sim)["gpu_instances"]}
        assert sorted(gi for _, gi in placed.values()) == sorted(instances)
        assert all(instances[gi] == PROFILE[t] for t, gi in placed.values())
        assert core.health()["layout"]["short"] == {}


@contextlib.contextmanager
def one_1g_recorded_at(host, start: int) -> Iterator[AgentCore]:
    """:func:`agent` with a layout of one 1g.18gb vGPU and a ledger that
    records its GPU instance (profile 19) at ``start``."""
    from accel_agent.devices.ledger import GpuInstanceRecord

    one = GpuLayout("mig", (GPU,), ((G1, 1),), "agent", (("1g.18gb", 1),))
    with agent(host) as core:
        core.devices.set_policy(dataclasses.replace(core.devices.policy, gpu_layouts=(one,)))
        core.devices.ledger.record_gpu_instance(
            GpuInstanceRecord(GPU, start, 1, 19, "gpu_layout_mig"))
        yield core


def test_recorded_instances_are_rebuilt_where_the_ledger_has_them(sim):
    """An instance recorded at 6:1 (where an earlier plan put it) is made
    there again, not where a fresh plan would (0:1), at the start and after
    a reboot: the ledger says what recovery rebuilds."""
    with one_1g_recorded_at(sim, 6) as core:
        core.startup()
        for _ in range(2):
            ((gi,),) = [gpu_state(sim)["gpu_instances"]]
            assert (gi["name"], gi["placement"]) == ("1g.18gb", [6, 1])
            ((_, on),) = on_host(sim).values()
            assert on == gi["gpu_instance_id"]
            assert core.health()["layout"]["short"] == {}
            sim.sim.reboot()
            core.rescan()


# --- a kill at every crash point of the order ------------------------------------------


def _child(host, kill: Point | None, record: str | None = None) -> int:
    """Bring the layout up in a forked process killed at ``kill`` (crash_points.py)."""
    return recover_in_child(lambda on_step: host.manager(INI, on_step=on_step), kill, record)


@pytest.mark.filterwarnings("ignore:Using fork")  # the child never runs eventlet
@pytest.mark.parametrize("reboot_first", [False, True], ids=["first-start", "after-reboot"])
def test_a_kill_at_any_step_of_the_mig_order_is_recovered_to_the_whole_layout(
    sim, tmp_path, reboot_first
):
    """The MIG order killed between its steps (the mode set, each instance
    created, the first intent, type and assignment; after a reboot each
    rebuilt instance): the next start brings the GPU to its whole layout,
    nothing leaked, and a second recovery changes nothing."""
    points = points_of_a_bring_up(sim, _child, str(tmp_path / "steps"), reboot_first)
    names = {s for s, _ in points}
    assert {"mig.mode_set", "mig.instance_created"} <= names, names
    assert reboot_first or "allocate.created" in names, names
    # Every MIG step, and each other step the first time only: the protocol's
    # own steps are proven at each of their points by the mixed-size test
    # (tests/functional/test_mixed_layout.py), and CI time is dear.
    for kill in [(s, n) for s, n in points if s.startswith("mig.") or n == 1]:
        kill_bring_up_at(sim, _child, kill, reboot_first)
        with agent_on(sim) as core:
            core.startup()
            assert_complete(sim, core)
            assert_nothing_leaked_and_settled(sim, core, on_host, kill)


def test_a_mig_layout_that_does_not_fit_is_short_and_makes_nothing(sim):
    too_big = GpuLayout("mig", (GPU,), ((G1, 1), (G3, 2)), "agent",
                        (("1g.18gb", 1), ("3g.71gb", 2)))
    with agent(sim) as core:
        core.devices.set_policy(dataclasses.replace(core.devices.policy, gpu_layouts=(too_big,)))
        core.startup()
        assert gpu_state(sim)["gpu_instances"] == [] and on_host(sim) == {}
        short = core.health()["layout"]["short"][GPU]
        assert short["reason"].startswith(
            f"does not fit: GPU {GPU} cannot hold the GPU instances 1g.18gb:1, 3g.71gb:2"), short


def test_mig_is_never_enabled_on_a_gpu_with_a_vgpu_on_it(sim):
    """A foreign time-sliced vGPU on the GPU, MIG off: the agent asks for no
    mode change (NVML would leave it pending until a reset) and says why."""
    with agent(sim) as core:
        vf = "0000:61:00.4"
        _write_type(sim, vf, SLICED.removeprefix("nvidia-"))
        core.startup()
        assert gpu_state(sim)["mig"] == {"current": False, "pending": False}
        assert gpu_state(sim)["gpu_instances"] == []
        assert on_host(sim) == {vf: (SLICED, None)}
        short = core.health()["layout"]["short"][GPU]
        assert short["reason"].startswith("in use, so MIG mode cannot be set: 1 vGPU(s) exist "
                                          f"on it ({vf})"), short
        _write_type(sim, vf, "0")


def test_a_recorded_instance_the_gpu_does_not_take_is_forgotten_and_planned_afresh(sim):
    """A record at a placement its profile does not have (1g.18gb at 7:1):
    NVML refuses it, the record goes, the layout is planned as if new."""
    with one_1g_recorded_at(sim, 7) as core:
        core.startup()
        ((gi,),) = [gpu_state(sim)["gpu_instances"]]
        assert (gi["name"], gi["placement"]) == ("1g.18gb", [0, 1])
        assert ledger_sql.query(sim.state_dir, "SELECT start FROM gpu_instances") == [(0,)]
        assert core.health()["layout"]["short"] == {}


def test_an_a100_keeps_its_mig_mode_over_a_reboot_and_gets_its_instances_back(tmp_path):
    """An A100-class GPU keeps MIG mode across a reboot but, like every GPU,
    loses its GPU instances (the simulator's nvidia-a100-mig, after NVIDIA's
    k8s-device-plugin #225): the agent finds the mode on, does not set it
    again, and rebuilds the instances before it re-types the VFs."""
    skip_unless_root()
    a100, g1, g3 = "0000:a1:00.0", "nvidia-700", "nvidia-702"
    ini = (f"[devices]\nstanding_vf_wait = 5\nenabled_mdev_types = {g1}, {g3}\n"
           f"enabled_gpu_layouts = a100\n[gpu_layout_a100]\ngpus = {a100}\n"
           f"vgpus = {g1}:2, {g3}:1\nmig = 1g.5gb:2, 3g.20gb:1\n")
    with simulated_host(tmp_path, ["nvidia-a100-mig"], gpus=1, vfs=8) as host:
        manager = host.manager(ini)
        conf = make_conf(ini + f"\n[DEFAULT]\nstate_dir = {host.state_dir}\n",
                         sysfs_root=host.root)
        try:
            core = AgentCore(conf, manager=manager)

            def a100_state() -> dict:
                (gpu,) = [g for g in host.sim.status()["nvidia_gpus"] if g["address"] == a100]
                return gpu

            def laid_out() -> list:
                state = a100_state()
                names = {g["gpu_instance_id"]: g["name"] for g in state["gpu_instances"]}
                return sorted((f"nvidia-{v['type_id']}", names[v["gpu_instance_id"]])
                              for v in state["vgpus"])

            whole = [(g1, "1g.5gb"), (g1, "1g.5gb"), (g3, "3g.20gb")]
            core.startup()
            assert laid_out() == whole
            typed = {v["vf"] for v in a100_state()["vgpus"]}
            steps: list[str] = []
            manager.on_step = steps.append
            host.sim.reboot()
            assert a100_state()["mig"]["current"] is True  # the mode survived
            assert a100_state()["gpu_instances"] == [] and a100_state()["vgpus"] == []
            core.rescan()
            assert laid_out() == whole
            assert {v["vf"] for v in a100_state()["vgpus"]} == typed  # the same VFs
            assert "mig.mode_set" not in steps, steps  # on already: not set again
            assert "mig.instance_created" in steps, steps
            assert core.health()["layout"]["short"] == {}
        finally:
            manager.ledger.close()


def test_a_gpu_taken_out_of_every_mig_layout_keeps_nothing_of_the_agent_s(sim):
    """The layout disabled while a guest holds one vGPU: the free vGPUs and
    their GPU instances go; the guest's vGPU and its instance stay (it
    drains); once the guest lets go both go, and the ledger keeps no GPU
    instance.  MIG mode stays on (the operator's to turn off)."""
    with agent(sim) as core:
        core.startup()
        assert_complete(sim, core)
        vf, (_, gi) = next((v, p) for v, p in on_host(sim).items() if p[0] == G3)
        with held_open(sim, vf):
            core.devices.set_policy(dataclasses.replace(core.devices.policy, gpu_layouts=()))
            core.rescan()
            core.rescan()
            assert on_host(sim) == {vf: (G3, gi)}
            assert [g["gpu_instance_id"] for g in gpu_state(sim)["gpu_instances"]] == [gi]
            assert ledger_sql.query(sim.state_dir, "SELECT gpu, size FROM gpu_instances") == [
                (GPU, 4)]
        core.rescan()
        core.rescan()
        assert on_host(sim) == {}
        assert gpu_state(sim)["gpu_instances"] == []
        assert ledger_sql.query(sim.state_dir, "SELECT gpu FROM gpu_instances") == []
        assert ledger_sql.query(sim.state_dir, "SELECT uuid FROM mdevs") == []
        assert gpu_state(sim)["mig"]["current"] is True


def test_a_guest_s_vgpu_on_a_gpu_taken_out_of_every_mig_layout_survives_a_reboot(sim):
    """An instance holds a MIG-backed vGPU, its GPU is taken out of every
    layout, the host reboots (instances and mode wiped): recovery sets MIG
    mode and rebuilds the recorded instance, so the instance's vGPU comes
    back (before, it was lost: no free instance to type it on).  Once the
    instance releases it, vGPU and instance go."""
    with agent(sim) as core:
        core.startup()
        (held,) = core.devices.allocate("vm-1", 1, device_type=G1).uuids
        core.devices.set_policy(dataclasses.replace(core.devices.policy, gpu_layouts=()))
        core.rescan()
        core.rescan()
        (vf,) = on_host(sim)
        sim.sim.reboot()
        assert on_host(sim) == {} and gpu_state(sim)["gpu_instances"] == []
        core.rescan()
        assert on_host(sim)[vf][0] == G1  # the instance's vGPU, back on its VF
        assert [g["name"] for g in gpu_state(sim)["gpu_instances"]] == ["1g.18gb"]
        assert ledger_sql.query(sim.state_dir, "SELECT uuid, parent FROM mdevs") == [(held, vf)]
        assert core.health()["status"] != "degraded", core.health()
        core.devices.release("vm-1", remove=True)
        core.rescan()
        core.rescan()
        assert on_host(sim) == {}
        assert gpu_state(sim)["gpu_instances"] == []
        assert ledger_sql.query(sim.state_dir, "SELECT gpu FROM gpu_instances") == []
