"""SIGKILL at a random instant of any mutating operation, then ``recover``,
then the crash-safety promises checked from sysfs and the ledger separately.

Each iteration runs ONE operation (allocate, release, release --remove,
migration claim, commit, abort, adopt, recover) in a child process
(``tests/functional/kill_child.py``) that writes through the REAL privsep
helper onto the FUSE-simulated host.  The harness draws a random delay
uniformly over the operation's measured duration (x1.25, so some calls finish
first); right before the call the child arms a kernel timer that SIGKILLs it
after that delay (the kernel keeps time: a busy machine cannot make the kill
land late, which a sleeping killer process would for a 2 ms call).  Half of
the time its privsep helper is killed too, as systemd kills a crashed unit's
cgroup; otherwise the helper finishes the write in flight after the agent
died.  Then ``accelctl recover`` runs (a quarter of the time
after a first ``recover`` that is itself killed mid-way), and the promises are
checked from two independent sources: the mdevs listed under ``sysfs``
(``bus/mdev/devices``, their links) and the ledger's rows read with plain
SQL, against what the clients were told (the ``ack`` lines):

* every mdev in sysfs is recorded or one of the harness's foreign mdevs, with
  the parent and type the ledger says; every recorded mdev is in sysfs;
  nothing is left creating, removing or reserved;
* no UUID has two owners, in the ledger's rows and in the acknowledged
  answers alike, and no owner holds more mdevs than it asked for;
* the interrupted operation took effect wholly or not at all, and every
  acknowledged allocation, claim or commit is still there;
* a completed operation left the ledger settled without any ``recover``;
* a second ``recover`` changes nothing.

Deliberate faults this harness was seen to catch (``tests/faults/*.patch``,
``make prove-faults`` applies each to a copy of the tree and expects a
violation; see README):

* ``early-create``: the first sysfs ``create`` of an allocation moved before
  the intent commit (same steps, same commit count): a kill between the two
  leaks an mdev that is neither recorded nor foreign;
* ``skip-settle``: ``release --remove`` skips its closing commit: the call
  returns, the ledger still says ``removing`` with a pending intent;
* ``claim-create-first``: a migration claim creates its mdevs before
  recording its intent: a leaked mdev after a kill.

The two leak windows are a few milliseconds of a 15-40 ms call, so a run of
50 kills may miss them; ``make prove-faults`` allows 400 kills and they showed
within 40-130 runs (seed 20261124, 2026-11-24), the skipped settlement within
5 runs.

Run it alone: ``python -m tests.functional.killharness --kills 1000`` (what
``make soak`` does; it prints runs, kills per operation and violations).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_agent.backends import sriov_vf
from accel_agent.sysfs import nvidia_vfio
from tests.functional.vfnet import RESET, StateFileNet

REPO = Path(__file__).resolve().parents[2]
TYPE = "nvidia-15"  # GRID M60-1Q: 8 per GPU
GPUS = 3
INSTANCES = tuple(f"vm-{n}" for n in range(4))
CLAIMS = tuple(f"mig-{n}" for n in range(2))
MAX_FOREIGN = 2
# Periodic rescans the idle-layout check runs after a layout change.
IDLE_PERIODS = 3
OPERATIONS = (
    "allocate", "release", "release --remove", "claim", "commit", "abort", "adopt", "recover",
)
# The round robin: the operations that write sysfs (create, remove) and so
# have a window between a write and its record come twice.
SCHEDULE = (
    "allocate", "release", "claim", "release --remove", "recover",
    "allocate", "commit", "claim", "abort", "release --remove", "adopt",
)
# The attach model (issue 15): mdevs and SR-IOV VFs of one pool, attached
# together; its operations are the ones an attach can meet.
POOL = "nic_a"
POOL_PF = "0000:10:00.0"  # the igb-sriov profile's first port
ATTACH_OPERATIONS = ("attach", "release", "release --remove", "adopt", "recover")
ATTACH_SCHEDULE = ("attach", "release", "attach", "release --remove", "recover", "attach", "adopt")
# Most allocations and claims start from an empty free pool, so that they
# create (a reuse-only one is a single transaction: nothing to interrupt).
DRAIN = 0.8
CHILD_TIMEOUT = 120.0
# Until an operation has been timed, it runs to completion (its first run is
# its calibration); afterwards the kill delay is drawn over its median x1.25.
DELAY_SPAN = 1.25


# --- independent readers ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    uuid: str
    parent: str
    mdev_type: str
    state: str
    owner: str | None
    owner_kind: str | None
    source_uuid: str | None
    intent_id: int | None
    adopted: bool
    settings: str | None = None  # JSON, as the ledger keeps it


def read_ledger(state_dir: str) -> tuple[list[Row], int]:
    """Every row with its assignment, and the number of pending intents,
    with plain SQL (not through the Ledger class under test)."""
    path = os.path.join(state_dir, "ledger.sqlite3")
    if not os.path.exists(path):
        return [], 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(
            "SELECT m.uuid, m.parent, m.mdev_type, m.state, a.owner, a.owner_kind, "
            "a.source_uuid, m.intent_id, m.adopted, m.settings FROM mdevs m "
            "LEFT JOIN assignments a ON a.uuid = m.uuid"
        ).fetchall()
        intents = conn.execute("SELECT count(*) FROM intents").fetchone()[0]
    finally:
        conn.close()
    return [Row(*r[:8], bool(r[8]), r[9]) for r in rows], int(intents)


def read_sysfs(root: str) -> dict[str, tuple[str, str]]:
    """uuid -> (parent, type) of every device the (simulated) kernel has:
    each mdev, and each typed vendor-VFIO VF (named by the UUID the agent
    gives a VF, uuid5 of its address)."""
    devices = os.path.join(root, "bus", "mdev", "devices")
    found = {}
    for uuid in os.listdir(devices) if os.path.isdir(devices) else ():
        link = os.path.join(devices, uuid)
        parent = os.path.basename(os.path.dirname(os.path.realpath(link)))
        found[uuid] = (parent, os.path.basename(os.readlink(os.path.join(link, "mdev_type"))))
    for vf, type_id in typed_vfs(root).items():
        if type_id:
            found[nvidia_vfio.device_uuid(vf)] = (vf, f"nvidia-{type_id}")
    for vf in pool_vfs(root):
        if pci_driver(root, vf) == "vfio-pci":
            found[sriov_vf.device_uuid(vf)] = (vf, POOL)  # handed over: the pool's device
    return found


def pool_vfs(root: str) -> list[str]:
    """The VFs of the attach model's pool PF (none when SR-IOV is off)."""
    pf = os.path.join(root, "bus", "pci", "devices", POOL_PF)
    if not os.path.isdir(pf):
        return []
    links = sorted((n for n in os.listdir(pf) if n.startswith("virtfn")), key=lambda n: int(n[6:]))
    return [os.path.basename(os.readlink(os.path.join(pf, n))) for n in links]


