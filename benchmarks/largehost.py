"""(m) A large host: 2,000 parents x 4 types, through the real daemon.

Issue 21, item 7: on such a host (the FUSE simulator) the daemon took
7 min 20 s to be ready, its listings and an allocate got no answer in 120 s,
and SIGTERM was not honoured within 90 s.  This measures, on a static tree
(plain files: kernel-speed reads, the agent's own cost) and on the FUSE
simulator (every sysfs access a round trip to a Python process):

* time from start to ``READY=1``;
* the listings through the daemon: ``accelctl types --json`` and
  ``accelctl inventory --json`` as whole processes, ``GET /v1/types``;
* allocate and ``GET /v1/types`` while the periodic rescan (every counter
  and every mdev read again) runs back to back (``rescan_interval`` 0.1 s:
  the rescan thread is scanning nearly all the time, which the busy share
  shows), beside how long one such rescan takes;
* SIGTERM during start-up's scans and during a periodic rescan: time from
  the signal to the exit, the exit code, and whether the log shows the scan
  stopped (graceful) or the hard exit at ``[api] shutdown_timeout``.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import trees
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir

PARENTS = 2000
TYPES = 4
CONF = "[devices]\nenabled_mdev_types = nvidia-1003\n"
QUIET = "[DEFAULT]\ndebug = false\n"
VENV_BIN = os.path.dirname(sys.executable)
START_TIMEOUT = 900.0

TARGETS = (
    "READY <= 30 s; listings through the daemon <= 2 s; an allocate answered while a "
    "rescan runs (not after it); no request waiting longer than one rescan takes; "
    "SIGTERM mid-scan ends the daemon cleanly (exit 0, no hard exit) within "
    "[api] shutdown_timeout"
)


@contextmanager
def _fuse_host(tmp: Path) -> Iterator[str]:
    mountpoint = tmp / "sys"
    os.environ.setdefault("ACCEL_SIM_RUNDIR", str(tmp / "run"))
    spec = build_spec(["synthetic"], parents=PARENTS, types=TYPES)
    with sim_testing.mounted(spec, mountpoint, timeout=300) as sim:
        yield sim.root


@contextmanager
def _static_host(tmp: Path) -> Iterator[str]:
    yield trees.tree(PARENTS, TYPES)


@contextmanager
def _daemon(root: str, tmp: Path, rescan_interval: float) -> Iterator[tuple[AgentDaemon, Path]]:
    tmp.mkdir(parents=True, exist_ok=True)
    with short_dir() as sock_dir:
        state = tmp / "state"
        config = agent_config(
            tmp / "agent.conf",
            root,
            str(state),
            str(sock_dir / "api.sock"),
            CONF,
            rescan_interval=rescan_interval,
            extra=QUIET,
        )
        daemon = AgentDaemon(config, str(sock_dir / "api.sock"), tmp)
        try:
            yield daemon, config
        finally:
            daemon.kill()


def _timed(func: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return samples


def _worst(samples: list[float]) -> str:
    return (
        f"median {statistics.median(samples):.2f} s, max {max(samples):.2f} s "
        f"({len(samples)} runs)"
    )


def _rescan_seconds(daemon: AgentDaemon) -> tuple[float, float]:
    """(sum, count) of the daemon's rescan durations so far (its histogram)."""
    return (
        daemon.metric("accel_agent_rescan_duration_seconds_sum"),
        daemon.metric("accel_agent_rescan_duration_seconds_count"),
    )


def _ready_and_listings(root: str, tmp: Path, runs: int) -> dict[str, object]:
    results: dict[str, object] = {}
    with _daemon(root, tmp / "a", rescan_interval=3600) as (daemon, config):
        start = time.perf_counter()
        daemon.start(timeout=START_TIMEOUT)
        results["time to READY=1"] = f"{time.perf_counter() - start:.1f} s"
        accelctl = os.path.join(VENV_BIN, "accelctl")
        api = daemon.client(timeout=600)
        for label, func in (
            ("accelctl types --json (whole process)",
             lambda: subprocess.run([accelctl, "--config-file", str(config), "types", "--json"],
                                    stdout=subprocess.DEVNULL, check=True)),
            ("accelctl inventory --json (whole process)",
             lambda: subprocess.run(
                 [accelctl, "--config-file", str(config), "inventory", "--json"],
                 stdout=subprocess.DEVNULL, check=True)),
            ("GET /v1/types", api.types),
            ("GET /v1/inventory", api.inventory),
        ):
            results[label] = _worst(_timed(func, runs))
        results["exit code on SIGTERM, idle"] = daemon.stop()
    return results


