"""The random-kill harness's mixed-size layout model (issue 36): two
simulated L40S GPUs, each with a ``[gpu_layout_mix]`` of three sizes (two
12Q, one 8Q, two 4Q: placement sizes 12, 8 and 4 of 48), the children
building their manager from that config file as ``accelctl`` does.

Its operations are the ones a mixed layout meets: ``layout`` (a reload that
changes the mix to one 12Q, three 8Q and one 4Q and back: the converge
drains and places, the new vGPUs made after, and below, the kept ones, so
that a reboot's re-creation in the ledger's order finds their placements
taken), ``allocate`` (an instance takes a layout's vGPU
of one type), ``release`` and ``release --remove`` (the layout makes it
again on its planned placement), and ``recover`` after what the driver
undoes: a reboot (every VF untyped, the mode lost), a reboot without VFs
then NVIDIA's ``sriov-manage -e``, a driver reload then ``sriov-manage -e``
(the mode cleared), a first start on a wiped host (no ledger), or a vGPU
untyped behind the agent's back.

Each child is killed, half of the time, at a random instant (as in every
model) and otherwise at one of the order's crash points
(``DeviceManager.on_step``; the same points tests/functional/test_mixed_layout.py
kills at): after the mode was set and before it was read back
(``layout.mode_set``), after an intent (``allocate.intent``), after a type
write and before its placement write (``allocate.typed``; after a reboot,
``recover.typed``), after the placement was written and read back
(``allocate.created``) and after the assignment (``allocate.assigned``).
The points each operation passes are learnt from its runs that were not
killed (the first run of an operation after each kind of disruption is
never killed, so every point is learnt however loaded the machine is); a
point of :data:`ORDER` never killed yet comes first, then the least killed,
and a run goes on until every point of the order was killed at least once.

After ``accelctl recover`` the model's promises, beside every model's
(no leak, nothing missing, no UUID with two owners, all or nothing, a
second recover changes nothing), read from the simulator's own state and
the ledger's rows with plain SQL:

* every vGPU reads back at the placement and type the ledger records;
* on each GPU every placement is one its type supports and none overlaps
  another;
* each GPU carries its whole layout, mixed-size mode on (instances'
  vGPUs counted; a GPU where an instance holds a type the mix no longer
  names may be short: it drains);
* a vGPU an instance holds never moves, and a ``recover`` brings every
  recorded vGPU back where it was (same UUIDs, same placements).

Deliberate faults it catches: ``mixed-harness-recovery-types-before-mode``
(after a reboot recovery re-types before the mode is set: the first type
locks the GPU to one size, the others cannot be made, the GPU stays short).
Not caught in a run of ``make test``'s size: recovery re-typing a vGPU
without writing its placement back (the converge that follows puts a
layout's own vGPU back; only an instance's vGPU re-created out of order
shows it, as a move).
"""

from __future__ import annotations

import collections
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_agent import exception
from accel_agent.simulator.profiles import nvidia_vfio_pf
from accel_agent.simulator.profiles_nvidia import L40S_VGPU_TYPES
from tests.functional.killharness import (
    INSTANCES,
    DeviceModel,
    Holding,
    KillHarness,
    Outcome,
)

Q12, Q8, Q4 = "nvidia-1153", "nvidia-1152", "nvidia-1150"
GPUS = (nvidia_vfio_pf(0), nvidia_vfio_pf(1))
# The layouts a reload switches between: the same three sizes (a type an
# instance holds must stay configured, or recovery refuses: it would retype
# it), other counts, 40 of 48 units each.
MIXES = (((Q12, 2), (Q8, 1), (Q4, 2)), ((Q12, 1), (Q8, 3), (Q4, 1)))
# The crash points of the order every run must have killed a child at.
ORDER = ("layout.mode_set", "allocate.intent", "allocate.typed", "allocate.created",
         "allocate.assigned", "recover.typed")
OPERATIONS = ("layout", "allocate", "release", "release --remove", "recover")
SCHEDULE = ("layout", "allocate", "recover", "release --remove", "recover", "allocate",
            "release", "layout", "recover")
# The share of kills at a named crash point (the rest: a random instant).
AT_STEP = 0.5
SIZES = {f"nvidia-{t.type_id}": (t.placement_size, frozenset(t.placements))
         for t in L40S_VGPU_TYPES}


@dataclass(frozen=True)
class MixedModel(DeviceModel):
    @property
    def lays_out(self) -> bool:
        return True

    def conf_with(self, mix: int) -> str:
        return layout_conf((Q12, Q8, Q4), "mix", GPUS, MIXES[mix])


