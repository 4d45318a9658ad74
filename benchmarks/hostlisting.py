"""(n) listing across host shapes: (a)'s interleaved measurement, daemon
listing, offline, offline on one core and ``mdevctl types --dumpjson``, on
each tree of :mod:`benchmarks.hosttrees`, each judged against the targets of
docs/design.md §9 (issue 26: on all of them, not on the best one)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks import cold, hosttrees, timing

VENV_BIN = os.path.dirname(sys.executable)
# (command, statistic, target ratio to mdevctl, what the report calls it)
TARGETS = (
    (cold.VIA_DAEMON, "median", 0.3, "daemon wall"),
    (cold.OFFLINE, "median", 1.0, "offline wall"),
    (cold.OFFLINE, "cpu_median", 1.5, "offline CPU"),
)
# Shown, not judged: the single-process cost (no forked scan worker).
ONE_CORE = ((cold.ONE_CORE, "median", "one-core wall"), (cold.ONE_CORE, "cpu_median",
                                                         "one-core CPU"))


def seed_state(state_dir: str, mdevs: list[dict[str, object]]) -> int:
    """A state dir whose ledger records the tree's "owned" mdevs as adopted
    (what ``accelctl adopt UUID`` records, in one transaction instead of a
    process per mdev); how many."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    owned = [m for m in mdevs if m["owned"]]
    if not owned:
        return 0
    from accel_agent.devices.ledger import Ledger

    with Ledger(state_dir) as ledger, ledger.transaction():
        for mdev in owned:
            ledger.adopt(str(mdev["uuid"]), str(mdev["parent"]), str(mdev["mdev_type"]))
    return len(owned)


def offline_config(path: str, root: str, state_dir: str, devices: str) -> str:
    with open(path, "w") as handle:
        handle.write(
            f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {state_dir}\nhost = bench\n"
            f"[libvirt]\nuri =\n{devices}"
        )
    return path


def measure(shape: hosttrees.Shape, runs: int) -> dict[str, object]:
    """The tree of ``shape`` measured: ``results`` (name -> summary or why
    skipped), ``commands`` (name -> argv), ``tree`` and ``owned``."""
    started = time.monotonic()
    root = hosttrees.tree(shape)
    built = time.monotonic()
    written = hosttrees.manifest(root)
    devices = shape.devices_config(written)
    accelctl = os.path.join(VENV_BIN, "accelctl")
    cold.byte_compile()
    with tempfile.TemporaryDirectory(prefix="accel-bench-n-") as tmp:
        # One state dir for the daemon and the offline CLI, as on a host; new
        # each time: the daemon may write to it, the tree stays as built.
        state = os.path.join(tmp, "state")
        owned = seed_state(state, written["mdevs"])  # type: ignore[arg-type]
        conf = offline_config(os.path.join(tmp, "offline.conf"), root, state, devices)
        commands = {
            cold.OFFLINE: [accelctl, "--offline", "--config-file", conf, "types", "--json"],
            cold.ONE_CORE: ["taskset", "-c", "0", accelctl, "--offline", "--config-file", conf,
                            "types", "--json"],
        }
        results: dict[str, object] = {}
        with cold.mdevctl_chroot(root) as mdevctl, \
                cold.daemon_on(root, devices=devices, state_dir=state) as daemon_conf:
            if mdevctl:
                commands[cold.MDEVCTL] = mdevctl
            else:
                results[cold.MDEVCTL] = "skipped: needs root and mdevctl"
            if daemon_conf:
                commands[cold.VIA_DAEMON] = [accelctl, "--config-file", daemon_conf, "types",
                                             "--json"]
            else:
                results[cold.VIA_DAEMON] = "skipped: the daemon needs root"
            ready = time.monotonic()
            results.update(cold.interleaved(commands, runs))
            measured = time.monotonic()
    # Where a run's minutes go (the whole of (n) should stay <= 10 minutes).
    spent = (f"tree {built - started:.1f} s (0 when cached), mounts and daemon start "
             f"{ready - built:.1f} s, measuring {measured - ready:.1f} s")
    return {"results": results, "commands": commands, "tree": root, "owned": owned,
            "enabled": devices.splitlines()[1], "spent": spent}


def ratio(results: dict[str, object], name: str, stat: str) -> float | None:
    base, ours = results.get(cold.MDEVCTL), results.get(name)
    if not isinstance(base, dict) or not isinstance(ours, dict):
        return None
    return float(ours[stat]) / float(base[stat])


