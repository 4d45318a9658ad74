"""The random-kill harness's MIG model (issue 37): two simulated H200 GPUs,
each with a ``[gpu_layout_mig]`` of MIG-backed vGPUs (three H200X-1-18C on
``1g.18gb`` GPU instances, one H200X-3-71C on a ``3g.71gb`` one), the
children building their manager from that config file as ``accelctl`` does.
The machinery (kills at crash points learnt per operation, the scenes set
before an operation) is the mixed-size model's (killharness_mixed.py).

Its operations are the ones a MIG layout meets: ``layout`` (a reload that
changes the layout to one 1g.18gb and one 3g.71gb instance and back: the
converge destroys the free instances it no longer needs, their vGPUs
removed first, and creates them again on the way back; a vGPU an instance
holds, or whose VF a VM holds open, drains with its GPU instance),
``allocate`` (an instance takes a layout's vGPU of one type), ``release`` and
``release --remove`` (the layout makes it again), and ``recover`` after what
the driver undoes: a reboot (MIG mode, every GPU instance and every type
gone), a driver reload then ``sriov-manage -e``, a VF re-enable alone
(``sriov_numvfs`` 0, then ``sriov-manage -e``: the instances are wiped,
the mode stays), a first start on a wiped host (no ledger), or a vGPU
untyped behind the agent's back.

Each child is killed, half of the time, at a random instant and otherwise
at one of the MIG order's crash points (``DeviceManager.on_step``): after
MIG mode was set and before it was read back (``mig.mode_set``), after a GPU
instance was created and before it was read back and recorded
(``mig.instance_created``), after it was recorded and before any type is
written on it (``mig.instance_recorded``), after an instance was
destroyed and before its record went (``mig.instance_destroyed``), and the
protocol's own (``allocate.intent``, ``allocate.created``,
``allocate.assigned``).  A run goes on until every point of :data:`ORDER`
was killed at least once.

After ``accelctl recover`` the model's promises, beside every model's (no
vGPU leaked or missing, no UUID with two owners, all or nothing, a second
recover changes nothing), read from the simulator's own state (its GPUs'
MIG mode, GPU instances and vGPUs, as its NVML has them) and the ledger's
rows (``mdevs``, ``assignments``, ``gpu_instances``) with plain SQL:

* every recorded GPU instance exists at its recorded profile and placement,
  a placement its profile has; no instance is unrecorded (a leak); no two
  overlap;
* every MIG-backed vGPU reads back ``gpu_instance_id`` of a recorded
  instance of its type's profile, its own (no two vGPUs on one);
* each GPU carries its whole layout: MIG mode on, every type's count
  (instances' vGPUs counted; a GPU where instances hold more of a type than
  the layout names may be short: it drains);
* a vGPU an instance holds is never lost nor moved (same VF, and while no
  reboot, reload or VF enable wiped the instances, the same GPU instance
  placement); a VF a VM holds open keeps its type and instance; a
  ``recover`` brings every recorded vGPU back on its VF;
* a second ``recover`` changes nothing, GPU instances and their records
  included.

Deliberate faults it catches: ``mig-harness-recovery-types-before-instances``
(recovery re-types the recorded vGPUs before it rebuilds their GPU
instances: after a reboot, a driver reload or a VF re-enable every type
write fails, the recover fails and the vGPUs stay missing).  It found recovery
rebuilding only the layout's count of instances after a layout shrank
under held vGPUs (fixed; its fault,
``mig-recorded-vgpus-instances-not-rebuilt``, is proven by
tests/functional/test_mig_layout.py, which reaches that state at once).
Not caught here: an instance left unrecorded by a crash is recorded by the
next converge, so a fault shows only where it is never recorded
(``mig-instance-made-before-crash-unrecorded``, caught by
tests/functional/test_mig_layout.py, which kills at each point of the order
in turn); a pending MIG mode and a GPU reset are not modelled (a reset is
refused while a vGPU exists, which is always here).
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any

from accel_agent import exception
from accel_agent.simulator.profiles_nvidia import H200_MIG_PROFILES, H200_VGPU_TYPES
from tests.functional.killharness import DeviceModel, Outcome, typed_vfs
from tests.functional.killharness_mixed import (
    OPERATIONS,
    SCHEDULE,
    MixedHarness,
    MixedModel,
    layout_conf,
    read_placements,
)

G1, G3 = "nvidia-1414", "nvidia-1418"  # H200X-1-18C, H200X-3-71C
GPUS = ("0000:61:00.0", "0000:62:00.0")
# The layouts a reload switches between: the same two types (a type an
# instance holds must stay configured, or recovery refuses to retype it),
# other counts: going to the second destroys two 1g.18gb instances per GPU,
# coming back creates them.
LAYOUTS = (((G1, 3), (G3, 1)), ((G1, 1), (G3, 1)))
PROFILE_ID = {f"nvidia-{t.type_id}": t.gpu_instance_profile for t in H200_VGPU_TYPES
              if t.gpu_instance_profile is not None}
PROFILES = {p.profile_id: p for p in H200_MIG_PROFILES}
SECTION = "gpu_layout_mig"
ORDER = ("mig.mode_set", "mig.instance_created", "mig.instance_recorded",
         "mig.instance_destroyed", "allocate.intent", "allocate.created", "allocate.assigned")
# What the driver undoes before a recover, with the share of each.
SCENES = (("reboot", 0.4), ("driver reload", 0.15), ("vfs re-enabled", 0.2),
          ("first start", 0.1), ("vanished", 0.15))


@dataclass(frozen=True)
class MigModel(MixedModel):
    """The mixed model's operations and schedule over a MIG-backed layout."""

    def conf_with(self, mix: int) -> str:
        mig = ", ".join(f"{PROFILES[PROFILE_ID[t]].name}:{n}" for t, n in LAYOUTS[mix])
        return layout_conf((G1, G3), SECTION.removeprefix("gpu_layout_"), GPUS, LAYOUTS[mix],
                           f"mig = {mig}\n")


