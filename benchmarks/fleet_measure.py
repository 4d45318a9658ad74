"""What the fleet benchmark (benchmarks/fleet.py) measures, and how.

* :class:`Requests` — Placement's request log (placement_pg.RequestLog: one
  line per request, its agent from the token) read between two instants:
  counts by agent, method and route, writes, the peak rate in one-second and
  ten-second windows.  The benchmark's own reads of Placement (none in the
  measured windows; its token has no agent) are left out.
* :func:`exact_hosts` — which hosts Placement holds exactly, read from
  PostgreSQL in one query (not through Placement, which the polling would
  load while it is being measured).
* :class:`HealthSampler` — every agent's ``reporting`` (``GET /v1/health``)
  sampled in a thread: states, failures in a row, the spread of the next
  attempts.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.functional.fleet_agents import FleetAgent
from tests.functional.placement_pg import PostgresServer, read_log

# The agent's provider namespace (plan.PROVIDER_NAMESPACE), written out.
NAMESPACE = uuid.UUID("6b0d1c1e-3f5a-5d8e-9c47-acce1a9e0001")


@dataclass
class Requests:
    """The agents' requests logged in ``[start, end)``."""

    rows: list[tuple[float, str, str, str, str]]
    start: float
    end: float

    @classmethod
    def between(cls, path: Any, start: float, end: float) -> Requests:
        rows = [r for r in read_log(path) if start <= r[0] < end and r[1] != "-"]
        return cls(rows, start, end)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    def count(self) -> int:
        return len(self.rows)

    def writes(self) -> int:
        return sum(1 for r in self.rows if r[2] != "GET")

    def per_agent_hour(self, agents: int, writes: bool = False) -> float:
        n = self.writes() if writes else self.count()
        return n / agents / (self.seconds / 3600)

    def by_route(self) -> list[tuple[str, int]]:
        counts = collections.Counter(f"{r[2]} {r[3]}" for r in self.rows)
        return counts.most_common()

    def by_status(self) -> dict[str, int]:
        return dict(collections.Counter(r[4] for r in self.rows).most_common())

    def per_agent(self) -> list[int]:
        return list(collections.Counter(r[1] for r in self.rows).values())

    def peak(self, window: float = 1.0) -> float:
        """The most requests per second in any ``window`` (sliding, 0.1 s steps)."""
        times = sorted(r[0] for r in self.rows)
        best, left = 0, 0
        for right, t in enumerate(times):
            while times[left] <= t - window:
                left += 1
            best = max(best, right - left + 1)
        return best / window

    def first(self) -> float | None:
        return min((r[0] for r in self.rows), default=None)


def exact_hosts(pg: PostgresServer, agents: Iterable[FleetAgent]) -> set[str]:
    """The hosts whose subtree in Placement's database is what the agent
    wants (children, inventories, traits), read in one query."""
    held: dict[str, dict[str, tuple[dict[str, Any], list[str]]]] = {}
    with pg.connect() as conn:
        cur = conn.cursor()
        cur.execute(
            """
            SELECT root.name, rp.name, rc.name, inv.total, inv.reserved, inv.min_unit,
                   inv.max_unit, inv.step_size, inv.allocation_ratio
            FROM resource_providers rp
            JOIN resource_providers root ON root.id = rp.root_provider_id
            LEFT JOIN inventories inv ON inv.resource_provider_id = rp.id
            LEFT JOIN resource_classes rc ON rc.id = inv.resource_class_id
            WHERE rp.parent_provider_id IS NOT NULL
            """
        )
        for root, name, rc, *record in cur.fetchall():
            inventories = held.setdefault(root, {}).setdefault(name, ({}, []))[0]
            if rc is not None:
                keys = ("total", "reserved", "min_unit", "max_unit", "step_size")
                inventories[rc] = {**dict(zip(keys, record[:5], strict=True)),
                                   "allocation_ratio": float(record[5])}
        cur.execute(
            """
            SELECT root.name, rp.name, t.name
            FROM resource_provider_traits rpt
            JOIN resource_providers rp ON rp.id = rpt.resource_provider_id
            JOIN resource_providers root ON root.id = rp.root_provider_id
            JOIN traits t ON t.id = rpt.trait_id
            WHERE rp.parent_provider_id IS NOT NULL
            """
        )
        for root, name, trait in cur.fetchall():
            held.setdefault(root, {}).setdefault(name, ({}, []))[1].append(trait)
    exact = set()
    for agent in agents:
        mine = {n: (inv, sorted(traits)) for n, (inv, traits) in held.get(agent.name, {}).items()}
        if mine == agent.expected():
            exact.add(agent.name)
    return exact


