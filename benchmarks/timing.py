"""Small timing helpers: medians and percentiles of repeated runs."""

from __future__ import annotations

import os
import re
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def run_command(argv: Sequence[str], runs: int, warmup: int = 2) -> list[float]:
    """Wall time of a whole process, ``runs`` times after ``warmup`` runs."""
    samples = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def run_process(argv: Sequence[str]) -> tuple[float, float]:
    """(wall time, CPU time) of one run of a whole process: user + system
    time of it and of the children it waited for (a forked scan worker)."""
    import os

    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, list(argv))
    return wall, usage.ru_utime + usage.ru_stime


def run_callable(func: Callable[[], object], runs: int, warmup: int = 3) -> list[float]:
    samples = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        func()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "p90": percentile(samples, 90),
        "min": min(samples),
        "runs": len(samples),
    }


def median_min_table(title: str, results: dict[str, object]) -> list[str]:
    """A report's heading and its "| what | result |" table of
    :func:`summary` results, each row its median and minimum."""
    lines = [title, "", "| what | result |", "| --- | --- |"]
    for name, value in results.items():
        assert isinstance(value, dict)
        lines.append(
            f"| {name} | median {ms(value['median'])}, min {ms(value['min'])} "
            f"({value['runs']} runs) |"
        )
    return lines


# What a command line shows in BENCHMARKS.md: paths of this checkout relative
# to it, a run's temporary directory as $TMP, so that the file names no
# directory of the machine it was measured on (the commands still say what
# ran; the fixed caches under /var/tmp/accel-agent-bench are the project's own).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN_TMP = re.compile(
    re.escape(tempfile.gettempdir().rstrip("/")) + r"/accel-[A-Za-z0-9_.-]*?[a-z0-9_]{8}(?=/|$)"
)


def shown(argv: Sequence[str]) -> str:
    """``argv`` as a shell line for a report: no machine's paths in it."""
    text = shlex.join(argv)
    text = text.replace(_REPO + "/", "").replace(_REPO, ".")
    return _RUN_TMP.sub("$TMP", text)
