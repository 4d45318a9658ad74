"""Run one manager operation in a real process and SIGKILL it at a chosen step.

    python -m tests.functional.crash_worker CONF allocate|release INSTANCE COUNT STEP N

STEP ``-`` records the steps instead: each reached step is printed on stdout.
Writes go through the real privsep daemon, as in production.
"""

from __future__ import annotations

import os
import signal
import sys

from accel_agent import wiring


def main() -> None:
    config, operation, instance, count, kill_step, kill_nth = sys.argv[1:7]
    conf = wiring.load_config([config], [], prog="crash-worker")
    seen: dict[str, int] = {}

    def on_step(step: str) -> None:
        seen[step] = seen.get(step, 0) + 1
        if kill_step == "-":
            print(f"{step} {seen[step]}", flush=True)
        elif step == kill_step and seen[step] == int(kill_nth):
            os.kill(os.getpid(), signal.SIGKILL)

    manager = wiring.build_manager(conf, on_step=on_step)
    if operation == "allocate":
        manager.allocate(instance, int(count))
    else:
        manager.release(instance, remove=True)


if __name__ == "__main__":
    main()