def verdicts(results: dict[str, object]) -> list[tuple[str, float | None, float, bool | None]]:
    """(what, ratio, target, met) per target; None where not measured."""
    out = []
    for name, stat, target, what in TARGETS:
        value = ratio(results, name, stat)
        out.append((what, value, target, None if value is None else value <= target))
    return out


def _cell(value: float | None, target: float | None = None) -> str:
    if value is None:
        return "n/a"
    if target is None:
        return f"{value:.2f}x"
    return f"{value:.2f}x {'pass' if value <= target else '**FAIL**'}"


def _ms(results: dict[str, object], name: str, stat: str = "median") -> str:
    value = results.get(name)
    return timing.ms(float(value[stat])) if isinstance(value, dict) else "n/a"


def console(shape: hosttrees.Shape, measured: dict[str, object]) -> str:
    """What a run prints per tree: the commands, the medians, the ratios."""
    results: dict[str, object] = measured["results"]  # type: ignore[assignment]
    commands: dict[str, list[str]] = measured["commands"]  # type: ignore[assignment]
    lines = [f"tree {shape.name}: {shape.label()}", f"  at {measured['tree']}",
             f"  {measured['enabled']}", f"  time spent: {measured['spent']}"]
    for name, argv in commands.items():
        lines.append(f"  {name}: {timing.shown(argv)}")
    for name, value in results.items():
        if isinstance(value, dict):
            lines.append(f"  {name}: wall median {_ms(results, name)}, CPU median "
                         f"{_ms(results, name, 'cpu_median')}")
        else:
            lines.append(f"  {name}: {value}")
    for what, value, target, met in verdicts(results):
        state = "n/a" if met is None else ("pass" if met else "FAIL")
        shown = "n/a" if value is None else f"{value:.2f}x"
        lines.append(f"  {what} / mdevctl: {shown} (target <= {target}x): {state}")
    return "\n".join(lines)


HEADER = (
    "| tree | what it varies | mdevctl wall | daemon wall (<= 0.3x) | offline wall (<= 1.0x) "
    "| offline CPU (<= 1.5x) | one core: wall, CPU |"
)


def row(shape: hosttrees.Shape, measured: dict[str, object]) -> str:
    results: dict[str, object] = measured["results"]  # type: ignore[assignment]
    judged = verdicts(results)
    one = ", ".join(_cell(ratio(results, name, stat)) for name, stat, _ in ONE_CORE)
    cells = [
        shape.name,
        shape.label(),
        _ms(results, cold.MDEVCTL),
        f"{_ms(results, cold.VIA_DAEMON)}, {_cell(judged[0][1], judged[0][2])}",
        f"{_ms(results, cold.OFFLINE)}, {_cell(judged[1][1], judged[1][2])}",
        f"{_ms(results, cold.OFFLINE, 'cpu_median')}, {_cell(judged[2][1], judged[2][2])}",
        one,
    ]
    return "| " + " | ".join(cells) + " |"


def report(runs: int, shapes: list[hosttrees.Shape],
           progress: Callable[[str], None] | None = None) -> list[str]:
    """The Markdown of (n): one table row per tree, then each tree's commands."""
    rows, details = [], []
    failed = 0
    for shape in shapes:
        measured = measure(shape, runs)
        if progress is not None:
            progress(console(shape, measured))
        rows.append(row(shape, measured))
        failed += any(met is False for *_, met in verdicts(measured["results"]))  # type: ignore[arg-type]
        commands: dict[str, list[str]] = measured["commands"]  # type: ignore[assignment]
        details += [f"- `{shape.name}` ({measured['owned']} owned mdevs in the ledger; "
                    f"`{measured['enabled']}`, the GPUs shared out among them by "
                    "`[mdev_<type>] device_addresses`):"]
        details += [f"  - {name}: `{timing.shown(argv)}`" for name, argv in commands.items()]
    return [
        "### (n) listing across host shapes",
        "",
        f"Trees from `benchmarks/hosttrees.py` (plain `os` calls, not the simulator), "
        f"{runs} interleaved runs of each command per tree; ratios are to `mdevctl types "
        f"--dumpjson` in the same run (wall: median wall times; CPU: median user + system "
        f"times). {failed} of {len(rows)} trees miss a target. Machine load average at the "
        f"end: {os.getloadavg()[0]:.2f}.",
        "",
        HEADER,
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "<details><summary>Commands per tree</summary>",
        "",
        *details,
        "",
        "</details>",
        "",
    ]