def providers(pg: PostgresServer) -> list[tuple[str, str, bool]]:
    """(name, uuid, is_root) of every provider in Placement's database."""
    with pg.connect() as conn:
        cur = conn.cursor()
        cur.execute("SELECT name, uuid, parent_provider_id IS NULL FROM resource_providers")
        return [(n, u, bool(r)) for n, u, r in cur.fetchall()]


def duplicates(pg: PostgresServer, agents: list[FleetAgent]) -> list[str]:
    """What is wrong with the set of providers: one twice, one left over, one
    missing, one not under the UUID of its name (empty: nothing)."""
    rows = providers(pg)
    problems = []
    names = collections.Counter(n for n, _, _ in rows)
    problems += [f"{n} x{c}" for n, c in names.items() if c > 1]
    wanted = {a.name for a in agents} | {n for a in agents for n in a.expected()}
    problems += [f"left over: {n}" for n in sorted(set(names) - wanted)]
    problems += [f"missing: {n}" for n in sorted(wanted - set(names))]
    problems += [f"{n}: uuid {u}" for n, u, _ in rows
                 if u != str(uuid.uuid5(NAMESPACE, n))]
    return problems


def wait_exact(pg: PostgresServer, agents: list[FleetAgent], timeout: float,
               poll: float = 1.0) -> float | None:
    """Seconds until every host is exact (polled from the database); None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if len(exact_hosts(pg, agents)) == len(agents):
                return time.monotonic() - start
        except Exception:  # the database restarting: not exact yet
            pass
        time.sleep(poll)
    return None


@dataclass
class HealthSampler:
    """Every agent's ``reporting`` every ``interval`` seconds, in a thread."""

    agents: list[FleetAgent]
    interval: float
    samples: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> HealthSampler:
        self._thread = threading.Thread(target=self._run, name="health-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            found = []
            for agent in self.agents:
                try:
                    found.append(agent.reporting())
                except Exception as exc:  # an agent that does not answer is a finding
                    found.append({"state": "no answer", "error": str(exc)})
            self.samples.append((at, found))
            self._stop.wait(self.interval)

    def between(self, start: float, end: float) -> dict[str, Any]:
        """What the samples in ``[start, end)`` show, summed up."""
        chosen = [s for at, s in self.samples if start <= at < end]
        if not chosen:
            return {"samples": 0}
        failing = [sum(1 for r in s if r.get("state") == "failing") for s in chosen]
        states: collections.Counter[str] = collections.Counter()
        for sample in chosen:
            states.update(r.get("state", "?") for r in sample)
        streak = max((r.get("consecutive_failures") or 0) for s in chosen for r in s)
        spreads = []
        for sample in chosen:
            times = [_epoch(r.get("next_attempt_at")) for r in sample]
            times = [t for t in times if t is not None]
            if len(times) > 1:
                spreads.append(max(times) - min(times))
        return {
            "samples": len(chosen),
            "states": dict(states),
            "most failing at once": max(failing),
            "longest failure streak": streak,
            "next attempts spread over (max)": f"{max(spreads):.0f} s" if spreads else "-",
        }


def _epoch(text: Any) -> float | None:
    if not text:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def spread(values: list[int]) -> str:
    if not values:
        return "-"
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"
