"""``python -m benchmarks.soak [--kills N] [--seed S] [--output BENCHMARKS.md]``

The random-kill harness of ``tests/functional/killharness.py`` for many kills
(``make soak``: 1,000), with its figures (runs, kills per operation,
violations) written into BENCHMARKS.md between two markers, so that
``make bench`` (which rewrites the rest of the file) keeps them.  Needs root
and /dev/fuse, like the functional tier.  Exit status 1 on any violation.
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


def block(path: str) -> list[str]:
    """The soak block of an existing report (empty when there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return found.group(0).splitlines() if found else []


def write_block(path: str, lines: list[str]) -> None:
    text = Path(path).read_text() if os.path.exists(path) else "# Benchmarks\n"
    new = "\n".join([BEGIN, *lines, END])
    pattern = re.escape(BEGIN) + r".*?" + re.escape(END)
    if re.search(pattern, text, re.S):
        text = re.sub(pattern, lambda _: new, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    Path(path).write_text(text)


def render(summary: dict, command: str, machine: str) -> list[str]:
    kills = summary["kills_per_operation"]
    lines = [
        "### (s) random-kill soak: SIGKILL at random instants, then recover",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{machine}",
        f"- command: `{command}` (what `make soak` runs), seed {summary['seed']}, "
        f"{summary['seconds']} s",
        "",
        "| what | result |",
        "| --- | --- |",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--output", help="BENCHMARKS.md to update")
    parser.add_argument("--log", help="one line per run")
    args = parser.parse_args(argv)
    from benchmarks.__main__ import machine
    from tests.functional import killharness

    with tempfile.TemporaryDirectory(prefix="accel-soak-") as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        harness_args = ["--kills", str(args.kills), "--json", summary_path]
        if args.seed is not None:
            harness_args += ["--seed", str(args.seed)]
        if args.log:
            harness_args += ["--log", args.log]
        started = time.monotonic()
        status = killharness.main(harness_args)
        import json

        summary = json.loads(Path(summary_path).read_text())
    print(f"soak finished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.output:
        command = "python -m benchmarks.soak " + shlex.join(
            argv if argv is not None else sys.argv[1:]
        )
        write_block(args.output, render(summary, command.strip(), machine()))
    return status


if __name__ == "__main__":
    sys.exit(main())
