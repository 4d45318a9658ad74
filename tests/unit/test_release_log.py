"""What a release's log line says it did (accel_agent.devices.allocations)."""

from __future__ import annotations

from accel_agent.devices.allocations import _what_became
from tests.unit.test_api_app import record

A, B, C = (f"{n}0000000-0000-4000-8000-000000000000" for n in "abc")


def test_removed_kept_and_left_free_are_told_apart():
    records = [record(A, "vm"), record(B, "vm")]
    assert _what_became(records, True, set(), []) == "2 removed"
    assert _what_became(records, True, set(), [B]) == (
        f"1 removed, 1 kept (in use, not removed): {B}")
    assert _what_became(records, False, set(), []) == "2 left free for reuse"
    assert _what_became(records, True, set(), [A, B]) == (
        f"2 kept (in use, not removed): {A}, {B}")


def test_a_pool_vf_is_given_back_to_its_driver_with_or_without_remove():
    records = [record(A, "vm"), record(C, "vm")]
    assert _what_became(records, False, {C}, []) == (
        "1 VF(s) given back to their driver, 1 left free for reuse")
    assert _what_became(records, True, {C}, []) == "1 removed, 1 VF(s) given back to their driver"
    assert _what_became(records, False, {C}, [C]) == (
        f"1 left free for reuse, 1 kept (in use, not removed): {C}")
