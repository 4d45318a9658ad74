"""(h) A fleet against one Placement.

``python -m benchmarks.fleet [--quick] [--agents N] [--output BENCHMARKS.md]``
(``make bench-fleet``; ``python -m benchmarks --only h`` prints it).

Issue 38: what N agents cost one Placement, and what happens when Placement
goes away and comes back.  N real daemons (each its own state, socket and
static host of two M60 GPUs: tests/functional/fleet_agents.py) report to ONE
Placement as production runs it: its WSGI application under gunicorn with
four worker processes on Debian's PostgreSQL, on loopback
(tests/functional/placement_pg.py, which says why gunicorn), with a request
log on Placement's side counting every request by agent, method and route.
The benchmark installs PostgreSQL with apt when it is missing, runs its own
cluster in a directory of its own, and removes it afterwards.

Phases, each a table: the fleet's first start; the steady state (nothing
changes) with the agent as it is and with ``refresh_interval = 0`` (a read at
every sync, as before issue 38); a change on every host at once (a reload
that changes every GPU's type); Placement killed for ``outage`` seconds with
nothing changing, then again with every host changing during it; the
database restarted with every host changing while it is down; Placement
answering 503 (a load balancer without a backend) for a while, every host
changing.  Throughout, every agent's ``reporting`` is sampled.

The agents run with the defaults (``sync_interval`` 60 s, ``refresh_interval``
300 s, ``max_backoff`` 600 s) and a 5-minute outage: about 80 minutes for 50
agents.  ``--quick``: 10 agents and every interval and phase divided by 10
(about 10 minutes); its per-hour figures are given as measured and as at the
defaults (divided by 10), its peaks are not comparable.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import fleet_measure as fm
from tests.functional.fleet_agents import FleetAgent, fleet
from tests.functional.placement_pg import (
    PlacementService,
    PostgresServer,
    install_postgres,
    postgres_missing,
)

BEGIN = "<!-- fleet: begin (make bench-fleet writes this block; make bench keeps it) -->"
END = "<!-- fleet: end -->"
GPUS = 2
WORKERS = 4
TABLES = ("resource_providers", "inventories", "resource_provider_traits", "traits",
          "resource_classes")


class Run:
    """One benchmark run: the settings, the servers, the fleet, the findings."""

    def __init__(self, agents: int, scale: int, workdir: Path) -> None:
        self.n = agents
        self.scale = scale
        self.sync_interval = max(1, 60 // scale)
        self.refresh_interval = 300 // scale
        self.max_backoff = 600 // scale
        self.outage = 300 / scale
        self.steady = 1800 / scale
        self.before = 600 / scale
        self.workdir = workdir
        self.converge = 2 * self.max_backoff + 180
        self.lines: list[str] = []
        self.pg: PostgresServer
        self.placement: PlacementService
        self.agents: list[FleetAgent] = []
        self.sampler: fm.HealthSampler

    # --- helpers ---------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[fleet {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def requests(self, start: float, end: float | None = None) -> fm.Requests:
        return fm.Requests.between(self.placement.request_log, start, end or time.time())

    def table(self, title: str, rows: dict[str, Any], notes: list[str] = ()) -> None:
        self.lines += [f"#### {title}", "", "| what | result |", "| --- | --- |"]
        self.lines += [f"| {k} | {_fmt(v)} |" for k, v in rows.items()]
        self.lines += ["", *notes, ""] if notes else [""]

    def set_type_everywhere(self, mdev_type: str) -> float:
        at = time.time()
        for agent in self.agents:
            agent.set_type(mdev_type)
        return at

    def converged(self, what: str) -> float | None:
        took = fm.wait_exact(self.pg, self.agents, self.converge)
        self.say(f"{what}: exact after {took}")
        return took

    def all_ok(self, since: float) -> float | None:
        """When every agent's reporting said ok (polled); None after ``converge``."""
        while time.time() - since < self.converge:
            try:
                if all(a.reporting()["state"] == "ok" for a in self.agents):
                    return time.time()
            except Exception:  # an agent busy answering: ask again
                pass
            time.sleep(1.0)
        return None

    def syncs(self) -> dict[str, float]:
        """The fleet's accel_agent_placement_syncs_total, by result."""
        totals = {"ok": 0.0, "failed": 0.0}
        for agent in self.agents:
            for result in totals:
                totals[result] += agent.daemon.metric(
                    "accel_agent_placement_syncs_total", result=result)
        return totals

    def burst(self, start: float, end: float) -> dict[str, Any]:
        window = self.requests(start, end)
        first_minute = self.requests(start, start + 60)
        return {
            "requests (per agent)": f"{window.count()} ({window.count() / self.n:.1f})",
            "writes": window.writes(),
            "peak in the first minute, 1 s window": f"{first_minute.peak(1.0):.0f} req/s "
            f"(N/10 = {self.n / 10:g})",
            "peak in the first minute, 10 s window": f"{first_minute.peak(10.0):.1f} req/s",
            "statuses": window.by_status(),
        }

    # --- phases ----------------------------------------------------------------------

    def start(self) -> None:
        began = time.time()
        settings = {"sync_interval": self.sync_interval, "max_backoff": self.max_backoff,
                    "refresh_interval": self.refresh_interval}
        self.say(f"starting {self.n} agents")
        self._fleet = fleet(self.n, self.workdir / "agents", self.placement.endpoint,
                            gpus=GPUS, placement=settings, start_timeout=900)
        self.agents = self._fleet.__enter__()
        self.sampler = fm.HealthSampler(self.agents, max(2.0, 10.0 / self.scale * 2)).start()
        ready = time.time()
        took = self.converged("first start")
        end = time.time()
        size = self.pg.database_bytes()
        rows = self.pg.rows(TABLES)
        self.grown = (size - self.empty_bytes, rows)
        self.table(f"first start of {self.n} agents at once", {
            "spawn to every READY=1": f"{ready - began:.0f} s",
            "READY to Placement exact everywhere": f"{took:.0f} s" if took else "not exact",
            **self.burst(began, end),
            "database growth per agent": f"{(size - self.empty_bytes) / self.n / 1024:.1f} KiB "
            f"(pg_database_size, {self.empty_bytes / 1e6:.1f} MB empty -> {size / 1e6:.1f} MB)",
            "rows per agent": {t: f"{(rows[t] - self.empty_rows[t]) / self.n:g}"
                               for t in TABLES},
        })

    def idle_baseline(self, seconds: float = 60.0) -> None:
        """Placement's and PostgreSQL's CPU with no agent: subtracted from the
        steady state's (gunicorn's workers and PostgreSQL cost something idle)."""
        self.say(f"Placement idle for {seconds:.0f} s (the CPU baseline)")
        cpu0, db0 = self.placement.cpu_seconds(), self.pg.cpu_seconds()
        time.sleep(seconds)
        self.idle_cpu = (self.placement.cpu_seconds() - cpu0) / seconds
        self.idle_db = (self.pg.cpu_seconds() - db0) / seconds

    def steady_state(self, seconds: float, title: str, note: str) -> float:
        self.say(f"steady state for {seconds:.0f} s ({title})")
        start = time.time()
        cpu0, db0 = self.placement.cpu_seconds(), self.pg.cpu_seconds()
        size0 = self.pg.database_bytes()
        time.sleep(seconds)
        end = time.time()
        cpu, db = self.placement.cpu_seconds() - cpu0, self.pg.cpu_seconds() - db0
        # Less what the servers spend with no request at all (idle_baseline).
        cpu = max(0.0, cpu - self.idle_cpu * (end - start))
        db = max(0.0, db - self.idle_db * (end - start))
        window = self.requests(start, end)
        hours = (end - start) / 3600
        per_hour = window.per_agent_hour(self.n)
        per_request = f"{cpu / window.count() * 1000:.1f} ms" if window.count() else "-"
        rows = {
            "window": f"{end - start:.0f} s",
            "requests per agent per hour": f"{per_hour:.1f}"
            + (f" ({per_hour / self.scale:.1f} at the default intervals)" if self.scale > 1
               else ""),
            "writes per agent per hour": f"{window.per_agent_hour(self.n, writes=True):.2f}",
            "requests by method and route": dict(window.by_route()) or "none",
            "requests per agent in the window": fm.spread(window.per_agent()),
            "Placement CPU per request (gunicorn, all workers, less idle)": per_request,
            "Placement CPU per agent per hour (less idle)": f"{cpu / self.n / hours:.3f} s"
            + (f" ({cpu / self.n / hours / self.scale:.3f} s at the default intervals)"
               if self.scale > 1 else ""),
            "PostgreSQL CPU per agent per hour (less idle)": f"{db / self.n / hours:.3f} s",
            "idle (no agent): Placement, PostgreSQL": f"{self.idle_cpu * 3600:.0f} s, "
            f"{self.idle_db * 3600:.0f} s of CPU per hour",
            "database growth in the window": f"{(self.pg.database_bytes() - size0) / 1024:.0f} KiB",
            "agents' reporting": self.sampler.between(start, end),
        }
        self.table(title, rows, [note])
        return per_hour

    def fleet_change(self) -> None:
        self.say("a change on every host at once")
        syncs = self.syncs()
        at = self.set_type_everywhere("nvidia-15")
        took = self.converged("fleet-wide change")
        end = time.time()
        after = self.syncs()
        self.table("a change on every host at once (a reload: every GPU nvidia-35 -> nvidia-15)", {
            "time until Placement is exact everywhere": f"{took:.0f} s" if took else "not exact",
            **self.burst(at, end),
            "syncs (ok, failed)": f"{after['ok'] - syncs['ok']:.0f}, "
            f"{after['failed'] - syncs['failed']:.0f}",
            "agents' reporting": self.sampler.between(at, end),
        })

    def placement_outage(self, change: str | None) -> None:
        what = "with every host changing during it" if change else "nothing changing"
        self.say(f"Placement killed for {self.outage:.0f} s, {what}")
        down = time.time()
        self.placement.stop(signal.SIGKILL)
        if change:
            time.sleep(2)
            self.set_type_everywhere(change)
        time.sleep(max(0.0, down + self.outage - time.time()))
        noticed = self.sampler.between(down, time.time())
        back = time.time()
        self.placement.start()
        served = time.time()
        took = self.converged(f"outage, {what}")
        ok = self.all_ok(served)
        # The whole first minute after, whatever came before it.
        time.sleep(max(0.0, served + 60 - time.time()))
        end = time.time()
        problems = fm.duplicates(self.pg, self.agents)
        self.table(f"Placement killed for {self.outage:.0f} s, {what}", {
            "agents' reporting during the outage": noticed,
            "Placement serving again after its start": f"{served - back:.1f} s",
            "time until every agent is exact (from the start)":
                f"{served - back + took:.0f} s" if took is not None else "not exact",
            "time until every agent reports ok (from the start)":
                f"{ok - back:.0f} s" if ok is not None else "not ok",
            **self.burst(served, end),
            "nothing lost, no provider twice, none left over": "yes" if not problems and took
            is not None else f"NO: {problems[:5]}",
            "agents' reporting after": self.sampler.between(served, end),
        })

    def database_restart(self) -> None:
        self.say("database down, every host changing")
        down = time.time()
        self.pg.stop("fast")
        time.sleep(2)
        self.set_type_everywhere("nvidia-15")
        time.sleep(max(0.0, down + self.outage / 5 - time.time()))
        during = self.requests(down)
        noticed = self.sampler.between(down, time.time())
        back = time.time()
        self.pg.start()
        took = self.converged("database restart")
        end = time.time()
        self.table(f"PostgreSQL stopped for {self.outage / 5:.0f} s (Placement up), every host "
                   "changing", {
                       "answers while the database was down": during.by_status(),
                       "agents' reporting during it": noticed,
                       "time until every agent is exact (from the database's start)":
                           f"{took:.0f} s" if took is not None else "not exact",
                       **self.burst(back, end),
                       "no provider twice, none left over":
                           "yes" if not fm.duplicates(self.pg, self.agents) else "NO",
                   })

    def answering_503(self) -> None:
        self.say("Placement answering 503, every host changing")
        start = time.time()
        self.placement.set_unavailable(True)
        self.set_type_everywhere("nvidia-35")
        time.sleep(self.outage / 2)
        noticed = self.sampler.between(start, time.time())
        during = self.requests(start)
        back = time.time()
        self.placement.set_unavailable(False)
        took = self.converged("503")
        end = time.time()
        self.table(f"Placement answering 503 for {self.outage / 2:.0f} s, every host changing", {
            "requests answered 503 (per agent)":
                f"{during.count()} ({during.count() / self.n:.1f})",
            "agents' reporting during it": noticed,
            "time until every agent is exact (from the end of the 503s)":
                f"{took:.0f} s" if took is not None else "not exact",
            **self.burst(back, end),
            "no provider twice, none left over":
                "yes" if not fm.duplicates(self.pg, self.agents) else "NO",
        })

    def before_issue_38(self) -> None:
        """The steady state with a read at every sync (refresh_interval = 0)."""
        for agent in self.agents:
            agent.placement = {**agent.placement, "refresh_interval": 0}
            agent.set_type(agent.mdev_type)  # the config rewritten, SIGHUP
        time.sleep(self.sync_interval * 2)
        self.steady_state(
            self.before, "steady state, refresh_interval = 0 (a read at every sync)",
            "About what every agent sent before issue 38: the tree at every sync_interval "
            "(then also the root by name: twice this). Shown for comparison; not the default.")
        for agent in self.agents:
            agent.placement = {**agent.placement, "refresh_interval": self.refresh_interval}
            agent.set_type(agent.mdev_type)

    # --- the whole run ---------------------------------------------------------------

    def run(self) -> list[str]:
        self.pg = PostgresServer()
        try:
            self.pg.start()
            self.placement = PlacementService(self.pg, self.workdir / "placement", WORKERS)
            self.placement.start()
            self.empty_bytes = self.pg.database_bytes()
            self.empty_rows = self.pg.rows(TABLES)
            self.idle_baseline()
            phases = [
                self.start,
                lambda: self.steady_state(
                    self.steady, "steady state, nothing changing",
                    "Each agent reads the tree under its root once per refresh_interval "
                    "(jittered between half of it and all of it), one GET while nobody changed "
                    "its providers; nothing else. No writes."),
                self.before_issue_38,
                self.fleet_change,
                lambda: self.placement_outage(None),
                lambda: self.placement_outage("nvidia-35"),
                self.database_restart,
                self.answering_503,
            ]
            try:
                for phase in phases:
                    try:
                        phase()
                    except Exception as exc:  # the tables so far are kept, the failure said
                        self.say(f"phase failed: {exc!r}")
                        self.lines += [f"**The run stopped: a phase failed: {exc!r}**", ""]
                        raise
            finally:
                if self.agents:
                    self.sampler.stop()
                    self._fleet.__exit__(None, None, None)
                self.placement.stop()
        finally:
            self.pg.cleanup()
        return self.lines


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "/")


