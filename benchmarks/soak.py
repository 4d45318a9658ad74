"""``python -m benchmarks.soak [--model mdev|daemon] [--kills N] [--seed S] [--output FILE]``

The random-kill harnesses for many kills (``make soak``: 1,000 of each), with
their figures written into BENCHMARKS.md between markers (one block per
model), so that ``make bench`` (which rewrites the rest of the file) keeps
them.  ``mdev``: ``tests/functional/killharness.py``, one operation at a time
in a child process; ``daemon``: ``tests/functional/daemonharness.py``, the
running daemon driven through its API beside reloads, offline readers,
restarts and failing helpers.  Needs root and /dev/fuse, like the functional
tier.  Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

BEGIN = "<!-- soak: begin (make soak writes this block; make bench keeps it) -->"
END = "<!-- soak: end -->"
# The daemon model's block, beside the first one.
DAEMON_BEGIN = "<!-- soak-daemon: begin (make soak writes this block; make bench keeps it) -->"
DAEMON_END = "<!-- soak-daemon: end -->"
MARKERS = ((BEGIN, END), (DAEMON_BEGIN, DAEMON_END))


def block(path: str, begin: str = BEGIN, end: str = END) -> list[str]:
    """A soak block of an existing report (empty when there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    found = re.search(re.escape(begin) + r".*?" + re.escape(end), text, re.S)
    return found.group(0).splitlines() if found else []


def blocks(path: str) -> list[str]:
    """Every soak block of an existing report, in order (what make bench keeps)."""
    kept: list[str] = []
    for begin, end in MARKERS:
        found = block(path, begin, end)
        if found:
            kept += [""] * bool(kept) + found
    return kept


def write_block(path: str, lines: list[str], begin: str = BEGIN, end: str = END) -> None:
    text = Path(path).read_text() if os.path.exists(path) else "# Benchmarks\n"
    new = "\n".join([begin, *lines, end])
    pattern = re.escape(begin) + r".*?" + re.escape(end)
    if re.search(pattern, text, re.S):
        text = re.sub(pattern, lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    Path(path).write_text(text)


def _heading(title: str, summary: dict, command: str, machine: str) -> list[str]:
    """A soak block's title, when, where, the command, and its table's head."""
    return [
        title,
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{machine}",
        f"- command: `{command}` (what `make soak` runs), seed {summary['seed']}, "
        f"{summary['seconds']} s",
        "",
        "| what | result |",
        "| --- | --- |",
    ]


def render(summary: dict, command: str, machine: str) -> list[str]:
    kills = summary["kills_per_operation"]
    lines = [
        *_heading("### (s) random-kill soak: SIGKILL at random instants, then recover",
                  summary, command, machine),
        f"| runs (one operation each, then recover and the checks) | {summary['iterations']} |",
        f"| kills in all | {summary['kills']} |",
        *(f"| kills during {op} | {n} |" for op, n in kills.items()),
        f"| kills of a first recover (then recover again) | "
        f"{summary['kills_of_a_first_recover']} |",
        f"| kills that took the privsep helper too | {summary['helper_killed_too']} |",
        f"| operations that finished before the kill | "
        f"{sum(summary['completed_per_operation'].values())} |",
        f"| operations refused (capacity) | {sum(summary['refused_per_operation'].values())} |",
        f"| **violations** | **{summary['violations']}** |",
        "",
        "Each run checks, from sysfs and the ledger read apart: no leaked or missing mdev, "
        "parent and type agreeing, no UUID with two owners (rows and acknowledged answers), "
        "no owner above its request, all-or-nothing for the killed call, every acknowledged "
        "result kept, a completed call left settled, a second recover changes nothing.",
        "",
    ]
    return lines


def render_daemon(summary: dict, command: str, machine: str) -> list[str]:
    steps = summary["steps"]
    return [
        *_heading("### (s2) random-kill soak of the running daemon (multi-process model)",
                  summary, command, machine),
        f"| steps in all | {sum(steps.values())} |",
        *(f"| steps: {kind} | {n} |" for kind, n in steps.items()),
        f"| SIGKILLs of the daemon (then a restart that recovers) | {summary['daemon_kills']} |",
        f"| SIGKILLs of its privileged helper | {summary['helper_kills']} |",
        f"| mutations answered 2xx | {sum(summary['acked'].values())} |",
        f"| mutations refused (4xx) | {sum(summary['refused'].values())} |",
        f"| answers lost to a kill or a failed helper | {sum(summary['answer_lost'].values())} |",
        *(f"| reloads: {kind} | {n} |" for kind, n in summary["reloads"].items()),
        f"| confirmed answers checked in the ledger | {summary['confirmed_answers_checked']} |",
        f"| **violations** | **{summary['violations']}** |",
        "",
        "After every step, from the ledger read with plain SQL and sysfs, against the "
        "harness's own log of the API's answers: every answer confirmed 2xx is in the "
        "ledger, nothing leaked, missing or unsettled, no UUID with two owners, no held "
        "or domain-referenced mdev removed and no remove written to a held one, foreign "
        "mdevs untouched, the daemon alive unless the harness killed it.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    parser.add_argument("--model", choices=("mdev", "daemon"), default="mdev",
                        help="mdev: one operation at a time in a child (killharness); "
                        "daemon: the running daemon through its API (daemonharness)")
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--output", help="BENCHMARKS.md to update")
    parser.add_argument("--log", help="one line per run")
    args = parser.parse_args(argv)
    from benchmarks.__main__ import machine
    from tests.functional import daemonharness, killharness

    harness = daemonharness if args.model == "daemon" else killharness
    with tempfile.TemporaryDirectory(prefix="accel-soak-") as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        harness_args = ["--kills", str(args.kills), "--json", summary_path]
        if args.seed is not None:
            harness_args += ["--seed", str(args.seed)]
        if args.log:
            harness_args += ["--log", args.log]
        started = time.monotonic()
        status = harness.main(harness_args)
        import json

        summary = json.loads(Path(summary_path).read_text())
    print(f"soak finished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.output:
        command = "python -m benchmarks.soak " + shlex.join(
            argv if argv is not None else sys.argv[1:]
        )
        if args.model == "daemon":
            write_block(args.output, render_daemon(summary, command.strip(), machine()),
                        DAEMON_BEGIN, DAEMON_END)
        else:
            write_block(args.output, render(summary, command.strip(), machine()))
    return status


if __name__ == "__main__":
    sys.exit(main())
