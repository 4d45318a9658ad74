"""(c) on a real kernel: allocate/release through the daemon's API against
Debian's kernel with the mtty sample driver, in the real-kernel lab's QEMU
guest (tests/realkernel/lab.sh), so that every create and remove is the
kernel's own sysfs write instead of a round trip to the FUSE simulator.

The guest runs under TCG (no usable KVM here): every instruction is
emulated, so absolute times are slower than the same kernel on hardware.
The same pure-Python workload is timed on the host and in the guest to say
by how much; the report gives the guest's numbers as measured, and that
factor next to them.

The host side (``report``) boots the lab with this module as the guest
command; the guest side (``python -m benchmarks.realkernel --guest``) runs the
daemon, its privsep helper and the load, and writes JSON into the lab's
results share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "tests" / "realkernel" / "lab.sh"
RESULT_NAME = "bench-realkernel.json"
TYPE = "mtty-1"  # 1 port of mtty's pool of 24: room for 8 clients and reuse


def calibration() -> float:
    """Seconds for a fixed pure-Python workload (median of 5): the ratio
    guest/host is what emulation costs this code."""
    from accel_agent.libvirt_xml import rewrite_mdev_uuids
    from benchmarks import xml as xml_bench

    sources = [f"00000000-0000-4000-8000-{i:012d}" for i in range(16)]
    mapping = {s: s.replace("4000", "4111") for s in sources}
    document = xml_bench.domain(sources)

    def work() -> None:
        for _ in range(200):
            rewrite_mdev_uuids(document, mapping)

    samples = []
    for _ in range(5):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _phases(seconds: float) -> dict[str, object]:
    """Where one allocate on the create path spends its time, from the
    manager's own step hooks (in process, the real privsep helper)."""
    from accel_agent import privileged, wiring
    from accel_agent.config.load import load_config

    marks: list[tuple[str, float]] = []
    conf = load_config([os.environ["ACCEL_BENCH_CONF"]], [], prog="bench")
    privileged.start_privsep([os.environ["ACCEL_BENCH_CONF"]], [])
    manager = wiring.build_manager(
        conf, on_step=lambda step: marks.append((step, time.perf_counter()))
    )
    split: dict[str, list[float]] = {
        "scan + plan + intent commit": [],
        "privsep create": [],
        "settle commit": [],
        "release --remove": [],
    }
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        marks.clear()
        start = time.perf_counter()
        manager.allocate("phases", 1, device_type=TYPE)
        steps = dict(marks)
        split["scan + plan + intent commit"].append(steps["allocate.intent"] - start)
        split["privsep create"].append(steps["allocate.created"] - steps["allocate.intent"])
        split["settle commit"].append(steps["allocate.assigned"] - steps["allocate.created"])
        start = time.perf_counter()
        manager.release("phases", remove=True)
        split["release --remove"].append(time.perf_counter() - start)
    return {name: f"p50 {statistics.median(v) * 1000:.1f} ms" for name, v in split.items()}


def guest_main(output: Path, seconds: float) -> int:
    """In the guest: the daemon on /sys (mtty), the load, the phases."""
    from benchmarks import daemon as daemon_bench
    from tests.functional.daemon_fixture import AgentDaemon, agent_config

    results: dict[str, object] = {"calibration_s": calibration(), "uname": os.uname().release}
    body = f"[devices]\nenabled_mdev_types = {TYPE}\n[mdev_{TYPE}]\ndevice_addresses = mtty\n"
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        work = Path(tmp)
        socket_path = str(work / "api.sock")
        config = agent_config(
            work / "agent.conf",
            "/sys",
            str(work / "state"),
            socket_path,
            body,
            # The load, not DEBUG lines, is what is measured; no udevd here.
            extra="[DEFAULT]\ndebug = false\nudev_events = false\n",
        )
        os.environ["ACCEL_BENCH_CONF"] = str(config)
        with AgentDaemon(config, socket_path, work) as agent:
            agent.start()
            results["create"] = {
                f"{n} client(s)": daemon_bench.allocate_load(agent, n, seconds, True)
                for n in (1, 8)
            }
            # In this process beside the idle daemon (the manager's file lock
            # serialises the two), while no free mdev invites a reuse.
            results["phases"] = _phases(seconds / 2)
            results["reuse"] = {
                f"{n} client(s)": daemon_bench.allocate_load(agent, n, seconds, False)
                for n in (1, 8)
            }
            results["rss_mb"] = daemon_bench.rss_mb(agent.pid, "VmHWM")
    output.write_text(json.dumps(results))
    return 0


def report(quick: bool) -> list[str]:
    """Host side: boot the lab with the guest benchmark, format its JSON."""
    from benchmarks.__main__ import section

    seconds = 3.0 if quick else 8.0
    host_calibration = calibration()
    # lab.sh's default lab ("host") writes into host/ under the results base.
    results_dir = (
        Path(os.environ.get("ACCEL_REALKERNEL_RESULTS", REPO / "tests/realkernel/results"))
        / "host"
    )
    env = dict(
        os.environ, ACCEL_REALKERNEL_TIMEOUT=os.environ.get("ACCEL_REALKERNEL_TIMEOUT", "900")
    )
    with tempfile.TemporaryDirectory(prefix="accel-lab-") as tmp:
        reason_path = Path(tmp) / "reason"
        env["LAB_REASON_FILE"] = str(reason_path)
        argv = [
            str(LAB),
            "--",
            "python",
            "-m",
            "benchmarks.realkernel",
            "--guest",
            "--seconds",
            str(seconds),
            "--output",
            str(results_dir / RESULT_NAME),
        ]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        reason = reason_path.read_text().strip() if reason_path.exists() else ""
    title = "(c''') allocate via the API on a real kernel (mtty in the QEMU/TCG lab guest)"
    if proc.returncode == 75:
        return section(title, {"result": f"skipped: {reason or 'the lab cannot run here'}"}, [])
    result_file = results_dir / RESULT_NAME
    if proc.returncode != 0 or not result_file.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return section(title, {"result": "failed: " + " / ".join(tail)}, [])
    data = json.loads(result_file.read_text())
    slowdown = data["calibration_s"] / host_calibration
    rows: dict[str, object] = {}
    for key, label in (("create", "create on allocate, release --remove"), ("reuse", "reuse")):
        for clients, value in data[key].items():
            rows[f"{label}, {clients}"] = value
    for phase, value in data["phases"].items():
        rows[f"one create-path allocate, {phase}"] = value
    rows["daemon peak RSS in the guest"] = f"{data['rss_mb']:.1f} MB"
    notes = [
        f"Guest kernel {data['uname']}, 2 vCPUs under TCG (no usable KVM here): the same "
        f"pure-Python workload runs {slowdown:.1f}x slower in the guest than on this host. "
        "Every create and remove is the kernel's own sysfs write (mtty, type "
        f"{TYPE}); {seconds:.0f} s per level; phases come from the manager's step hooks in "
        "process. The guest's state directory is a tmpfs, so the ledger's fsyncs cost "
        "nothing here: they are in the static-tree rows, which run on this host's disk.",
        "Command: `python -m benchmarks --only k` (part of `make bench`).",
    ]
    return section(title, rows, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.realkernel")
    parser.add_argument("--guest", action="store_true", help="run the guest side (in the lab)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.guest:
        return guest_main(args.output, args.seconds)
    print("\n".join(report(quick=args.seconds < 8)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