def report(agents: int, quick: bool, command: str) -> list[str]:
    missing = postgres_missing()
    if missing and "apt-get install" in missing:
        install_postgres()
        missing = postgres_missing()
    if missing:
        raise SystemExit(f"the fleet benchmark cannot run: {missing}")
    scale = 10 if quick else 1
    started = time.time()
    from benchmarks.__main__ import machine

    where = machine()  # its load average is the start's
    with tempfile.TemporaryDirectory(prefix="accel-bench-fleet-") as tmp:
        run = Run(agents, scale, Path(tmp))
        try:
            body = run.run()
        except Exception:
            print("\n".join(run.lines), file=sys.stderr)
            raise
    took = time.time() - started

    kind = ("QUICK MODE: 10x shorter intervals and phases, a development run, not the "
            "figures of record, which `make bench-fleet` makes on a quiet machine: 50 agents, "
            "about 80 minutes" if quick else "full run, the agents' default intervals")
    return [
        BEGIN,
        f"### (h) a fleet of {agents} agents against one Placement ({kind})",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{took / 60:.0f} min",
        f"- machine: {where}",
        f"- command: `{command}`",
        f"- Placement: openstack-placement under gunicorn, {WORKERS} sync worker processes, on "
        f"PostgreSQL from Debian, loopback; each agent a real daemon on a static host of {GPUS} "
        f"GPUs; sync_interval {run.sync_interval} s, refresh_interval {run.refresh_interval} s, "
        f"max_backoff {run.max_backoff} s",
        "",
        *body,
        *herd_lines(),
        END,
    ]


