"""(p) where a listing's time goes: ``accelctl types --json`` through the
running daemon and offline, split into start-up, imports, config, scan,
serialisation and transport (issue 26).

Each phase is measured on its own, the way the command runs it:

* start-up: the interpreter and ``site`` (``python -c pass``), a whole process;
* imports: a process importing what the path imports, less start-up;
* config: ``config.cache.load`` (the cached listing config; a miss loads
  oslo.config, BENCHMARKS.md (a)'s "config cache off" row);
* scan: ``wiring.host_state`` with one worker, the single-process case (the
  offline command forks a worker per idle core, none on a busy machine);
* serialisation: the listing document and its JSON, as ``output.emit_json``;
* transport: one GET of ``/v1/types`` on the daemon's socket, the daemon
  answering from its snapshot (plain_listing._get), and printing the body.

In-process phases are medians of repeated runs after a warm-up (page cache
and dentries warm, as for every row of (a)); process phases are medians of
interleaved runs.  The sum is near, not equal to, the whole command's time:
the whole also pays exit and, offline, ``gc.freeze``.  A sampling profile
shows the same split: ``py-spy record -r 1000 --subprocesses -f raw -- accelctl
--offline types --json`` (not run here: py-spy is no dependency).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks import cold, timing, trees

PYTHON = sys.executable
# What each path imports before it reads anything (plain_listing.answer).
DAEMON_IMPORTS = (
    "import _socket, accel_agent.cmd.plain_listing, accel_agent.config.cache,"
    " accel_agent.config.files"
)
OFFLINE_IMPORTS = (
    DAEMON_IMPORTS + ", accel_agent.wiring, accel_agent.cmd.listings, accel_agent.cmd.output,"
    " accel_agent.backends, accel_agent.backends.host"
)


def _process_medians(commands: dict[str, list[str]], runs: int) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for argv in commands.values():
        timing.run_process(argv)
    for _ in range(runs):
        for name, argv in commands.items():
            samples[name].append(timing.run_process(argv))
    return {
        name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
        for name, got in samples.items()
    }


def _in_process(func: Callable[[], object], runs: int) -> float:
    return statistics.median(timing.run_callable(func, runs, warmup=2))


def measure(tree: str, runs: int) -> dict[str, object]:
    from accel_agent import wiring
    from accel_agent.cmd import listings, plain_listing
    from accel_agent.config import cache as config_cache
    from accel_agent.config.files import config_sources

    conf = trees.config(tree)
    accelctl = os.path.join(cold.VENV_BIN, "accelctl")
    cold.byte_compile()
    # Fill the config cache the way a first run does.
    timing.run_process([accelctl, "--offline", "--config-file", conf, "types", "--json"])
    files, dirs = config_sources([conf], [])
    cached = config_cache.load(files, dirs)
    if cached is None:
        return {"skipped": "the config cache is off (ACCEL_AGENT_CACHE_DIR empty)"}
    listing = wiring.ListingConfig.from_dict(cached)
    process = _process_medians(
        {
            "start-up": [PYTHON, "-c", "pass"],
            "daemon imports": [PYTHON, "-c", DAEMON_IMPORTS],
            "offline imports": [PYTHON, "-c", OFFLINE_IMPORTS],
            "offline, one core": ["taskset", "-c", "0", accelctl, "--offline", "--config-file",
                                  conf, "types", "--json"],
        },
        runs,
    )
    startup = process["start-up"][0]
    state = wiring.host_state(listing)
    document = listings.BUILDERS["types"](state)

    def serialise() -> None:
        # As output.emit_json into a pipe: compact, Python's C encoder.
        io.StringIO().write(json.dumps(listings.BUILDERS["types"](state), separators=(",", ":"),
                                       check_circular=False))

    rows: dict[str, object] = {
        "start-up (interpreter, site)": startup,
        "imports, daemon path": process["daemon imports"][0] - startup,
        "imports, offline path": process["offline imports"][0] - startup,
        "config (cached listing config)": _in_process(lambda: config_cache.load(files, dirs), runs),
        "scan (one process)": _in_process(lambda: wiring.host_state(listing), runs),
        "serialisation (document + JSON)": _in_process(serialise, runs),
        "offline, one core, whole command": process["offline, one core"][0],
    }
    with cold.daemon_on(tree) as daemon_conf:
        if daemon_conf is None:
            rows["transport"] = "skipped: the daemon needs root"
        else:
            socket_path = _socket_of(daemon_conf)
            body = plain_listing._get(socket_path, "/v1/types") or b""
            rows["transport (GET /v1/types, daemon's answer)"] = _in_process(
                lambda: plain_listing._get(socket_path, "/v1/types"), runs
            )
            rows["printing the body"] = _in_process(lambda: _print_to_null(body), runs)
            whole = _process_medians(
                {"daemon": [accelctl, "--config-file", daemon_conf, "types", "--json"]}, runs
            )
            rows["through the daemon, whole command"] = whole["daemon"][0]
            rows["answer size"] = f"{len(body) / 1e6:.2f} MB"
    rows["parents x types"] = (
        f"{len(document['parents'])} parents" if isinstance(document, dict)
        and "parents" in document else "-"
    )
    return rows


def _socket_of(config_path: str) -> str:
    with open(config_path) as handle:
        for line in handle:
            name, _, value = line.partition("=")
            if name.strip() == "socket_path":
                return value.strip()
    raise ValueError(f"no socket_path in {config_path}")


def _print_to_null(body: bytes) -> None:
    with open(os.devnull, "wb") as sink:
        sink.write(body.rstrip(b"\n") + b"\n")


def report(tree: str, runs: int) -> list[str]:
    start = time.monotonic()
    rows = measure(tree, runs)
    lines = ["| phase | median |", "| --- | --- |"]
    for name, value in rows.items():
        shown = timing.ms(value) if isinstance(value, float) else str(value)
        lines.append(f"| {name} | {shown} |")
    lines.append("")
    lines.append(
        f"Tree: `{tree}`. Phases measured separately (benchmarks/breakdown.py's docstring); "
        f"{runs} runs each, {time.monotonic() - start:.0f} s in all."
    )
    return lines
