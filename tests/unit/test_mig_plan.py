"""The GPU instances of a MIG-backed vGPU layout and their placements
(accel_agent/devices/mig_plan.py), from the GPU's own tables as the
simulator's NVML answers them: the H200's (read from a real H200) and the
A100-class profile.  Pure functions, in process (milliseconds)."""

from __future__ import annotations

import pytest

from accel_agent import exception
from accel_agent.devices import mig_plan
from accel_agent.nvml import GpuInstance, Placement
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.sysfs.nvidia_vfio import type_name

H200, A100 = "0000:61:00.0", "0000:a1:00.0"
# The H200's MIG-backed types, by profile (simulator/profiles_nvidia.py).
H1G18, H1G18ME, H1G35, H2G35, H3G71, H4G71, H7G = (type_name(i) for i in range(1414, 1421))
TIME_SLICED = type_name(1421)  # H200X-4C
A1G5, A2G10, A3G20, A4G20, A7G40 = (type_name(i) for i in range(700, 705))


@pytest.fixture(scope="module")
def nvml() -> SimulatedNvml:
    return SimulatedNvml(SimulatedHost(profiles.build_spec(["nvidia-h200", "nvidia-a100-mig"],
                                                           vfs=4)))


def tables(nvml, gpu):
    types = {type_name(t.type_id): t for t in nvml.vgpu_types(gpu)}
    return types, nvml.gpu_instance_profiles(gpu)


def needed(nvml, gpu, vgpus, mig=None):
    types, found = tables(nvml, gpu)
    return mig_plan.instances_needed(gpu, vgpus, types, found, mig)


def placed(result: mig_plan.MigPlan) -> list[str]:
    return [str(i) for i in result.new]


def test_the_h200_table_is_the_one_a_real_h200_reported(nvml):
    # docs/design.md §16: nvidia-smi mig -lgip / -lgipp on a real H200, driver 580.159.04.
    table = {p.name: (p.profile_id, p.instance_count, [str(x) for x in p.placements])
             for p in nvml.gpu_instance_profiles(H200)}
    assert table == {
        "1g.18gb": (19, 7, [f"{s}:1" for s in range(7)]),
        "1g.18gb+me": (20, 1, [f"{s}:1" for s in range(7)]),
        "1g.35gb": (15, 4, ["0:2", "2:2", "4:2", "6:2"]),
        "2g.35gb": (14, 3, ["0:2", "2:2", "4:2"]),
        "3g.71gb": (9, 2, ["0:4", "4:4"]),
        "4g.71gb": (5, 1, ["0:4"]),
        "7g.141gb": (0, 1, ["0:8"]),
    }


def test_h200_three_1g_and_one_3g_fit_largest_first_on_the_lowest_start(nvml):
    asked = needed(nvml, H200, [(H1G18, 3), (H3G71, 1)], [("1g.18gb", 3), ("3g.71gb", 1)])
    assert [(n.profile.name, n.count) for n in asked] == [("1g.18gb", 3), ("3g.71gb", 1)]
    # The instances derived from the types alone are the same.
    assert needed(nvml, H200, [(H1G18, 3), (H3G71, 1)]) == asked
    result = mig_plan.plan(H200, asked)
    assert placed(result) == ["3g.71gb@0:4", "1g.18gb@4:1", "1g.18gb@5:1", "1g.18gb@6:1"]
    assert [i.profile_id for i in result.new] == [9, 19, 19, 19]
    assert mig_plan.plan(H200, asked) == result  # deterministic


def test_h200_two_3g_and_a_1g_do_not_fit_naming_placements_and_what_is_free(nvml):
    asked = needed(nvml, H200, [(H3G71, 2), (H1G18, 1)], [("3g.71gb", 2), ("1g.18gb", 1)])
    with pytest.raises(exception.MigPlacementsDoNotFit) as info:
        mig_plan.plan(H200, asked)
    assert str(info.value) == (
        f"GPU {H200} cannot hold the GPU instances 3g.71gb:2, 1g.18gb:1: needs 2 x 3g.71gb "
        "(profile 9) on placements 0:4, 4:4; 1 x 1g.18gb (profile 19) on placements 0:1, 1:1, "
        "2:1, 3:1, 4:1, 5:1, 6:1; free slices: 0-7; what would fit: 3g.71gb:2"
    )


def test_a_profile_holds_at_most_its_instance_count(nvml):
    asked = needed(nvml, H200, [(H1G18ME, 2)])
    with pytest.raises(exception.MigPlacementsDoNotFit,
                       match=r"2 x 1g.18gb\+me .* more than the 1 the GPU holds"):
        mig_plan.plan(H200, asked)
    with pytest.raises(exception.MigPlacementsDoNotFit, match=r"what would fit: 1g\.18gb:7"):
        mig_plan.plan(H200, needed(nvml, H200, [(H1G18, 8)]))