def pci_driver(root: str, address: str) -> str | None:
    try:
        return os.path.basename(
            os.readlink(os.path.join(root, "bus", "pci", "devices", address, "driver"))
        )
    except OSError:
        return None


def _vgpu_file(root: str, vf: str, name: str) -> str:
    return os.path.join(root, "bus", "pci", "devices", vf, "nvidia", name)


def typed_vfs(root: str) -> dict[str, int]:
    """VF -> ``current_vgpu_type`` (0: untyped) of every vendor-VFIO VF."""
    devices = os.path.join(root, "bus", "pci", "devices")
    found = {}
    for vf in sorted(os.listdir(devices)) if os.path.isdir(devices) else ():
        path = _vgpu_file(root, vf, "current_vgpu_type")
        if os.path.exists(path):
            with open(path) as handle:
                found[vf] = int(handle.read())
    return found


def _write(path: str, value: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DeviceModel:
    """What the harness needs to know of a device model: the simulated
    host, the type, and how another tool (or the kernel) makes and unmakes
    a device behind the agent's back."""

    name: str
    profiles: tuple[str, ...]
    host_options: dict[str, int]
    mdev_type: str
    operations: tuple[str, ...] = OPERATIONS
    schedule: tuple[str, ...] = SCHEDULE
    pool_vfs: int = 0  # the attach model: VFs of its pool
    # The standing model (issue 23): [mdev_<type>] standing, changed at random
    # before each "layout" operation (1..3 per GPU).
    standing: int = 0
    # Another tool's devices made now and then (the mixed-size model has none:
    # a foreign vGPU would take placements its layout needs).
    foreign: bool = True
    # Crash points (DeviceManager.on_step names) a run must have killed the
    # child at, each at least once (killharness_mixed: the order's steps).
    steps: tuple[str, ...] = ()

    @property
    def lays_out(self) -> bool:
        """The agent makes the devices itself (a layout): no free pool to drain."""
        return self.standing > 0

    @property
    def conf(self) -> str:
        return self.conf_with(self.standing)

    def conf_with(self, standing: int) -> str:
        text = f"[devices]\nenabled_mdev_types = {self.mdev_type}\n"
        if self.standing:
            text += f"[mdev_{self.mdev_type}]\nstanding = {standing}\n"
        if self.pool_vfs:
            text += (
                f"enabled_vf_pools = {POOL}\n[vf_pool_{POOL}]\ndevice_addresses = {POOL_PF}\n"
                f"num_vfs = {self.pool_vfs}\n"
            )
        return text + "[libvirt]\nuri =\n"

    def create_foreign(self, host: Any, rng: random.Random) -> str:
        """Another tool's device on a random parent with room; its UUID."""
        if self.name in ("mdev", "attach"):
            uuid = str(uuid_mod.uuid4())
            parents = sorted(os.listdir(os.path.join(host.root, "class", "mdev_bus")))
            for parent in rng.sample(parents, len(parents)):
                try:
                    host.create_foreign(parent, self.mdev_type, uuid)
                except OSError:
                    continue  # full
                return uuid
        else:
            type_id = self.mdev_type.removeprefix("nvidia-")
            free = [vf for vf, typed in typed_vfs(host.root).items() if not typed]
            for vf in rng.sample(free, len(free)):
                try:
                    _write(_vgpu_file(host.root, vf, "current_vgpu_type"), type_id.encode())
                except OSError:
                    continue  # not creatable on this VF now
                return nvidia_vfio.device_uuid(vf)
        raise RuntimeError(f"no {self.name} parent has room for a foreign device")

    def vanish(self, host: Any, uuid: str) -> None:
        """The device goes behind the agent's back (``remove``; a VF untyped,
        or a pool VF taken off vfio-pci)."""
        for vf in pool_vfs(host.root):
            if sriov_vf.device_uuid(vf) == uuid:
                unbind = os.path.join(host.root, "bus", "pci", "drivers", "vfio-pci", "unbind")
                _write(unbind, vf.encode())
                return
        if self.name in ("mdev", "attach"):
            _write(os.path.join(host.root, "bus", "mdev", "devices", uuid, "remove"), b"1")
            return
        (vf,) = [v for v in typed_vfs(host.root) if nvidia_vfio.device_uuid(v) == uuid]
        _write(_vgpu_file(host.root, vf, "current_vgpu_type"), b"0")


MDEV = DeviceModel("mdev", ("nvidia-pf",), {"gpus": GPUS}, TYPE)
# An mdev GPU and one igb port of 4 VFs: attach calls of mdevs and VFs together.
ATTACH = DeviceModel(
    "attach", ("nvidia-pf", "igb-sriov"), {"gpus": 2, "nics": 1}, TYPE,
    ATTACH_OPERATIONS, ATTACH_SCHEDULE, pool_vfs=4,
)
# Two L40S GPUs of 8 VFs (L40S-4Q: 12 per GPU, so the VFs are the limit).
VFIO = DeviceModel("nvidia_vfio", ("nvidia-vfio",), {"gpus": 2, "vfs": 8}, "nvidia-1150")
# Standing layouts on the same two L40S GPUs: kills while a layout is placed,
# drained (a lower N) and restored (a reboot, then recover), beside
# allocations that take the layout's devices and releases that give them back.
STANDING = DeviceModel(
    "standing", ("nvidia-vfio",), {"gpus": 2, "vfs": 8}, "nvidia-1150",
    ("allocate", "release", "release --remove", "layout", "recover"),
    ("layout", "allocate", "release --remove", "layout", "recover", "allocate", "release",
     "layout"),
    standing=2,
)
MODELS = {m.name: m for m in (MDEV, VFIO, ATTACH, STANDING)}


# --- what the clients were told -----------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    kind: str  # instance | claim
    uuids: frozenset[str]
    requested: int
    sources: tuple[tuple[str, str], ...] = ()  # claim: (source uuid, our uuid)


@dataclass
class Model:
    holdings: dict[str, Holding] = field(default_factory=dict)
    foreign: set[str] = field(default_factory=set)


def holdings_of(rows: list[Row]) -> dict[str, Holding]:
    owners: dict[str, list[Row]] = collections.defaultdict(list)
    for row in rows:
        if row.owner is not None and row.owner_kind != "standing":
            owners[row.owner].append(row)
    result = {}
    for owner, held in owners.items():
        kinds = {r.owner_kind for r in held}
        kind = kinds.pop() if len(kinds) == 1 else "mixed:" + ",".join(sorted(map(str, kinds)))
        result[owner] = Holding(
            kind,
            frozenset(r.uuid for r in held),
            len(held),
            tuple(sorted((r.source_uuid, r.uuid) for r in held if r.source_uuid)),
        )
    return result


# --- one operation in a child, killed ---------------------------------------------------


@dataclass
class Outcome:
    operation: str
    args: dict[str, Any]
    delay: float | None  # None: not killed (calibration)
    result: str = "killed"  # acked | refused | killed
    answer: Any = None
    duration: float | None = None
    helper_killed: bool = False
    at_step: str | None = None  # "<crash point>:<n>": killed there, not after a delay
    steps: dict[str, int] | None = None  # the crash points the child passed (not killed)


def _helper_pids(config: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"--privsep_context" in argv and os.fsencode(config) in argv:
            found.append(int(entry))
    return found


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if pids:
            time.sleep(0.02)
    return pids


def start_child(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The child with unbuffered pipes (see :func:`read_line`)."""
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env=env
    )


def read_line(proc: subprocess.Popen[bytes]) -> str:
    """One line of the child's stdout, read a byte at a time: nothing past
    the newline is taken from the pipe.  A buffered readline would read
    ahead ("ready", "begin" and "ack" arrive together when a loaded machine
    lets the harness read late), and ``communicate`` then reads the pipe's
    file descriptor past that buffer: the ack was lost and the child looked
    as if it had died on its own (seen under load, exit status 0)."""
    assert proc.stdout is not None
    return proc.stdout.readline().decode(errors="replace")  # a raw FileIO: byte by byte


def finish_child(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    return out.decode(errors="replace"), err.decode(errors="replace")


def run_child(
    config: str,
    operation: str,
    args: dict[str, Any],
    delay: float | None,
    kill_helper: bool,
    env: dict[str, str] | None = None,
    at_step: str | None = None,
) -> Outcome:
    name = "release" if operation.startswith("release") else operation
    outcome = Outcome(operation, args, delay, at_step=at_step)
    argv = [sys.executable, "-m", "tests.functional.kill_child", config, name, json.dumps(args)]
    if delay is not None:
        argv.append(f"{delay:.9f}")  # the child's kernel timer kills it: exact under load
    elif at_step is not None:
        argv.append(f"step:{at_step}")  # the child kills itself at that crash point
    # The helper's pids, for a kill "of the whole unit": the helper exists
    # once the child said ready (it starts it first).
    helpers: list[int] = []
    proc = start_child(argv, env)
    try:
        ready = read_line(proc)
        if ready != "ready\n":
            proc.kill()
            _, err = finish_child(proc)
            raise RuntimeError(f"child for {operation} did not start: {ready!r} {err}")
        helpers = _helper_pids(config)
        out, err = finish_child(proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if kill_helper and proc.returncode == -signal.SIGKILL:
        # systemd kills a crashed unit's cgroup: the helper dies too, its
        # write in flight done or not.
        outcome.helper_killed = True
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # The child disarms its timer once the call returned, so an answer
    # always reaches its client and a killed child printed none.
    for line in out.splitlines():
        if line.startswith("ack "):
            took, _, answer = line[4:].partition(" ")
            outcome.result, outcome.answer = "acked", json.loads(answer)
            outcome.duration = float(took)
        elif line.startswith("error "):
            outcome.result, outcome.answer = "refused", line[6:]
        elif line.startswith("steps "):
            outcome.steps = json.loads(line[6:])
    if outcome.result != "killed" and proc.returncode != 0:
        raise RuntimeError(f"child for {operation} failed ({proc.returncode}): {err}")
    if outcome.result == "killed" and proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"child for {operation} died on its own ({proc.returncode}): {err}")
    # A crashed agent's helper either dies with it or finishes the write it
    # was doing and exits on EOF; recovery starts only once it is gone.
    left = _wait_gone(_helper_pids(config), 30.0)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(left, 10.0)
    return outcome


# --- the harness -------------------------------------------------------------------------


@dataclass
class Stats:
    iterations: int = 0
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    completed: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    recover_kills: int = 0
    helper_kills: int = 0
    violations: list[str] = field(default_factory=list)
    # Kills at a named crash point (the mixed-size model), per crash point.
    step_kills: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values()) + self.recover_kills

    def to_dict(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            "kills": sum(self.kills.values()) + self.recover_kills,
            "kills_per_operation": dict(sorted(self.kills.items())),
            "kills_of_a_first_recover": self.recover_kills,
            "helper_killed_too": self.helper_kills,
            "completed_per_operation": dict(sorted(self.completed.items())),
            "refused_per_operation": dict(sorted(self.refused.items())),
            "kills_per_step": dict(sorted(self.step_kills.items())),
            "violations": len(self.violations),
        }


class KillHarness:
    """Runs iterations against one simulated host (``host``: tests.functional.simhost.SimHost)."""

    def __init__(
        self,
        host: Any,
        seed: int,
        log: Callable[[str], None] = lambda line: None,
        model: DeviceModel = MDEV,
    ):
        self.host = host
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = log
        self.device_model = model
        self.config = host.config(model.conf, name="killharness.conf")
        self.standing = model.standing
        # A layout VF a "VM" holds during an iteration (it must keep its type).
        self.vm_held: str | None = None
        self.model = Model()
        self.stats = Stats()
        self.durations: dict[str, list[float]] = collections.defaultdict(list)

    # -- helpers ------------------------------------------------------------------------

    @property
    def _vfnet(self) -> str:
        return str(self.host.work / "vfnet.json")

    @property
    def _env(self) -> dict[str, str] | None:
        """The children's environment: the attach model's VF settings go to a
        file (the simulator has no netlink; tests.functional.vfnet)."""
        if not self.device_model.pool_vfs:
            return None
        return dict(os.environ, ACCEL_TEST_VFNET=self._vfnet)

    @contextlib.contextmanager
    def _manager(self) -> Iterator[Any]:
        """An in-process manager for setting the scene (not under test)."""
        kwargs: dict[str, Any] = {}
        if self.device_model.pool_vfs:
            from accel_agent.backends import builtin
            from accel_agent.devices.writers import DirectWriter
            from accel_agent.sriov.pools import build_pools
            from accel_agent.sriov.vfpool import VfPools
            from tests.configutil import make_conf

            conf = make_conf(self.device_model.conf, sysfs_root=self.host.root)
            writer = DirectWriter(self.host.root)
            pools = VfPools(self.host.root, build_pools(conf), writer, StateFileNet(self._vfnet))
            kwargs = {"writer": writer,
                      "backends": {**builtin(), "sriov_vf": sriov_vf.SriovVfBackend(pools)}}
        manager = self.host.manager(self._conf(), **kwargs)
        try:
            yield manager
        finally:
            manager.ledger.close()

    def _conf(self) -> str:
        """The configuration as the children have it now."""
        return self.device_model.conf_with(self.standing)

    def _delay(self, operation: str) -> float | None:
        measured = self.durations.get(operation)
        if not measured:
            return None
        return self.rng.uniform(0.0, statistics.median(measured) * DELAY_SPAN)

    def _free_name(self, names: tuple[str, ...]) -> str | None:
        free = [n for n in names if n not in self.model.holdings]
        return self.rng.choice(free) if free else None

    def _held(self, kind: str) -> list[str]:
        return sorted(o for o, h in self.model.holdings.items() if h.kind == kind)

    def _violation(self, text: str, outcome: Outcome | None = None) -> None:
        where = (
            f" [seed {self.seed}, iteration {self.stats.iterations}, {outcome.operation} "
            f"{json.dumps(outcome.args, sort_keys=True)}, delay {outcome.delay}, "
            f"{outcome.result}, helper killed {outcome.helper_killed}]"
            if outcome else f" [seed {self.seed}, iteration {self.stats.iterations}]"
        )
        self.stats.violations.append(text + where)
        self.log("VIOLATION " + text + where)

    # -- setting the scene (in process) -------------------------------------------------

    def _setup_allocate(self) -> str | None:
        instance = self._free_name(INSTANCES)
        if instance is None:
            return None
        with self._manager() as manager:
            if self.device_model.pool_vfs:
                from accel_agent.attach_requests import parse

                pools = manager.backends["sriov_vf"].pools.pools
                handles = manager.attach(instance, parse(self._requests(), pools)).handles
                uuids = [h["uuid"] for h in handles]
            else:
                uuids = manager.allocate(instance, 1 + self.rng.randrange(2)).uuids
        self.model.holdings[instance] = Holding("instance", frozenset(uuids), len(uuids))
        return instance

    def _requests(self) -> list[dict[str, Any]]:
        """An attach call: 1-2 mdevs and one VF with a MAC and a VLAN."""
        tag = self.rng.randrange(1, 255)
        return [
            {"mdev_type": self.device_model.mdev_type, "count": 1 + self.rng.randrange(2)},
            {"pool": POOL, "mac": f"52:54:00:00:00:{tag:02x}", "vlan": tag},
        ]

    def _setup_claim(self) -> str | None:
        owner = self._free_name(CLAIMS)
        if owner is None:
            return None
        sources = {
            str(uuid_mod.uuid4()): self.device_model.mdev_type
            for _ in range(1 + self.rng.randrange(2))
        }
        with self._manager() as manager:
            mapping = manager.claim(owner, sources, time.time() + 24 * 3600)
        self.model.holdings[owner] = Holding(
            "claim", frozenset(mapping.values()), len(sources), tuple(sorted(mapping.items()))
        )
        return owner

    def _release_some(self, names: tuple[str, ...] | None = None) -> None:
        """Make room: free one holder (in process), one of ``names`` if given."""
        owners = sorted(o for o in self.model.holdings if names is None or o in names)
        if not owners:
            return
        owner = self.rng.choice(owners)
        with self._manager() as manager:
            if self.model.holdings[owner].kind == "claim":
                manager.abort_claim(owner)
            else:
                manager.release(owner, remove=self.rng.random() < 0.5)
        del self.model.holdings[owner]

    def _drain_free(self) -> None:
        """Remove the free owned mdevs (in process), so that the next
        allocation or claim has to create: reuse alone writes no sysfs."""
        rows, _ = read_ledger(self.host.state_dir)
        free: dict[str, int] = collections.Counter(
            r.parent for r in rows if r.owner is None and r.state == "present"
        )
        with self._manager() as manager:
            for parent, count in sorted(free.items()):
                # On one parent, reuse comes before create: this takes exactly them.
                manager.allocate("drain", count, parent=parent)
                manager.release("drain", remove=True)

    def _hold_a_layout_vf(self) -> None:
        """Half of the time a VM holds one of the layout's typed VFs (its
        VFIO group open) while the layout changes: it must keep its type."""
        if self.rng.random() >= 0.5:
            return
        rows, _ = read_ledger(self.host.state_dir)
        layouts = sorted(r.parent for r in rows if r.owner_kind == "standing")
        if layouts:
            self.vm_held = self.rng.choice(layouts)
            self.host.sim.hold(self.vm_held)

    def _let_go(self) -> None:
        if self.vm_held is not None:
            self.host.sim.release(self.vm_held)
            self.vm_held = None

    def _create_foreign(self) -> str:
        uuid = self.device_model.create_foreign(self.host, self.rng)
        self.model.foreign.add(uuid)
        return uuid

    def prepare(self, operation: str) -> dict[str, Any]:
        """Arguments for ``operation``, after making it possible."""
        if operation == "attach":
            instance = self._free_name(INSTANCES)
            if instance is None:
                self._release_some(INSTANCES)
                instance = self._free_name(INSTANCES)
            assert instance is not None
            requests = self._requests()
            return {"instance": instance, "requests": requests,
                    "count": requests[0]["count"] + 1}
        if operation == "allocate":
            instance = self._free_name(INSTANCES)
            if instance is None:
                self._release_some(INSTANCES)
                instance = self._free_name(INSTANCES)
            assert instance is not None
            return {"instance": instance, "count": 1 + self.rng.randrange(3)}
        if operation.startswith("release"):
            held = self._held("instance") or [self._setup_allocate() or self._held("instance")[0]]
            return {"instance": self.rng.choice(held), "remove": operation.endswith("--remove")}
        if operation == "claim":
            owner = self._free_name(CLAIMS)
            if owner is None:
                self._release_some(CLAIMS)
                owner = self._free_name(CLAIMS)
            assert owner is not None
            sources = {
                str(uuid_mod.uuid4()): self.device_model.mdev_type
                for _ in range(1 + self.rng.randrange(2))
            }
            return {"owner": owner, "sources": sources}
        if operation in ("commit", "abort"):
            held = self._held("claim")
            if not held:
                if self._free_name(CLAIMS) is None:
                    self._release_some(CLAIMS)
                owner = self._setup_claim()
                assert owner is not None
                held = [owner]
            return {"owner": self.rng.choice(held)}
        if operation == "adopt":
            foreign = sorted(self.model.foreign) or [self._create_foreign()]
            return {"uuid": self.rng.choice(foreign)}
        if operation == "layout":
            # Another N (a reload): the converge then places, drains or removes.
            self.standing = self.rng.choice([n for n in (1, 2, 3) if n != self.standing])
            self.config = self.host.config(self.device_model.conf_with(self.standing),
                                           name="killharness.conf")
            self._hold_a_layout_vf()
            return {}
        if operation == "recover":
            if not any(h.uuids for h in self.model.holdings.values()):
                self._setup_allocate() or self._release_some()
            if self.rng.random() < 0.5:
                self.host.sim.reboot()  # every mdev is gone: recover re-creates them all
                self.model.foreign.clear()
                # ... and every VF, with what its PF's driver held for it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._vfnet)
            else:
                owned = sorted(u for h in self.model.holdings.values() for u in h.uuids)
                if owned:  # one vanishes behind the agent's back
                    self.device_model.vanish(self.host, self.rng.choice(owned))
            return {}
        raise ValueError(operation)

    # -- one iteration ----------------------------------------------------------------------

    def iteration(self, operation: str) -> Outcome:
        self.stats.iterations += 1
        if self.device_model.foreign and operation != "adopt" and (
            len(self.model.foreign) < MAX_FOREIGN
        ) and self.rng.random() < 0.15:
            with contextlib.suppress(RuntimeError):
                self._create_foreign()  # another tool's mdev, never to be touched
        args = self.prepare(operation)
        timing = operation
        if operation in ("allocate", "claim", "attach") and self.rng.random() < DRAIN and (
            not self.device_model.lays_out
        ):
            self._drain_free()
            timing += " (creates)"  # timed apart: creates take longer than reuse
        before = dict(self.model.holdings)
        delay, at_step = self._kill_plan(timing)
        kill_helper = (delay is not None or at_step is not None) and self.rng.random() < 0.5
        outcome = run_child(self.config, operation, args, delay, kill_helper, self._env,
                            at_step)
        self._saw(timing, outcome)
        if outcome.result == "acked":
            assert outcome.duration is not None
            self.durations[timing].append(outcome.duration)
            self.stats.completed[operation] += 1
        elif outcome.result == "refused":
            self.stats.refused[operation] += 1
        else:
            self.stats.kills[operation] += 1
            self.stats.helper_kills += outcome.helper_killed
            if at_step is not None:
                self.stats.step_kills[at_step.rsplit(":", 1)[0]] += 1
        if outcome.result != "killed":
            self._check_settled(outcome)
        held_type = typed_vfs(self.host.root).get(self.vm_held) if self.vm_held else None
        self._recover(outcome)
        self._check(outcome, before)
        self._check_model(outcome, held_type)
        self._check_idempotent(outcome)
        self._let_go()
        self.log(
            f"{self.stats.iterations:5d} {operation:18s} {outcome.result:8s} "
            f"delay={'-' if delay is None else f'{delay * 1000:.1f}ms'} "
            f"helper_killed={outcome.helper_killed} holders={len(self.model.holdings)} "
            f"foreign={len(self.model.foreign)}"
        )
        return outcome

    def _kill_plan(self, timing: str) -> tuple[float | None, str | None]:
        """When the child dies: after a random delay, or (a model that names
        crash points) at one; (None, None): not killed."""
        return self._delay(timing), None

    def _saw(self, timing: str, outcome: Outcome) -> None:
        """What a model learns from a child's run (the crash points it passed)."""

    def _check_model(self, outcome: Outcome, held_type: int | None) -> None:
        """The model's own promises, after recover."""
        if self.device_model.standing:
            self._check_layout(outcome, held_type)
            if outcome.operation == "layout":
                self._check_idle_layout(outcome)

    def _recover(self, outcome: Outcome) -> None:
        if self.durations.get("recover") and self.rng.random() < 0.25:
            first = run_child(
                self.config, "recover", {}, self._delay("recover"), self.rng.random() < 0.5,
                self._env,
            )
            if first.result == "killed":
                self.stats.recover_kills += 1
            elif first.result == "refused":
                self._violation(f"a recover refused: {first.answer}", outcome)
        if self._env is not None:
            # The same recover, in a child whose VF settings go to the file.
            done = run_child(self.config, "recover", {}, None, False, self._env)
            if done.result != "acked":
                self._violation(f"recover failed: {done.answer}", outcome)
            return
        proc = subprocess.run(
            [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", self.config,
             "recover", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
        )
        if proc.returncode != 0:
            self._violation(f"accelctl recover failed: {proc.stderr.strip()}", outcome)

    # -- the promises -----------------------------------------------------------------------

    def _check_settled(self, outcome: Outcome) -> None:
        """A call that returned left nothing for recovery to finish."""
        rows, intents = read_ledger(self.host.state_dir)
        unsettled = [r.uuid for r in rows if r.state != "present" or r.intent_id is not None]
        if intents or unsettled:
            self._violation(
                f"the ledger is not settled after a completed call: {intents} pending "
                f"intent(s), unsettled rows {unsettled}", outcome,
            )

    def _check(self, outcome: Outcome, before: dict[str, Holding]) -> None:
        rows, intents = read_ledger(self.host.state_dir)
        sysfs = read_sysfs(self.host.root)
        recorded = {r.uuid: r for r in rows}
        # sysfs <-> ledger, both directions, parent and type included
        leaked = set(sysfs) - set(recorded) - self.model.foreign
        if leaked:
            self._violation(f"mdevs in sysfs neither recorded nor foreign (leaked): "
                            f"{sorted(leaked)}", outcome)
        missing = set(recorded) - set(sysfs)
        if missing:
            self._violation(f"recorded mdevs missing from sysfs: {sorted(missing)}", outcome)
        for uuid, row in recorded.items():
            if uuid in sysfs and sysfs[uuid] != (row.parent, row.mdev_type):
                self._violation(f"mdev {uuid} is {sysfs[uuid]} in sysfs but "
                                f"{(row.parent, row.mdev_type)} in the ledger", outcome)
        if intents or any(r.state != "present" or r.intent_id is not None for r in rows):
            self._violation("recover left pending intents or unsettled rows", outcome)
        gone_foreign = self.model.foreign - set(sysfs)
        if gone_foreign:
            self._violation(f"foreign mdevs were removed: {sorted(gone_foreign)}", outcome)
        touched = self.model.foreign & set(recorded)
        adopting = {outcome.args["uuid"]} if outcome.operation == "adopt" else set()
        if touched - adopting:
            self._violation(f"foreign mdevs were recorded without adopt: {sorted(touched)}",
                            outcome)
        if outcome.operation == "adopt" and outcome.result == "acked" and not touched:
            self._violation(f"adopted mdev {outcome.args['uuid']} is not recorded", outcome)
        for uuid in touched & adopting:
            adopted = recorded[uuid]
            if not adopted.adopted or adopted.owner is not None:
                self._violation(f"adopted mdev {uuid} is recorded as {adopted}", outcome)
        self.model.foreign -= touched & adopting
        # owners: one per UUID (counted from the rows themselves), no more than asked
        per_uuid = collections.Counter(r.uuid for r in rows if r.owner is not None)
        if any(n > 1 for n in per_uuid.values()):
            self._violation(f"UUIDs with two owners: {per_uuid}", outcome)
        ledger = holdings_of(rows)
        self._check_owners(outcome, before, ledger)
        if self.device_model.pool_vfs:
            self._check_vf_settings(outcome, recorded)
        # ... and in the answers the clients hold: no UUID told to two owners
        told: dict[str, str] = {}
        for owner, holding in self.model.holdings.items():
            for uuid in holding.uuids:
                if uuid in told:
                    self._violation(f"mdev {uuid} was given to {told[uuid]} and {owner}", outcome)
                told[uuid] = owner

    def _check_layout(self, outcome: Outcome, held_type: int | None) -> None:
        """After recover (which converges the layouts): each GPU carries at
        least N of the agent's typed VFs, the layout's own among them never
        more than N (but one a VM holds, draining): beyond N only instances'
        devices, which drain when released; the VF a VM held kept its type;
        every typed VF is the ledger's or foreign (checked in _check), so
        none is left that no record or layout explains."""
        if self.vm_held is not None and typed_vfs(self.host.root).get(self.vm_held) != held_type:
            self._violation(f"VF {self.vm_held}, held by a VM, was retyped or untyped",
                            outcome)
        rows, _ = read_ledger(self.host.state_dir)
        per_gpu: dict[str, list[Row]] = collections.defaultdict(list)
        for row in rows:
            per_gpu[row.parent[:8] + "00.0"].append(row)
        for gpu in sorted({vf[:8] + "00.0" for vf in typed_vfs(self.host.root)}):
            mine = [r for r in per_gpu.get(gpu, []) if r.mdev_type == self.device_model.mdev_type]
            own = [r for r in mine if r.owner_kind == "standing"]
            vm = sum(1 for r in own if r.parent == self.vm_held)
            if len(mine) < self.standing or len(own) > self.standing + vm:
                self._violation(
                    f"GPU {gpu} carries {len(mine)} of the agent's {self.device_model.mdev_type}, "
                    f"{len(own)} of them the layout's (standing {self.standing}, {vm} held by "
                    "a VM)", outcome)

    def _check_idle_layout(self, outcome: Outcome) -> None:
        """The idle-layout check (issue 33): after a layout change, with a VM
        perhaps holding one of its devices (draining, its remove refused at
        each converge), the daemon's periodic rescans ask for no rescan
        while nothing changes.  The daemon's core in process: one rescan
        settles what the change left, IDLE_PERIODS more must ask nothing."""
        from accel_agent.daemon.core import AgentCore
        from tests.configutil import make_conf

        conf = make_conf(self._conf() + f"\n[DEFAULT]\nstate_dir = {self.host.state_dir}\n",
                         sysfs_root=self.host.root)
        with self._manager() as manager:
            core = AgentCore(conf, manager=manager)
            asked: list[str] = []
            core.request_rescan = asked.append
            core.rescan(("periodic",))
            asked.clear()
            for _ in range(IDLE_PERIODS):
                core.rescan(("periodic",))
        if asked:
            self._violation(f"an idle layout asked for {len(asked)} rescan(s) in "
                            f"{IDLE_PERIODS} periods with nothing changed", outcome)

    def _check_vf_settings(self, outcome: Outcome, recorded: dict[str, Row]) -> None:
        """What the PF's "driver" holds for each VF: the recorded settings for
        a VF handed over, the reset values for any other (nothing a tenant
        set survives a VF's return, however it was interrupted)."""
        net = StateFileNet(self._vfnet)
        for index, vf in enumerate(pool_vfs(self.host.root)):
            held = net.settings(POOL_PF, index)
            row = recorded.get(sriov_vf.device_uuid(vf))
            if pci_driver(self.host.root, vf) == "vfio-pci" and row is not None:
                wanted = {**RESET, **json.loads(row.settings or "{}")}
            else:
                wanted = dict(RESET)
            if held != wanted:
                self._violation(f"VF {vf} holds {held}, should hold {wanted}", outcome)

    def _check_owners(
        self, outcome: Outcome, before: dict[str, Holding], ledger: dict[str, Holding]
    ) -> None:
        op, args, result = outcome.operation, outcome.args, outcome.result
        target = args.get("instance") or args.get("owner")
        for owner in sorted(set(before) | set(ledger)):
            now, was = ledger.get(owner), before.get(owner)
            if owner != target:
                if now != was:
                    self._violation(f"{owner} changed from {was} to {now} although "
                                    f"the operation was about {target}", outcome)
                continue
            allowed = self._allowed(op, args, result, was, outcome.answer)
            if not any(self._matches(now, a) for a in allowed):
                self._violation(f"{owner} holds {now}; allowed after {result} {op}: "
                                f"{allowed}", outcome)
        if target is not None:
            held = ledger.get(target)
            requested = (
                args.get("count") or len(args.get("sources") or {})
                or (before[target].requested if target in before else 0)
            )
            if held is not None and len(held.uuids) > requested:
                self._violation(f"{target} holds {len(held.uuids)} mdevs, asked for {requested}",
                                outcome)
            if held is None:
                self.model.holdings.pop(target, None)
            else:
                self.model.holdings[target] = Holding(
                    held.kind, held.uuids, max(requested, len(held.uuids)), held.sources
                )

    @staticmethod
    def _matches(now: Holding | None, allowed: Any) -> bool:
        if allowed is None or now is None:
            return allowed is None and now is None
        if callable(allowed):
            return bool(allowed(now))
        return now == allowed

    @staticmethod
    def _allowed(op: str, args: dict[str, Any], result: str, was: Holding | None,
                 answer: Any) -> list[Any]:
        """What the target owner may hold after ``op`` ended as ``result``."""
        unchanged = [was]
        if result == "refused":
            return unchanged
        if op in ("allocate", "attach"):
            count = args["count"]
            if result == "acked":
                return [Holding("instance", frozenset(answer), count)]
            return [None, lambda h: h.kind == "instance" and len(h.uuids) == count]
        if op.startswith("release") or op == "abort":
            return [None] if result == "acked" else [None, was]
        if op == "claim":
            sources = set(args["sources"])
            if result == "acked":
                return [lambda h: h.kind == "claim" and dict(h.sources) == answer]
            return [None, lambda h: h.kind == "claim" and {s for s, _ in h.sources} == sources]
        if op == "commit":
            assert was is not None
            committed = lambda h: h.kind == "instance" and h.uuids == was.uuids  # noqa: E731
            return [committed] if result == "acked" else [was, committed]
        return unchanged  # adopt and recover never change an owner

    def _check_idempotent(self, outcome: Outcome) -> None:
        state = (read_ledger(self.host.state_dir), read_sysfs(self.host.root))
        with self._manager() as manager:
            report = manager.recover().to_dict()
        # foreign and layout_draining say what is, not what it did.
        changed = {k: v for k, v in report.items() if v and k not in ("foreign", "layout_draining")}
        if changed or (read_ledger(self.host.state_dir), read_sysfs(self.host.root)) != state:
            self._violation(f"a second recover changed something: {changed}", outcome)

    # -- a run ------------------------------------------------------------------------------

    def run(
        self, kills: int, max_iterations: int | None = None, stop_on_violation: bool = False
    ) -> Stats:
        """Round-robin over :data:`SCHEDULE` until ``kills`` children died
        before answering and every operation was killed at least once
        (calibration runs first)."""
        index = 0
        schedule, operations = self.device_model.schedule, self.device_model.operations
        limit = max_iterations or kills * 4 + 4 * len(schedule)
        steps = set(self.device_model.steps)
        while (
            self.stats.total_kills < kills or set(self.stats.kills) != set(operations)
            or not steps <= set(self.stats.step_kills)
        ) and self.stats.iterations < limit:
            self.iteration(schedule[index % len(schedule)])
            index += 1
            if stop_on_violation and self.stats.violations:
                break
        return self.stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.functional.killharness",
        description="SIGKILL random instants of the agent's mutating operations on a "
        "FUSE-simulated host (real privsep helper), recover, and check the crash-safety "
        "promises from sysfs and the ledger. Needs root and /dev/fuse.",
    )
    parser.add_argument("--kills", type=int, default=1000, help="stop after this many kills")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--log", help="write one line per iteration here")
    parser.add_argument("--json", help="write the summary as JSON here")
    parser.add_argument(
        "--model", choices=sorted([*MODELS, "mixed", "mig"]), default="mdev",
        help="the device model under test (default mdev; nvidia_vfio: vGPU 17+ VFs; "
        "attach: mdevs and SR-IOV VFs attached together; standing: standing layouts; "
        "mixed: a mixed-size layout, killed at every step of its order too; mig: a "
        "MIG-backed layout, likewise)",
    )
    args = parser.parse_args(argv)
    from tests.functional import killharness_mig, killharness_mixed
    from tests.functional.simhost import simulated_host

    ordered = {killharness_mixed.MIXED.name: (killharness_mixed.MIXED,
                                              killharness_mixed.MixedHarness),
               killharness_mig.MIG.name: (killharness_mig.MIG, killharness_mig.MigHarness)}
    model, harness = ordered.get(args.model) or (MODELS[args.model], KillHarness)

    def run(tmp: Path, seed: int, log: Callable[[str], None]) -> Any:
        with simulated_host(tmp, list(model.profiles), **model.host_options) as host:
            return harness(host, seed, log, model).run(args.kills)

    return run_soak(args, model.name, run)


def run_soak(
    args: argparse.Namespace,
    model: str,
    run: Callable[[Path, int, Callable[[str], None]], Any],
) -> int:
    """The command line of a harness (``--seed``, ``--log``, ``--json``): ``run``
    in a temporary directory with the seed and a log of one line per step
    (violations also on stderr); the summary printed as JSON.  Exit status 1
    on any violation."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    log_file = open(args.log, "w") if args.log else None  # noqa: SIM115
    started = time.monotonic()

    def log(line: str) -> None:
        if log_file is not None:
            log_file.write(line + "\n")
            log_file.flush()
        if line.startswith("VIOLATION"):
            print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="accel-soak-") as tmp:
        stats = run(Path(tmp), seed, log)
    summary = {
        "model": model,
        "seed": seed,
        "seconds": round(time.monotonic() - started),
        **stats.to_dict(),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if log_file is not None:
        log_file.close()
    return 1 if stats.violations else 0


if __name__ == "__main__":
    sys.exit(main())
