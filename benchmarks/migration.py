"""(l) a real live migration through the agent, timed: the real-kernel lab
"trixie" (tests/realkernel/labs/trixie.sh: Debian's 6.12 kernel with mtty,
trixie's QEMU 10 and libvirt 11, two libvirtds and two agents in one TCG guest).

One VM with one mtty mdev goes back and forth between host A and host B,
``rounds`` times each way, every migration through the agents the way the
real-kernel test drives it (tests/realkernel/migration/migrationlab.py:
claim on the destination's API, ``MigrationSource.migrate`` with the rewritten
XML, commit, release with remove).  Each step is timed on the orchestrator's
clock; downtime and libvirt's own elapsed time come from the destination's
completed job statistics.  Every migration is checked (the domain runs on the
other host, the UART scratch register arrived): a broken one fails the
benchmark instead of being timed.

Host side (``report``) boots the lab with this module as the guest command;
guest side (``python -m benchmarks.migration --guest``) writes JSON into the
lab's results share.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "tests" / "realkernel" / "lab.sh"
RESULT_NAME = "bench-migration.json"
PHASES = ("claim", "migrate", "commit", "release")


def guest_main(output: Path, rounds: int) -> int:
    from tests.realkernel.migration import migrationlab

    results: dict[str, Any] = {"uname": os.uname().release, "migrations": []}
    setup: dict[str, float] = {}
    with migrationlab.two_hosts(setup) as hosts:
        with hosts.libvirt_a.connect() as conn:
            from accel_agent.migration import versions

            results["versions"] = versions.probe(conn).to_dict()
        start = time.monotonic()
        hosts.a.client().allocate("vm1", 1)
        parts = hosts.a.client().domain_xml("vm1")
        domain = hosts.libvirt_a.open().defineXML(
            migrationlab.compose_domain("vm1", "0f0f0f0f-1111-4222-8333-444444444444", parts)
        )
        domain.create()
        migrationlab.write_scratch(domain, 0x5A)
        setup["domain defined, started, UART written"] = time.monotonic() - start
        results["setup"] = setup
        here, there = hosts.a, hosts.b
        try:
            for _ in range(2 * rounds):
                run = migrationlab.migrate_through_agents(domain, here, there, "vm1")
                domain = there.libvirtd.open().lookupByName("vm1")
                assert domain.isActive(), "the domain does not run on the destination"
                assert migrationlab.active_mdevs(domain) == list(run.mapping.values())
                assert migrationlab.read_scratch(domain) == 0x5A, "the device state was lost"
                results["migrations"].append(
                    {
                        "direction": f"{here.name}->{there.name}",
                        **run.timings,
                        "downtime_ms": run.job.get("downtime"),
                        "libvirt_elapsed_ms": run.job.get("time_elapsed"),
                    }
                )
                here, there = there, here
        finally:
            here.libvirtd.destroy_all()
            there.libvirtd.destroy_all()
    output.write_text(json.dumps(results, indent=1))
    return 0


def _spread(values: list[float], unit: str) -> str:
    digits = 0 if unit == "ms" else 2
    median, low, high = statistics.median(values), min(values), max(values)
    return (
        f"median {median:.{digits}f} {unit}, min {low:.{digits}f}, max {high:.{digits}f} "
        f"({len(values)} migrations)"
    )


def report(quick: bool) -> list[str]:
    """Host side: boot the lab with the guest benchmark, format its JSON."""
    from benchmarks.__main__ import section

    rounds = 1 if quick else 3
    results_dir = (
        Path(os.environ.get("ACCEL_REALKERNEL_RESULTS", REPO / "tests/realkernel/results"))
        / "trixie"
    )
    title = "(l) live migration through the agent on a real kernel (lab trixie, QEMU/TCG guest)"
    with tempfile.TemporaryDirectory(prefix="accel-lab-") as tmp:
        reason_path = Path(tmp) / "reason"
        env = dict(os.environ, LAB_REASON_FILE=str(reason_path))
        argv = [
            str(LAB),
            "--lab",
            "trixie",
            "--",
            "python",
            "-m",
            "benchmarks.migration",
            "--guest",
            "--rounds",
            str(rounds),
            "--output",
            str(results_dir / RESULT_NAME),
        ]
        started = time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        reason = reason_path.read_text().strip() if reason_path.exists() else ""
    if proc.returncode == 75:
        return section(title, {"result": f"skipped: {reason or 'the lab cannot run here'}"}, [])
    result_file = results_dir / RESULT_NAME
    if proc.returncode != 0 or not result_file.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return section(title, {"result": "failed: " + " / ".join(tail)}, [])
    data = json.loads(result_file.read_text())
    migrations = data["migrations"]
    rows: dict[str, object] = {}
    for phase in PHASES:
        rows[phase] = _spread([m[phase] for m in migrations], "s")
    downtimes = [m["downtime_ms"] for m in migrations if m["downtime_ms"] is not None]
    if downtimes:
        rows["downtime (libvirt, destination's job)"] = _spread(downtimes, "ms")
    rows["libvirt's own migration time"] = _spread(
        [m["libvirt_elapsed_ms"] for m in migrations], "ms"
    )
    for name, seconds in data["setup"].items():
        rows[f"setup: {name}"] = f"{seconds:.1f} s"
    rows["whole run (boot, setup, migrations)"] = f"{wall:.0f} s"
    versions = data["versions"]
    notes = [
        f"Guest kernel {data['uname']}, libvirt {versions['libvirt']}, QEMU {versions['qemu']}; "
        "2 vCPUs under TCG (no usable KVM here), and the VM inside is TCG too (64 MiB, "
        "SeaBIOS, one mtty-1 mdev). Steps on the orchestrator's clock: claim = the source's "
        "prepare + the destination's claim through its API; migrate = MigrationSource.migrate "
        "until libvirt reported success and the source stopped (migrateToURI3, peer to peer, "
        "data over 127.0.0.1); commit = the destination's commit; release = the source's "
        "release with remove through its API. The migrations alternate A->B and B->A; each "
        "was checked (domain on the other host, UART scratch register arrived).",
        "Command: `python -m benchmarks --only l` (part of `make bench`).",
    ]
    return section(title, rows, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migration")
    parser.add_argument("--guest", action="store_true", help="run the guest side (in the lab)")
    parser.add_argument("--rounds", type=int, default=3, help="round trips A->B->A")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.guest:
        return guest_main(args.output, args.rounds)
    print("\n".join(report(quick=args.rounds < 3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
