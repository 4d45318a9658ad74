"""The real daemon under concurrent load from several client processes, and
SIGKILLed in the middle of it: no double assignment, no lost assignment,
every answer well-formed, ledger and sysfs in agreement."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from accel_agent.api.app import load_openapi
from accel_agent.mdev.ledger import Ledger
from tests.functional.daemon_fixture import (
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
CONFLICT_CODES = {"InsufficientCapacity", "InstanceAlreadyAllocated", "MdevInUse", "LedgerConflict"}
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


def check_host(host, expected_owner: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Ledger vs sysfs; returns instance -> uuids."""
    with Ledger(host.state_dir) as ledger:
        rows = ledger.all()
        assert ledger.pending_intents() == []
        assert ledger.unsettled() == []
    sysfs = host.sysfs_uuids()
    recorded = {r.uuid for r in rows}
    assert recorded <= sysfs, "a ledger row has no mdev in sysfs"
    assert sysfs - recorded == {FOREIGN}, "an mdev in sysfs is neither recorded nor foreign"
    held: dict[str, list[str]] = {}
    for row in rows:
        if row.owner is not None:
            held.setdefault(row.owner, []).append(row.uuid)
    every = [u for uuids in held.values() for u in uuids]
    assert len(every) == len(set(every)), "an mdev is assigned twice"
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
        assert body == {
            "instance": record["instance"],
            "released": body["released"],
            "removed": record["remove"],
        }, record


def test_concurrent_allocate_and_release_from_four_processes(agent, sim, tmp_path):
    shared = [f"vm-{n}" for n in range(12)]  # every worker uses every id
    outs, procs = run_workers(agent, tmp_path, [shared] * WORKERS)
    for proc in procs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr.decode()
    records = [r for out in outs for r in read_records(out)]
    assert len(records) == WORKERS * REQUESTS
    assert all("error" not in r for r in records), [r for r in records if "error" in r][:3]
    for record in records:
        check_answer(record)
    statuses = {(r["op"], r["status"]) for r in records}
    assert ("PUT", 200) in statuses and ("DELETE", 200) in statuses and ("PUT", 409) in statuses

    held = check_host(sim)
    client = agent.client()
    for instance in shared:
        via_api = sorted(m["uuid"] for m in client.allocation(instance)["mdevs"])
        assert via_api == sorted(held.get(instance, []))
    # The daemon counted what the clients saw.
    puts_ok = sum(1 for r in records if r["op"] == "PUT" and r["status"] == 200)
    assert agent.metric("accel_agent_allocations_total") == puts_ok
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
