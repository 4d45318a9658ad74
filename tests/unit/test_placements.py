"""The placement planner of mixed-size layouts (devices/placements.py)."""

from __future__ import annotations

import itertools

import pytest

from accel_agent import exception
from accel_agent.devices import placements as P

# The guide's L4 figures (L4-6Q: size 6, ids 0 6 12 18) with a half and a
# double size beside it, on a GPU of 24 units.
L4 = {
    "nvidia-3": P.TypePlacements("nvidia-3", 3, tuple(range(0, 24, 3))),
    "nvidia-6": P.TypePlacements("nvidia-6", 6, (0, 6, 12, 18)),
    "nvidia-12": P.TypePlacements("nvidia-12", 12, (0, 12)),
}


def _spans(plan: P.Plan) -> list[range]:
    return [L4[p.device_type].span(p.placement_id) for p in plan.placed]


def _no_overlap(plan: P.Plan) -> bool:
    spans = sorted(_spans(plan), key=lambda r: r.start)
    return all(a.stop <= b.start for a, b in itertools.pairwise(spans))


def test_three_sizes_largest_first_on_supported_ids_without_overlap():
    plan = P.plan("0000:01:00.0", [("nvidia-3", 2), ("nvidia-6", 1), ("nvidia-12", 1)], L4)
    assert [(p.device_type, p.placement_id) for p in plan.new] == [
        ("nvidia-12", 0), ("nvidia-6", 12), ("nvidia-3", 18), ("nvidia-3", 21)]
    assert all(p.placement_id in L4[p.device_type].supported for p in plan.placed)
    assert _no_overlap(plan)


def test_the_plan_is_the_same_every_time_whatever_the_order_of_supported_ids():
    shuffled = {t: P.TypePlacements(t, tp.size, tuple(reversed(tp.supported)))
                for t, tp in L4.items()}
    asks = [("nvidia-6", 2), ("nvidia-3", 4)]
    assert P.plan("g", asks, L4) == P.plan("g", asks, shuffled)


def test_fixed_vgpus_stay_and_count_towards_the_layout():
    fixed = [P.Placed("nvidia-6", 6)]
    plan = P.plan("g", [("nvidia-6", 1), ("nvidia-12", 1), ("nvidia-3", 2)], L4, fixed)
    assert plan.fixed == tuple(fixed)
    assert [p.device_type for p in plan.new] == ["nvidia-12", "nvidia-3", "nvidia-3"]
    assert _no_overlap(plan)


def test_greedy_dead_end_is_searched_past():
    # Largest first puts the big one at 0, where it covers both ids of the
    # small one: the search moves the big one to 2 and the small one fits at 0.
    odd = {
        "big": P.TypePlacements("big", 6, (0, 2)),
        "small": P.TypePlacements("small", 2, (0, 4)),
    }
    plan = P.plan("g", [("big", 1), ("small", 1)], odd)
    assert [(p.device_type, p.placement_id) for p in plan.new] == [("big", 2), ("small", 0)]


def test_a_layout_that_does_not_fit_names_gpu_sizes_ids_and_what_fits():
    with pytest.raises(exception.PlacementsDoNotFit) as caught:
        P.plan("0000:01:00.0", [("nvidia-3", 4), ("nvidia-6", 1), ("nvidia-12", 1)], L4)
    message = caught.value.message
    assert "0000:01:00.0" in message
    assert "4 x nvidia-3 of size 3" in message and "1 x nvidia-12 of size 12" in message
    assert "supported ids 0 6 12 18" in message
    assert "what would fit: nvidia-3:2, nvidia-6:1, nvidia-12:1" in message


def test_more_of_a_type_than_its_supported_ids_never_fits():
    with pytest.raises(exception.PlacementsDoNotFit, match="nvidia-6:4"):
        P.plan("g", [("nvidia-6", 5)], L4)


def test_fixed_vgpus_that_block_the_rest_are_said():
    with pytest.raises(exception.PlacementsDoNotFit, match="kept where they are: nvidia-3@12"):
        P.plan("g", [("nvidia-12", 2), ("nvidia-3", 1)], L4, [P.Placed("nvidia-3", 12)])
