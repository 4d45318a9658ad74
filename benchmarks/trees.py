"""Generated sysfs trees for the benchmarks (the simulator's synthetic profile)."""

from __future__ import annotations

import os

from accel_agent.simulator import build_spec, materialise

CACHE = os.environ.get("ACCEL_BENCH_CACHE", "/var/tmp/accel-agent-bench")


def tree(parents: int, types: int) -> str:
    """A static tree of ``parents`` x ``types``, built once and cached."""
    path = os.path.join(CACHE, f"tree-{parents}x{types}")
    if not os.path.isdir(os.path.join(path, "class", "mdev_bus")):
        os.makedirs(CACHE, exist_ok=True)
        tmp = path + ".partial"
        if os.path.exists(tmp):
            import shutil

            shutil.rmtree(tmp)
        materialise(build_spec(["synthetic"], parents=parents, types=types), tmp)
        os.rename(tmp, path)
    return path


def config(root: str, enabled: str = "nvidia-1003") -> str:
    path = root.rstrip("/") + ".conf"
    with open(path, "w") as handle:
        handle.write(
            f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {root}.state\nhost = bench\n"
            f"[devices]\nenabled_mdev_types = {enabled}\n[libvirt]\nuri =\n"
        )
    return path