def _during_rescans(root: str, tmp: Path, runs: int) -> dict[str, object]:
    """Allocate/release and GET /v1/types while periodic full rescans run back to back."""
    results: dict[str, object] = {}
    with _daemon(root, tmp / "b", rescan_interval=0.1) as (daemon, _config):
        daemon.start(timeout=START_TIMEOUT)
        api = daemon.client(timeout=600)
        # Let the periodic rescans start (the first one after the interval).
        time.sleep(1.0)
        before_sum, before_count = _rescan_seconds(daemon)
        begin = time.perf_counter()
        allocations, listings = [], []
        for index in range(runs):
            instance = f"large-{index}"
            start = time.perf_counter()
            api.allocate(instance, 1)
            allocations.append(time.perf_counter() - start)
            api.release(instance)
            listings += _timed(api.types, 1)
        wall = time.perf_counter() - begin
        after_sum, after_count = _rescan_seconds(daemon)
        rescans = after_count - before_count
        busy = after_sum - before_sum
        results["allocate while rescans run"] = _worst(allocations)
        results["GET /v1/types while rescans run"] = _worst(listings)
        if rescans:
            results["one periodic rescan (every counter and mdev)"] = (
                f"mean {busy / rescans:.2f} s ({rescans:.0f} rescans)"
            )
        results["rescan thread busy"] = f"{min(100.0, 100 * busy / wall):.0f} % of the time"
        results["exit code on SIGTERM"] = daemon.stop()
    return results


def _sigterm(root: str, tmp: Path, during_startup: bool) -> dict[str, object]:
    label = "start-up" if during_startup else "a periodic rescan"
    with _daemon(root, tmp / ("c" if during_startup else "d"), rescan_interval=0.1) as (
        daemon, _config
    ):
        if during_startup:
            proc = daemon.spawn()
            # prepare() binds the socket first, then recovers and scans.
            deadline = time.monotonic() + 120
            while not os.path.exists(daemon.socket_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            if "READY=1" in daemon.read_notifications():
                return {f"SIGTERM during {label}": "skipped: start-up ended within 1 s"}
        else:
            daemon.start(timeout=START_TIMEOUT)
            proc = daemon.proc
            time.sleep(1.0)
        assert proc is not None
        start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(300)
        elapsed = time.perf_counter() - start
        log = daemon.log()
    stopped_scan = bool(re.search(r"rescan stopped: the agent is stopping|during start-up", log))
    hard = "did not stop within [api] shutdown_timeout" in log
    how = "hard exit at the deadline" if hard else "graceful"
    return {
        f"SIGTERM during {label}": f"exit {code} after {elapsed:.2f} s, {how}"
        + ("; a scan was stopped" if stopped_scan and not during_startup else ""),
    }


def measure(host: str, quick: bool) -> dict[str, object]:
    runs = 3 if quick else 5
    make_host = _fuse_host if host == "fuse" else _static_host
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="accel-bench-m-") as tmp_name:
        tmp = Path(tmp_name)
        with make_host(tmp) as root:
            results.update(_ready_and_listings(root, tmp, runs))
            results.update(_during_rescans(root, tmp, runs))
            results.update(_sigterm(root, tmp, during_startup=True))
            results.update(_sigterm(root, tmp, during_startup=False))
    return results


def report(quick: bool) -> list[str]:
    from benchmarks.__main__ import section

    lines: list[str] = []
    for host, title in (
        ("static", f"(m) large host, {PARENTS} parents x {TYPES} types, static tree"),
        ("fuse", f"(m) large host, {PARENTS} parents x {TYPES} types, FUSE simulator"),
    ):
        started = time.strftime("%H:%M")
        load = os.getloadavg()[0]
        results = measure(host, quick)
        lines += section(
            title,
            results,
            [
                f"Targets: {TARGETS}.",
                "Each row is the real daemon (with its privsep helper) as a process; the "
                "listings and the allocate go through its API socket. The FUSE simulator is "
                "in the path of every sysfs access of the FUSE rows (each an upcall to a "
                "Python process: what a real /sys answers in microseconds). Started "
                f"{started} UTC, load average {load:.2f} at the start, "
                f"{os.getloadavg()[0]:.2f} at the end.",
                "Command: `python -m benchmarks --only m`.",
            ],
        )
    return lines
