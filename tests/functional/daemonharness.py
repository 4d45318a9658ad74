"""The random-kill harness's multi-process model (issue 21): the REAL daemon,
driven through its API, while everything around it happens that an
operator's host sees, and SIGKILL at random instants.

``killharness.py`` kills one operation in a child process at a time.  Here
the agent runs as operators run it: ``accel-agent`` with its real privsep
helper on the FUSE-simulated host, its ledger read and written by other
processes too.  Each step draws one of:

* an API mutation (allocate, release with or without remove, a migration
  claim whose name may equal an instance's, commit, abort, adopt) — some of
  them SIGKILLed (the daemon, and half of the time its helper, as systemd
  kills a crashed unit's cgroup) at a random instant of their measured
  duration, then the daemon started again (its start-up recovers);
* a SIGHUP reload: the same file, another valid file (config changes between
  kills: ``max_instances`` on and off), or a refused one (a bad value, an
  option that needs a restart);
* offline readers beside a mutation (``check-config``, ``--offline``
  listings), an offline writer (``accelctl --offline recover``), and
  ``accelctl recover --check`` through the daemon;
* a daemon restart (SIGTERM, then start);
* a stalled privsep helper (SIGSTOP, then a mutation that must get 503 or
  an answer, never hang) and a helper SIGKILLed in the middle of a mutation;
* a VM holding one of the agent's mdevs (its VFIO group open: the
  simulator's hold) or letting go; a libvirt domain (libvirt's test driver,
  a node file the daemon reads at every check) referencing one, or
  undefined;
* a wedged libvirtd (a socket that accepts and never answers,
  tests/wedged_libvirt.py) reloaded in as ``[libvirt] uri``: more listings
  at once than the API has workers, and a mutation, must all be answered,
  health must say libvirt is stalled and answer, as ``/metrics`` does; then
  libvirt is back and the daemon settles what the stall left (a release's
  undefine is recovery's).

The promises are checked from two sources apart from the agent: the
ledger's rows with plain SQL and sysfs (``killharness.read_ledger`` /
``read_sysfs``), against the harness's OWN log of what the API confirmed:

* **every mutation the API answered 2xx is in the ledger after recovery**:
  for every owner whose last answer is known, the ledger holds exactly what
  that answer said (an answer lost to a kill makes the owner unknown until
  its next confirmed answer);
* nothing leaked or missing between sysfs and the ledger, nothing left
  unsettled once the daemon settled, no UUID with two owners;
* a held mdev or one a domain references is never removed, and no remove
  is ever written to a held one (the simulator counts blocked removes);
* foreign mdevs are never touched;
* the daemon never dies of a reload, a reader, a stalled or killed helper:
  only of the harness's own SIGKILLs.

Deliberate faults this harness was seen to catch (besides the tests named in
their patches): ``ledger-lock-dropping-open`` (seed 7: an adoption answered 200
gone from the ledger 8 steps in, the daemon writing into a WAL another
process's last close had deleted; then a committed claim lost after a kill).

Run it alone: ``python -m tests.functional.daemonharness --kills 200``
(``make soak`` runs it at length beside the other models).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_agent import exception
from accel_agent.api.client import ApiClient
from tests.functional.daemon_fixture import AgentDaemon
from tests.functional.killharness import (
    REPO,
    TYPE,
    Row,
    _helper_pids,
    _wait_gone,
    read_ledger,
    read_sysfs,
    run_soak,
)

GPUS = 3
INSTANCES = tuple(f"vm-{n}" for n in range(4))
# Claims named like instances too: a claim and an allocation of one name are
# different owners, which nothing may mix up.
CLAIM_OWNERS = ("vm-0", "vm-1", "mig-0")
MAX_FOREIGN = 2
TIMEOUT = 120.0  # any one call, restart or settle; only a hang reaches it
DELAY_SPAN = 1.25
# The API's codes of a release that kept a held device: each kind's, and theirs together.
IN_USE = ("MdevInUse", "VfInUse", "DeviceInUse")
CALL_TIMEOUT = 1.5  # [DEFAULT] privileged_call_timeout: a stalled helper costs this
MUTATIONS = ("allocate", "release", "claim", "commit", "abort", "adopt")
# What a step may be, and how often (weights).
STEPS = {
    "mutation": 30,
    "kill": 16,
    "reload": 8,
    "readers": 8,
    "restart": 4,
    "stall": 5,
    "helper kill": 5,
    "hold": 5,
    "domain": 5,
    "recover": 3,
    "wedged libvirt": 3,
}
# [libvirt] call_timeout: what a libvirt that accepts and never answers costs.
LIBVIRT_CALL_TIMEOUT = 1.0
# Listings at once beside a wedged libvirt: more than the API's 16 workers.
WEDGED_LISTINGS = 20


def _base_config(state_dir: str, sysfs_root: str, socket_path: str, uri: str) -> str:
    return textwrap.dedent(f"""\
        [DEFAULT]
        host = testhost
        sysfs_root = {sysfs_root}
        state_dir = {state_dir}
        rescan_interval = 2
        event_debounce = 0.05
        privileged_call_timeout = {CALL_TIMEOUT}
        remove_timeout = 2
        [api]
        socket_path = {socket_path}
        shutdown_timeout = 10
        [libvirt]
        uri = {uri}
        call_timeout = {LIBVIRT_CALL_TIMEOUT}
        [migration]
        claim_timeout = 86400
        min_libvirt_version = 0.0.1
        min_qemu_version = 0.0.1
        min_kernel_version = 0.0.1
        [devices]
        enabled_mdev_types = {TYPE}
        [mdev_{TYPE}]
        """)


# Valid variants the reload step and the restarts switch between, and the
# refused ones (the running configuration must be kept).
VALID = {
    "plain": "",
    "capped": "max_instances = 6\n",
}
REFUSED = {
    "bad value": "[DEFAULT]\nevent_debounce = 50\n",
    "not a number": "[DEFAULT]\nrescan_interval = abc\n",
    "needs a restart": "[DEFAULT]\nhost = otherhost\n",
}


@dataclass
class Told:
    """What the API confirmed, per owner ``(kind, name)``: the UUIDs it holds
    (an empty set: nothing), or absent while its state is unknown (an answer
    lost to a kill, a 503 in the middle of a change)."""

    holds: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    unknown: set[tuple[str, str]] = field(default_factory=set)

    def confirm(self, owner: tuple[str, str], uuids: frozenset[str]) -> None:
        self.holds[owner] = uuids
        self.unknown.discard(owner)

    def forget(self, owner: tuple[str, str]) -> None:
        self.holds.pop(owner, None)
        self.unknown.add(owner)


@dataclass
class Stats:
    steps: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: int = 0
    helper_kills: int = 0
    acked: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    lost: collections.Counter[str] = field(default_factory=collections.Counter)
    reloads: collections.Counter[str] = field(default_factory=collections.Counter)
    confirmed_checked: int = 0
    violations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": dict(sorted(self.steps.items())),
            "daemon_kills": self.kills,
            "helper_kills": self.helper_kills,
            "acked": dict(sorted(self.acked.items())),
            "refused": dict(sorted(self.refused.items())),
            "answer_lost": dict(sorted(self.lost.items())),
            "reloads": dict(sorted(self.reloads.items())),
            "confirmed_answers_checked": self.confirmed_checked,
            "violations": len(self.violations),
        }


@dataclass
class Call:
    """One mutation: its arguments, and what came back (``status`` None: no
    answer, the daemon died or the connection broke)."""

    op: str
    args: dict[str, Any]
    status: int | None = None
    code: str | None = None
    answer: Any = None
    seconds: float | None = None


class DaemonHarness:
    def __init__(self, host: Any, sockdir: Path, seed: int,
                 log: Callable[[str], None] = lambda line: None) -> None:
        from tests.functional.test_takeover import libvirt_node

        self.host = host
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = log
        self.work = host.work
        self.socket_path = str(sockdir / "api.sock")
        self.node = self.work / "node.xml"
        self.domains: dict[str, str] = {}  # mdev uuid -> domain name
        self.uri = libvirt_node(self.node, [])
        self.config = self.work / "daemonharness.conf"
        self.variant = "plain"
        self._write(VALID[self.variant])
        self.daemon = AgentDaemon(self.config, self.socket_path, self.work)
        self.told = Told()
        self.stats = Stats()
        self.foreign: set[str] = set()
        # Adoptions whose answer a kill lost: done or not, the ledger says
        # at the next check (recorded: adopted; not: still foreign).
        self.adoptions_unknown: set[str] = set()
        self.held: set[str] = set()
        self.durations: dict[str, list[float]] = collections.defaultdict(list)

    # --- the scene -------------------------------------------------------------------

    def _write(self, section_or_extra: str) -> None:
        base = _base_config(self.host.state_dir, self.host.root, self.socket_path, self.uri)
        extra = section_or_extra
        if extra and not extra.startswith("["):
            base, extra = base + extra, ""  # an option of [mdev_<type>]
        self.config.write_text(base + extra)

    def _write_domains(self) -> None:
        from tests.functional.test_takeover import libvirt_node

        by_name: dict[str, list[str]] = collections.defaultdict(list)
        for uuid, name in sorted(self.domains.items()):
            by_name[name].append(uuid)
        libvirt_node(
            self.node,
            [(name, str(uuid_mod.uuid5(uuid_mod.NAMESPACE_URL, name)), uuids)
             for name, uuids in sorted(by_name.items())],
        )

    def client(self) -> ApiClient:
        return ApiClient(self.socket_path, timeout=TIMEOUT)

    def _violation(self, text: str, step: str = "") -> None:
        where = f" [seed {self.seed}, step {sum(self.stats.steps.values())} {step}]"
        self.stats.violations.append(text + where)
        self.log("VIOLATION " + text + where)

    # --- mutations -------------------------------------------------------------------

    def _owned(self) -> set[str]:
        return {u for uuids in self.told.holds.values() for u in uuids}

    def _pick(self) -> tuple[str, dict[str, Any]]:
        op = self.rng.choice(MUTATIONS)
        if op == "allocate":
            return op, {"instance": self.rng.choice(INSTANCES),
                        "count": 1 + self.rng.randrange(3)}
        if op == "release":
            return op, {"instance": self.rng.choice(INSTANCES),
                        "remove": self.rng.random() < 0.5}
        if op == "claim":
            sources = {str(uuid_mod.uuid4()): TYPE for _ in range(1 + self.rng.randrange(2))}
            return op, {"owner": self.rng.choice(CLAIM_OWNERS), "sources": sources}
        if op in ("commit", "abort"):
            args: dict[str, Any] = {"owner": self.rng.choice(CLAIM_OWNERS)}
            if op == "abort":
                args["remove"] = self.rng.random() < 0.5
            return op, args
        if not self.foreign:
            try:
                self._create_foreign()
            except RuntimeError:
                # A full host has nothing to adopt: free room instead (a
                # full host would also starve every later allocate).
                return "release", {"instance": self.rng.choice(INSTANCES), "remove": True}
        return "adopt", {"uuid": self.rng.choice(sorted(self.foreign))}

    def _send(self, call: Call) -> None:
        api, a = self.client(), call.args
        started = time.monotonic()
        try:
            if call.op == "allocate":
                call.answer = api.allocate(a["instance"], a["count"])
            elif call.op == "release":
                call.answer = api.release(a["instance"], remove=a["remove"])
            elif call.op == "claim":
                call.answer = api.migration_claim(a["owner"], a["sources"])
            elif call.op == "commit":
                call.answer = api.migration_commit(a["owner"])
            elif call.op == "abort":
                call.answer = api.migration_abort(a["owner"], remove=a["remove"])
            else:
                call.answer = api.adopt(a["uuid"])
            call.status = 200
        except exception.ApiError as exc:
            call.status, call.code, call.answer = exc.kwargs["status"], exc.kwargs["code"], \
                exc.message
        except (exception.AgentUnreachable, exception.AgentNotRunning) as exc:
            call.answer = exc.message  # no answer: the daemon died under it
        call.seconds = time.monotonic() - started

    def _learn(self, call: Call) -> None:
        """What ``call``'s answer says each owner holds now (the harness's
        own log: never read back from the agent)."""
        a, op = call.args, call.op
        if op == "adopt":
            if call.status == 200:
                self.foreign.discard(a["uuid"])
            elif call.status is None or call.status >= 500:
                self.adoptions_unknown.add(a["uuid"])
                self.stats.lost[op] += 1
            return
        owner = ("claim", a["owner"]) if op in ("claim", "commit", "abort") else (
            "instance", a["instance"])
        if call.status is None or call.status >= 500:
            # Lost, or interrupted half-way (a failed helper): unknown until
            # the next confirmed answer about this owner.
            self.told.forget(owner)
            if op == "commit":
                self.told.forget(("instance", a["owner"]))
            self.stats.lost[op] += 1
            return
        if call.status != 200:
            self.stats.refused[f"{op} {call.code}"] += 1
            released = call.code in IN_USE and op in ("release", "abort")
            if not released:
                return  # refused: nothing changed
            # "released but not removed": the owner holds nothing now.
            self.told.confirm(owner, frozenset())
            return
        self.stats.acked[op] += 1
        if op == "allocate":
            self.told.confirm(owner, frozenset(m["uuid"] for m in call.answer["mdevs"]))
        elif op in ("release", "abort"):
            self.told.confirm(owner, frozenset())
        elif op == "claim":
            self.told.confirm(owner, frozenset(call.answer["mapping"].values()))
        elif op == "commit":
            self.told.confirm(("instance", a["owner"]),
                              frozenset(m["uuid"] for m in call.answer["mdevs"]))
            self.told.confirm(owner, frozenset())

    def _mutate(self, kill: str | None = None) -> Call:
        """One mutation; ``kill``: "daemon" or "helper", SIGKILLed at a
        random instant of the call's measured duration."""
        op, args = self._pick()
        call = Call(op, args)
        measured = self.durations.get(op)
        if kill is None or not measured:
            self._send(call)
        else:
            helpers = _helper_pids(str(self.config))
            thread = threading.Thread(target=self._send, args=(call,), daemon=True)
            thread.start()
            time.sleep(self.rng.uniform(0.0, statistics.median(measured) * DELAY_SPAN))
            if kill == "daemon":
                self.daemon.kill()
                self.stats.kills += 1
                if self.rng.random() < 0.5:
                    self._kill(helpers)
                    self.stats.helper_kills += 1
            else:
                self._kill(helpers)
                self.stats.helper_kills += 1
            thread.join(TIMEOUT)
            if thread.is_alive():
                self._violation(f"{op} {args} still unanswered after {TIMEOUT:g} s", kill)
        if call.status == 200 and call.seconds is not None:
            self.durations[op].append(call.seconds)
        self._learn(call)
        self.log(f"{op:9s} {json.dumps(args, sort_keys=True)} -> {call.status} {call.code or ''}"
                 f"{' (killed: ' + kill + ')' if kill else ''}")
        return call

    @staticmethod
    def _kill(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _create_foreign(self) -> str:
        uuid = str(uuid_mod.uuid4())
        parents = sorted(os.listdir(os.path.join(self.host.root, "class", "mdev_bus")))
        for parent in self.rng.sample(parents, len(parents)):
            try:
                self.host.create_foreign(parent, TYPE, uuid)
            except OSError:
                continue  # full
            self.foreign.add(uuid)
            return uuid
        raise RuntimeError("no parent has room for a foreign mdev")

    # --- the other steps ---------------------------------------------------------------

    def _restart_after_kill(self) -> None:
        """As systemd restarts a crashed unit: the old helper gone first."""
        left = _wait_gone(_helper_pids(str(self.config)), 30.0)
        self._kill(left)
        _wait_gone(left, 10.0)
        self._maybe_switch_config()
        self.daemon.start(timeout=TIMEOUT)

    def _maybe_switch_config(self) -> None:
        """Config changes between kills (both variants keep every assigned
        mdev's type, so a start never has to refuse)."""
        if self.rng.random() < 0.3:
            self.variant = self.rng.choice(sorted(VALID))
            self._write(VALID[self.variant])

    def _reload(self) -> None:
        refused = self.rng.random() < 0.4
        if refused:
            name = self.rng.choice(sorted(REFUSED))
            self._write(REFUSED[name])
        else:
            name = self.rng.choice(sorted(VALID))
            self._write(VALID[name])
        before = self.client().health()["config"]["last_reload"]
        self.daemon.sighup()
        deadline = time.monotonic() + TIMEOUT
        while True:
            config = self.client().health()["config"]
            if config["last_reload"] != before:
                break
            if time.monotonic() > deadline or not self.daemon.running:
                self._violation(f"no reload result for {name!r}", "reload")
                return
            time.sleep(0.05)
        result = config["last_reload_result"]
        self.stats.reloads[f"{name}: {result}"] += 1
        if result != ("refused" if refused else "applied"):
            self._violation(f"reload {name!r} was {result}: {config}", "reload")
        if refused:
            self._write(VALID[self.variant])  # the file as the daemon runs it
        else:
            self.variant = name

    def _readers(self) -> None:
        """Offline readers beside a mutation: they may run at any instant of it."""
        commands = [
            ["check-config"],
            ["--offline", "mdevs", "--json"],
            ["--offline", "inventory", "--json"],
            ["--offline", "types", "--json"],
            # An offline writer beside the daemon (the file lock serialises
            # them): the case where a second open inside the daemon would
            # let this process's last close delete the daemon's WAL.
            ["--offline", "recover", "--json"],
        ]
        chosen = self.rng.sample(commands, 2)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file",
                 str(self.config), *argv],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for argv in chosen
        ]
        self._mutate()
        for argv, proc in zip(chosen, procs, strict=True):
            out, err = proc.communicate(timeout=TIMEOUT)
            if proc.returncode != 0 or "Traceback" in out + err:
                self._violation(f"accelctl {' '.join(argv)} failed ({proc.returncode}): "
                                f"{err.strip()[-500:]}", "readers")

    def _recover_check(self) -> None:
        try:
            self.client().recover(check=True)
        except exception.ApiError as exc:
            self._violation(f"recover --check through the daemon: {exc.message}", "recover")

    def _stall(self) -> None:
        helpers = _helper_pids(str(self.config))
        if not helpers:
            self._mutate()  # no helper yet: it starts on the first privileged call
            return
        for pid in helpers:
            os.kill(pid, signal.SIGSTOP)
        try:
            call = self._mutate()
            if call.status is None:
                self._violation(f"no answer from the daemon behind a stalled helper: "
                                f"{call.answer}", "stall")
            elif call.status == 503 and call.code != "PrivilegedHelperUnavailable":
                self._violation(f"a stalled helper answered {call.code}", "stall")
        finally:
            for pid in helpers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def _hold(self) -> None:
        if self.held and self.rng.random() < 0.5:
            uuid = self.rng.choice(sorted(self.held))
            with contextlib.suppress(exception.AccelAgentException):
                self.host.sim.release(uuid)
            self.held.discard(uuid)
            return
        present = sorted(self._owned() & set(self.host.sysfs_uuids()))
        if present:
            uuid = self.rng.choice(present)
            self.host.sim.hold(uuid)
            self.held.add(uuid)

    def _domain(self) -> None:
        if self.domains and self.rng.random() < 0.5:
            del self.domains[self.rng.choice(sorted(self.domains))]
        else:
            present = sorted(self._owned() & set(self.host.sysfs_uuids()))
            if present:
                self.domains[self.rng.choice(present)] = f"instance-{self.rng.randrange(3)}"
        self._write_domains()

    def _switch_libvirt(self, uri: str, step: str) -> None:
        """``[libvirt] uri`` reloaded to ``uri`` (a reload must apply it)."""
        self.uri = uri
        self._write(VALID[self.variant])
        before = self.client().health()["config"]["last_reload"]
        self.daemon.sighup()
        deadline = time.monotonic() + TIMEOUT
        while (config := self.client().health()["config"])["last_reload"] == before:
            if time.monotonic() > deadline or not self.daemon.running:
                self._violation(f"no reload result for [libvirt] uri = {uri}", step)
                return
            time.sleep(0.05)
        if config["last_reload_result"] != "applied":
            self._violation(f"[libvirt] uri = {uri} was {config['last_reload_result']}", step)

    def _wedged_libvirt(self) -> None:
        """libvirt accepts and never answers: nothing the daemon serves may
        wait for it longer than [libvirt] call_timeout, and health says so."""
        from tests.wedged_libvirt import WedgedLibvirtd

        step = "wedged libvirt"
        home = self.uri
        with WedgedLibvirtd() as wedged:
            self._switch_libvirt(wedged.uri, step)
            answers: list[str] = []

            def listing() -> None:
                try:
                    found = self.client().mdevs()
                except exception.ApiError as exc:
                    answers.append(f"{exc.kwargs['status']} {exc.kwargs['code']}")
                except (exception.AgentUnreachable, exception.AgentNotRunning) as exc:
                    answers.append(f"no answer: {exc.message}")
                else:
                    stalled = found.get("libvirt_error") and all(
                        m["libvirt"] is None for m in found["mdevs"])
                    answers.append("ok" if stalled else f"libvirt shown: {found}")

            readers = [threading.Thread(target=listing, daemon=True)
                       for _ in range(WEDGED_LISTINGS)]
            for reader in readers:
                reader.start()
            call = self._mutate()
            for reader in readers:
                reader.join(TIMEOUT)
            if any(reader.is_alive() for reader in readers) or call.status is None:
                self._violation(f"unanswered beside a wedged libvirt: {call.answer}", step)
            if set(answers) != {"ok"}:
                self._violation(f"listings beside a wedged libvirt: {sorted(set(answers))}",
                                step)
            if call.status is not None and call.status >= 500 and call.code != "LibvirtStalled":
                self._violation(f"{call.op} beside a wedged libvirt: {call.code}", step)
            libvirt = self.client().health()["libvirt"]
            self.log(f"wedged libvirt: {len(answers)} listings {sorted(set(answers))}, "
                     f"health libvirt {libvirt['state']} ({libvirt['last_error']})")
            if libvirt["state"] != "stalled":
                self._violation(f"health's libvirt beside a wedged one: {libvirt}", step)
            if "accel_agent_healthy" not in str(self.client().call("GET", "/metrics")):
                self._violation("no metrics beside a wedged libvirt", step)
        self._switch_libvirt(home, step)

    # --- the promises ------------------------------------------------------------------

    def _settle(self) -> bool:
        """Wait until the daemon has settled whatever was interrupted (its
        rescans run recovery); False when it did not within TIMEOUT."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            rows, intents = read_ledger(self.host.state_dir)
            if not intents and all(r.state == "present" and r.intent_id is None for r in rows):
                return True
            time.sleep(0.1)
        return False

    def check(self, step: str) -> None:
        if not self.daemon.running:
            self._violation(f"the daemon died on its own: {self.daemon.log()[-2000:]}", step)
            self.daemon.start(timeout=TIMEOUT)
        if not self._settle():
            self._violation("the daemon left interrupted work unsettled", step)
        rows, _ = read_ledger(self.host.state_dir)
        sysfs = read_sysfs(self.host.root)
        recorded = {r.uuid: r for r in rows}
        self._resolve_adoptions(set(recorded))
        leaked = set(sysfs) - set(recorded) - self.foreign
        if leaked:
            self._violation(f"in sysfs, neither recorded nor foreign: {sorted(leaked)}", step)
        missing = set(recorded) - set(sysfs)
        if missing:
            self._violation(f"recorded, missing from sysfs: {sorted(missing)}", step)
        per_uuid = collections.Counter(r.uuid for r in rows if r.owner is not None)
        if any(n > 1 for n in per_uuid.values()):
            self._violation(f"UUIDs with two owners: {per_uuid}", step)
        self._check_confirmed(rows, step)
        gone = (self.held | set(self.domains)) - set(sysfs)
        if gone:
            self._violation(f"held or domain-referenced mdevs were removed: {sorted(gone)}",
                            step)
        blocked = self.host.sim.status(counters=False).get("blocked_removes") or []
        if blocked:
            self._violation(f"a remove was written to a held mdev: {blocked}", step)
        if self.foreign - set(sysfs):
            self._violation(f"foreign mdevs were removed: {sorted(self.foreign - set(sysfs))}",
                            step)
        if self.foreign & set(recorded):
            self._violation(f"foreign mdevs recorded without adopt: "
                            f"{sorted(self.foreign & set(recorded))}", step)

    def _resolve_adoptions(self, recorded: set[str]) -> None:
        """An adoption lost to a kill happened if the settled ledger records
        the mdev; otherwise it is still foreign (and must stay unrecorded)."""
        adopted = self.adoptions_unknown & recorded
        self.foreign -= adopted
        self.adoptions_unknown.clear()

    def _check_confirmed(self, rows: list[Row], step: str) -> None:
        """Every owner whose last answer is known holds exactly that."""
        held: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        for row in rows:
            if row.owner is not None:
                held[(str(row.owner_kind), row.owner)].add(row.uuid)
        for owner, uuids in sorted(self.told.holds.items()):
            self.stats.confirmed_checked += 1
            if held.get(owner, set()) != set(uuids):
                self._violation(
                    f"{owner[0]} {owner[1]} was told it holds {sorted(uuids)}; the ledger says "
                    f"{sorted(held.get(owner, set()))}", step,
                )
        # Unknown owners become known again from what the ledger says now:
        # the next check holds the agent to it.
        for owner in list(self.told.unknown):
            self.told.confirm(owner, frozenset(held.get(owner, set())))

    # --- a run ---------------------------------------------------------------------------

    def step(self) -> None:
        kinds, weights = zip(*STEPS.items(), strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        self.stats.steps[kind] += 1
        if len(self.foreign) < MAX_FOREIGN and self.rng.random() < 0.1:
            with contextlib.suppress(RuntimeError):
                self._create_foreign()
        if kind == "mutation":
            self._mutate()
        elif kind == "kill":
            self._mutate(kill="daemon")
            if not self.daemon.running:
                self._restart_after_kill()
        elif kind == "helper kill":
            self._mutate(kill="helper")
        elif kind == "reload":
            self._reload()
        elif kind == "readers":
            self._readers()
        elif kind == "restart":
            code = self.daemon.stop(timeout=TIMEOUT)
            if code != 0:
                self._violation(f"SIGTERM ended the daemon with {code}", kind)
            self._maybe_switch_config()
            self.daemon.start(timeout=TIMEOUT)
        elif kind == "stall":
            self._stall()
        elif kind == "hold":
            self._hold()
        elif kind == "domain":
            self._domain()
        elif kind == "recover":
            self._recover_check()
        elif kind == "wedged libvirt":
            self._wedged_libvirt()
        self.check(kind)

    def run(self, kills: int, stop_on_violation: bool = False) -> Stats:
        self.daemon.start(timeout=TIMEOUT)
        try:
            limit = kills * 20 + 50
            while (self.stats.kills < kills or set(self.stats.steps) != set(STEPS)) and sum(
                self.stats.steps.values()
            ) < limit:
                self.step()
                if stop_on_violation and self.stats.violations:
                    break
        finally:
            self.daemon.close()
            for uuid in list(self.held):
                with contextlib.suppress(exception.AccelAgentException):
                    self.host.sim.release(uuid)
        return self.stats


@contextlib.contextmanager
def harness_host(tmp: Path) -> Iterator[Any]:
    from tests.functional.simhost import simulated_host

    with simulated_host(tmp, ["nvidia-pf"], gpus=GPUS) as host:
        yield host


def main(argv: list[str] | None = None) -> int:
    from tests.functional.daemon_fixture import short_dir

    parser = argparse.ArgumentParser(
        prog="python -m tests.functional.daemonharness",
        description="The random-kill harness's multi-process model: the real daemon on a "
        "FUSE-simulated host, driven through its API beside reloads, offline readers, "
        "restarts, stalled and killed helpers, held devices and libvirt domains, SIGKILLed "
        "at random instants; every answer the API confirmed is checked in the ledger. "
        "Needs root and /dev/fuse.",
    )
    parser.add_argument("--kills", type=int, default=200, help="stop after this many SIGKILLs")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--log", help="write one line per step here")
    parser.add_argument("--json", help="write the summary as JSON here")
    args = parser.parse_args(argv)

    def run(tmp: Path, seed: int, log: Callable[[str], None]) -> Stats:
        with harness_host(tmp) as host, short_dir() as sockdir:
            return DaemonHarness(host, sockdir, seed, log).run(args.kills)

    return run_soak(args, "daemon", run)


if __name__ == "__main__":
    sys.exit(main())
