"""(r) Start to READY with a standing layout (issue 23): 4 NVIDIA L40S GPUs x
16 VFs, ``[mdev_nvidia-1149] standing = 16`` (L40S-3Q: 16 per GPU, every VF
typed), the real daemon and privsep helper on the FUSE simulator.

Three starts, each measured from the process's start to ``READY=1``:

* a first start: an empty ledger, the layout made (64 VFs typed);
* after ``simulate reboot`` (every VF's type reset): recovery re-creates the
  64 recorded vGPUs with the same UUIDs on the same VFs;
* after ``simulate reboot --vfs-disabled`` with the VFs enabled (``simulate
  enable-vfs ALL``, nvidia-sriov.service's job) once the agent waits for
  them: from the enabling to READY.

Every sysfs access is a FUSE round trip to the simulator's process, so the
figures are the agent's cost plus the simulator's, an upper bound of the
kernel's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import timing
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir
from tests.functional.killharness import typed_vfs

GPUS, VFS, TYPE = 4, 16, "nvidia-1149"
PFS = [f"0000:c{n + 1}:00.0" for n in range(GPUS)]
BODY = (
    f"[devices]\nenabled_mdev_types = {TYPE}\nstanding_vf_wait = 300\n"
    f"[mdev_{TYPE}]\ndevice_addresses = {', '.join(PFS)}\nstanding = {VFS}\n"
)
QUIET = "[DEFAULT]\ndebug = false\n"


def _typed(root: str) -> int:
    return sum(1 for value in typed_vfs(root).values() if value)


def _start(daemon: AgentDaemon) -> float:
    started = time.perf_counter()
    daemon.start(timeout=900)
    return time.perf_counter() - started


def measure(rounds: int) -> dict[str, object]:
    first: list[float] = []
    rebooted: list[float] = []
    enabled: list[float] = []
    with tempfile.TemporaryDirectory(prefix="accel-bench-standing-") as tmp:
        work = Path(tmp)
        spec = build_spec(["nvidia-vfio"], gpus=GPUS, vfs=VFS)
        with sim_testing.mounted(spec, work / "sys", timeout=120) as sim, short_dir() as sock:
            for index in range(rounds):
                state = work / f"state-{index}"
                config = agent_config(work / f"agent-{index}.conf", str(work / "sys"),
                                      str(state), str(sock / "api.sock"), BODY, extra=QUIET)
                sim.reboot()
                with AgentDaemon(config, str(sock / "api.sock"), work) as daemon:
                    first.append(_start(daemon))
                    assert _typed(str(work / "sys")) == GPUS * VFS
                    daemon.stop()
                    sim.reboot()
                    rebooted.append(_start(daemon))
                    assert _typed(str(work / "sys")) == GPUS * VFS
                    daemon.stop()
                    sim.reboot(vfs_disabled=True)
                    daemon.spawn()
                    deadline = time.monotonic() + 300
                    while "waiting up to" not in daemon.log() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    since = time.perf_counter()
                    sim.enable_vfs("ALL")
                    daemon.wait_ready(timeout=900)
                    enabled.append(time.perf_counter() - since)
                    assert _typed(str(work / "sys")) == GPUS * VFS
                    daemon.stop()
    return {
        "first start (layout made, 64 VFs typed)": timing.summary(first),
        "after simulate reboot (64 re-created)": timing.summary(rebooted),
        "VFs enabled while the agent waits -> READY": timing.summary(enabled),
    }


def report(quick: bool) -> list[str]:
    results = measure(1 if quick else 3)
    lines = timing.median_min_table(
        f"### (r) start to READY, standing layout {GPUS} GPUs x {VFS} VFs (FUSE simulator)",
        results,
    )
    lines += ["", "Command: `python -m benchmarks --only r` (each start a whole daemon "
              "process; the times include the FUSE simulator's).", ""]
    return lines
