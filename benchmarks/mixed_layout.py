"""(x) and (y) Start to READY with a GPU layout, the real daemon and privsep
helper on the FUSE simulator and its NVML, the layout in the daemon's config
file (``[devices] enabled_gpu_layouts`` and ``[gpu_layout_<name>]``):

* (x) a mixed-size layout (issue 36): 4 NVIDIA L40S GPUs x 8 VFs, each
  carrying one 24Q, one 12Q and two 4Q (three sizes, four vGPUs, 44 of its
  48 placement units);
* (y) a MIG-backed layout (issue 37): 4 NVIDIA H200s x 8 VFs, each cut into
  ``mig = 1g.18gb:3, 3g.71gb:1`` with an H200X-1-18C on each 1g.18gb GPU
  instance and an H200X-3-71C on the 3g.71gb one.

Two starts per round, each from the process's spawn to its ``READY=1``
(sd_notify):

* a first start: an empty ledger; per GPU the mode set and read back (the
  mixed-size mode, or MIG mode and then four GPU instances created and read
  back), four vGPUs typed and read back (16 vGPUs);
* after ``simulate reboot`` (every VF untyped, every GPU's mixed-size mode
  off; on the H200s every GPU instance gone and MIG mode off): recovery sets
  each mode again (and rebuilds the recorded GPU instances at their recorded
  placements), then re-creates the 16 recorded vGPUs on the same VFs.

Every sysfs access and NVML call is a round trip to the simulator's
process, so the figures are the agent's cost plus the simulator's.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import timing
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir

GPUS, VFS = 4, 8
ROUNDS = 5
QUIET = "[DEFAULT]\ndebug = false\n"


@dataclass(frozen=True)
class Layout:
    """One benchmarked layout: the simulator's GPU profile, the layout's
    section, what every GPU must hold once it is READY, and the report's
    words."""

    letter: str
    profile: str
    first_pf: int  # the simulator's first PF bus number for the profile
    vgpus: tuple[tuple[str, int], ...]
    mig: str | None  # the section's ``mig``, None for a time-sliced layout
    complete: Callable[[dict[str, Any]], bool]  # one GPU of sim.status()
    title: str
    first_row: str  # what a first start does, in the table's words
    again_row: str  # what a start after a reboot does
    notes: str

    @property
    def pfs(self) -> tuple[str, ...]:
        return tuple(f"0000:{self.first_pf + n:02x}:00.0" for n in range(GPUS))

    @property
    def body(self) -> str:
        return (
            f"[devices]\nenabled_mdev_types = {', '.join(t for t, _ in self.vgpus)}\n"
            "enabled_gpu_layouts = mix\nstanding_vf_wait = 300\n"
            f"[gpu_layout_mix]\ngpus = {', '.join(self.pfs)}\n"
            f"vgpus = {', '.join(f'{t}:{n}' for t, n in self.vgpus)}\n"
            + (f"mig = {self.mig}\n" if self.mig else "")
        )


MIXED = Layout(
    letter="x",
    profile="nvidia-vfio",
    first_pf=0xC1,
    vgpus=(("nvidia-1155", 1), ("nvidia-1153", 1), ("nvidia-1150", 2)),
    mig=None,
    complete=lambda gpu: gpu["heterogeneous"] and len(gpu["vgpus"]) == 4,
    title=f"### (x) start to READY, mixed-size layout {GPUS} GPUs x 3 sizes (FUSE simulator)",
    first_row=f"{GPUS} modes set, {GPUS * 4} vGPUs typed and placed",
    again_row=f"{GPUS} modes set again, {GPUS * 4} re-created",
    notes=f"{GPUS} L40S GPUs x {VFS} VFs, each with one 24Q, one 12Q and two 4Q "
    "(`[gpu_layout_mix]` in the daemon's config file); each GPU's mode set and read "
    "back through the simulator's NVML, each vGPU typed, placed and read back.",
)

MIG = Layout(
    letter="y",
    profile="nvidia-h200",
    first_pf=0x61,
    vgpus=(("nvidia-1414", 3), ("nvidia-1418", 1)),
    mig="1g.18gb:3, 3g.71gb:1",
    complete=lambda gpu: (gpu["mig"]["current"] and len(gpu["gpu_instances"]) == 4
                          and len(gpu["vgpus"]) == 4
                          and all(v["gpu_instance_id"] for v in gpu["vgpus"])),
    title=f"### (y) start to READY, MIG-backed layout {GPUS} H200 GPUs x 4 GPU instances "
    "(FUSE simulator)",
    first_row=f"{GPUS} MIG modes set, {GPUS * 4} GPU instances made, {GPUS * 4} vGPUs typed",
    again_row=f"{GPUS} MIG modes set and {GPUS * 4} GPU instances made again, {GPUS * 4} "
    "vGPUs re-created",
    notes=f"{GPUS} H200 GPUs x {VFS} VFs, each with `mig = 1g.18gb:3, 3g.71gb:1` and an "
    "H200X-1-18C (`nvidia-1414`) on each 1g.18gb instance, an H200X-3-71C (`nvidia-1418`) "
    "on the 3g.71gb one (`[gpu_layout_mix]` with `mig` in the daemon's config file); each "
    "GPU's MIG mode set and read back, its GPU instances created at their planned "
    "placements and read back through the simulator's NVML, each vGPU typed and its "
    "`gpu_instance_id` read back. The simulated reboot wipes the GPU instances and (as on "
    "a real H200) MIG mode.",
)

LAYOUTS = {layout.letter: layout for layout in (MIXED, MIG)}


def _start(daemon: AgentDaemon) -> float:
    """Spawn to READY=1."""
    started = time.perf_counter()
    daemon.start(timeout=900)
    return time.perf_counter() - started


def measure(layout: Layout, rounds: int) -> dict[str, object]:
    first: list[float] = []
    rebooted: list[float] = []
    with tempfile.TemporaryDirectory(prefix=f"accel-bench-{layout.letter}-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("ACCEL_SIM_RUNDIR", str(work / "run"))
        spec = build_spec([layout.profile], gpus=GPUS, vfs=VFS)
        with sim_testing.mounted(spec, work / "sys", timeout=120) as sim, short_dir() as sock:

            def complete() -> None:
                gpus = sim.status()["nvidia_gpus"]
                assert len(gpus) == GPUS and all(layout.complete(g) for g in gpus), gpus

            for index in range(rounds):
                config = agent_config(work / f"agent-{index}.conf", str(work / "sys"),
                                      str(work / f"state-{index}"), str(sock / "api.sock"),
                                      layout.body, extra=QUIET)
                sim.reboot()
                with AgentDaemon(config, str(sock / "api.sock"), work) as daemon:
                    first.append(_start(daemon))
                    complete()
                    daemon.stop()
                    sim.reboot()
                    rebooted.append(_start(daemon))
                    complete()
                    daemon.stop()
    return {
        f"first start ({layout.first_row})": timing.summary(first),
        f"after simulate reboot ({layout.again_row})": timing.summary(rebooted),
    }


def report(quick: bool, letter: str = "x") -> list[str]:
    layout = LAYOUTS[letter]
    lines = timing.median_min_table(layout.title, measure(layout, 1 if quick else ROUNDS))
    lines += ["", layout.notes,
              "", f"Command: `python -m benchmarks --only {letter}` (each start a whole daemon "
              "process, from its spawn to `READY=1` on its notify socket; the times include "
              "the FUSE simulator's and its NVML's).", ""]
    return lines
