"""Mixed-size vGPU layouts (``[gpu_layout_<name>]``, issue 36) brought up in
the driver's order by the daemon's core, in process, over the FUSE
simulator's NVIDIA L40S GPUs and its NVML (the simulator's control socket).

Every outcome is read from sources independent of the agent: the
simulator's own state (each VF's type and placement, each GPU's
mixed-size mode, every ``current_vgpu_type`` write) and the ledger file
(plain SQL).  The layout has three sizes: one 24Q (placement size 24),
one 12Q (12) and two 4Q (4) on a GPU of 48 placement units.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator

import pytest

from accel_agent import exception
from accel_agent.daemon import starting
from accel_agent.daemon.core import AgentCore
from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.devices.manager import DeviceManager
from accel_agent.simulator.profiles_nvidia import L40S_VGPU_TYPES
from tests import ledger_sql
from tests.configutil import make_conf
from tests.functional.crash_points import (
    Point,
    StepKiller,
    assert_nothing_leaked_and_settled,
    kill_bring_up_at,
    points_of_a_bring_up,
    recover_in_child,
)
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse]

GPU = "0000:c1:00.0"
Q24, Q12, Q4, Q8 = "nvidia-1155", "nvidia-1153", "nvidia-1150", "nvidia-1152"
MIXED = ((Q24, 1), (Q12, 1), (Q4, 2))
INI = "[devices]\nstanding_vf_wait = 5\n"
SUPPORTED = {f"nvidia-{t.type_id}": (t.placement_size, t.placements) for t in L40S_VGPU_TYPES}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("mixed"), ["nvidia-vfio"], gpus=1,
                        vfs=8) as host:
        yield host


def layout(vgpus=MIXED, name: str = "mix") -> GpuLayout:
    return GpuLayout(name, (GPU,), tuple(vgpus))


@contextlib.contextmanager
def agent(host, vgpus=MIXED) -> Iterator[AgentCore]:
    """The daemon's core over a manager on the simulated host, with the
    layout in its policy (its config sections are read by check-config's
    and the policy's code; here the policy is given whole)."""
    host.reset()
    with agent_on(host, vgpus) as core:
        yield core


@contextlib.contextmanager
def agent_on(host, vgpus=MIXED) -> Iterator[AgentCore]:
    """:func:`agent` on the host as it is (its ledger, its devices)."""
    manager = host.manager(INI)
    manager.set_policy(dataclasses.replace(manager.policy, gpu_layouts=(layout(vgpus),)))
    conf = make_conf(INI + f"\n[DEFAULT]\nstate_dir = {host.state_dir}\n", sysfs_root=host.root)
    try:
        yield AgentCore(conf, manager=manager)
    finally:
        manager.ledger.close()


def gpu_state(host) -> dict:
    (gpu,) = [g for g in host.sim.status()["nvidia_gpus"] if g["address"] == GPU]
    return gpu


def on_host(host) -> dict[str, tuple[str, int]]:
    """VF -> (type, placement) as the simulated driver holds them."""
    return {v["vf"]: (f"nvidia-{v['type_id']}", v["placement_id"])
            for v in gpu_state(host)["vgpus"]}


def recorded(host) -> dict[str, tuple[str, int | None]]:
    """VF -> (type, placement) as the ledger file records them."""
    return {parent: (device_type, pid) for parent, device_type, pid in ledger_sql.query(
        host.state_dir, "SELECT parent, mdev_type, placement_id FROM mdevs")}


def assert_complete(host, vgpus=MIXED) -> None:
    """The GPU carries the layout: mixed-size mode on, each vGPU of it on a
    placement its type supports, none overlapping, each as recorded."""
    state = gpu_state(host)
    assert state["heterogeneous"] is True
    placed = on_host(host)
    assert sorted(t for t, _ in placed.values()) == sorted(t for t, n in vgpus for _ in range(n))
    spans = []
    for device_type, pid in placed.values():
        size, supported = SUPPORTED[device_type]
        assert pid in supported, (device_type, pid)
        spans.append(range(pid, pid + size))
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            assert not (a.start < b.stop and b.start < a.stop), placed
    assert recorded(host) == placed


def test_a_mixed_layout_comes_up_complete_and_again_after_reboot_reload_and_vf_enable(sim):
    with agent(sim) as core:
        core.startup()
        assert_complete(sim)
        first = on_host(sim)
        health = core.health()
        assert health["layout"]["short"] == {}, health["layout"]
        # The largest first, each on the lowest id left (devices/placements.py).
        assert sorted(first.values()) == [(Q4, 36), (Q4, 40), (Q12, 24), (Q24, 0)]
        uuids = {r.uuid for r in ledger_sql.rows(sim.state_dir)}

        # A reboot: every VF untyped, the mode lost; recovery sets the mode,
        # then re-types the same VFs, each back on its placement.
        sim.sim.reboot()
        assert gpu_state(sim)["heterogeneous"] is False
        core.rescan()
        assert_complete(sim)
        assert on_host(sim) == first
        assert {r.uuid for r in ledger_sql.rows(sim.state_dir)} == uuids

        # A driver reload: no VF until they are enabled again, which clears the
        # mode: the agent never sets it on a GPU without VFs, and sets it again
        # once they are there.
        sim.sim.driver_reload()
        core.rescan()
        assert gpu_state(sim)["heterogeneous"] is False  # not before the VFs
        assert on_host(sim) == {}
        sim.sim.enable_vfs("ALL")
        core.rescan()
        assert_complete(sim)
        assert on_host(sim) == first

        # A reboot with the VFs disabled, then NVIDIA's sriov-manage -e.
        sim.sim.reboot(vfs_disabled=True)
        core.rescan()
        sim.sim.enable_vfs("ALL")
        core.rescan()
        assert_complete(sim)
        assert on_host(sim) == first
        assert core.health()["layout"]["short"] == {}


def test_the_start_waits_for_the_vfs_then_sets_the_mode_and_the_layout(sim):
    """A boot where NVIDIA's nvidia-sriov.service enables the VFs after the
    agent started: the start waits for them ([devices] standing_vf_wait),
    then sets the mode (never before the VFs) and makes the layout before
    it is ready."""
    with agent(sim) as core:
        core.conf.set_override("standing_vf_wait", 120, group="devices")
        sim.sim.reboot(vfs_disabled=True)
        enabled: list[bool] = []

        def enable_when_waited() -> None:
            # Once the start waits for the GPU's VFs (the mode still off).
            deadline = time.monotonic() + 60
            waited = False
            while not waited and time.monotonic() < deadline:
                phase = core.starting.current()
                waited = phase is not None and phase.phase == starting.WAITING_FOR_VFS
                time.sleep(0.05)
            enabled.append((waited, gpu_state(sim)["heterogeneous"]))
            sim.sim.enable_vfs("ALL")

        core.starting.begin()  # as the daemon does: the phases are told
        helper = threading.Thread(target=enable_when_waited, daemon=True)
        helper.start()
        core.startup()
        helper.join(60)
        assert enabled == [(True, False)]  # it waited, and set no mode meanwhile
        assert_complete(sim)
        assert core.health()["layout"]["missing_gpus"] == []


@contextlib.contextmanager
def held_open(host, vf: str):
    """A guest holds the VF (its VFIO group node open, as QEMU does; Nova's
    PCI passthrough hands a layout's VF to a guest without the agent)."""
    group = os.path.basename(os.readlink(os.path.join(host.root, "bus/pci/devices", vf,
                                                      "iommu_group")))
    fd = os.open(os.path.join(host.root, "vfio", group), os.O_RDONLY)
    try:
        yield
    finally:
        os.close(fd)


def test_a_layout_change_drains_without_retyping_or_moving_a_device_in_use(sim):
    with agent(sim) as core:
        core.startup()
        assert_complete(sim)
        first = on_host(sim)
        vf = next(v for v, (t, _) in first.items() if t == Q12)
        held = next(u for u, p in ledger_sql.query(sim.state_dir, "SELECT uuid, parent FROM mdevs")
                    if p == vf)
        # A driver that destroys a vGPU under its guest instead of refusing:
        # only the agent's own in-use check protects the guest.
        sim.sim.accept_held_vgpu_destroy(True)
        writes = len(sim.sim.status()["vgpu_writes"])
        new = ((Q24, 1), (Q8, 2), (Q4, 2))  # no 12Q any more, two 8Q
        with held_open(sim, vf):
            core.devices.set_policy(dataclasses.replace(core.devices.policy,
                                                        gpu_layouts=(layout(new),)))
            core.rescan()
            core.rescan()
            # The guest's 12Q is untouched, its placement kept: it drains.
            assert on_host(sim) == first
            assert not [w for w in sim.sim.status()["vgpu_writes"][writes:] if w["vf"] == vf]
            assert core.health()["layout"]["draining"] == [held]
            # With the 12Q kept at 24..36 the two 8Q fit nowhere: nothing else
            # changed either, and health says why.
            short = core.health()["layout"]["short"][GPU]
            assert short["mdev_type"] == "gpu_layout_mix" and "does not fit" in short["reason"]
        # The guest let go: the 12Q goes, the layout is placed anew (an idle
        # 4Q where the new plan has none is removed first).
        core.rescan()
        assert_complete(sim, new)
        assert core.health()["layout"]["draining"] == []
        assert core.health()["layout"]["short"] == {}
        assert not [w for w in sim.sim.status()["vgpu_writes"][writes:] if w["held"]]
        # A reboot now re-creates them in the ledger's order, the kept 4Q
        # first after the 24Q: the driver puts it at 24, recovery puts it back.
        placed = on_host(sim)
        sim.sim.reboot()
        core.rescan()
        assert_complete(sim, new)
        assert on_host(sim) == placed


class _NotSticking:
    """NVML of a driver that answers a mode write with success and keeps
    the mode off (what only a read-back can see)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def set_heterogeneous_mode(self, gpu: str, enabled: bool) -> bool:
        return True


def test_a_mode_that_does_not_read_back_leaves_the_gpu_short_and_untyped(sim):
    with agent(sim) as core:
        core.devices.nvml = _NotSticking(core.devices.nvml)
        writes = len(sim.sim.status()["vgpu_writes"])
        core.startup()
        assert gpu_state(sim)["heterogeneous"] is False
        assert sim.sim.status()["vgpu_writes"][writes:] == []  # no type written
        short = core.health()["layout"]["short"][GPU]
        assert "mixed-size mode reads back off" in short["reason"], short
        assert core.health()["status"] == "degraded"


def test_a_gpu_holding_a_vgpu_of_its_own_is_short_in_use_and_left_alone(sim):
    """The mode can be set only while the GPU holds no vGPU: a foreign one
    (typed by hand before the agent) keeps the layout off, said in health."""
    with agent(sim) as core:
        vf = "0000:c1:00.4"
        with open(os.path.join(sim.root, "bus/pci/devices", vf, "nvidia/current_vgpu_type"),
                  "w") as handle:
            handle.write("1150")
        core.startup()
        assert gpu_state(sim)["heterogeneous"] is False
        assert on_host(sim) == {vf: (Q4, 0)}
        short = core.health()["layout"]["short"][GPU]
        assert "mixed-size mode cannot be set" in short["reason"], short
        assert vf in short["reason"]


def test_a_placement_moved_behind_the_agent_s_back_is_put_back(sim):
    with agent(sim) as core:
        core.startup()
        vf, (device_type, pid) = min(on_host(sim).items(), key=lambda kv: kv[1][1])
        assert (device_type, pid) == (Q24, 0)
        # Someone moves the 24Q onto ids the plan left free (the driver takes any).
        with open(os.path.join(sim.root, "bus/pci/devices", vf, "nvidia/vgpu_params"),
                  "w") as handle:
            handle.write("vgpu-placement-id=24")
        assert on_host(sim)[vf] == (Q24, 24)
        core.rescan()
        assert_complete(sim)
        assert on_host(sim)[vf] == (Q24, 0)


def test_nvml_unavailable_is_the_reason_the_gpu_is_short(sim):
    from accel_agent.nvml.base import Unavailable

    with agent(sim) as core:
        core.devices.nvml = Unavailable(sim.root, "no NVIDIA driver here (test)")
        core.startup()
        assert on_host(sim) == {}
        short = core.health()["layout"]["short"][GPU]
        assert short["reason"].startswith("NVML unavailable"), short
        with pytest.raises(exception.NvmlNotAvailable):
            core.devices.nvml.heterogeneous_mode(GPU)


# --- a kill at every crash point of the order ------------------------------------------


def _child(host, kill: Point | None, record: str | None = None) -> int:
    """Bring the layout up in a forked process killed at ``kill`` (crash_points.py)."""

    def build(on_step: StepKiller) -> DeviceManager:
        manager = host.manager(INI, on_step=on_step)
        manager.set_policy(dataclasses.replace(manager.policy, gpu_layouts=(layout(),)))
        return manager

    return recover_in_child(build, kill, record)


@pytest.mark.filterwarnings("ignore:Using fork")  # the child never runs eventlet
@pytest.mark.parametrize("reboot_first", [False, True], ids=["first-start", "after-reboot"])
def test_a_kill_at_any_step_of_the_order_is_recovered_to_the_whole_layout(
    sim, tmp_path, reboot_first
):
    """Issue 36's order killed between any two of its steps (the mode set,
    each intent, each type, each placement, each assignment; after a reboot
    each re-created type and placement): the next start brings the GPU to its
    whole layout, every placement as recorded and read back, nothing leaked,
    and a second recovery changes nothing."""
    points = points_of_a_bring_up(sim, _child, str(tmp_path / "steps"), reboot_first)
    names = {s for s, _ in points}
    order = {"layout.mode_set", "recover.typed" if reboot_first else "allocate.typed"}
    assert order <= names, names
    for kill in points:
        kill_bring_up_at(sim, _child, kill, reboot_first)
        with agent_on(sim) as core:
            core.startup()
            assert_complete(sim)
            assert_nothing_leaked_and_settled(sim, core, on_host, kill)


def test_a_destination_claim_takes_a_layout_vgpu_on_its_planned_placement(sim):
    """Issue 36 item 7: a live migration's destination claim on a mixed
    layout's GPU gets a vGPU of the same type on a placement that fits: the
    layout's own, planned and read back; it never makes one beyond the
    layout (which could only land on a taken placement), and a claim the
    layout has no more of is refused with nothing changed."""
    sim.reset()
    ini = (f"[devices]\nstanding_vf_wait = 5\nenabled_mdev_types = {Q24}, {Q12}, {Q4}\n"
           f"enabled_gpu_layouts = mix\n[gpu_layout_mix]\ngpus = {GPU}\n"
           f"vgpus = {Q24}:1, {Q12}:1, {Q4}:2\n")
    manager = sim.manager(ini)
    assert manager.policy.gpu_layouts == (layout(),)  # read from its sections
    conf = make_conf(ini + f"\n[DEFAULT]\nstate_dir = {sim.state_dir}\n", sysfs_root=sim.root)
    with contextlib.closing(manager.ledger):
        core = AgentCore(conf, manager=manager)
        core.startup()
        before = on_host(sim)
        source = "6c8f2a4e-1b3d-4e5f-8a9b-0c1d2e3f4a5b"  # the source host's vGPU
        mapping = core.devices.claim("vm-moving", {source: Q12}, expires_at=time.time() + 3600)
        (uuid,) = mapping.values()
        (row,) = [r for r in ledger_sql.rows(sim.state_dir) if r.uuid == uuid]
        assert row.mdev_type == Q12 and row.owner == "vm-moving"
        # Its VF already carried the 12Q at the layout's placement: nothing moved.
        assert on_host(sim) == before
        assert on_host(sim)[row.parent] == (Q12, 24)
        assert_complete(sim)
        # The layout has one 12Q: a second claim of it is refused, nothing made.
        with pytest.raises(exception.AccelAgentException):
            core.devices.claim("vm-second", {source: Q12}, expires_at=time.time() + 3600)
        # Two 4Q: a claim of three is refused, though the driver would still
        # take a 4Q in the 4 units the layout leaves free (at 44): a vGPU
        # there is outside the plan, where the driver put it.
        sources = {f"6c8f2a4e-1b3d-4e5f-8a9b-0c1d2e3f4a5{i}": Q4 for i in range(3)}
        with pytest.raises(exception.AccelAgentException):
            core.devices.claim("vm-third", sources, expires_at=time.time() + 3600)
        assert on_host(sim) == before
        assert_complete(sim)
