"""When a fleet's agents come back after an outage: ``python -m benchmarks.fleet_herd [--agents N]``

The fleet benchmark (benchmarks/fleet.py) runs tens of real agents; this
carries its back-off to 1,000 and 10,000 agents without starting them: the
agent's own :class:`~accel_agent.reporting.placement.health.SyncHealth`, one
per agent with a random source of its own, on a clock the script moves.  Two
worst cases for an outage of ``--outage`` seconds (the defaults:
``sync_interval`` 60 s, ``max_backoff`` 600 s):

* ``together``: every agent fails at the outage's first instant (a
  fleet-wide reload, or every agent syncing at once when Placement went);
* ``at their reads``: each agent fails at its first read during the outage
  (nothing changed on the hosts: the read is its refresh, anywhere in its
  current wait, drawn between half of ``refresh_interval`` and all of it);
  one whose read comes after the outage never notices it.

and the first case again with the jitter before issue 38 ([0.8, 1] of the delay).

It prints, for the first minute after Placement is back, the most syncs that
start in one second and in ten seconds, per agent of the fleet.  A sync costs
1 request when nothing changed on the host (the tree under its root), and
``1 + 3 x GPUs`` when the host changed during the outage.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys

from accel_agent.reporting.placement import health as health_mod
from accel_agent.reporting.placement.health import SyncHealth, jittered
from accel_agent.reporting.placement.result import SyncResult

FAILED = SyncResult(ok=False, error="Placement unavailable")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def comeback(agents: int, outage: float, together: bool, seed: int = 1,
             sync_interval: float = 60, max_backoff: float = 600,
             refresh_interval: float = 300) -> list[float]:
    """When each agent's first attempt after Placement is back starts (seconds after it)."""
    rng = random.Random(seed)
    log = logging.getLogger("fleet_herd")
    log.disabled = True
    starts = []
    for i in range(agents):
        clock = Clock()
        health = SyncHealth(sync_interval=sync_interval, max_backoff=max_backoff, clock=clock,
                            log=log, rng=random.Random(rng.random() + i))
        # Steady agents' next reads fall anywhere in their current wait.
        clock.now = 0.0 if together else rng.uniform(0, jittered(refresh_interval, rng))
        if clock.now >= outage:
            continue  # its next read came after the outage: it never noticed
        while clock.now < outage:
            health.record(FAILED)
            clock.now = health.next_attempt_at
        starts.append(clock.now - outage)
    return starts


def peaks(starts: list[float], window: float, within: float = 60.0) -> int:
    times = sorted(t for t in starts if t < within)
    best, left = 0, 0
    for right, t in enumerate(times):
        while times[left] <= t - window:
            left += 1
        best = max(best, right - left + 1)
    return best


def table(agents: list[int], outages: list[float]) -> list[str]:
    """The Markdown table of every case."""
    lines = ["| outage | agents | failed | first minute: agents back "
             "| most syncs starting in 1 s | in 10 s (per s) | all back after |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    cases = [("together", True, None), ("at their reads", False, None),
             ("together, jitter [0.8, 1] (before issue 38)", True, 0.8)]
    for outage, n in ((o, a) for o in outages for a in agents):
        for name, together, low in cases:
            kept = health_mod.JITTER_LOW
            health_mod.JITTER_LOW = low or kept
            try:
                starts = comeback(n, outage, together)
            finally:
                health_mod.JITTER_LOW = kept
            within = sum(1 for t in starts if t < 60)
            one_s, ten_s = peaks(starts, 1.0), peaks(starts, 10.0)
            lines.append(
                f"| {outage:.0f} s | {n} | {name} | {within} ({within / n:.0%}) "
                f"| {one_s} (N/{n / max(one_s, 1):.0f}) "
                f"| {ten_s / 10:.1f} (N/{n * 10 / max(ten_s, 1):.0f}) "
                f"| {max(starts, default=0):.0f} s |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_herd")
    parser.add_argument("--agents", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--outage", type=float, nargs="*", default=[40.0, 300.0])
    args = parser.parse_args(argv)
    print("\n".join(table(args.agents, args.outage)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
