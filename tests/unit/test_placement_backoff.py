"""The reporter's waits (reporting/placement/health.py): a fleet's agents that
failed together do not come back together.

Rules, not timings: the clock is a number the test sets, the jitter's
source a seeded Random per agent (as each daemon has its own)."""

from __future__ import annotations

import itertools
import logging
import random

from accel_agent.reporting.placement.health import SyncHealth, jittered
from accel_agent.reporting.placement.result import SyncResult

NOW = 1_000_000.0
AGENTS = 50


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def _health(seed: int, clock: Clock, sync_interval: float = 60,
            max_backoff: float = 600) -> SyncHealth:
    return SyncHealth(sync_interval=sync_interval, max_backoff=max_backoff, clock=clock,
                      log=logging.getLogger("test"), rng=random.Random(seed))


FAILED = SyncResult(ok=False, error="Placement unavailable: connection refused")


def test_agents_that_failed_together_retry_spread_over_half_the_delay() -> None:
    clock = Clock()
    fleet = [_health(seed, clock) for seed in range(AGENTS)]
    for failures, delay in ((1, 60), (2, 120), (3, 240), (4, 480), (5, 600), (6, 600)):
        for health in fleet:
            health.record(FAILED)
        waits = sorted(h.next_attempt_at - clock.now for h in fleet)
        assert all(h.failures == failures for h in fleet)
        # Never sooner than half the delay, never later than the delay...
        assert delay / 2 <= waits[0] and waits[-1] <= delay, (failures, waits)
        # ...and spread across that half: not a herd at one instant (50 agents
        # over half the delay: the widest gap between neighbours is a small part of it).
        assert waits[-1] - waits[0] >= delay * 0.4, (failures, waits)
        assert max(b - a for a, b in itertools.pairwise(waits)) <= delay * 0.1


def test_a_success_clears_the_back_off_and_the_next_failure_starts_again() -> None:
    clock = Clock()
    health = _health(1, clock)
    health.record(FAILED)
    health.record(FAILED)
    health.record(SyncResult(ok=True, providers=2))
    assert health.failures == 0 and health.next_attempt_at == 0.0
    health.record(FAILED)
    assert NOW + 30 <= health.next_attempt_at <= NOW + 60


def test_jittered_stays_within_half_and_all_of_the_delay() -> None:
    rng = random.Random(7)
    draws = [jittered(100.0, rng) for _ in range(1000)]
    assert min(draws) >= 50.0 and max(draws) <= 100.0
    assert min(draws) < 55.0 and max(draws) > 95.0  # the whole half is used


def test_a_reloads_new_record_keeps_the_failures_and_their_back_off() -> None:
    clock = Clock()
    old = _health(1, clock)
    old.record(FAILED)
    old.record(FAILED)
    new = _health(2, clock)
    new.carry_from(old)
    assert new.failures == 2
    assert new.next_attempt_at == old.next_attempt_at
    document = new.document(enabled=True)
    assert document["state"] == "failing"
    assert document["last_error"] == FAILED.error