def layout_conf(types: tuple[str, ...], name: str, gpus: tuple[str, ...],
                vgpus: tuple[tuple[str, int], ...], extra: str = "") -> str:
    """The children's config file: ``types`` enabled, one layout ``name``
    of ``vgpus`` on ``gpus`` (``extra``: more lines of its section), no libvirt."""
    counts = ", ".join(f"{t}:{n}" for t, n in vgpus)
    return (f"[devices]\nenabled_mdev_types = {', '.join(types)}\n"
            f"enabled_gpu_layouts = {name}\n"
            f"[gpu_layout_{name}]\ngpus = {', '.join(gpus)}\nvgpus = {counts}\n{extra}"
            "[libvirt]\nuri =\n")


MIXED = MixedModel("mixed", ("nvidia-vfio",), {"gpus": len(GPUS), "vfs": 8}, Q4,
                   OPERATIONS, SCHEDULE, foreign=False, steps=ORDER)


@dataclass(frozen=True)
class Placed:
    uuid: str
    parent: str
    device_type: str
    placement_id: int | None
    owner: str | None
    owner_kind: str | None


def read_placements(state_dir: str) -> dict[str, Placed]:
    """uuid -> what the ledger file records of each vGPU, with plain SQL."""
    path = Path(state_dir) / "ledger.sqlite3"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(
            "SELECT m.uuid, m.parent, m.mdev_type, m.placement_id, a.owner, a.owner_kind "
            "FROM mdevs m LEFT JOIN assignments a ON a.uuid = m.uuid").fetchall()
    finally:
        conn.close()
    return {r[0]: Placed(*r) for r in rows}


def on_host(host: Any) -> dict[str, tuple[bool, list[tuple[str, str, int | None]]]]:
    """GPU -> (mixed-size mode on, [(VF, type, placement)]) as the simulated
    driver holds them."""
    return {
        g["address"]: (bool(g["heterogeneous"]),
                       [(v["vf"], f"nvidia-{v['type_id']}", v["placement_id"])
                        for v in g["vgpus"]])
        for g in host.sim.status()["nvidia_gpus"]
    }


