"""(x) Start to READY with a mixed-size layout (issue 36): 4 NVIDIA L40S GPUs
x 8 VFs, each carrying one 24Q, one 12Q and two 4Q (three sizes, four vGPUs,
44 of its 48 placement units), the real daemon and privsep helper on the
FUSE simulator and its NVML, the layout in the daemon's config file
(``[devices] enabled_gpu_layouts`` and ``[gpu_layout_mix]``).

Two starts, each from the process's spawn to its ``READY=1`` (sd_notify):

* a first start: an empty ledger; per GPU the mode set and read back, four
  vGPUs typed and placed, each read back (16 vGPUs);
* after ``simulate reboot`` (every VF untyped, every GPU's mode off):
  recovery sets each mode again, then re-creates the 16 recorded vGPUs on
  the same VFs and placements.

Every sysfs access and NVML call is a round trip to the simulator's
process, so the figures are the agent's cost plus the simulator's.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import timing
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir

GPUS, VFS = 4, 8
PFS = tuple(f"0000:c{n + 1}:00.0" for n in range(GPUS))
VGPUS = (("nvidia-1155", 1), ("nvidia-1153", 1), ("nvidia-1150", 2))
BODY = (
    f"[devices]\nenabled_mdev_types = {', '.join(t for t, _ in VGPUS)}\n"
    "enabled_gpu_layouts = mix\nstanding_vf_wait = 300\n"
    f"[gpu_layout_mix]\ngpus = {', '.join(PFS)}\n"
    f"vgpus = {', '.join(f'{t}:{n}' for t, n in VGPUS)}\n"
)
QUIET = "[DEFAULT]\ndebug = false\n"


def _start(daemon: AgentDaemon) -> float:
    """Spawn to READY=1."""
    started = time.perf_counter()
    daemon.start(timeout=900)
    return time.perf_counter() - started


def measure(rounds: int) -> dict[str, object]:
    first: list[float] = []
    rebooted: list[float] = []
    with tempfile.TemporaryDirectory(prefix="accel-bench-mixed-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("ACCEL_SIM_RUNDIR", str(work / "run"))
        spec = build_spec(["nvidia-vfio"], gpus=GPUS, vfs=VFS)
        with sim_testing.mounted(spec, work / "sys", timeout=120) as sim, short_dir() as sock:

            def complete() -> None:
                gpus = sim.status()["nvidia_gpus"]
                assert all(g["heterogeneous"] and len(g["vgpus"]) == 4 for g in gpus), gpus

            for index in range(rounds):
                config = agent_config(work / f"agent-{index}.conf", str(work / "sys"),
                                      str(work / f"state-{index}"), str(sock / "api.sock"),
                                      BODY, extra=QUIET)
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
        f"first start ({GPUS} modes set, {GPUS * 4} vGPUs typed and placed)":
            timing.summary(first),
        f"after simulate reboot ({GPUS} modes set again, {GPUS * 4} re-created)":
            timing.summary(rebooted),
    }


def report(quick: bool) -> list[str]:
    results = measure(1 if quick else 3)
    lines = timing.median_min_table(
        f"### (x) start to READY, mixed-size layout {GPUS} GPUs x 3 sizes (FUSE simulator)",
        results,
    )
    lines += ["", f"{GPUS} L40S GPUs x {VFS} VFs, each with one 24Q, one 12Q and two 4Q "
              "(`[gpu_layout_mix]` in the daemon's config file); each GPU's mode set and read "
              "back through the simulator's NVML, each vGPU typed, placed and read back.",
              "", "Command: `python -m benchmarks --only x` (each start a whole daemon "
              "process, from its spawn to `READY=1` on its notify socket; the times include "
              "the FUSE simulator's and its NVML's).", ""]
    return lines
