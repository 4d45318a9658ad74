"""(c) allocate/release through the API, (e) daemon RSS, (f) time from an mdev
removed behind the agent to the API showing it gone.

The real daemon on a FUSE-simulated host with the real privsep daemon, like
the functional tests (tests/functional/daemon_fixture.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from benchmarks import timing
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir

CONF = "[devices]\nenabled_mdev_types = nvidia-35\n"  # 16 per GPU, 8 GPUs: 128 slots
FOREIGN = "fe0fe0fe-0000-4000-8000-0000000000f1"
# The test fixture's config logs at DEBUG (and privsep sends each of its
# DEBUG lines over its channel); an operator's daemon does not.
QUIET = "[DEFAULT]\ndebug = false\n"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def allocate_load(
    daemon: AgentDaemon, clients: int, seconds: float, remove: bool
) -> dict[str, object]:
    """Each client loops: allocate 1 mdev, release it.  ``remove``: release
    removes it, so every allocate creates one through privsep (the slow
    path); otherwise released mdevs are reused (Nova's steady state)."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    errors = 0
    kinds: dict[str, int] = {}

    def client(index: int) -> None:
        nonlocal errors
        api = daemon.client(timeout=60)
        instance = f"bench-{clients}-{index}"
        while time.monotonic() < stop:
            start = time.perf_counter()
            try:
                api.allocate(instance, 1)
            except Exception as exc:
                with lock:
                    errors += 1
                    kinds[type(exc).__name__ + ": " + str(exc)[:80]] = 1
                continue
            elapsed = time.perf_counter() - start
            api.release(instance, remove=remove)
            with lock:
                latencies.append(elapsed)

    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - begin
    if kinds:
        print("allocate errors:", *sorted(kinds)[:5], sep="\n  ", file=sys.stderr)
    if not latencies:
        return {"errors": errors}
    return {
        "allocations/s": f"{len(latencies) / wall:.0f}",
        "p50": timing.ms(statistics.median(latencies)),
        "p99": timing.ms(timing.percentile(latencies, 99)),
        "requests": len(latencies),
        "errors": errors,
    }


def vanish_latency(daemon: AgentDaemon, root: str, rounds: int) -> list[float]:
    samples = []
    api = daemon.client()
    type_dir = os.path.join(root, "class/mdev_bus/0000:84:00.0/mdev_supported_types/nvidia-35")
    for _ in range(rounds):
        with open(os.path.join(type_dir, "create"), "w") as handle:
            handle.write(FOREIGN)
        deadline = time.monotonic() + 30
        while FOREIGN not in {m["uuid"] for m in api.mdevs()["mdevs"]}:
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon never saw the foreign mdev")
            time.sleep(0.01)
        start = time.perf_counter()
        with open(os.path.join(root, "bus/mdev/devices", FOREIGN, "remove"), "w") as handle:
            handle.write("1")
        while FOREIGN in {m["uuid"] for m in api.mdevs()["mdevs"]}:
            time.sleep(0.005)
        samples.append(time.perf_counter() - start)
    return samples


def static_tree(seconds: float, remove: bool) -> dict[str, object]:
    """Allocations on a static tree (plain files: kernel-speed reads, unlike
    FUSE where every open is a round trip to the simulator process), 8 GPUs.

    Reuse (``remove`` False): 16 existing mdevs per GPU, all adopted first.
    Create (``remove`` True): no mdev at first; every allocate writes the
    ``create`` file and every release the ``remove`` one, through the real
    privsep helper, with every ledger commit.  Plain files have no kernel
    behind them, so nothing appears or goes: this is everything the agent
    does on that path except the kernel's own work (measured on mtty by
    benchmarks/realkernel.py).
    """
    import dataclasses
    import uuid as uuid_mod

    from accel_agent.simulator import MdevSpec, materialise

    spec = build_spec(["nvidia-pf"], gpus=8)
    mdevs = [
        MdevSpec(str(uuid_mod.uuid4()), parent.name, "nvidia-35")
        for parent in spec.parents
        for _ in range(0 if remove else 16)
    ]
    spec = dataclasses.replace(spec, mdevs=mdevs)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp, short_dir() as sock_dir:
        root = materialise(spec, str(Path(tmp) / "sys"))
        config = agent_config(
            Path(tmp) / "agent.conf",
            root,
            str(Path(tmp) / "state"),
            str(sock_dir / "api.sock"),
            CONF,
            extra=QUIET,
        )
        with AgentDaemon(config, str(sock_dir / "api.sock"), Path(tmp)) as daemon:
            daemon.start()
            api = daemon.client()
            for mdev in mdevs:
                api.adopt(mdev.uuid)
            for clients in (1, 8, 64):
                results[f"{clients} client(s)"] = allocate_load(daemon, clients, seconds, remove)
    return results


def report(only: str, quick: bool) -> list[str]:
    from benchmarks.__main__ import section

    lines: list[str] = []
    seconds = 3.0 if quick else 8.0
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp, short_dir() as sock_dir:
        mountpoint = Path(tmp) / "sys"
        mountpoint.mkdir()
        os.environ.setdefault("ACCEL_SIM_RUNDIR", str(Path(tmp) / "run"))
        spec = build_spec(["nvidia-pf"], gpus=8)
        with sim_testing.mounted(spec, mountpoint):
            rescan_interval = 0.5
            config = agent_config(
                Path(tmp) / "agent.conf",
                str(mountpoint),
                str(Path(tmp) / "state"),
                str(sock_dir / "api.sock"),
                CONF,
                rescan_interval=rescan_interval,
                extra=QUIET,
            )
            with AgentDaemon(config, str(sock_dir / "api.sock"), Path(tmp)) as daemon:
                daemon.start()
                idle = rss_mb(daemon.pid)
                if "c" in only:
                    for remove, title in (
                        (False, "(c) allocate via the API, release keeps the mdev (reuse)"),
                        (True, "(c') allocate via the API creating each mdev, release --remove"),
                    ):
                        results = {
                            f"{n} client(s)": allocate_load(daemon, n, seconds, remove)
                            for n in (1, 8, 64)
                        }
                        note = (
                            f"{seconds:.0f} s per level; clients are threads of one process "
                            "over the unix socket; latency is the allocate call only; "
                            "mutations are serialised by the manager's lock. The FUSE "
                            "simulator is in the path of every sysfs access (a round trip to "
                            "a Python process each): the simulator's speed more than the "
                            "agent's; the static-tree rows below leave it out."
                        )
                        lines += section(title, results, [note])
                if "c" in only:
                    lines += section(
                        "(c'') on a static tree (kernel-speed sysfs reads), reuse",
                        static_tree(seconds, remove=False),
                        [
                            "What the agent itself costs: the reuse loop without the FUSE "
                            "simulator in the path (each FUSE open is a round trip to a "
                            "Python process, ~0.4 ms; a sysfs open is microseconds)."
                        ],
                    )
                    lines += section(
                        "(c'') on a static tree, creating each mdev, release --remove",
                        static_tree(seconds, remove=True),
                        [
                            "Every allocate writes `create` and every release `remove` through "
                            "the real privsep helper, with every ledger commit; the files are "
                            "plain, so no kernel acts on them: the agent's whole create path "
                            "but the kernel's own work, which (c''') measures on mtty."
                        ],
                    )
                if "e" in only:
                    lines += section(
                        "(e) daemon memory",
                        {
                            "RSS idle after start": f"{idle:.1f} MB",
                            "RSS now": f"{rss_mb(daemon.pid):.1f} MB",
                            "peak RSS (VmHWM)": f"{rss_mb(daemon.pid, 'VmHWM'):.1f} MB",
                        },
                        ["The privsep helper is a separate process and not counted."],
                    )
                if "f" in only:
                    samples = vanish_latency(daemon, str(mountpoint), 5 if quick else 10)
                    lines += section(
                        "(f) mdev removed behind the agent -> gone from GET /v1/mdevs",
                        {"latency": timing.summary(samples)},
                        [
                            "Each GET /v1/mdevs re-reads the mdev list (accel_agent.sysfs."
                            "rescan), so the first listing after the remove already shows it "
                            "gone; no udev event or periodic rescan is needed (the simulated "
                            "host sends none)."
                        ],
                    )
    return lines