class MixedHarness(KillHarness):
    """:class:`KillHarness` over :data:`MIXED` (module docstring)."""

    def __init__(self, host: Any, seed: int, log: Any = lambda line: None,
                 model: DeviceModel = MIXED) -> None:
        self.mix = 0
        super().__init__(host, seed, log, model)
        # "<timing>/<scene>" -> crash point -> the most times one run passed it
        self.known: dict[str, dict[str, int]] = collections.defaultdict(dict)
        self.scene = ""  # what was done before the operation (a reboot, ...)
        self.before: dict[str, Placed] = {}
        self.wiped = False

    def _conf(self) -> str:
        return self.device_model.conf_with(self.mix)

    # -- when a child dies --------------------------------------------------------------

    def _kill_plan(self, timing: str) -> tuple[float | None, str | None]:
        delay = self._delay(timing)
        known = self.known.get(f"{timing}/{self.scene}")
        if not known:
            # The first run of an operation in a scene is not killed: the
            # crash points are learnt from it.  Left to random kills, a loaded
            # machine (most kills land before an answer) could end a run
            # with a point of the order never learnt, so never killed.
            return None, None
        order = self.device_model.steps  # this model's ORDER
        first = sorted(s for s in known if s in order and not self.stats.step_kills[s])
        if first:  # a step of the order this operation passes here, never killed yet
            return None, f"{self.rng.choice(first)}:1"
        if self.rng.random() >= AT_STEP:
            return delay, None
        fewest = min(self.stats.step_kills[s] for s in known)
        step = self.rng.choice(sorted(s for s in known if self.stats.step_kills[s] == fewest))
        return None, f"{step}:{self.rng.randint(1, known[step])}"

    def _saw(self, timing: str, outcome: Outcome) -> None:
        for step, times in (outcome.steps or {}).items():
            seen = self.known[f"{timing}/{self.scene}"]
            seen[step] = max(seen.get(step, 0), times)

    # -- setting the scene ----------------------------------------------------------------

    def iteration(self, operation: str) -> Outcome:
        self.before = read_placements(self.host.state_dir)
        self.wiped = False
        self.scene = ""
        return super().iteration(operation)

    def _types(self) -> list[str]:
        return [t for t, _ in MIXES[self.mix]]

    def _setup_allocate(self) -> str | None:
        instance = self._free_name(INSTANCES)
        if instance is None:
            return None
        with self._manager() as manager:
            for device_type in self.rng.sample(self._types(), len(self._types())):
                try:
                    uuids = manager.allocate(instance, 1, device_type=device_type).uuids
                except exception.AccelAgentException:
                    continue  # every one of that type is held
                break
            else:
                return None
        self.model.holdings[instance] = Holding("instance", frozenset(uuids), len(uuids))
        return instance

    def prepare(self, operation: str) -> dict[str, Any]:
        if operation == "layout":
            self.mix = 1 - self.mix
            self.config = self.host.config(self._conf(), name="killharness.conf")
            return {}
        if operation == "allocate":
            args = super().prepare(operation)
            return {**args, "count": 1, "device_type": self.rng.choice(self._types())}
        if operation == "recover":
            return self._disrupt()
        return super().prepare(operation)

    def _disrupt(self) -> dict[str, Any]:
        """What the driver (or someone) undoes before a recover."""
        if not self.model.holdings:
            self._setup_allocate()
        draw = self.rng.random()
        self.scene = ("reboot" if draw < 0.3 else "vfs enabled" if draw < 0.45
                      else "driver reload" if draw < 0.6 else "first start" if draw < 0.8
                      else "vanished")
        if draw < 0.3:
            self.host.sim.reboot()
        elif draw < 0.45:
            self.host.sim.reboot(vfs_disabled=True)
            self.host.sim.enable_vfs("ALL")
        elif draw < 0.6:
            self.host.sim.driver_reload()
            self.host.sim.enable_vfs("ALL")
        elif draw < 0.8:
            self._first_start()
        else:
            self._vanish_one()
        return {}

    def _first_start(self) -> None:
        """A first start: a new host (no ledger), the layout made from nothing."""
        self.host.sim.reboot()
        shutil.rmtree(self.host.state_dir, ignore_errors=True)
        self.model.holdings.clear()
        self.wiped = True

    def _vanish_one(self) -> None:
        """One recorded vGPU untyped behind the agent's back."""
        recorded = sorted(self.before)
        if recorded:
            self.device_model.vanish(self.host, self.rng.choice(recorded))

    # -- the promises ---------------------------------------------------------------------

    def _check_model(self, outcome: Outcome, held_type: int | None) -> None:
        recorded = read_placements(self.host.state_dir)
        by_vf = {p.parent: p for p in recorded.values()}
        mix = dict(MIXES[self.mix])
        for gpu, (mode, vgpus) in sorted(on_host(self.host).items()):
            spans = []
            for vf, device_type, pid in vgpus:
                row = by_vf.get(vf)
                if row is not None and (row.device_type, row.placement_id) != (device_type, pid):
                    self._violation(f"vGPU {vf} reads back {device_type} at {pid}, the ledger "
                                    f"says {row.device_type} at {row.placement_id}", outcome)
                size, supported = SIZES[device_type]
                if pid not in supported:
                    self._violation(f"vGPU {vf} ({device_type}) is on placement {pid}, not "
                                    f"one its type supports", outcome)
                    continue
                spans.append((vf, range(pid, pid + size)))
            for i, (vf, span) in enumerate(spans):
                for other, taken in spans[i + 1:]:
                    if span.start < taken.stop and taken.start < span.stop:
                        self._violation(f"on GPU {gpu} vGPU {vf} at {span.start} overlaps "
                                        f"{other} at {taken.start}", outcome)
            self._check_whole(outcome, gpu, mode, vgpus, by_vf, mix)
        self._check_kept_places(outcome, recorded)

    def _check_whole(self, outcome: Outcome, gpu: str, mode: bool,
                     vgpus: list[tuple[str, str, int | None]], by_vf: dict[str, Placed],
                     mix: dict[str, int]) -> None:
        have = collections.Counter(device_type for _, device_type, _ in vgpus)
        held = collections.Counter(
            device_type for vf, device_type, _ in vgpus
            if (row := by_vf.get(vf)) is not None and row.owner_kind == "instance")
        if any(n > mix.get(t, 0) for t, n in held.items()):
            return  # instances hold more of a type than the mix names now: it drains
        short = {t: f"{have[t]} of {n}" for t, n in mix.items() if have[t] < n}
        if not mode or short:
            self._violation(f"GPU {gpu} is not whole after recover: mixed-size mode "
                            f"{'on' if mode else 'off'}, short {short}", outcome)

    def _check_kept_places(self, outcome: Outcome, recorded: dict[str, Placed]) -> None:
        """An instance's vGPU never moves; a recover puts every recorded vGPU
        back where it was (a first start on a wiped host has none)."""
        for uuid, was in self.before.items():
            now = recorded.get(uuid)
            moved = now is not None and now.placement_id != was.placement_id
            if moved and was.owner_kind == "instance" and now.owner == was.owner:
                self._violation(f"vGPU {uuid} of {was.owner} moved from {was.placement_id} "
                                f"to {now.placement_id}", outcome)
            if outcome.operation == "recover" and not self.wiped and (now is None or moved):
                self._violation(f"recover did not bring vGPU {uuid} back to {was.parent} at "
                                f"{was.placement_id}: now {now}", outcome)
