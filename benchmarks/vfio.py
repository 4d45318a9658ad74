"""(g) ``types`` and ``inventory`` on a host of NVIDIA vGPU 17+ GPUs: 8 PFs x
48 VFs (the simulator's nvidia-vfio profile with its PFs widened to 48 VFs
through the spec, as a JSON spec file would), as a static tree: whole
``accelctl --offline`` processes (wall and CPU), and the in-process scan."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys

from accel_agent.simulator import build_spec, materialise
from benchmarks import timing, trees

GPUS, VFS = 8, 48


def tree() -> str:
    path = os.path.join(trees.CACHE, f"vfio-{GPUS}x{VFS}")
    if not os.path.isdir(os.path.join(path, "bus", "pci", "devices")):
        os.makedirs(trees.CACHE, exist_ok=True)
        spec = build_spec(["nvidia-vfio"], gpus=GPUS, vfs=1)
        wide = [dataclasses.replace(pf, total_vfs=VFS, num_vfs=VFS) for pf in spec.sriov_pfs]
        tmp = path + ".partial"
        if os.path.exists(tmp):
            import shutil

            shutil.rmtree(tmp)
        materialise(dataclasses.replace(spec, sriov_pfs=wide), tmp)
        os.rename(tmp, path)
    return path


def measure(runs: int) -> dict[str, object]:
    from accel_agent import backends
    from accel_agent.backends.host import scan_host

    root = tree()
    config = trees.config(root, enabled="nvidia-1150")
    ctl = [os.path.join(os.path.dirname(sys.executable), "accelctl"), "--config-file", config,
           "--offline"]
    results: dict[str, object] = {}
    for name in ("types", "inventory"):
        samples = [timing.run_process([*ctl, name, "--json"]) for _ in range(runs + 2)][2:]
        results[f"accelctl --offline {name} --json, wall (median)"] = timing.ms(
            statistics.median(w for w, _ in samples)
        )
        results[f"accelctl --offline {name} --json, CPU (median)"] = timing.ms(
            statistics.median(c for _, c in samples)
        )
    state = root + ".state"
    scans = timing.run_callable(
        lambda: scan_host(root, backends.builtin(), state_dir=state), runs * 2
    )
    results["in-process scan of the host (median)"] = timing.ms(statistics.median(scans))
    snapshot = scan_host(root, backends.builtin(), state_dir=state)
    results["parents (VFs) / devices in the snapshot"] = (
        f"{len(snapshot.parents)} / {len(snapshot.mdevs)}"
    )
    return results