def herd_lines() -> list[str]:
    """The back-off carried to 1,000 and 10,000 agents (benchmarks/fleet_herd.py)."""
    from benchmarks import fleet_herd

    return [
        "#### the back-off carried to 1,000 and 10,000 agents (a simulation, not a measurement)",
        "",
        "The agents' own back-off (health.SyncHealth, one per agent, a clock the script moves), "
        "with the defaults, for an outage of 40 s and of 300 s: when the agents' first attempts "
        "after Placement is back start. Command: `python -m benchmarks.fleet_herd`.",
        "",
        *fleet_herd.table([1000, 10000], [40.0, 300.0]),
        "",
    ]


def write_block(path: str, lines: list[str]) -> None:
    from benchmarks import soak

    soak.write_block(path, lines[1:-1], BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="10 agents, every interval and phase 10x shorter (~10 min)")
    parser.add_argument("--agents", type=int, help="how many agents (default 50, quick 10)")
    parser.add_argument("--output", help="write the block into this report (BENCHMARKS.md)")
    args = parser.parse_args(argv)
    agents = args.agents or (10 if args.quick else 50)
    command = "python -m benchmarks.fleet " + shlex.join(argv if argv is not None
                                                         else sys.argv[1:])
    lines = report(agents, args.quick, command.strip())
    print("\n".join(lines))
    if args.output:
        write_block(args.output, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