MIG = MigModel("mig", ("nvidia-h200",), {"gpus": len(GPUS), "vfs": 8}, G1,
               OPERATIONS, SCHEDULE, foreign=False, steps=ORDER)


@dataclass(frozen=True)
class Instance:
    """A GPU instance as the simulated driver holds it."""

    gpu_instance_id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class Gpu:
    """One GPU as the simulated driver holds it: MIG mode, GPU instances
    by id, and each vGPU as (VF, type, GPU instance id)."""

    mig: bool
    instances: dict[int, Instance]
    vgpus: tuple[tuple[str, str, int | None], ...]


def on_host(host: Any) -> dict[str, Gpu]:
    return {
        g["address"]: Gpu(
            bool(g["mig"] and g["mig"]["current"]),
            {i["gpu_instance_id"]: Instance(i["gpu_instance_id"], i["profile_id"],
                                            *i["placement"])
             for i in g["gpu_instances"]},
            tuple((v["vf"], f"nvidia-{v['type_id']}", v["gpu_instance_id"])
                  for v in g["vgpus"]))
        for g in host.sim.status()["nvidia_gpus"]
    }


def read_instances(state_dir: str) -> set[tuple[str, int, int, int, str]]:
    """(GPU, start, size, profile id, owner) of every recorded GPU instance,
    with plain SQL."""
    rows = _query(state_dir, "SELECT gpu, start, size, profile_id, owner FROM gpu_instances")
    return {tuple(r) for r in rows}  # type: ignore[misc]


def _query(state_dir: str, sql: str) -> list[tuple[Any, ...]]:
    import sqlite3

    path = os.path.join(state_dir, "ledger.sqlite3")
    if not os.path.exists(path):
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def instance_places(host: Any) -> dict[str, tuple[str, int, int, int]]:
    """VF -> (GPU, start, size, profile id) of the GPU instance its vGPU is on."""
    places = {}
    for gpu, state in on_host(host).items():
        for vf, _, gi in state.vgpus:
            if (inst := state.instances.get(gi or -1)) is not None:
                places[vf] = (gpu, inst.start, inst.size, inst.profile_id)
    return places


