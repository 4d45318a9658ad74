"""Run one manager operation in a real process and SIGKILL it at a chosen step.

    python -m tests.functional.crash_worker CONF allocate|release INSTANCE COUNT STEP N
    python -m tests.functional.crash_worker CONF attach INSTANCE REQUESTS_JSON STEP N
    python -m tests.functional.crash_worker CONF recover - - STEP N

STEP ``-`` records the steps instead: each reached step is printed on stdout.
Writes go through the real privsep daemon, as in production.  With
``ACCEL_TEST_VFNET=FILE`` a VF's network settings go to that file
(tests.functional.vfnet: the simulator has no netlink).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from accel_agent import wiring
from accel_agent.config.load import load_config


def main() -> None:
    config, operation, instance, count, kill_step, kill_nth = sys.argv[1:7]
    conf = load_config([config], [], prog="crash-worker")
    seen: dict[str, int] = {}

    def on_step(step: str) -> None:
        seen[step] = seen.get(step, 0) + 1
        if kill_step == "-":
            print(f"{step} {seen[step]}", flush=True)
        elif step == kill_step and seen[step] == int(kill_nth):
            os.kill(os.getpid(), signal.SIGKILL)

    net = None
    if os.environ.get("ACCEL_TEST_VFNET"):
        from tests.functional.vfnet import StateFileNet

        net = StateFileNet(os.environ["ACCEL_TEST_VFNET"])
    manager = wiring.build_manager(conf, on_step=on_step, net=net)
    if operation == "allocate":
        manager.allocate(instance, int(count))
    elif operation == "attach":
        manager.attach(instance, wiring.attach_requests(manager, json.loads(count)))
        print("attached", flush=True)
    elif operation == "recover":
        print(json.dumps(manager.recover().to_dict()), flush=True)
    else:
        manager.release(instance, remove=True)


if __name__ == "__main__":
    main()
