"""MIG-backed layouts' configuration (``mig`` in ``[gpu_layout_<name>]``,
issue 37): the text read into the policy, each bad item one error naming the
section; and ``check-config``'s fit from the GPU's own profile table, asked
of the simulator's NVML (an H200: devices/gpu_layout_fit.py's ``mig_fit``,
over mig_plan's functions the converge plans with).  In process."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import pytest

from accel_agent import exception
from accel_agent.config import check
from accel_agent.devices import gpu_layout_fit
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.gpu_layout_config import LayoutOptions
from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.simulator import control, profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise
from tests.configutil import make_conf

H200, L4 = "0000:61:00.0", "0000:21:00.0"
# H200 MIG-backed types (profiles_nvidia.py): 1-18C on 1g.18gb, 3-71C on 3g.71gb.
G1, G3, SLICED = "nvidia-1414", "nvidia-1418", "nvidia-1421"
TYPES = f"{G1}, {G3}, {SLICED}"


def policy(ini: str) -> policy_mod.DevicePolicy:
    return policy_mod.build_policy(make_conf(ini, sysfs_root="/nonexistent"))


def section(vgpus: str, mig: str | None) -> str:
    return (f"[devices]\nenabled_mdev_types = {TYPES}\nenabled_gpu_layouts = mig\n"
            f"[gpu_layout_mig]\ngpus = {H200}\nvgpus = {vgpus}\n"
            + (f"mig = {mig}\n" if mig is not None else ""))


def test_mig_is_read_into_the_layout_and_a_layout_without_it_is_time_sliced():
    (found,) = policy(section(f"{G1}:3, {G3}:1", "1g.18gb:3, 3g.71gb:1")).gpu_layouts
    assert found == GpuLayout("mig", (H200,), ((G1, 3), (G3, 1)), "agent",
                              (("1g.18gb", 3), ("3g.71gb", 1)))
    assert found.is_mig
    (plain,) = policy(section(f"{SLICED}:2", None)).gpu_layouts
    assert plain.mig is None and not plain.is_mig


@pytest.mark.parametrize(("mig", "said"), [
    ("1g.18gb", "[gpu_layout_mig] mig item '1g.18gb' is not <profile>:<count>"),
    ("big:1", "[gpu_layout_mig] mig item 'big:1' is not <profile>:<count>"),
    ("1g.18gb:0", "[gpu_layout_mig] mig item '1g.18gb:0': the count must be an integer "
                  "from 1 to 7"),
    ("1g.18gb:8", "[gpu_layout_mig] mig item '1g.18gb:8': the count must be an integer "
                  "from 1 to 7"),
    ("1g.18gb:1, 1g.18gb:2", "[gpu_layout_mig] mig names 1g.18gb twice"),
])
def test_a_bad_mig_item_is_one_error_naming_the_section(mig, said):
    with pytest.raises(exception.ConfigErrors) as info:
        policy(section(f"{G1}:3", mig))
    (message,) = [e.message for e in info.value.errors]
    assert said in message, message


def test_the_policy_cache_carries_mig_and_reads_a_cache_written_before_it():
    options = LayoutOptions("mig", (H200,), (f"{G1}:3",), "agent", ("1g.18gb:3",))
    assert LayoutOptions.from_list(options.to_list()) == options
    # A cache of the issue-36 agent: four items, no mig.
    assert LayoutOptions.from_list(["mig", [H200], [f"{G1}:3"], "agent"]).mig == ()


# --- the fit, from the GPU's own table -------------------------------------------------------


@pytest.fixture
def host() -> SimulatedHost:
    return SimulatedHost(profiles.build_spec(["nvidia-h200", "nvidia-l4"], vfs=4))


def layout(vgpus, mig) -> GpuLayout:
    return GpuLayout("mig", (H200,), tuple(vgpus), "agent", mig)


def test_three_small_and_one_large_instance_fit_an_h200(host):
    plan = gpu_layout_fit.mig_fit(SimulatedNvml(host), H200, layout(
        ((G1, 3), (G3, 1)), (("1g.18gb", 3), ("3g.71gb", 1))))
    assert [str(p) for p in plan.new] == ["3g.71gb@0:4", "1g.18gb@4:1", "1g.18gb@5:1",
                                          "1g.18gb@6:1"]


def test_types_and_instances_that_disagree_are_refused_naming_both(host):
    with pytest.raises(exception.MigLayoutInvalid) as info:
        gpu_layout_fit.mig_fit(SimulatedNvml(host), H200, layout(
            ((G1, 3), (G3, 1)), (("1g.18gb", 2), ("3g.71gb", 1))))
    assert info.value.message == (
        f"GPU {H200} cannot carry the MIG layout: its vGPU types and GPU instances disagree: "
        f"mig asks 2 x 1g.18gb, and the vGPUs on them ({G1}:3) need 3, one GPU instance "
        "per vGPU")


def test_a_time_sliced_type_in_a_mig_layout_is_refused(host):
    with pytest.raises(exception.MigLayoutInvalid) as info:
        gpu_layout_fit.mig_fit(SimulatedNvml(host), H200, layout(
            ((G1, 1), (SLICED, 1)), (("1g.18gb", 1),)))
    assert f"{SLICED} (NVIDIA H200X-4C) is time-sliced, not MIG-backed" in info.value.message


def test_instances_beyond_the_gpu_are_refused_naming_placements_and_what_is_free(host):
    with pytest.raises(exception.MigPlacementsDoNotFit) as info:
        gpu_layout_fit.mig_fit(SimulatedNvml(host), H200, layout(
            ((G1, 1), (G3, 2)), (("1g.18gb", 1), ("3g.71gb", 2))))
    message = info.value.message
    assert message.startswith(f"GPU {H200} cannot hold the GPU instances 1g.18gb:1, "
                              "3g.71gb:2: needs 1 x 1g.18gb (profile 19) on placements "
                              "0:1, 1:1, 2:1, 3:1, 4:1, 5:1, 6:1; 2 x 3g.71gb (profile 9) on "
                              "placements 0:4, 4:4"), message
    assert message.endswith("free slices: 0-7; what would fit: 3g.71gb:2"), message


def test_a_mig_layout_on_a_gpu_without_mig_is_refused(host):
    with pytest.raises(exception.LayoutCannotFit) as info:
        gpu_layout_fit.mig_fit(SimulatedNvml(host), L4, GpuLayout(
            "mig", (L4,), (("nvidia-1184", 1),), "agent", (("1g.18gb", 1),)))
    assert info.value.message == (f"[gpu_layout_mig] GPU {L4} cannot hold its layout: MIG not "
                                  "supported: NVML says the GPU has no MIG")


@pytest.fixture
def served(host, tmp_path):
    """``host``'s tree with its NVML served on a control socket the tree
    names (as tests/unit/test_gpu_layout_fit.py serves it)."""
    rundir = tempfile.mkdtemp(prefix="accel-mig-", dir="/tmp")
    path = os.path.join(rundir, "s.sock")
    server = control._Server(path, host, "/x", threading.Event(), lambda: None)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    host.announce_control_socket(path)
    try:
        yield materialise(host, tmp_path / "sys")
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(rundir, ignore_errors=True)


def checked(root: str, tmp_path, vgpus: str, mig: str | None) -> list[str]:
    conf = make_conf(f"state_dir = {tmp_path / 'state'}\n[libvirt]\nuri =\n"
                     + section(vgpus, mig), sysfs_root=root)
    errors, _warnings, _state = check.check(conf)
    return [e for e in errors if "gpu_layout" in e or H200 in e]


def test_check_config_passes_a_mig_layout_that_fits(served, tmp_path):
    assert checked(served, tmp_path, f"{G1}:3, {G3}:1", "1g.18gb:3, 3g.71gb:1") == []


def test_check_config_refuses_a_mig_layout_that_does_not_fit(served, tmp_path):
    (error,) = checked(served, tmp_path, f"{G1}:1, {G3}:2", "1g.18gb:1, 3g.71gb:2")
    assert error.startswith(f"[gpu_layout_mig] GPU {H200} cannot hold the GPU instances "
                            "1g.18gb:1, 3g.71gb:2: needs"), error


def test_check_config_refuses_mig_backed_types_in_a_layout_without_mig(served, tmp_path):
    (error,) = checked(served, tmp_path, f"{G1}:3", None)
    assert error == (f"[gpu_layout_mig] GPU {H200} cannot hold its layout: {G1} (NVIDIA "
                     "H200X-1-18C) MIG-backed, and the layout names no mig: a layout is "
                     "either time-sliced (no mig) or MIG-backed (mig = <profile>:<count>, "
                     "... and only MIG-backed types)")


# --- the converge's read-back of each vGPU's GPU instance ------------------------------------


def test_each_vgpu_must_read_back_on_its_own_instance_of_its_profile(host):
    from types import SimpleNamespace

    from accel_agent.devices import gpu_layout_mig
    from accel_agent.nvml.types import GpuInstance, Placement
    from accel_agent.sysfs.model import Mdev

    m = SimpleNamespace(nvml=SimulatedNvml(host))
    mig = layout(((G1, 1), (G3, 1)), (("1g.18gb", 1), ("3g.71gb", 1)))
    instances = (GpuInstance(1, 9, Placement(0, 4)), GpuInstance(2, 19, Placement(4, 1)))

    def vgpu(vf: str, device_type: str, gi: int | None) -> Mdev:
        return Mdev(vf, vf, device_type, None, "nvidia_vfio", vf, None, gi)

    good = [vgpu("0000:61:00.4", G3, 1), vgpu("0000:61:00.5", G1, 2)]
    gpu_layout_mig.check_instances(H200, mig, good, instances, m)
    for bad, said in [
        ([vgpu("0000:61:00.4", G3, 2)], "the vGPU on 0000:61:00.4 (nvidia-1418) reads back "
         "nvidia/gpu_instance_id 2, no GPU instance of its profile 9 on the GPU"),
        ([vgpu("0000:61:00.5", G1, None)], "reads back nvidia/gpu_instance_id None"),
        ([vgpu("0000:61:00.5", G1, 2), vgpu("0000:61:00.6", G1, 2)],
         "the vGPUs on 0000:61:00.5 and 0000:61:00.6 read back the same GPU instance 2"),
    ]:
        with pytest.raises(gpu_layout_mig.MigShort) as info:
            gpu_layout_mig.check_instances(H200, mig, bad, instances, m)
        assert info.value.reason.startswith("GPU instance read back differs: ")
        assert said in info.value.reason, info.value.reason
