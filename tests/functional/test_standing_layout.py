"""Standing layouts (``[mdev_<type>] standing = N``, issue 23) through the real
daemon and its privsep helper on the FUSE simulator's NVIDIA vGPU 17+ GPUs.

Every outcome is read from two independent sources: the simulated sysfs
(which VFs carry a vGPU type) and the ledger file (plain SQL).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.daemon.core import AgentCore
from accel_agent.daemon.reloads import refusal_reason
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from tests import ledger_sql
from tests.configutil import make_conf
from tests.functional.daemon_fixture import (
    AgentDaemon,
    agent_config,
    ctl,
    short_dir,
    sim_agent,
    wait_for,
)
from tests.functional.killharness import typed_vfs
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.refusals import assert_said_by_all, check_and_agent_check, daemon_conf, start
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
TYPE = "nvidia-1150"


def body(standing: int, reported_by: str = "agent", wait: int = 60) -> str:
    return (
        f"[devices]\nenabled_mdev_types = {TYPE}\nstanding_vf_wait = {wait}\n"
        f"[mdev_{TYPE}]\ndevice_addresses = {GPU1}, {GPU2}\nstanding = {standing}\n"
        f"reported_by = {reported_by}\n"
    )


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("standing"), ["nvidia-vfio"], gpus=2,
                        vfs=4) as host:
        yield host


def typed_per_gpu(host) -> dict[str, int]:
    """GPU -> how many of its VFs carry a vGPU type, from sysfs."""
    counts = {GPU1: 0, GPU2: 0}
    for vf, value in typed_vfs(host.root).items():
        if value:
            counts[vf[:8] + "00.0"] += 1
    return counts


def owners(host) -> dict[str, tuple[str | None, str | None]]:
    """uuid -> (owner, owner kind), from the ledger file."""
    return {r.uuid: (r.owner, r.owner_kind) for r in ledger_sql.rows(host.state_dir)}


def test_the_layout_stands_before_ready_and_allocations_take_it_without_adding(sim, tmp_path):
    with sim_agent(sim, tmp_path, body(2)) as agent:
        agent.daemon.start()
        # READY came after the layout: 2 typed VFs per GPU, all the layout's.
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        assert set(owners(sim).values()) == {("layout", "standing")}
        api = agent.daemon.client()
        listed = {m["uuid"]: m for m in api.mdevs()["mdevs"]}
        assert all(listed[u]["standing"] for u in owners(sim))
        got = api.allocate("vm-a", 3, mdev_type=TYPE)
        uuids = [m["uuid"] for m in got["mdevs"]]
        assert set(uuids) <= set(owners(sim))  # standing devices, no new one
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        api.allocate("vm-b", 1, mdev_type=TYPE)
        with pytest.raises(exception.ApiError) as refused:
            api.allocate("vm-c", 1, mdev_type=TYPE)  # never beyond the layout
        assert refused.value.kwargs["status"] == 409
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        # Release, even --remove: the devices stay, the layout's again.
        api.release("vm-a", remove=True)
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        assert {owners(sim)[u] for u in uuids} == {("layout", "standing")}


def reload(agent, standing: int, reported_by: str = "agent") -> None:
    """A new config and SIGHUP; returns once the daemon applied it (its log)."""
    before = agent.daemon.log().count("configuration reloaded")
    agent.body = body(standing, reported_by)
    agent.write()
    agent.daemon.sighup()
    deadline = time.monotonic() + 60
    while agent.daemon.log().count("configuration reloaded") == before:
        assert time.monotonic() < deadline, agent.daemon.log()[-3000:]
        time.sleep(0.1)


def settle(agent, sim, expected: dict[str, int]) -> None:
    """Until sysfs shows ``expected`` typed VFs per GPU (the rescan a reload
    asks for converges the layout), or a minute passed."""
    deadline = time.monotonic() + 60
    while typed_per_gpu(sim) != expected and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_lower_standing_drains_and_never_retypes_a_device_in_use(sim, tmp_path):
    with sim_agent(sim, tmp_path, body(2)) as agent:
        agent.daemon.start()
        api = agent.daemon.client()
        held = api.allocate("vm-a", 2, mdev_type=TYPE, parent=GPU1)["mdevs"]
        mine = {m["uuid"] for m in held}
        assert {m["parent"][:8] + "00.0" for m in held} == {GPU1}
        # N 2 -> 1: GPU2 loses a free layout device; GPU1's two are vm-a's:
        # one drains, none goes while vm-a holds it.
        reload(agent, 1)
        settle(agent, sim, {GPU1: 2, GPU2: 1})
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 1}
        assert {u for u, (o, _) in owners(sim).items() if o == "vm-a"} == mine
        listed = {m["uuid"]: m for m in api.mdevs()["mdevs"]}
        assert sum(listed[u]["draining"] for u in mine) == 1
        # Released: one goes back to the layout, the drained one is removed.
        api.release("vm-a")
        assert typed_per_gpu(sim) == {GPU1: 1, GPU2: 1}
        assert set(owners(sim).values()) == {("layout", "standing")}
        # standing = 0: every layout device goes.
        reload(agent, 0)
        settle(agent, sim, {GPU1: 0, GPU2: 0})
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0}
        assert owners(sim) == {}


def test_a_layout_device_a_vm_holds_drains_until_the_vm_lets_go(sim, tmp_path):
    with sim_agent(sim, tmp_path, body(1, "nova")) as agent:
        agent.daemon.start()
        api = agent.daemon.client()
        listed = {m["address"]: m for m in api.mdevs()["mdevs"]}
        vf = min(a for a in listed if a.startswith(GPU1[:8]))
        assert {m["in_use"] for m in listed.values()} == {False}
        # Nova's guest has it: a process (this one, as QEMU would) holds its
        # VFIO group open; the agent sees it in /proc, never by opening it.
        group = os.open(os.path.join(sim.root, "vfio", str(listed[vf]["iommu_group"])),
                        os.O_RDONLY)
        try:
            listed = {m["address"]: m for m in api.mdevs()["mdevs"]}
            assert listed[vf]["in_use"] is True
            assert [a for a, m in listed.items() if m["in_use"]] == [vf]
            reload(agent, 0)
            settle(agent, sim, {GPU1: 1, GPU2: 0})
            assert typed_per_gpu(sim) == {GPU1: 1, GPU2: 0}
            (left,) = api.mdevs()["mdevs"]
            assert left["address"] == vf and left["draining"] and not left["standing"]
            assert left["in_use"] is True
            assert agent.daemon.health()["layout"]["draining"] == [left["uuid"]]
            assert agent.daemon.metric("accel_agent_layout_draining") == 1
        finally:
            os.close(group)
        reload(agent, 0)  # a rescan converges again (so does the periodic one)
        settle(agent, sim, {GPU1: 0, GPU2: 0})
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0}
        assert owners(sim) == {}
        wait_for(lambda: agent.daemon.metric("accel_agent_layout_draining") == 0,
                 what="the draining gauge back to 0")


def in_use_gauge(agent) -> float | None:
    """``accel_agent_layout_in_use{mdev_type=TYPE}``; None when it has no sample."""
    text = agent.daemon.client().call("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(f'accel_agent_layout_in_use{{mdev_type="{TYPE}"}} '):
            return float(line.rpartition(" ")[2])
    return None


def converged(agent, in_use: int):
    """A converge (the rescan a reload asks for) until health says ``in_use``:
    the section once it does."""
    agent.daemon.client().call("POST", "/v1/reload")
    return wait_for(
        lambda: (layout := agent.daemon.health()["layout"])["in_use"] == in_use and layout,
        what=f"health's layout in_use to be {in_use}",
    )


def test_a_layout_device_a_guest_holds_is_in_use_in_health_and_the_gauge(sim, tmp_path):
    """Issue 23's "in use" in health's ``layout.in_use`` and the
    ``accel_agent_layout_in_use`` gauge.  What is in use is decided here,
    independently of the agent: this process holds a device's VFIO group
    node open, as a guest's QEMU does (Nova, with ``reported_by = nova``,
    hands the VF to a guest without the agent knowing).  Each change is seen
    after the converge of the rescan a reload asks for."""
    with sim_agent(sim, tmp_path, body(2, "nova")) as agent:
        agent.daemon.start()
        layout = agent.daemon.health()["layout"]
        assert (layout["in_use"], layout["in_use_by_type"], layout["in_use_by_gpu"]) == (
            0, {TYPE: 0}, {GPU1: 0, GPU2: 0})
        assert in_use_gauge(agent) == 0
        devices = agent.daemon.client().mdevs()["mdevs"]
        assert len(devices) == 4 and all(d["standing"] for d in devices)
        device = min((d for d in devices if d["physical_gpu"] == GPU1),
                     key=lambda d: d["address"])
        # A guest's QEMU has it: its group node open in this process.
        group = os.open(os.path.join(sim.root, "vfio", str(device["iommu_group"])),
                        os.O_RDONLY)
        try:
            layout = converged(agent, 1)
            assert layout["in_use_by_type"] == {TYPE: 1}
            assert layout["in_use_by_gpu"] == {GPU1: 1, GPU2: 0}
            assert in_use_gauge(agent) == 1
            # In use is not a problem: the layout stands, nothing drains.
            health = agent.daemon.health()
            assert health["status"] == "ok", health["problems"]
            assert health["layout"]["draining"] == []
            # accelctl status: one row per GPU, from health and the listing.
            status = ctl(agent.config, "status", "--json")
            assert status.returncode == 0, status.stderr
            rows = {row["gpu"]: row for row in json.loads(status.stdout)["layouts"]}
            assert rows == {gpu: {
                "gpu": gpu, "mdev_type": TYPE, "standing": 2, "present": 2,
                "in_use": int(gpu == GPU1), "draining": 0, "short": 0, "missing": False,
            } for gpu in (GPU1, GPU2)}
            screen = ctl(agent.config, "status").stdout
            assert screen.startswith("status: ok\n") and "standing layouts:" in screen
            assert any(line.split() == [GPU1, TYPE, "2", "2", "1", "0", "0"]
                       for line in screen.splitlines()), screen
        finally:
            os.close(group)
        # Let go: the next converge counts none.
        layout = converged(agent, 0)
        assert layout["in_use_by_gpu"] == {GPU1: 0, GPU2: 0}
        assert in_use_gauge(agent) == 0


def test_reported_by_nova_is_made_but_never_handed_out_nor_reported(sim, tmp_path):
    with sim_agent(sim, tmp_path, body(1, "nova")) as agent:
        agent.daemon.start()
        assert typed_per_gpu(sim) == {GPU1: 1, GPU2: 1}
        api = agent.daemon.client()
        with pytest.raises(exception.ApiError) as refused:
            api.allocate("vm-a", 1, mdev_type=TYPE)
        assert refused.value.kwargs["status"] == 409
        assert "reported_by = nova" in str(refused.value)
        assert api.inventory()["providers"] == []
        assert set(owners(sim).values()) == {("layout", "standing")}
        # Nova's [pci] lines: exactly the layout's typed VFs, even asked for more.
        document = json.loads(ctl(agent.config, "nova-pci-config", "--json", "--per-gpu",
                                  "4").stdout)
        typed = sorted(vf for vf, value in typed_vfs(sim.root).items() if value)
        assert [s["address"] for s in document["device_spec"]] == typed
        assert all(v["typed"] for v in document["vfs"])
        # Nova counts these GPUs alone: the printed lines check clean.
        conf = agent.config.parent / "nova.conf"
        conf.write_text(ctl(agent.config, "nova-pci-config").stdout)
        checked = ctl(agent.config, "nova-pci-config", "--check", str(conf))
        assert checked.returncode == 0, checked.stderr
        assert "matches the 2 vGPU VF(s)" in checked.stdout


def test_after_a_reboot_with_vfs_disabled_the_layout_waits_for_them_before_ready(
    sim, tmp_path
):
    with sim_agent(sim, tmp_path, body(2, wait=120)) as agent:
        agent.daemon.start()
        before = dict(owners(sim))
        agent.daemon.stop()
        sim.sim.reboot(vfs_disabled=True)
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0}
        agent.daemon.spawn()
        # The agent waits for the VFs (nvidia-sriov.service's job); enable
        # them once it says so, from another thread than the one waiting.
        deadline = time.monotonic() + 60
        while "waiting up to" not in agent.daemon.log() and time.monotonic() < deadline:
            assert agent.daemon.running, agent.daemon.log()[-3000:]
            time.sleep(0.1)
        assert "READY=1" not in agent.daemon.read_notifications()
        answers_while_it_waits(agent)
        assert "READY=1" not in agent.daemon.read_notifications()
        enabler = threading.Thread(target=sim.sim.enable_vfs, args=("ALL",))
        enabler.start()
        agent.daemon.wait_ready()
        enabler.join()
        # The layout was placed before READY, not by a rescan after it.
        log = agent.daemon.log()
        assert "every configured GPU is there" in log, log[-3000:]
        assert log.rindex("every configured GPU is there") < log.rindex(" ready: API on")
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        # The same devices: recovery re-created the recorded ones.
        assert owners(sim) == before


def answers_while_it_waits(agent) -> None:
    """Issue 34 item 3: during the wait for the VFs (minutes with
    standing_vf_wait = 120), accelctl health says starting and what it waits
    for, a listing answers, and a change is refused naming the wait instead
    of hanging until "overloaded or stuck"."""
    health = ctl(agent.config, "health", "--json")
    assert health.returncode == 0, health.stderr
    document = json.loads(health.stdout)
    assert document["status"] == "starting", document
    assert document["starting"]["phase"] == "waiting for VFs"
    assert document["starting"]["waiting_for"] == [GPU1, GPU2]
    text = ctl(agent.config, "health")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(
        f"status: starting: waiting for VFs of GPU(s) {GPU1}, {GPU2}"), text.stdout
    listed = ctl(agent.config, "mdevs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["mdevs"] == []  # the VFs (and their vGPUs) are not there
    refused = ctl(agent.config, "allocate", "vm-early", "--count", "1")
    assert refused.returncode == 1
    assert f"error: starting: waiting for VFs of GPU(s) {GPU1}, {GPU2}" in refused.stderr


def test_a_second_agent_on_the_same_host_is_refused_before_it_touches_a_device(sim, tmp_path):
    """Issue 33 item 5: a second agent on the same sysfs root, with a state
    directory (and socket) of its own, would type VFs the first one then
    finds foreign.  It is refused by the host-wide lock, naming the first
    agent, before it wrote anything: the same typed VFs and devices."""
    with sim_agent(sim, tmp_path, body(2)) as first:
        first.daemon.start()
        typed, devices = typed_vfs(sim.root), sim.sysfs_uuids()
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        other_state = tmp_path / "second-state"
        (tmp_path / "second").mkdir()
        with short_dir() as sockdir:
            socket_path = str(sockdir / "api.sock")
            config = agent_config(tmp_path / "second.conf", sim.root, str(other_state),
                                  socket_path, body(2))
            second = AgentDaemon(config, socket_path, tmp_path / "second")
            try:
                assert second.spawn().wait(90) == 1
            finally:
                second.close()
            log = second.log()
            assert (f"another accel-agent (pid {first.daemon.pid}, config {first.config}) "
                    f"already uses the sysfs root {os.path.realpath(sim.root)}") in log, log
            assert not os.path.exists(socket_path)
        assert typed_vfs(sim.root) == typed and sim.sysfs_uuids() == devices
        assert not (other_state / "ledger.sqlite3").exists()
        assert first.daemon.health()["status"] == "ok"


def test_a_start_refused_on_a_busy_metrics_port_changed_nothing_on_the_host(sim, tmp_path):
    """Issue 33 item 5: the [metrics] listen port is taken before recovery
    and the layouts: a start it refuses typed no VF and made no ledger."""
    with socket.socket() as busy, sim_agent(sim, tmp_path, body(2)) as agent:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        agent.write(extra=f"[metrics]\nlisten = 127.0.0.1:{port}\n")
        assert agent.daemon.spawn().wait(90) == 1
        log = agent.daemon.log()
        assert f"[metrics] listen = 127.0.0.1:{port}" in log, log[-3000:]
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0}
        assert sim.sysfs_uuids() == set()
        assert not os.path.exists(os.path.join(sim.state_dir, "ledger.sqlite3"))
        # The daemon's own start past its check (which refused above, before
        # the start ran): the port is taken before recovery and the layouts.
        said = start(agent.config, sim.root)
        assert any(f"[metrics] listen = 127.0.0.1:{port}" in line for line in said), said
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0}
        assert not os.path.exists(os.path.join(sim.state_dir, "ledger.sqlite3"))


def test_a_gpu_whose_layout_fails_keeps_no_other_gpu_without_its_layout(sim):
    """One GPU's converge failing (a VF the driver refuses to type: EIO) is
    that GPU's problem: the GPUs after it get their layouts in the same
    converge, and the failed one gets its own at the next."""
    sim.reset()
    manager = sim.manager(body(2))
    try:
        sim.sim.fail_next_vgpu_write("EIO", vf="0000:c1:00.4", type_id=1150)
        report = manager.converge_layout()
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 2}
        assert list(report.failed) == [GPU1] and "EIO" in report.failed[GPU1].upper()
        again = manager.converge_layout()
        assert again.converged and typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
    finally:
        manager.ledger.close()


def types_per_gpu(host) -> dict[str, list[int]]:
    """GPU -> the vGPU type of each of its typed VFs, from sysfs."""
    found: dict[str, list[int]] = {GPU1: [], GPU2: []}
    for vf, value in sorted(typed_vfs(host.root).items()):
        if value:
            found[vf[:8] + "00.0"].append(value)
    return found


def moved(gpu1: tuple[str, int], gpu2: tuple[str, int]) -> str:
    """A configuration giving each GPU its own (type, standing)."""
    types = sorted({gpu1[0], gpu2[0]})
    sections = "".join(
        f"[mdev_{t}]\ndevice_addresses = "
        + ", ".join(g for g, (gt, _) in ((GPU1, gpu1), (GPU2, gpu2)) if gt == t)
        + f"\nstanding = {max(n for gt, n in (gpu1, gpu2) if gt == t)}\n"
        for t in types
    )
    return f"[devices]\nenabled_mdev_types = {', '.join(types)}\n{sections}"


def test_a_gpu_moved_to_another_type_is_cleared_then_given_the_new_layout(sim):
    """Moving a GPU to another type (issue 23: "one device at a time", never
    a device in use): its free devices and its layout's devices of the old
    type go, and the new type's layout is made in the same converge.  An L40S
    takes one vGPU size at a time (the homogeneous rule), so nothing of the
    new type fits until the last device of the old one is gone: the converge
    must plan on what the host has after those removals, not before."""
    sim.reset()
    three_q = "nvidia-1149"  # L40S-3Q beside TYPE, L40S-4Q
    manager = sim.manager(body(0))
    try:
        # Two free 4Q devices on GPU1: an instance's, released without --remove.
        manager.allocate("vm-a", 2, parent=GPU1, device_type=TYPE)
        manager.release("vm-a")
        assert types_per_gpu(sim) == {GPU1: [1150, 1150], GPU2: []}
    finally:
        manager.ledger.close()
    # GPU1 moves to 3Q with a layout of 2; GPU2 gets a 4Q layout of 2.
    manager = sim.manager(moved((three_q, 2), (TYPE, 2)))
    try:
        report = manager.converge_layout()
        assert types_per_gpu(sim) == {GPU1: [1149, 1149], GPU2: [1150, 1150]}
        assert report.converged and len(report.removed) == 2
        assert set(owners(sim).values()) == {("layout", "standing")}
    finally:
        manager.ledger.close()
    # And back: each GPU's layout devices of the type it no longer has go first.
    manager = sim.manager(moved((TYPE, 1), (three_q, 3)))
    try:
        report = manager.converge_layout()
        assert types_per_gpu(sim) == {GPU1: [1150], GPU2: [1149, 1149, 1149]}
        assert report.converged and len(report.removed) == 4
        rows = ledger_sql.rows(sim.state_dir)
        assert sorted(r.mdev_type for r in rows) == [three_q] * 3 + [TYPE]
        assert {(r.owner, r.owner_kind) for r in rows} == {("layout", "standing")}
    finally:
        manager.ledger.close()


@pytest.mark.parametrize("new_body, words", [
    # Issue 33 item 12: Nova would list the VF the instance holds for its own guests.
    (body(2, "nova"), "reported_by = nova would hand it to Nova too"),
    # Another owner: GPU1 moves to another type's layout.
    (moved(("nvidia-1149", 2), (TYPE, 2)), "which would get type nvidia-1149"),
], ids=["reported-by-nova", "another-type"])
def test_a_configuration_that_hands_an_instance_s_vf_to_another_owner_is_refused_everywhere(
    sim, tmp_path, new_body, words
):
    """A VF the agent gave an instance, and a configuration that would give it
    to another owner: the reload is refused naming the instance (the running
    configuration kept), and check-config, ``accel-agent --check`` and the
    start refuse it in the same words (devices.recovery.owner_refusals, over
    the ledger the running agent writes, read read-only)."""
    sim.reset()
    with short_dir() as sockdir:
        extra = f"[api]\nsocket_path = {sockdir}/api.sock\n[libvirt]\nuri =\n"
        running = Path(sim.config(body(2) + extra, name="running.conf"))
        core = AgentCore(daemon_conf(running), writer=writers.DirectWriter(sim.root))
        try:
            core.startup()
            (held,) = core.devices.allocate("vm-a", 1, parent=GPU1, device_type=TYPE).uuids
            config = Path(sim.config(new_body + extra, name="new.conf"))
            with pytest.raises(exception.ReloadRefused) as refused:
                core.reload(daemon_conf(config))
            assert f"mdev {held} of instance vm-a" in refused.value.message
            assert words in refused.value.message
            assert core.devices.policy.reported_by_nova(TYPE) is False  # the old one kept
            check, agent_check = check_and_agent_check(config)  # beside the running core
        finally:
            core.close()
        said = start(config, sim.root)
    assert said == ["refusing to start: recovery needs a configuration change",
                    refusal_reason(refused.value)]
    assert_said_by_all(said, check, agent_check)
    assert owners(sim)[held] == ("vm-a", "instance")  # nothing changed
# --- in process: the daemon's core over the simulated host (no threads) ---------------------


class Periods:
    """The daemon's rescan scheduler as a test drives it: a period is one
    periodic rescan, then the rescans it asked for (``request_rescan``), as
    the scheduler would run them, at most ROUNDS of them: a layout that
    asks for a rescan at every converge never ends them."""

    ROUNDS = 5

    def __init__(self, core) -> None:
        self.core = core
        self.pending: set[str] = set()
        core.request_rescan = self.pending.add

    def run(self, periods: int = 1) -> None:
        for _ in range(periods):
            self.core.rescan(("periodic",))
            for _ in range(self.ROUNDS):
                if not self.pending:
                    break
                reasons = frozenset(self.pending)
                self.pending.clear()
                self.core.rescan(reasons)

    def asked(self) -> float:
        """Rescans run because an operation asked for one (reason "api")."""
        return self.core.metrics.value("accel_agent_rescans_total", {"reason": "api"})


@contextlib.contextmanager
def in_process(host, ini: str):
    """The daemon's core (health, listings, metrics, rescans) over a manager
    on the simulated host, with a DirectWriter (the privileged writes in
    this process, the same in-use probe)."""
    from accel_agent.daemon.core import AgentCore

    manager = host.manager(ini)
    conf = make_conf(ini + f"\n[DEFAULT]\nstate_dir = {host.state_dir}\n", sysfs_root=host.root)
    try:
        yield AgentCore(conf, manager=manager)
    finally:
        manager.ledger.close()


def configure(core, ini: str) -> None:
    """A new configuration in place (what an applied reload changes)."""
    conf = make_conf(ini, sysfs_root=core.devices.sysfs_root)
    core.devices.set_policy(policy_mod.build_policy(conf))


def listed(core) -> dict[str, dict]:
    return {m["uuid"]: m for m in json.loads(core.listings.mdevs_json())["mdevs"]}


def draining_listed(core) -> set[str]:
    return {uuid for uuid, m in listed(core).items() if m["draining"]}


@contextlib.contextmanager
def held_open(host, device: dict):
    """A VM holds ``device`` (its VFIO group node open, as QEMU does)."""
    fd = os.open(os.path.join(host.root, "vfio", str(device["iommu_group"])), os.O_RDONLY)
    try:
        yield
    finally:
        os.close(fd)


def kept_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "kept as a free vGPU VF instead of removed" in r.getMessage()]


def test_an_idle_layout_asks_for_no_rescan_and_says_a_refused_remove_once(sim, caplog):
    """Issue 33 (1): a converge that changes nothing asks for no rescan (the
    converge runs in every rescan: asking would make the next, for ever),
    nor does a remove refused because a VM holds the device, which is
    logged once, not at every converge.  Issue 34: the layout's devices
    are ``standing`` in the metrics, never an instance called "layout"."""
    sim.reset()
    with in_process(sim, body(1)) as core:
        periods = Periods(core)
        periods.run()  # places the layout: a change, one rescan asked for
        placed = periods.asked()
        periods.run(3)
        assert periods.asked() == placed, "an idle layout asked for rescans"
        assert core.metrics.value("accel_agent_mdevs", {"state": "standing"}) == 2
        assert core.metrics.value("accel_agent_mdevs", {"state": "assigned"}) == 0
        exposition = core.metrics.render()[0].decode()
        assert 'instance_id="layout"' not in exposition
        assert exposition.count('state="standing"') == 3  # the gauge and both devices' info
        # A VM holds GPU1's device; the layout goes (standing = 0): GPU2's is
        # removed, GPU1's drains, tried again at each converge until free.
        device = next(m for m in listed(core).values() if m["physical_gpu"] == GPU1)
        with held_open(sim, device), caplog.at_level(logging.DEBUG, "accel_agent.devices"):
            configure(core, body(0))
            periods.run()
            assert typed_per_gpu(sim) == {GPU1: 1, GPU2: 0}
            changed = periods.asked()
            periods.run(3)
            assert periods.asked() == changed, "a refused remove asked for rescans"
            assert len(kept_lines(caplog)) == 1, kept_lines(caplog)
            # Draining, both ways: the listing and health name it ...
            assert draining_listed(core) == set(core.health()["layout"]["draining"]) == {
                device["uuid"]}
        # ... and it is what goes once free.
        periods.run()
        assert typed_per_gpu(sim) == {GPU1: 0, GPU2: 0} and owners(sim) == {}
        assert core.health()["layout"]["draining"] == []


def test_draining_is_one_set_for_the_listing_health_and_the_release(sim):
    """Issue 33 (9): a lowered layout's extra devices an instance holds are
    named draining by the listing and health alike (one definition,
    devices/layout.py); the named one is removed when released, the other
    instance's goes back to the layout at once (no converge needed), and
    the name does not move meanwhile.  Issue 34: a planned drain is the
    status ``converging``, accel_agent_healthy 1."""
    sim.reset()
    with in_process(sim, body(2)) as core:
        periods = Periods(core)
        periods.run()
        devices = core.devices
        a = devices.allocate("vm-a", 1, parent=GPU1, device_type=TYPE).uuids[0]
        b = devices.allocate("vm-b", 1, parent=GPU1, device_type=TYPE).uuids[0]
        configure(core, body(1))  # 2 -> 1: GPU1 holds two instances' devices
        periods.run()
        named = draining_listed(core)
        health = core.health()
        assert set(health["layout"]["draining"]) == named
        assert len(named) == 1 and named <= {a, b}, named  # an instance's extra drains
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 1}  # GPU2's own extra is gone
        assert (health["status"], health["problem_kinds"]) == ("converging", ["layout_converging"])
        assert core.metrics.value("accel_agent_healthy") == 1
        assert core.metrics.value("accel_agent_layout_draining") == 1
        (drained,) = named
        kept = ({a, b} - named).pop()
        first, last = ("vm-a", "vm-b") if drained == b else ("vm-b", "vm-a")
        # The instance whose device is not named lets go first: the layout's
        # again at once, the same devices on the GPU.
        devices.release(first, remove=True)
        assert owners(sim)[kept] == ("layout", "standing")
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 1}
        periods.run()
        assert draining_listed(core) == set(core.health()["layout"]["draining"]) == named
        # The named one goes when released.
        devices.release(last)
        assert drained not in owners(sim) and drained not in listed(core)
        assert owners(sim)[kept] == ("layout", "standing")
        assert typed_per_gpu(sim) == {GPU1: 1, GPU2: 1}
        periods.run()
        health = core.health()
        assert (health["status"], health["layout"]["draining"]) == ("ok", [])
        assert core.metrics.value("accel_agent_layout_draining") == 0


def test_a_type_nova_reports_is_never_handed_out_by_class_nor_as_any_type(sim):
    """Issue 33 (14): a ``reported_by = nova`` type is Nova's to assign: an
    attach by its resource class and an allocate of any type are refused,
    and the layout keeps every device."""
    from accel_agent.devices.requests import DeviceRequest

    sim.reset()
    manager = sim.manager(body(1, "nova"))
    try:
        manager.converge_layout()
        before = owners(sim)
        assert set(before.values()) == {("layout", "standing")} and len(before) == 2
        (resource_class,) = {p.resource_class for p in manager.inventory().providers}
        with pytest.raises(exception.InsufficientCapacity) as by_class:
            manager.attach("vm-x", [DeviceRequest(1, resource_class=resource_class)])
        with pytest.raises(exception.InsufficientCapacity) as any_type:
            manager.allocate("vm-x", 1)
        assert owners(sim) == before
        # Issue 34: the refusal says why (the types are Nova's), not "insufficient
        # capacity for type any configured type on any configured parent".
        for refused, asked in ((by_class, f"class {resource_class}"), (any_type, "any type")):
            assert isinstance(refused.value, exception.OnlyNovaTypes)
            assert refused.value.message.startswith(
                f"no device of {asked} for the agent to hand out: the configured type(s) that "
                f"would serve it ({TYPE}) are reported_by = nova")
    finally:
        manager.ledger.close()


def test_vfs_disabled_at_boot_make_health_degraded_naming_the_gpus_after_the_wait(sim):
    """Issue 34: a layout GPU missing once ``standing_vf_wait`` expired is a
    problem in health (degraded, the GPUs named) and counted by
    accel_agent_layout_gpus_short (what AccelAgentLayoutGpusShort fires on),
    from the end of the wait until its VFs come and its layout is placed."""
    sim.reset()
    sim.sim.reboot(vfs_disabled=True)
    with in_process(sim, body(2, wait=1)) as core:
        core.startup()
        health = core.health()
        assert health["status"] == "degraded"
        assert health["layout"]["missing_gpus"] == [GPU1, GPU2]
        assert "layout_gpus_missing" in health["problem_kinds"]
        assert core.metrics.value("accel_agent_layout_gpus_short") == 2
        assert core.metrics.value("accel_agent_health_problem",
                                  {"problem": "layout_gpus_missing"}) == 1
        periods = Periods(core)
        periods.run()  # still missing: still said
        assert core.health()["layout"]["missing_gpus"] == [GPU1, GPU2]
        assert core.metrics.value("accel_agent_layout_gpus_short") == 2
        sim.sim.enable_vfs("ALL")
        periods.run()
        health = core.health()
        assert (health["status"], health["layout"]["missing_gpus"]) == ("ok", [])
        assert typed_per_gpu(sim) == {GPU1: 2, GPU2: 2}
        assert core.metrics.value("accel_agent_layout_gpus_short") == 0


def test_a_gpu_blocked_by_a_draining_device_of_its_old_type_is_short_in_health(sim):
    """Issue 34: a GPU moved to another type while a VM holds a device of the
    old one offers nothing of the new (one vGPU size per card): it is short
    of its layout, blocked, in health (degraded, the GPU and the device
    named) and in accel_agent_layout_gpus_short, until the VM lets go."""
    three_q = "nvidia-1149"
    sim.reset()
    with in_process(sim, moved((TYPE, 1), (TYPE, 1))) as core:
        periods = Periods(core)
        periods.run()
        device = next(m for m in listed(core).values() if m["physical_gpu"] == GPU1)
        with held_open(sim, device):
            configure(core, moved((three_q, 1), (TYPE, 1)))
            periods.run()
            health = core.health()
            assert health["layout"]["short"] == {GPU1: {
                "mdev_type": three_q, "standing": 1, "present": 0, "reason": "blocked",
                "blocked_by": [device["uuid"]],
            }}
            assert health["layout"]["draining"] == [device["uuid"]]
            assert health["status"] == "degraded"
            assert "layout_gpus_short" in health["problem_kinds"]
            assert core.metrics.value("accel_agent_layout_gpus_short") == 1
        periods.run()
        assert types_per_gpu(sim) == {GPU1: [1149], GPU2: [1150]}
        health = core.health()
        assert (health["status"], health["layout"]["short"]) == ("ok", {})
        assert core.metrics.value("accel_agent_layout_gpus_short") == 0
