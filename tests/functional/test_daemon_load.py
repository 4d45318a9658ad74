"""The real daemon under concurrent load from several client processes, and
SIGKILLed in the middle of it: no double assignment, no lost assignment,
every answer well-formed, ledger and sysfs in agreement."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from accel_agent.api.app import load_openapi
from tests import ledger_sql
from tests.functional.daemon_fixture import (
    REPO_ROOT,
    AgentDaemon,
    agent_config,
    read_records,
    short_dir,
    spawn_load,
    wait_for,
)
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

CONF = "[devices]\nenabled_mdev_types = nvidia-35\n"
FOREIGN = "f0f0f0f0-0000-4000-8000-0000000000ff"
WORKERS = 4
REQUESTS = 50
CLIENTS = 200
BURSTS = 3
# What a client may be told under contention; a LedgerConflict or MdevInUse here
# would mean two calls interleaved inside the manager.
CONFLICT_CODES = {"InsufficientCapacity", "InstanceAlreadyAllocated"}
_DOCUMENT = Resource.from_contents(load_openapi(), default_specification=DRAFT7)
_REGISTRY = Registry().with_resource("urn:openapi", _DOCUMENT)


def conforms(body: object, schema: str) -> None:
    """``body`` is what openapi.json promises (components/schemas/<schema>)."""
    ref = {"$ref": f"urn:openapi#/components/schemas/{schema}"}
    jsonschema.Draft7Validator(ref, registry=_REGISTRY).validate(body)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("load"), ["nvidia-pf"], gpus=2) as host:
        yield host


@pytest.fixture
def agent(sim, tmp_path) -> Iterator[AgentDaemon]:
    sim.reset()
    # A foreign mdev: counted, never touched.
    sim.create_foreign("0000:85:00.0", "nvidia-35", FOREIGN)
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(
            tmp_path / "agent.conf", sim.root, sim.state_dir, socket_path, CONF
        )
        daemon = AgentDaemon(config, socket_path, tmp_path)
        try:
            yield daemon.start()
        finally:
            daemon.close()


def run_workers(daemon: AgentDaemon, workdir: Path, instances: list[list[str]]):
    outs = [workdir / f"worker-{n}.jsonl" for n in range(len(instances))]
    procs = [
        spawn_load(daemon.socket_path, out, seed=1000 + n, requests=REQUESTS, instances=ids)
        for n, (out, ids) in enumerate(zip(outs, instances, strict=True))
    ]
    return outs, procs


def check_host(host) -> dict[str, list[str]]:
    """Ledger and sysfs, read apart, agree; returns instance -> uuids."""
    rows = ledger_sql.rows(host.state_dir)
    assert ledger_sql.pending_intents(host.state_dir) == 0
    assert ledger_sql.unsettled(host.state_dir) == []
    sysfs = host.sysfs_uuids()
    recorded = {r.uuid for r in rows}
    assert recorded <= sysfs, "a ledger row has no mdev in sysfs"
    assert sysfs - recorded == {FOREIGN}, "an mdev in sysfs is neither recorded nor foreign"
    devices = os.path.join(host.root, "bus", "mdev", "devices")
    for row in rows:
        parent = os.path.basename(os.path.dirname(os.path.realpath(f"{devices}/{row.uuid}")))
        mdev_type = os.path.basename(os.readlink(f"{devices}/{row.uuid}/mdev_type"))
        assert (parent, mdev_type) == (row.parent, row.mdev_type), row
    held: dict[str, list[str]] = {}
    for row in rows:
        if row.owner is not None:
            held.setdefault(row.owner, []).append(row.uuid)
    return held


def check_answer(record: dict) -> None:
    status, body = record["status"], record["body"]
    assert status in (200, 409), record
    assert record["content_type"] == "application/json", record
    if status == 409:
        conforms(body, "Error")
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, record
        assert body["error"]["code"] in CONFLICT_CODES, record
        return
    conforms(body, "Allocation" if record["op"] == "PUT" else "Release")
    if record["op"] == "PUT":
        assert body["instance"] == record["instance"]
        assert len(body["mdevs"]) == record["count"], record
        for mdev in body["mdevs"]:
            assert set(mdev) == {"uuid", "parent", "mdev_type"}
            assert mdev["mdev_type"] == "nvidia-35"
    else:
        assert set(body) == {"instance", "released", "removed"}, record
        assert body["instance"] == record["instance"] and body["removed"] == record["remove"]
        assert len(set(body["released"])) == len(body["released"]) <= 3, record


def check_never_held_twice(records: list[dict]) -> None:
    """From the clients' side alone: an mdev answered to two instances must
    have been released by the first between the two (the manager serialises
    them, so the release was sent before the second answer came back and
    answered after the first request was sent)."""
    given: dict[str, list[dict]] = {}
    for record in records:
        if record["op"] == "PUT" and record["status"] == 200:
            for mdev in record["body"]["mdevs"]:
                given.setdefault(mdev["uuid"], []).append(record)
    releases = [r for r in records if r["op"] == "DELETE" and r["status"] == 200]

    def released_between(first: dict, second: dict, uuid: str) -> bool:
        return any(
            d["instance"] == first["instance"] and uuid in d["body"]["released"]
            and d["sent"] < second["answered"] and d["answered"] > first["sent"]
            for d in releases
        )

    for uuid, puts in given.items():
        for a in puts:
            for b in puts:
                if a["instance"] < b["instance"]:
                    assert released_between(a, b, uuid) or released_between(b, a, uuid), (
                        f"mdev {uuid} answered to {a['instance']} and {b['instance']} with no "
                        f"release in between", a, b
                    )


def check_released_what_was_given(records: list[dict]) -> None:
    """A release answers exactly a set of mdevs that an allocation of the
    same instance answered (or nothing)."""
    given: dict[str, list[set[str]]] = {}
    for r in records:
        if r["op"] == "PUT" and r["status"] == 200:
            given.setdefault(r["instance"], []).append({m["uuid"] for m in r["body"]["mdevs"]})
    for r in records:
        if r["op"] == "DELETE" and r["status"] == 200 and r["body"]["released"]:
            assert set(r["body"]["released"]) in given.get(r["instance"], []), r


def run_burst(daemon: AgentDaemon, out: Path, seed: int, instances: list[str]) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.functional.burst_client", daemon.socket_path, str(out),
         str(seed), str(CLIENTS), ",".join(instances)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return read_records(out)


def test_200_simultaneous_clients_on_shared_instances(agent, sim, tmp_path):
    """200 connections, all open before the first request is sent (a barrier),
    allocate / release / release --remove on 16 instances that several of
    them share; three bursts, starting with free owned mdevs so that reuse
    is raced too.  Then the answers, the ledger and sysfs are checked apart."""
    client = agent.client()
    for n in range(6):  # the free pool: owned, unassigned, reusable
        client.allocate(f"seed-{n}", 2)
        client.release(f"seed-{n}")
    instances = [f"vm-{n}" for n in range(16)]
    records: list[dict] = []
    for burst in range(BURSTS):
        answers = run_burst(agent, tmp_path / f"burst-{burst}.jsonl", 500 + burst, instances)
        assert len(answers) == CLIENTS
        assert [r for r in answers if "error" in r] == []
        # Every client was connected before any answer came back.
        assert max(r["connected"] for r in answers) < min(r["answered"] for r in answers)
        records += answers
    for record in records:
        check_answer(record)
    statuses = {(r["op"], r["status"]) for r in records}
    assert ("PUT", 200) in statuses and ("DELETE", 200) in statuses and ("PUT", 409) in statuses
    assert any(r["op"] == "DELETE" and r["remove"] and r["body"]["released"] for r in records)
    check_never_held_twice(records)
    check_released_what_was_given(records)

    held = check_host(sim)
    for instance in instances:
        via_api = sorted(m["uuid"] for m in client.allocation(instance)["mdevs"])
        assert via_api == sorted(held.get(instance, []))
        answered = [
            {m["uuid"] for m in r["body"]["mdevs"]}
            for r in records if r["instance"] == instance and r["op"] == "PUT"
            and r["status"] == 200
        ]
        # What an instance holds is what one of its allocations answered.
        assert not via_api or set(via_api) in answered, instance
    # The daemon counted what the clients saw.
    puts_ok = sum(1 for r in records if r["op"] == "PUT" and r["status"] == 200)
    assert agent.metric("accel_agent_allocations_total") == puts_ok + 6
    for code in CONFLICT_CODES:
        seen = sum(1 for r in records if r["status"] == 409 and r["body"]["error"]["code"] == code)
        assert agent.metric("accel_agent_errors_total", code=code) == seen
    wait_for(lambda: agent.health()["status"] == "ok", what="health ok after the load")


def expected_after_restart(records: list[dict]) -> dict[str, tuple[set[str] | None, dict | None]]:
    """instance -> (what its acknowledged calls leave it holding, the call in
    flight when the daemon died, if any)."""
    state: dict[str, tuple[set[str] | None, dict | None]] = {}
    for record in records:
        held, _ = state.get(record["instance"], (None, None))
        if "error" in record:
            state[record["instance"]] = (held, record)
            continue
        if record["status"] != 200:
            continue
        held = {m["uuid"] for m in record["body"]["mdevs"]} if record["op"] == "PUT" else None
        state[record["instance"]] = (held, None)
    return state


def test_sigkill_under_load_loses_no_acknowledged_assignment(agent, sim, tmp_path):
    # Disjoint ids: each instance's calls come from one worker, in order.
    ids = [[f"w{w}-vm-{n}" for n in range(3)] for w in range(WORKERS)]
    outs, procs = run_workers(agent, tmp_path, ids)
    wait_for(
        lambda: sum(len(read_records(out)) for out in outs) >= 60,
        timeout=120,
        what="60 answers",
    )
    agent.kill()
    for proc in procs:
        proc.communicate(timeout=120)
    records = [r for out in outs for r in read_records(out)]
    answered = [r for r in records if "error" not in r]
    assert len(answered) >= 60
    assert len(answered) < WORKERS * REQUESTS, "the daemon died after the load: kill earlier"
    for record in answered:
        check_answer(record)

    agent.start()  # recovery runs before it is ready
    assert agent.health()["recovery"]["last_run"] is not None
    held = check_host(sim)
    client = agent.client()
    for worker_ids, out in zip(ids, outs, strict=True):
        expected = expected_after_restart(read_records(out))
        for instance in worker_ids:
            acknowledged, in_flight = expected.get(instance, (None, None))
            actual = {m["uuid"] for m in client.allocation(instance)["mdevs"]} or None
            assert actual == (set(held[instance]) if instance in held else None)
            if in_flight is None:
                assert actual == acknowledged, (instance, in_flight)
            elif in_flight["op"] == "DELETE":
                assert actual in (acknowledged, None), (instance, in_flight)
            elif acknowledged is None:  # a PUT in flight: all or nothing
                assert actual is None or len(actual) == in_flight["count"], (instance, actual)
            else:  # a PUT on an instance that held mdevs: same or refused
                assert actual == acknowledged, (instance, in_flight)
            assert actual is None or actual <= sim.sysfs_uuids()
    wait_for(lambda: agent.health()["status"] == "ok", what="health ok after the restart")
