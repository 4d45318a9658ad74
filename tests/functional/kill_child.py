"""One manager operation in a real process, for the random-kill harness.

    python -m tests.functional.kill_child CONFIG OPERATION JSON_ARGUMENTS

The child loads the agent's config, builds the manager the way ``accelctl``
does (writes through the REAL privsep helper, started here before anything
else so that its start-up is not part of the operation), then talks to the
harness on stdout, one line each:

``ready``
    the privsep helper runs; the operation has not started.
``begin``
    printed right before the manager is called: the harness starts its
    random kill clock here.
``ack <json>``
    printed after the call returned: the operation's answer reached its
    client.  An acknowledged result must never be lost.
``error <class> <message>``
    the operation refused (an AccelAgentException): it must have changed
    nothing that a client was told about.

Operations and their arguments: ``allocate {instance, count}``, ``release
{instance, remove}``, ``claim {owner, sources: {src uuid: type}}``, ``commit
{owner}``, ``abort {owner}``, ``adopt {uuid}``, ``recover {}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from accel_agent import exception, privileged
from accel_agent.cmd import common

CLAIM_LIFETIME = 24 * 3600.0  # never expires during a harness run


def run(manager: Any, operation: str, args: dict[str, Any]) -> Any:
    if operation == "allocate":
        return manager.allocate(args["instance"], int(args["count"])).uuids
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
    raise SystemExit(f"unknown operation {operation!r}")


def main() -> None:
    config, operation, arguments = sys.argv[1:4]
    conf = common.load_config([config], [], prog="kill-child")
    manager = common.build_manager(conf)
    privileged.start_privsep([config], [])
    # Warm, as the daemon is: imports done, static sysfs attributes cached,
    # the ledger open.  The kill clock then covers the operation's own work
    # (lock, rescan, plan, intent, writes, settlement), not a cold start.
    with manager.locked():
        manager.scan()
        manager.ledger.all()
    print("ready", flush=True)
    print("begin", flush=True)
    try:
        result = run(manager, operation, json.loads(arguments))
    except exception.AccelAgentException as exc:
        print(f"error {type(exc).__name__} {exc.message}", flush=True)
        return
    print(f"ack {json.dumps(result, sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
