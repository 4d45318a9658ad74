"""N clients at once: one thread and one connection each, all connected
before any request is sent, for the daemon's concurrency test.

    python -m tests.functional.burst_client SOCKET OUT.jsonl SEED CLIENTS INSTANCES

Every thread connects to the API socket, waits on a barrier that opens only
once all CLIENTS threads are connected, then sends ONE request (PUT an
allocation of 1-3 mdevs, DELETE it, or DELETE with remove=true, on one of
the comma-separated INSTANCES: several threads share each instance) and
reads the answer.  Each answer is one JSON line of OUT with the monotonic
times of connect, send and answer (comparable: one process, one clock), so
the test can reason about which calls overlapped.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import sys
import threading
import time
from typing import Any

from accel_agent.api.client import quote

TIMEOUT = 300.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self.sock = sock


def one_client(
    socket_path: str, request: dict[str, Any], barrier: threading.Barrier
) -> dict[str, Any]:
    record = dict(request)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A blocking connect: when the listen backlog is full (a busy server has
    # not accepted the first hundred yet), an AF_UNIX connect with a timeout
    # (a non-blocking socket underneath) fails at once with EAGAIN, while a
    # blocking one waits for room, as a real client's would.
    sock.connect(socket_path)
    sock.settimeout(TIMEOUT)
    record["connected"] = time.monotonic()
    barrier.wait(TIMEOUT)
    conn = _UnixConnection(sock)
    url = f"/v1/instances/{quote(request['instance'])}/allocation"
    try:
        record["sent"] = time.monotonic()
        if request["op"] == "PUT":
            body = json.dumps({"count": request["count"]})
            conn.request("PUT", url, body, {"Content-Type": "application/json"})
        else:
            conn.request("DELETE", url + ("?remove=true" if request["remove"] else "?remove=false"))
        response = conn.getresponse()
        data = response.read()
        record["answered"] = time.monotonic()
        record["status"] = response.status
        record["content_type"] = response.getheader("Content-Type", "")
        record["body"] = json.loads(data)
    except Exception as exc:  # recorded: the test fails on it with the details
        record["error"] = repr(exc)
    finally:
        conn.close()
    return record


def requests_for(seed: int, clients: int, instances: list[str]) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for n in range(clients):
        instance = instances[n % len(instances)]  # every instance shared by several clients
        roll = rng.random()
        if roll < 0.5:
            out.append({"n": n, "instance": instance, "op": "PUT", "count": rng.randint(1, 3)})
        else:
            out.append({"n": n, "instance": instance, "op": "DELETE", "remove": roll >= 0.75})
    return out


def main() -> None:
    socket_path, out_path, seed, clients, instances = sys.argv[1:6]
    requests = requests_for(int(seed), int(clients), instances.split(","))
    barrier = threading.Barrier(len(requests))
    results: list[dict[str, Any]] = [{} for _ in requests]

    def run(index: int) -> None:
        try:
            results[index] = one_client(socket_path, requests[index], barrier)
        except Exception as exc:
            results[index] = {**requests[index], "error": repr(exc)}
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(out_path, "w") as out:
        for record in results:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