class MigHarness(MixedHarness):
    """:class:`MixedHarness`'s machinery over :data:`MIG` (module docstring)."""

    def __init__(self, host: Any, seed: int, log: Any = lambda line: None,
                 model: DeviceModel = MIG) -> None:
        super().__init__(host, seed, log, model)
        self.places: dict[str, tuple[str, int, int, int]] = {}
        self.held_place: tuple[str, int, int, int] | None = None

    def _types(self) -> list[str]:
        return [t for t, _ in LAYOUTS[self.mix]]

    def iteration(self, operation: str) -> Outcome:
        self.places = instance_places(self.host)
        self.held_place = None
        return super().iteration(operation)

    def prepare(self, operation: str) -> dict[str, Any]:
        args = super().prepare(operation)
        if operation == "layout":
            self.scene = f"to layout {self.mix}"
            # Half of the time a VM holds one of the layout's own vGPUs open
            # (killharness.KillHarness._hold_a_layout_vf): it keeps its type
            # and its GPU instance, however the layout changes.
            self._hold_a_layout_vf()
            if self.vm_held is not None:
                self.held_place = self.places.get(self.vm_held)
        return args

    def _disrupt(self) -> dict[str, Any]:
        if not self.model.holdings:
            self._setup_allocate()
        (scene,) = self.rng.choices([s for s, _ in SCENES], [w for _, w in SCENES])
        self.scene = scene
        if scene == "reboot":
            self.host.sim.reboot()
        elif scene == "driver reload":
            self.host.sim.driver_reload()
            self.host.sim.enable_vfs("ALL")
        elif scene == "vfs re-enabled":
            # An operator's or a boot script's sriov-manage after the VFs
            # were disabled: the instances are gone, MIG mode stays.
            for gpu in self.rng.sample(GPUS, self.rng.randint(1, len(GPUS))):
                with open(os.path.join(self.host.root, "bus", "pci", "devices", gpu,
                                       "sriov_numvfs"), "w") as handle:
                    handle.write("0")
                self.host.sim.enable_vfs(gpu)
        elif scene == "first start":
            self._first_start()
        else:
            self._vanish_one()
        return {}

    # -- the promises ---------------------------------------------------------------------

    def _check_model(self, outcome: Outcome, held_type: int | None) -> None:
        host = on_host(self.host)
        recorded = read_instances(self.state_dir)
        rows = read_placements(self.state_dir)
        by_vf = {p.parent: p for p in rows.values()}
        layout = dict(LAYOUTS[self.mix])
        for gpu, state in sorted(host.items()):
            mine = {(s, z): (p, o) for g, s, z, p, o in recorded if g == gpu}
            self._check_instances(outcome, gpu, state, mine)
            self._check_vgpus(outcome, gpu, state, mine)
            self._check_whole(outcome, gpu, state, by_vf, layout)
        self._check_kept(outcome, rows, held_type)

    @property
    def state_dir(self) -> str:
        return self.host.state_dir

    def _check_instances(self, outcome: Outcome, gpu: str, state: Gpu,
                         mine: dict[tuple[int, int], tuple[int, str]]) -> None:
        found = {(i.start, i.size): i for i in state.instances.values()}
        for (start, size), (profile_id, owner) in sorted(mine.items()):
            inst = found.get((start, size))
            if inst is None or inst.profile_id != profile_id:
                self._violation(f"GPU {gpu}: recorded GPU instance profile {profile_id} at "
                                f"{start}:{size} ({owner}) is not there: {inst}", outcome)
        for (start, size), inst in sorted(found.items()):
            if (start, size) not in mine:
                users = [vf for vf, _, gi in state.vgpus if gi == inst.gpu_instance_id]
                self._violation(f"GPU {gpu}: GPU instance {inst.gpu_instance_id} (profile "
                                f"{inst.profile_id} at {start}:{size}) is not recorded "
                                f"({'used by ' + ', '.join(users) if users else 'leaked'})",
                                outcome)
            if (start, size) not in PROFILES[inst.profile_id].placements:
                self._violation(f"GPU {gpu}: GPU instance {inst.gpu_instance_id} at "
                                f"{start}:{size}, not a placement of its profile", outcome)
        spans = sorted(found)
        for i, (start, size) in enumerate(spans):
            for other, other_size in spans[i + 1:]:
                if start < other + other_size and other < start + size:
                    self._violation(f"GPU {gpu}: GPU instances at {start}:{size} and "
                                    f"{other}:{other_size} overlap", outcome)

    def _check_vgpus(self, outcome: Outcome, gpu: str, state: Gpu,
                     mine: dict[tuple[int, int], tuple[int, str]]) -> None:
        on: dict[int, str] = {}
        for vf, device_type, gi in state.vgpus:
            inst = state.instances.get(gi or -1)
            want = PROFILE_ID.get(device_type)
            if inst is None or inst.profile_id != want:
                self._violation(f"vGPU {vf} ({device_type}) reads back gpu_instance_id {gi}, "
                                f"no GPU instance of its profile {want}: {inst}", outcome)
                continue
            if mine.get((inst.start, inst.size)) != (want, SECTION):
                self._violation(f"vGPU {vf} ({device_type}) is on GPU instance {gi} at "
                                f"{inst.start}:{inst.size}, which the ledger records as "
                                f"{mine.get((inst.start, inst.size))}", outcome)
            if gi in on:
                self._violation(f"vGPUs {on[gi]} and {vf} are both on GPU instance {gi} of "
                                f"GPU {gpu}", outcome)
            on[gi] = vf

    def _check_whole(self, outcome: Outcome, gpu: str, state: Gpu, by_vf: dict[str, Any],
                     layout: dict[str, int]) -> None:
        have = collections.Counter(t for _, t, _ in state.vgpus)
        held = collections.Counter(
            t for vf, t, _ in state.vgpus
            if (row := by_vf.get(vf)) is not None and row.owner_kind == "instance")
        if any(n > layout.get(t, 0) for t, n in held.items()):
            return  # instances hold more of a type than the layout names now: it drains
        short = {t: f"{have[t]} of {n}" for t, n in layout.items() if have[t] < n}
        if not state.mig or short:
            self._violation(f"GPU {gpu} is not whole after recover: MIG mode "
                            f"{'on' if state.mig else 'off'}, short {short}", outcome)

    def _check_kept(self, outcome: Outcome, rows: dict[str, Any],
                    held_type: int | None) -> None:
        """An instance's vGPU is never lost or moved; a recover brings every
        recorded vGPU back on its VF; a VF a VM held open keeps its type
        and its GPU instance."""
        places = instance_places(self.host)
        wiped = self.scene in ("reboot", "driver reload", "vfs re-enabled", "first start")
        for uuid, was in self.before.items():
            now = rows.get(uuid)
            if was.owner_kind == "instance" and (now is None or now.owner != was.owner) and (
                    not self.wiped) and not (outcome.operation.startswith("release")
                                             and outcome.args["instance"] == was.owner):
                self._violation(f"vGPU {uuid} of {was.owner} was lost: now {now}", outcome)
                continue
            if now is None or now.owner_kind != "instance" or now.owner != was.owner:
                continue
            if now.parent != was.parent:
                self._violation(f"vGPU {uuid} of {was.owner} moved from VF {was.parent} to "
                                f"{now.parent}", outcome)
            elif not wiped and places.get(now.parent) != self.places.get(was.parent):
                self._violation(f"vGPU {uuid} of {was.owner} moved from GPU instance "
                                f"{self.places.get(was.parent)} to {places.get(now.parent)}",
                                outcome)
        if outcome.operation == "recover" and not self.wiped:
            for uuid, was in self.before.items():
                if (now := rows.get(uuid)) is None or now.parent != was.parent:
                    self._violation(f"recover did not bring vGPU {uuid} back to "
                                    f"{was.parent}: now {now}", outcome)
        if self.vm_held is not None:
            if typed_vfs(self.host.root).get(self.vm_held) != held_type:
                self._violation(f"VF {self.vm_held}, held by a VM, was retyped or untyped",
                                outcome)
            elif places.get(self.vm_held) != self.held_place:
                self._violation(f"VF {self.vm_held}, held by a VM, moved from GPU instance "
                                f"{self.held_place} to {places.get(self.vm_held)}", outcome)

    def _check_idempotent(self, outcome: Outcome) -> None:
        state = (on_host(self.host), read_instances(self.state_dir))
        try:
            super()._check_idempotent(outcome)
        except exception.AccelAgentException as exc:  # a violation, not a harness error
            self._violation(f"a second recover failed: {exc}", outcome)
            return
        after = (on_host(self.host), read_instances(self.state_dir))
        if after != state:
            self._violation(f"a second recover changed the GPU instances or their records: "
                            f"{state} -> {after}", outcome)
