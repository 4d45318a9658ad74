"""(b) The daemon's in-process rescans on the same trees."""

from __future__ import annotations

from accel_agent.sysfs import scan
from accel_agent.sysfs.rescan import Rescanner
from benchmarks import timing, trees


def measure(parents: int, types: int, runs: int) -> dict[str, object]:
    tree = trees.tree(parents, types)
    rescanner = Rescanner(tree)
    rescanner.rescan()
    configured = {"nvidia-1003"}
    return {
        "full scan (every attribute)": timing.summary(
            timing.run_callable(lambda: scan(tree), max(5, runs // 4))
        ),
        "steady-state rescan (configured counters + mdev list)": timing.summary(
            timing.run_callable(lambda: rescanner.rescan(lambda p: configured), runs)
        ),
        "every counter and mdev again (the periodic safety net)": timing.summary(
            timing.run_callable(
                lambda: rescanner.rescan(reread_mdevs=True), max(5, runs // 4)
            )
        ),
        "listing snapshot, nothing changed (GET /v1/types)": timing.summary(
            timing.run_callable(rescanner.listing, runs)
        ),
    }
