"""``python -m benchmarks [--quick] [--only a,b,...] [--output BENCHMARKS.md]``

Runs the benchmarks of docs/design.md §9 and writes a Markdown report with the
machine, the date and the command.  (a) cold CLI vs mdevctl, (b) in-process
rescan, (c) allocate/release through the API, (d) XML rewrite, (e) daemon
RSS, (f) time from an mdev removed behind the agent to inventory updated,
(k) (c) on a real kernel in the lab guest, (l) a real live migration through
the agent (lab trixie: timings of claim, migrate, commit, release; downtime),
(m) a large host (2,000 parents x 4 types, static tree and FUSE simulator):
time to READY, listings, an allocate during rescans, SIGTERM mid-scan,
(n) (a) on each host shape of benchmarks/hosttrees.py (bridges, descriptions,
NUMA nodes, existing mdevs, enabled types, no bus/mdev, vendor-VFIO VFs),
(h) a fleet of agents against one Placement (benchmarks/fleet.py, only when
asked: ``make bench-fleet`` writes its block, which ``make bench`` keeps).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from collections.abc import Callable

from benchmarks import breakdown, cold, hostlisting, hosttrees, rescan, timing, trees, vfio, xml

TARGETS = {
    "a": "accelctl types --json through the daemon <= 0.3x mdevctl types' wall time; offline "
    "<= 1.0x its wall time and <= 1.5x its CPU time, in the same run",
    "b": "steady-state rescan <= 15 ms, >= 10x faster than mdevctl types",
    "c": "p99 allocate <= 50 ms at 8 clients",
    "d": "XML rewrite of 16 mdevs <= 1 ms",
    "e": "daemon RSS <= 80 MB",
    "f": "inventory updated <= 1 s after an mdev vanishes",
    "m": "2,000 parents x 4 types (static tree and FUSE simulator): READY <= 30 s, listings "
    "through the daemon <= 2 s, an allocate answered while a rescan runs, SIGTERM mid-scan "
    "ends the daemon cleanly within [api] shutdown_timeout",
    "n": "(a)'s targets on every host shape of benchmarks/hosttrees.py, not on the best one",
    "r": "start to READY with a standing layout of 4 GPUs x 16 VFs, and after a reboot "
    "(measured, no target)",
    "x": "start to READY with a mixed-size layout of 4 GPUs x 3 sizes, and after a reboot "
    "(measured, no target)",
    "y": "start to READY with a MIG-backed layout of 4 H200 GPUs x 4 GPU instances, and "
    "after a reboot (measured, no target)",
    "h": "a fleet against one Placement (make bench-fleet, not in the default run): 0 writes "
    "per agent per hour with nothing changing; the first minute after an outage under N/10 "
    "requests per second",
}


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(
                line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return (
        f"{os.cpu_count()} cores ({model}), kernel {platform.release()}, "
        f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the "
        "start (the machine is shared: wall times grow with it, ratios of interleaved "
        "runs much less)"
    )


def fmt(value: object) -> str:
    if isinstance(value, dict) and "median" in value:
        cpu = f", CPU median {timing.ms(value['cpu_median'])}" if "cpu_median" in value else ""
        return (
            f"median {timing.ms(value['median'])}, p90 {timing.ms(value['p90'])}, "
            f"min {timing.ms(value['min'])}{cpu} ({value['runs']} runs)"
        )
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def section(title: str, results: dict[str, object], notes: list[str]) -> list[str]:
    lines = [f"### {title}", "", "| what | result |", "| --- | --- |"]
    lines += [f"| {name} | {fmt(value)} |" for name, value in results.items()]
    return [*lines, "", *notes, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument(
        "--only",
        default="abcdefgklmnprxy",
        help="letters of the benchmarks to run (g: types/inventory on 8 NVIDIA vGPU 17+ "
        "GPUs x 48 VFs; k: (c) on a real kernel in the lab guest; "
        "l: a real live migration through the agent in the lab trixie guest; "
        "m: a large host, 2,000 parents x 4 types; "
        "n: (a) on each host shape of benchmarks/hosttrees.py; "
        "p: where a listing's time goes; r: start to READY with a 4 x 16 standing layout; "
        "x: start to READY with a mixed-size layout of 4 GPUs x 3 sizes; "
        "y: start to READY with a MIG-backed layout of 4 H200 GPUs; "
        "h: a fleet of agents against one Placement, ~80 min, 10 with --quick: make bench-fleet)",
    )
    parser.add_argument(
        "--trees",
        help="(n) only: the host shapes to measure, comma-separated (default: all of "
        "benchmarks/hosttrees.py's VARIANTS)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer runs, 256-parent tree only")
    parser.add_argument("--output", help="write the Markdown report here")
    args = parser.parse_args(argv)
    try:
        shapes = list(hosttrees.variants(args.trees))
    except ValueError as exc:
        parser.error(str(exc))
    runs = 5 if args.quick else 15
    sizes = [(256, 24)] if args.quick else [(256, 24), (1024, 24)]
    out: list[str] = []
    started_on = machine()

    def run(letter: str, title: str, body: Callable[[], list[str]]) -> None:
        if letter in args.only:
            print(f"running ({letter}) {title} ...", file=sys.stderr, flush=True)
            out.extend(body())

    def cold_body() -> list[str]:
        lines = []
        for parents, types in sizes:
            results = cold.measure(parents, types, runs)
            notes = cold.ratios(results)
            notes.append(
                "Times are the median of whole processes, interleaved run by run; CPU is user "
                "+ system time of the process and of a forked scan worker. Offline, accelctl "
                "forks one scan worker per idle core (none when the machine is busy: "
                "/proc/loadavg's runnable count); the one-core row is the single-process cost. "
                f"Machine load average at the end: {os.getloadavg()[0]:.2f}."
            )
            lines += section(f"(a) cold listing, {parents} parents x {types} types", results, notes)
        return lines

    def rescan_body() -> list[str]:
        lines = []
        for parents, types in sizes:
            lines += section(
                f"(b) in-process rescan, {parents} x {types}",
                rescan.measure(parents, types, runs * 4),
                [],
            )
        return lines

    run("a", "cold listing", cold_body)
    run("b", "rescan", rescan_body)
    run(
        "p",
        "where a listing's time goes",
        lambda: [
            f"### (p) where the time goes, accelctl types --json, {sizes[0][0]} x {sizes[0][1]}",
            "",
            *breakdown.report(trees.tree(*sizes[0]), runs),
            "",
        ],
    )
    run("d", "XML rewrite", lambda: section("(d) XML rewrite", xml.measure(2000), []))
    run(
        "g",
        "vendor-VFIO listing",
        lambda: section(
            f"(g) types and inventory, {vfio.GPUS} NVIDIA vGPU 17+ GPUs x {vfio.VFS} VFs "
            "(static tree)",
            vfio.measure(5 if args.quick else 15),
            [
                "Each VF is a parent with the GPU's vGPU types (creatable_vgpu_types read "
                "per VF); the inventory is one provider per GPU. Machine load average at the "
                f"end: {os.getloadavg()[0]:.2f}."
            ],
        ),
    )
    run(
        "n",
        "listing across host shapes",
        # 9 rounds, not 15: 12 trees of 256 x 24 in <= 10 minutes on 2 cores.
        lambda: hostlisting.report(
            5 if args.quick else 9,
            shapes,
            progress=lambda text: print(text, file=sys.stderr, flush=True),
        ),
    )
    if any(letter in args.only for letter in "cef"):
        try:
            from benchmarks import daemon
        except ImportError as exc:
            out.extend([f"### (c), (e), (f) skipped: {exc}", ""])
        else:
            out.extend(daemon.report(args.only, args.quick))
    if "k" in args.only:
        from benchmarks import realkernel

        print("running (k) allocate on a real kernel (lab guest) ...", file=sys.stderr, flush=True)
        out.extend(realkernel.report(args.quick))
    if "l" in args.only:
        from benchmarks import migration

        print("running (l) live migration through the agent (lab trixie) ...", file=sys.stderr,
              flush=True)
        out.extend(migration.report(args.quick))
    if "r" in args.only:
        from benchmarks import standing

        print("running (r) start to READY with a standing layout ...", file=sys.stderr,
              flush=True)
        out.extend(standing.report(args.quick))
    for letter, kind in (("x", "mixed-size"), ("y", "MIG-backed")):
        if letter in args.only:
            from benchmarks import mixed_layout

            print(f"running ({letter}) start to READY with a {kind} layout ...",
                  file=sys.stderr, flush=True)
            out.extend(mixed_layout.report(args.quick, letter))
    if "h" in args.only:
        from benchmarks import fleet

        print("running (h) a fleet against one Placement ...", file=sys.stderr, flush=True)
        out.extend(fleet.report(10 if args.quick else 50, args.quick,
                                "python -m benchmarks --only h" + " --quick" * args.quick)[1:-1])
    if "m" in args.only:
        from benchmarks import largehost

        print("running (m) large host ...", file=sys.stderr, flush=True)
        out.extend(largehost.report(args.quick))

    command = "python -m benchmarks " + shlex.join(argv if argv is not None else sys.argv[1:])
    header = [
        "# Benchmarks",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {started_on}",
        f"- command: `{command.strip()}` (what `make bench` runs)",
        "",
        "Targets (docs/design.md §9):",
        "",
        *[f"- ({k}) {v}" for k, v in TARGETS.items()],
        "",
    ]
    report = "\n".join(header + out)
    if args.output:
        # The soak's figures take an hour to make (make soak): keep them.
        from benchmarks import soak

        kept = soak.blocks(args.output)
        if "h" not in args.only:
            # make bench-fleet's figures take over an hour to make: keep them too.
            from benchmarks import fleet

            fleet_block = soak.block(args.output, fleet.BEGIN, fleet.END)
            if fleet_block:
                kept += [""] * bool(kept) + fleet_block
        if kept:
            report = report.rstrip("\n") + "\n\n" + "\n".join(kept) + "\n"
        with open(args.output, "w") as handle:
            handle.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
