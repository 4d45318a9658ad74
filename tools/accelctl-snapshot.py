#!/usr/bin/env python3
"""Print what accelctl prints, for a before/after diff of a refactoring.

    .venv/bin/python tools/accelctl-snapshot.py > before.txt
    (change accel_agent/cmd/)
    .venv/bin/python tools/accelctl-snapshot.py > after.txt && diff before.txt after.txt

Runs the console script's entry point as a process for: ``--help`` of every
command and action (walked from accelctl's parser, the simulator's and the
xml command's included), the usage errors and bad values of each command,
and the read-only commands on a static simulated host (no daemon): for each,
the exit status, stdout and stderr.  Everything runs in a fixed directory
(``--work``, recreated) with COLUMNS fixed, so two runs of the same code
print the same bytes.  Nothing here is a test: tests/unit/test_accelctl_cli.py
keeps the commands and options; this shows every byte once, by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

ENTRY = "import sys; from accel_agent.cmd.accelctl import main; sys.exit(main())"


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
    tuple[str, ...]
]:
    """Every command path of ``parser`` (``()``, ``("migration",)``,
    ``("migration", "claim")``, ...), depth first in the order of the help."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_paths(sub, (*path, name))


def all_paths() -> list[tuple[str, ...]]:
    from accel_agent.cmd import ctl
    from accel_agent.simulator import cli as simulator_cli

    paths = list(command_paths(ctl.build_parser()))
    # `accelctl simulate ...` is parsed by the simulator's own parser.
    simulator = argparse.ArgumentParser(prog="accelctl simulate")
    simulator_cli.add_commands(simulator)
    paths += [("simulate", *p) for p in command_paths(simulator) if p]
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/accelctl-snapshot", help="scratch directory")
    work = parser.parse_args().work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    from accel_agent.simulator import SimulatedHost, build_spec, materialise

    root = os.path.join(work, "sys")
    materialise(SimulatedHost(build_spec(["nova"])), root)
    config = os.path.join(work, "accel-agent.conf")
    with open(config, "w") as handle:
        handle.write(
            f"[DEFAULT]\nsysfs_root = {root}\nhost = testhost\nstate_dir = {work}/state\n"
            f"[api]\nsocket_path = {work}/api.sock\n"
            "[libvirt]\nuri = test:///default\n"
            "[devices]\nenabled_mdev_types = nvidia-11\n"
            "[mdev_nvidia-11]\ndevice_addresses = 0000:06:00.0\n"
        )
    conf = ["--config-file", config]
    env = dict(os.environ, COLUMNS="100", ACCEL_AGENT_CACHE_DIR=os.path.join(work, "cache"))
    cases: list[list[str]] = [[*p, "--help"] for p in all_paths()]
    cases += [["-h"], ["simulate", "-h"]]
    cases += [
        [],
        ["bogus"],
        ["migration"],
        ["migration", "bogus"],
        ["ledger"],
        ["xml"],
        ["simulate"],
        ["types", "--bogus"],
        ["--sysfs-root=", "types"],
        ["allocate"],
        ["allocate", "vm1"],
        ["allocate", "vm1", "--count", "x"],
        ["adopt"],
        ["adopt", "fe0fe0fe-0000-4000-8000-0000000000aa", "--from-libvirt"],
        ["adopt", "fe0fe0fe-0000-4000-8000-0000000000aa", "--all"],
        ["attach", "vm1", "--vf", "nic_a,vlan"],
        ["attach", "vm1", "--vgpu", "VGPU:x"],
        ["attach", "vm1", "--request", "{"],
        ["nova-pci-config", "--per-gpu", "x"],
        ["nova-pci-config", "--per-gpu", "5000"],
        ["migration", "claim", "vm1"],
        ["--sysfs-root", root, "allocate", "vm1", "--count", "1"],
        [*conf, "attach", "vm1"],
        [*conf, "migration", "claim", "vm1", "--mdev", "nope"],
        [*conf, "migration", "claim", "vm1", "--mdev", "a=b", "--mdev", "a=c"],
        [*conf, "reload"],
        [*conf, "reload", "--json"],
        [*conf, "ledger", "upgrade"],
        [*conf, "ledger", "upgrade", "--json"],
        [*conf, "check-config"],
        [*conf, "check-config", "--strict"],
        [*conf, "domain-xml", "vm1"],
        [*conf, "nova-pci-config"],
        [*conf, "explain"],
        [*conf, "explain", "--json"],
        [*conf, "explain", "0000:99:00.0"],
        [*conf, "explain", "not/an/address"],
        # Acting directly (no daemon): a ledger is created in the work directory.
        [*conf, "release", "vm1"],
        [*conf, "release", "vm1", "--remove", "--json"],
        [*conf, "detach", "vm1"],
        [*conf, "detach", "vm1", "--json"],
        [*conf, "migration", "abort", "vm1"],
        [*conf, "migration", "abort", "vm1", "--remove", "--json"],
        [*conf, "migration", "commit", "vm1"],
        [*conf, "recover"],
        [*conf, "recover", "--check", "--json"],
        [*conf, "adopt", "fe0fe0fe-0000-4000-8000-0000000000aa"],
        [*conf, "adopt", "--from-libvirt", "--dry-run"],
        [*conf, "adopt", "--from-libvirt", "--dry-run", "--json"],
        [*conf, "allocate", "vm1", "--count", "0"],
        ["--config-file", os.path.join(work, "missing.conf"), "types"],
    ]
    for listing in ("types", "mdevs", "inventory"):
        cases += [
            [*conf, listing],
            [*conf, listing, "--json"],
            [*conf, "--offline", listing, "--json"],
            # An abbreviation: the parser path's JSON, not the plain path's.
            [*conf, "--offl", listing, "--json"],
            ["--sysfs-root", root, *conf, listing],
        ]
    for argv in cases:
        proc = subprocess.run(
            [sys.executable, "-c", ENTRY, *argv], capture_output=True, text=True, env=env,
            timeout=120,
        )
        print(f"=== accelctl {' '.join(argv)}\n--- exit {proc.returncode}")
        print(f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
