"""A standing layout's device that a consumer outside the agent uses
(issue 23's "in use"): health's ``layout.in_use`` and the
``accel_agent_layout_in_use`` gauge, through the real daemon on the FUSE
simulator's NVIDIA vGPU 17+ GPUs.

What is in use is decided here, independently of the agent: this process
holds a device's VFIO group node open, as a guest's QEMU does (Nova, with
``reported_by = nova``, hands the VF to a guest without the agent knowing).
Each change is seen after the converge of the rescan a reload asks for.
"""

from __future__ import annotations

import os

import pytest

from tests.functional.daemon_fixture import sim_agent, wait_for
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
TYPE = "nvidia-1150"
BODY = (
    f"[devices]\nenabled_mdev_types = {TYPE}\n"
    f"[mdev_{TYPE}]\ndevice_addresses = {GPU1}, {GPU2}\nstanding = 2\nreported_by = nova\n"
)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("in-use"), ["nvidia-vfio"], gpus=2,
                        vfs=4) as host:
        yield host


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
    with sim_agent(sim, tmp_path, BODY) as agent:
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
        finally:
            os.close(group)
        # Let go: the next converge counts none.
        layout = converged(agent, 0)
        assert layout["in_use_by_gpu"] == {GPU1: 0, GPU2: 0}
        assert in_use_gauge(agent) == 0
