"""(x) Start to ready with a mixed-size layout (issue 36): 4 NVIDIA L40S GPUs
x 8 VFs, each carrying one 24Q, one 12Q and two 4Q (three sizes, four vGPUs,
44 of its 48 placement units), on the FUSE simulator and its NVML.

Measured in process: the daemon's core (``AgentCore.startup``: recovery,
the wait for VFs, the layouts, the first scan) over a manager whose policy
holds the layout, the privileged writes in this process (``DirectWriter``,
the same validation and read-backs).  Two starts, each from the call to the
end of the start (what ``READY=1`` follows in the daemon):

* a first start: an empty ledger; per GPU the mode set and read back, four
  vGPUs typed and placed, each read back (16 vGPUs);
* after ``simulate reboot`` (every VF untyped, every GPU's mode off):
  recovery sets each mode again, then re-creates the 16 recorded vGPUs on
  the same VFs and placements.

Every sysfs access and NVML call is a round trip to the simulator's
process, so the figures are the agent's cost plus the simulator's.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from accel_agent.daemon.core import AgentCore
from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices import manager as manager_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from accel_agent.devices.gpu_layouts import GpuLayout
from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import timing
from tests.configutil import make_conf

GPUS, VFS = 4, 8
PFS = tuple(f"0000:c{n + 1}:00.0" for n in range(GPUS))
VGPUS = (("nvidia-1155", 1), ("nvidia-1153", 1), ("nvidia-1150", 2))
INI = "[devices]\nstanding_vf_wait = 300\n"


def _core(root: str, state: Path) -> AgentCore:
    conf = make_conf(INI + f"\n[DEFAULT]\nstate_dir = {state}\n", sysfs_root=root)
    policy = dataclasses.replace(policy_mod.build_policy(conf),
                                 gpu_layouts=(GpuLayout("mix", PFS, VGPUS),))
    manager = manager_mod.DeviceManager(
        sysfs_root=root, policy=policy, host="bench", ledger=ledger_mod.Ledger(str(state)),
        writer=writers.DirectWriter(root))
    return AgentCore(conf, manager=manager)


def measure(rounds: int) -> dict[str, object]:
    first: list[float] = []
    rebooted: list[float] = []
    with tempfile.TemporaryDirectory(prefix="accel-bench-mixed-") as tmp:
        work = Path(tmp)
        spec = build_spec(["nvidia-vfio"], gpus=GPUS, vfs=VFS)
        with sim_testing.mounted(spec, work / "sys", timeout=120) as sim:
            root = str(work / "sys")

            def complete() -> None:
                gpus = sim.status()["nvidia_gpus"]
                assert all(g["heterogeneous"] and len(g["vgpus"]) == 4 for g in gpus), gpus

            for index in range(rounds):
                sim.reboot()
                state = work / f"state-{index}"
                core = _core(root, state)
                try:
                    began = time.perf_counter()
                    core.startup()
                    first.append(time.perf_counter() - began)
                    complete()
                    sim.reboot()
                    began = time.perf_counter()
                    core.startup()
                    rebooted.append(time.perf_counter() - began)
                    complete()
                finally:
                    core.close()
    return {
        f"first start ({GPUS} modes set, {GPUS * 4} vGPUs typed and placed)":
            timing.summary(first),
        f"after simulate reboot ({GPUS} modes set again, {GPUS * 4} re-created)":
            timing.summary(rebooted),
    }


def report(quick: bool) -> list[str]:
    results = measure(1 if quick else 3)
    lines = [
        f"### (x) start to ready, mixed-size layout {GPUS} GPUs x 3 sizes (FUSE simulator, "
        "in process)",
        "",
        "| what | result |",
        "| --- | --- |",
    ]
    for name, value in results.items():
        assert isinstance(value, dict)
        lines.append(
            f"| {name} | median {timing.ms(value['median'])}, min {timing.ms(value['min'])} "
            f"({value['runs']} runs) |"
        )
    lines += ["", "Command: `python -m benchmarks --only x` (`AgentCore.startup` in "
              "process with the layout in its policy; the times include the FUSE "
              "simulator's and its NVML's).", ""]
    return lines
