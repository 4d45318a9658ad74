"""One manager operation in a real process, for the random-kill harness.

    python -m tests.functional.kill_child CONFIG OPERATION JSON_ARGUMENTS [DELAY]

The child loads the agent's config, builds the manager the way ``accelctl``
does (writes through the REAL privsep helper, started here before anything
else so that its start-up is not part of the operation), then talks to the
harness on stdout, one line each:

``ready``
    the privsep helper runs; the operation has not started.
``begin``
    printed right before the manager is called.  With DELAY (seconds), a
    kernel timer armed at this instant sends the process SIGKILL DELAY later:
    the kernel keeps time, so a loaded machine cannot make the kill late (a
    killer process that sleeps can wake up long after a 2 ms call returned).
``ack <seconds> <json>``
    printed after the call returned, with how long it took: the operation's
    answer reached its client.  An acknowledged result must never be lost.
``error <class> <message>``
    the operation refused (an AccelAgentException): it must have changed
    nothing that a client was told about.
``steps <json>``
    before ``ack`` or ``error``: each crash point (``DeviceManager.on_step``)
    the operation passed, with how many times.

Instead of DELAY, ``step:<crash point>:<n>``: the child SIGKILLs itself the
n-th time the operation reaches that crash point (the mixed-size model kills
between every step of the order; a point not reached lets the call finish).

Operations and their arguments: ``allocate {instance, count[, device_type]}``, ``attach
{instance, requests}``, ``release
{instance, remove}``, ``claim {owner, sources: {src uuid: type}}``, ``commit
{owner}``, ``abort {owner}``, ``adopt {uuid}``, ``recover {}``, ``layout {}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

from accel_agent import exception, privileged, wiring
from accel_agent.config.load import load_config
from tests.functional.crash_points import StepKiller, parse_point

CLAIM_LIFETIME = 24 * 3600.0  # never expires during a harness run


class _Sigevent(ctypes.Structure):
    # struct sigevent (64 bytes on Linux): value, signo, notify, padding.
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int),
                ("notify", ctypes.c_int), ("pad", ctypes.c_int * 12)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


CLOCK_MONOTONIC = 1
SIGEV_SIGNAL = 0


_LIBC = ctypes.CDLL(None, use_errno=True)


def _set(timer: ctypes.c_void_p, delay: float) -> None:
    seconds = int(delay)
    when = _Itimerspec(value=_Timespec(seconds, int((delay - seconds) * 1e9)))
    if _LIBC.timer_settime(timer, 0, ctypes.byref(when), None) != 0:
        raise OSError(ctypes.get_errno(), "timer_settime")


def sigkill_after(delay: float) -> ctypes.c_void_p:
    """Have the kernel send this process SIGKILL ``delay`` seconds from now
    (timer_create(2) with SIGEV_SIGNAL and SIGKILL); returns the timer."""
    event = _Sigevent(signo=signal.SIGKILL, notify=SIGEV_SIGNAL)
    timer = ctypes.c_void_p()
    if _LIBC.timer_create(CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
        raise OSError(ctypes.get_errno(), "timer_create")
    _set(timer, max(delay, 1e-9))  # all zeros would disarm it
    return timer


def disarm(timer: ctypes.c_void_p) -> None:
    _set(timer, 0.0)


def run(manager: Any, operation: str, args: dict[str, Any]) -> Any:
    if operation == "allocate":
        return manager.allocate(args["instance"], int(args["count"]),
                                device_type=args.get("device_type")).uuids
    if operation == "attach":
        requests = wiring.attach_requests(manager, args["requests"])
        return [h["uuid"] for h in manager.attach(args["instance"], requests).handles]
    if operation == "release":
        return manager.release(args["instance"], remove=bool(args["remove"]))
    if operation == "claim":
        return manager.claim(args["owner"], dict(args["sources"]), time.time() + CLAIM_LIFETIME)
    if operation == "commit":
        return manager.commit_claim(args["owner"]).uuids
    if operation == "abort":
        return manager.abort_claim(args["owner"])
    if operation == "adopt":
        return manager.adopt(args["uuid"]).uuid
    if operation == "recover":
        return manager.recover().to_dict()
    if operation == "layout":
        return manager.converge_layout().summary()
    raise SystemExit(f"unknown operation {operation!r}")


def main() -> None:
    config, operation, arguments = sys.argv[1:4]
    when = sys.argv[4] if len(sys.argv) > 4 else None
    at_step = parse_point(when.removeprefix("step:")) if when and when.startswith("step:") \
        else None
    delay = float(when) if when and at_step is None else None
    on_step = StepKiller(at_step)
    passed = on_step.passed
    conf = load_config([config], [], prog="kill-child")
    net = None
    if os.environ.get("ACCEL_TEST_VFNET"):
        # The simulator has no netlink: a VF's settings go to this file.
        from tests.functional.vfnet import StateFileNet

        net = StateFileNet(os.environ["ACCEL_TEST_VFNET"])
    manager = wiring.build_manager(conf, net=net, on_step=on_step)
    privileged.start_privsep([config], [])
    # Warm, as the daemon is: imports done, static sysfs attributes cached,
    # the ledger open.  The kill clock then covers the operation's own work
    # (lock, rescan, plan, intent, writes, settlement), not a cold start.
    with manager.locked():
        manager.scan()
        manager.ledger.all()
    passed.clear()  # only the operation's own crash points
    print("ready", flush=True)
    print("begin", flush=True)
    parsed = json.loads(arguments)
    timer = sigkill_after(delay) if delay is not None else None
    started = time.monotonic()
    try:
        result = run(manager, operation, parsed)
    except exception.AccelAgentException as exc:
        result, refusal = None, exc
    else:
        refusal = None
    took = time.monotonic() - started
    # The call has returned: from here on a kill would only hide the answer.
    if timer is not None:
        disarm(timer)
    print(f"steps {json.dumps(passed, sort_keys=True)}", flush=True)
    if refusal is not None:
        print(f"error {type(refusal).__name__} {refusal.message}", flush=True)
        return
    print(f"ack {took:.6f} {json.dumps(result, sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