@pytest.mark.parametrize(
    ("vgpus", "mig", "named"),
    [
        ([(H1G18, 3)], [("1g.18gb", 2)],
         "disagree: mig asks 2 x 1g.18gb, and the vGPUs on them (nvidia-1414:3) need 3"),
        ([(H1G18, 3)], [("1g.18gb", 3), ("3g.71gb", 1)],
         "mig asks 1 x 3g.71gb, and the vGPUs on them (no vGPU type) need 0"),
        ([(H1G18, 1), (H3G71, 1)], [("1g.18gb", 1)],
         "mig asks 0 x 3g.71gb, and the vGPUs on them (nvidia-1418:1) need 1"),
        ([(H1G18, 1)], [("1g.18gb", 1), ("1g.18gb", 1)], "names GPU instance profile 1g.18gb "
         "twice"),
        ([(H1G18, 1)], [("1g.5gb", 1)], "profile '1g.5gb', which the GPU does not have"),
        ([(TIME_SLICED, 1)], None, "nvidia-1421 (NVIDIA H200X-4C) is time-sliced"),
        ([(A1G5, 1)], None, "does not support vGPU type nvidia-700"),
        ([(H1G18, -1)], None, "nvidia-1414:-1 is not a count"),
        ([(H1G18, 1)], [("1g.18gb", True)], "1g.18gb:True is not a count"),
    ],
)
def test_types_and_instances_that_disagree_are_refused_by_name(nvml, vgpus, mig, named):
    with pytest.raises(exception.MigLayoutInvalid) as info:
        needed(nvml, H200, vgpus, mig)
    assert str(info.value).startswith(f"GPU {H200} cannot carry the MIG layout: ")
    assert named in str(info.value)


def test_instances_kept_stay_where_they_are_and_count(nvml):
    # A 3g.71gb at 4:4 holds a vGPU in use: it stays, and counts as the layout's 3g.
    kept = GpuInstance(gpu_instance_id=2, profile_id=9, placement=Placement(4, 4))
    asked = needed(nvml, H200, [(H1G18, 3), (H3G71, 1)])
    result = mig_plan.plan(H200, asked, fixed=[kept])
    assert result.fixed == (kept,)
    assert placed(result) == ["1g.18gb@0:1", "1g.18gb@1:1", "1g.18gb@2:1"]
    # A 1g.18gb kept at 0:1 leaves no room for two 3g.71gb.
    small = GpuInstance(gpu_instance_id=7, profile_id=19, placement=Placement(0, 1))
    with pytest.raises(exception.MigPlacementsDoNotFit) as info:
        mig_plan.plan(H200, needed(nvml, H200, [(H3G71, 2)]), fixed=[small])
    message = str(info.value)
    assert "kept where they are (a vGPU in use): profile 19@0:1" in message
    assert "free slices: 1-7; what would fit: 3g.71gb:1" in message


def test_the_search_finds_what_the_greedy_pass_misses(nvml):
    # Same placement size, the layout's order first: a 1g.35gb on slice 0 would
    # leave the third 2g.35gb nowhere; the search puts it on 6.
    asked = needed(nvml, H200, [(H1G35, 1), (H2G35, 3)])
    result = mig_plan.plan(H200, asked)
    assert sorted(placed(result)) == ["1g.35gb@6:2", "2g.35gb@0:2", "2g.35gb@2:2", "2g.35gb@4:2"]
    spans = [i.placement for i in result.new]
    assert not any(a.overlaps(b) for i, a in enumerate(spans) for b in spans[i + 1:])


def test_the_a100_profile(nvml):
    result = mig_plan.plan(A100, needed(nvml, A100, [(A1G5, 7)], [("1g.5gb", 7)]))
    assert placed(result) == [f"1g.5gb@{s}:1" for s in range(7)]
    result = mig_plan.plan(A100, needed(nvml, A100, [(A3G20, 1), (A4G20, 1)]))
    assert placed(result) == ["3g.20gb@4:4", "4g.20gb@0:4"]
    assert placed(mig_plan.plan(A100, needed(nvml, A100, [(A7G40, 1)]))) == ["7g.40gb@0:8"]
    with pytest.raises(exception.MigPlacementsDoNotFit, match=r"what would fit: 3g\.20gb:2"):
        mig_plan.plan(A100, needed(nvml, A100, [(A3G20, 2), (A2G10, 1)]))
