"""(a) Cold ``accelctl types --json`` as a whole process vs ``mdevctl types
--dumpjson`` in a chroot of the same tree vs a bare Python openat loop."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

from benchmarks import timing, trees

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)


@contextlib.contextmanager
def mdevctl_chroot(tree: str) -> Iterator[list[str] | None]:
    """mdevctl 1.2.0 has no fake-root option: run it in a chroot whose /sys is
    the tree (bind mounts, root only) with the script dirs it insists on."""
    mdevctl = shutil.which("mdevctl")
    if mdevctl is None or os.geteuid() != 0:
        yield None
        return
    root = tree + ".chroot"
    for sub in (
        "sys",
        "usr",
        "etc/mdevctl.d/scripts.d/callouts",
        "etc/mdevctl.d/scripts.d/notifiers",
    ):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for link in ("lib", "lib64", "bin", "sbin"):
        path = os.path.join(root, link)
        if not os.path.lexists(path):
            os.symlink(f"usr/{link}", path)
    mounts = [("/usr", os.path.join(root, "usr")), (tree, os.path.join(root, "sys"))]
    done = []
    try:
        for source, target in mounts:
            subprocess.run(["mount", "--bind", "-o", "ro", source, target], check=True)
            done.append(target)
        yield ["chroot", root, os.path.realpath(mdevctl), "types", "--dumpjson"]
    finally:
        for target in reversed(done):
            subprocess.run(["umount", target], check=False)


def byte_compile() -> None:
    """Measure the package as installed (pip byte-compiles it), also where
    PYTHONDONTWRITEBYTECODE keeps an editable checkout from caching bytecode."""
    import accel_agent

    package = os.path.dirname(os.path.abspath(accel_agent.__file__))
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True)


def measure(parents: int, types: int, runs: int) -> dict[str, object]:
    tree = trees.tree(parents, types)
    conf = trees.config(tree)
    byte_compile()
    accelctl = [os.path.join(VENV_BIN, "accelctl"), "--offline", "--config-file", conf]
    commands = {
        "accelctl types --json": [*accelctl, "types", "--json"],
        # What the first run after a config change pays: oslo.config's import.
        "accelctl types --json, config cache off": [
            "env",
            "ACCEL_AGENT_CACHE_DIR=",
            *accelctl,
            "types",
            "--json",
        ],
        "bare Python openat loop": [sys.executable, os.path.join(HERE, "bare_loop.py"), tree],
    }
    results: dict[str, object] = {}
    with mdevctl_chroot(tree) as mdevctl:
        if mdevctl:
            commands["mdevctl types --dumpjson (chroot)"] = mdevctl
        else:
            results["mdevctl types --dumpjson (chroot)"] = "skipped: needs root and mdevctl"
        for argv in commands.values():  # page cache, bytecode, config cache
            timing.run_command(argv, runs=0, warmup=1)
        # Interleave the commands run by run so drift hits all of them alike.
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                samples[name] += timing.run_command(argv, runs=1, warmup=0)
        for name in commands:
            results[name] = timing.summary(samples[name])
    return results
