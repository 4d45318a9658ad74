"""Whether a mixed-size layout fits its GPUs (issue 36), asked of the
simulator's NVML: the planner's input from NVML's placements, the verdict
per GPU, and ``check-config``'s check (config.check, the path the start and
every reload share) over a simulated host whose NVML is served on its
control socket, as a mounted simulator serves it.  In process."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import pytest

from accel_agent import exception
from accel_agent.config import check
from accel_agent.devices import gpu_layout_fit, placements
from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.simulator import control, profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise
from tests.configutil import make_conf

L4, A100 = "0000:21:00.0", "0000:a1:00.0"
L40S = profiles.nvidia_vfio_pf(0)
# L4 Q types (profiles_nvidia.py): 1182 + index of 1, 2, 3, 4, 6, 8, 12, 24 GB.
L4_12Q, L4_6Q, L4_3Q = "nvidia-1188", "nvidia-1186", "nvidia-1184"
# L40S Q types: 1147 + index of 1, 2, 3, 4, 6, 8, 12, 16, 24, 48 GB.
L40S_24Q, L40S_12Q, L40S_6Q = "nvidia-1155", "nvidia-1153", "nvidia-1151"
THREE_SIZES = f"{L4_12Q}:1, {L4_6Q}:1, {L4_3Q}:2"  # 12 + 6 + 2 x 3 = 24 of 24
TOO_MUCH = f"{L4_12Q}:1, {L4_6Q}:2, {L4_3Q}:1"  # 12 + 12 + 3 = 27 of 24


@pytest.fixture
def host() -> SimulatedHost:
    return SimulatedHost(profiles.build_spec(["nvidia-l4", "nvidia-a100-mig", "nvidia-vfio"],
                                             vfs=4))


def layout(vgpus: str, gpus: tuple[str, ...] = (L4,)) -> GpuLayout:
    pairs = tuple((t.strip(), int(n)) for t, n in (v.split(":") for v in vgpus.split(",")))
    return GpuLayout("mixed", gpus, pairs)


# --- one GPU, asked of NVML -----------------------------------------------------------------


def test_nvml_s_placements_are_what_the_planner_takes(host):
    found = gpu_layout_fit.type_placements(SimulatedNvml(host), L4, L4_6Q)
    # The guide's L4-6Q: placement size 6, ids 0 6 12 18.
    assert found == placements.TypePlacements(L4_6Q, 6, (0, 6, 12, 18))


def test_three_sizes_that_fill_an_l4_fit_and_are_planned_largest_first(host):
    plan = gpu_layout_fit.gpu_fit(SimulatedNvml(host), L4, layout(THREE_SIZES))
    assert [(p.device_type, p.placement_id) for p in plan.placed] == [
        (L4_12Q, 0), (L4_6Q, 12), (L4_3Q, 18), (L4_3Q, 21)]


def test_three_sizes_that_fill_an_l40s_fit(host):
    plan = gpu_layout_fit.gpu_fit(SimulatedNvml(host), L40S, layout(
        f"{L40S_24Q}:1, {L40S_12Q}:1, {L40S_6Q}:2", gpus=(L40S,)))
    assert [(p.device_type, p.placement_id) for p in plan.placed] == [
        (L40S_24Q, 0), (L40S_12Q, 24), (L40S_6Q, 36), (L40S_6Q, 42)]


def test_sizes_beyond_the_gpu_are_refused_with_what_would_fit(host):
    with pytest.raises(exception.PlacementsDoNotFit) as info:
        gpu_layout_fit.gpu_fit(SimulatedNvml(host), L4, layout(TOO_MUCH))
    message = info.value.message
    assert message.startswith(f"GPU {L4} cannot hold {TOO_MUCH} in mixed-size mode: needs "
                              f"1 x {L4_12Q} of size 12 (supported ids 0 12), 2 x {L4_6Q} of "
                              "size 6 (supported ids 0 6 12 18), 1 x nvidia-1184 of size 3")
    assert message.endswith(f"what would fit: {L4_12Q}:1, {L4_6Q}:2"), message


def test_a_gpu_without_mixed_size_capability_is_refused(host):
    with pytest.raises(exception.LayoutCannotFit) as info:
        gpu_layout_fit.gpu_fit(SimulatedNvml(host), A100, layout(
            "nvidia-473:1, nvidia-474:1", gpus=(A100,)))
    assert info.value.message == (
        f"[gpu_layout_mixed] GPU {A100} cannot hold its layout: it cannot hold vGPUs of "
        "different sizes: NVML says it has no heterogeneous time-slice capability "
        "(mixed-size mode)")


def test_a_type_the_gpu_does_not_support_is_refused_naming_it(host):
    with pytest.raises(exception.LayoutCannotFit) as info:
        gpu_layout_fit.gpu_fit(SimulatedNvml(host), L4, layout(f"{L4_6Q}:1, {L40S_6Q}:1"))
    assert info.value.message.startswith(
        f"[gpu_layout_mixed] GPU {L4} cannot hold its layout: it does not support "
        f"{L40S_6Q} (its vGPU types: nvidia-1182 (NVIDIA L4-1Q), ")


# --- check-config: the one path of the check, the start and a reload -------------------------


@pytest.fixture
def served(host, tmp_path):
    """``host``'s tree with its NVML served on a control socket the tree
    names, as a mounted simulator serves it (nvml.for_sysfs_root finds it)."""
    rundir = tempfile.mkdtemp(prefix="accel-fit-", dir="/tmp")
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


def checked(root: str, vgpus: str, tmp_path, gpus: str = L4, types: str = "") -> check.Checked:
    enabled = types or f"{L4_12Q}, {L4_6Q}, {L4_3Q}"
    conf = make_conf(
        f"state_dir = {tmp_path / 'state'}\n[libvirt]\nuri =\n"
        f"[devices]\nenabled_mdev_types = {enabled}\nenabled_gpu_layouts = mixed\n"
        f"[gpu_layout_mixed]\ngpus = {gpus}\nvgpus = {vgpus}\n", sysfs_root=root)
    return check.check(conf)


def test_check_config_refuses_a_layout_its_gpu_cannot_hold(served, tmp_path):
    errors, warnings, _state = checked(served, TOO_MUCH, tmp_path)
    (error,) = [e for e in errors if "gpu_layout" in e]
    assert error.startswith(f"[gpu_layout_mixed] GPU {L4} cannot hold {TOO_MUCH} in "
                            "mixed-size mode: needs 1 x nvidia-1188 of size 12")
    assert "what would fit: nvidia-1188:1, nvidia-1186:2" in error
    assert not [w for w in warnings if "could not check" in w]


def test_check_config_passes_three_sizes_that_fit(served, tmp_path):
    errors, warnings, _state = checked(served, THREE_SIZES, tmp_path)
    assert [e for e in errors if "layout" in e or L4 in e] == []
    assert not [w for w in warnings if "could not check" in w or "gpu_layout" in w]
    # The default type is a layout's: no GPU offering it unlisted is no news.
    assert warnings == [], warnings


def test_check_config_refuses_a_gpu_without_mixed_size_mode(served, tmp_path):
    errors, _warnings, _state = checked(served, "nvidia-473:1, nvidia-474:1", tmp_path,
                                        gpus=A100, types="nvidia-473, nvidia-474")
    assert f"[gpu_layout_mixed] GPU {A100} cannot hold its layout: it cannot hold vGPUs of " \
        "different sizes" in "\n".join(errors)


def test_check_config_without_nvml_says_it_could_not_check_the_fit(host, tmp_path):
    root = materialise(host, tmp_path / "sys")  # a static tree: no NVML serves it
    errors, warnings, _state = checked(root, TOO_MUCH, tmp_path)
    assert not [e for e in errors if "gpu_layout" in e or "mixed-size" in e]
    (warning,) = [w for w in warnings if "could not check" in w]
    assert warning.startswith(f"could not check whether the mixed-size layouts fit GPUs {L4}: "
                              f"NVML is not available ({root} is neither the host's /sys nor a "
                              "simulated host")
    assert warning.endswith("the start lists a GPU it cannot lay out as short in health")


def test_a_layout_gpu_absent_from_the_host_is_not_asked_of_nvml(host, tmp_path):
    root = materialise(host, tmp_path / "sys")
    errors, warnings, _state = checked(root, TOO_MUCH, tmp_path, gpus="0000:e1:00.0")
    assert not [m for m in errors + warnings if "mixed-size" in m]
    # It is named, with accelctl explain's verdict, as a type's absent GPU is.
    (warning,) = [w for w in warnings if "0000:e1:00.0" in w]
    assert warning.startswith("0000:e1:00.0 (in [gpu_layout_mixed] gpus) has no vGPU VFs on "
                              "this host: there is no PCI device 0000:e1:00.0")


def test_a_bad_reported_by_is_named_once_with_its_file_and_line(host, tmp_path):
    root = materialise(host, tmp_path / "sys")
    conf = make_conf(
        f"state_dir = {tmp_path / 'state'}\n[libvirt]\nuri =\n"
        f"[devices]\nenabled_mdev_types = {L4_6Q}\nenabled_gpu_layouts = mixed\n"
        f"[gpu_layout_mixed]\ngpus = {L4}\nvgpus = {L4_6Q}:2\nreported_by = cyborg\n",
        sysfs_root=root)
    errors, _warnings, _state = check.check(conf)
    (error,) = [e for e in errors if "reported_by" in e]
    assert error.endswith(".conf:13: [gpu_layout_mixed] reported_by = cyborg: valid values are "
                          "[agent, nova], but found 'cyborg'"), error
