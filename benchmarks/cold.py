"""(a) ``accelctl types --json`` as a whole process, through the running
daemon and offline, vs ``mdevctl types --dumpjson`` in a chroot of the same
tree vs a bare Python openat loop: wall and CPU time, in one run.

(n) the same interleaved measurement on each host shape of
:mod:`benchmarks.hosttrees` (trees not made by our simulator), with the
targets' ratios judged per tree."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks import timing, trees

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)
MDEVCTL = "mdevctl types --dumpjson (chroot)"
VIA_DAEMON = "accelctl types --json, daemon running"
OFFLINE = "accelctl --offline types --json"
ONE_CORE = "accelctl --offline types --json, one core (taskset)"


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


@contextlib.contextmanager
def daemon_on(
    tree: str,
    devices: str = "[devices]\nenabled_mdev_types = nvidia-1003\n",
    state_dir: str | None = None,
) -> Iterator[str | None]:
    """The real daemon (with its privsep helper) serving ``tree`` with the
    ``devices`` config (and ``state_dir``, else a new one): the path of its
    config file, or None where it cannot run (not root)."""
    if os.geteuid() != 0:
        yield None
        return
    from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir

    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp, short_dir() as sock_dir:
        socket_path = str(sock_dir / "api.sock")
        config = agent_config(
            Path(tmp) / "agent.conf",
            tree,
            state_dir or str(Path(tmp) / "state"),
            socket_path,
            devices,
            extra="[DEFAULT]\ndebug = false\n",
        )
        with AgentDaemon(config, socket_path, Path(tmp)) as daemon:
            daemon.start()
            yield str(config)


def byte_compile() -> None:
    """Measure the package as installed (pip byte-compiles it), also where
    PYTHONDONTWRITEBYTECODE keeps an editable checkout from caching bytecode."""
    import accel_agent

    package = os.path.dirname(os.path.abspath(accel_agent.__file__))
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True)


def summary(samples: list[tuple[float, float]]) -> dict[str, object]:
    wall = timing.summary([w for w, _ in samples])
    cpu = timing.summary([c for _, c in samples])
    return {**wall, "cpu_median": cpu["median"]}


def measure(parents: int, types: int, runs: int) -> dict[str, object]:
    tree = trees.tree(parents, types)
    conf = trees.config(tree)
    byte_compile()
    accelctl = os.path.join(VENV_BIN, "accelctl")
    commands = {
        OFFLINE: [accelctl, "--offline", "--config-file", conf, "types", "--json"],
        ONE_CORE: ["taskset", "-c", "0", accelctl, "--offline", "--config-file", conf,
                   "types", "--json"],
        # What the first run after a config change pays: oslo.config's import.
        "accelctl --offline types --json, config cache off": [
            "env",
            "ACCEL_AGENT_CACHE_DIR=",
            accelctl,
            "--offline",
            "--config-file",
            conf,
            "types",
            "--json",
        ],
        "bare Python openat loop": [sys.executable, os.path.join(HERE, "bare_loop.py"), tree],
    }
    results: dict[str, object] = {}
    with mdevctl_chroot(tree) as mdevctl, daemon_on(tree) as daemon_conf:
        if mdevctl:
            commands[MDEVCTL] = mdevctl
        else:
            results[MDEVCTL] = "skipped: needs root and mdevctl"
        if daemon_conf:
            commands[VIA_DAEMON] = [accelctl, "--config-file", daemon_conf, "types", "--json"]
        else:
            results[VIA_DAEMON] = "skipped: the daemon needs root"
        results.update(interleaved(commands, runs))
    return results


def interleaved(commands: dict[str, list[str]], runs: int) -> dict[str, object]:
    """Each command's summary: two warm-up runs each (page cache, bytecode,
    config cache, the daemon's first read), then ``runs`` rounds, the
    commands interleaved run by run so drift hits all of them alike."""
    for argv in commands.values():
        timing.run_process(argv)
        timing.run_process(argv)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            samples[name].append(timing.run_process(argv))
    return {name: summary(samples[name]) for name in commands}


def ratios(results: dict[str, object]) -> list[str]:
    """The targets' ratios to mdevctl in the same run (docs/design.md §9)."""
    base = results.get(MDEVCTL)
    if not isinstance(base, dict):
        return []
    notes = []
    for name, what in ((VIA_DAEMON, "wall"), (OFFLINE, "wall"), (OFFLINE, "CPU"),
                       (ONE_CORE, "wall"), (ONE_CORE, "CPU")):
        ours = results.get(name)
        if isinstance(ours, dict):
            key = "median" if what == "wall" else "cpu_median"
            notes.append(f"{name} / mdevctl, {what} time: {ours[key] / base[key]:.2f}")
    return notes
