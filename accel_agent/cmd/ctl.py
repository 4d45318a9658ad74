"""``accelctl``: the operator's view of the host's mediated devices.

This module assembles the parser and runs the command; each group of
subcommands is a module of its own that adds its subparsers and runs them:

=====================  ==========================================================
``ctl_config``         ``check-config``, ``reload``
``ctl_listings``       ``types``, ``mdevs``, ``inventory``
``ctl_devices``        ``allocate``, ``release``, ``attach``, ``detach``, ``domain-xml``
``ctl_reconcile``      ``adopt`` (and ``--from-libvirt``), ``recover``
``ctl_migration``      ``migration claim|commit|abort``
``nova_pci_config``    ``nova-pci-config``
``ledger_upgrade``     ``ledger upgrade``
(here)                 ``simulate`` (the simulator's own parser), ``xml`` (libvirt_xml.cli)
=====================  ==========================================================

The command modules import none of each other: this module is the only one
that knows them all (tests/unit/test_house.py).  What they share is in
``daemon`` (going through the running daemon), ``loading`` (the config and,
acting directly, the manager), ``output`` and ``listings``.

Exit codes (a public contract, DESIGN.md §6): 0 ok, 1 error (each error on
its own line on stderr, naming the offending value), 2 usage.

Imports stay light at module level, here and in the command modules: every
invocation pays for what is imported, so libvirt, lxml, the API client and
Placement code are imported inside the commands that use them.

One writer (DESIGN.md §6): when the daemon runs, every command that changes
something (allocate, release, adopt, recover) and the listings go through its
API on the unix socket ``[api] socket_path``.  When there is no daemon (no
socket, or nobody listening on it) they act directly, as the daemon would;
the manager's file lock still serialises them.  ``--offline`` forces direct
mode.  A daemon that is there but cannot be reached (permission denied, no
answer) is an error, never a fallback.

The ledger (DESIGN.md §5): while the daemon runs, accelctl asks it instead
of opening the ledger, unless ``--offline``.  Acting directly, the listings,
``check-config`` and ``nova-pci-config`` open it read-only (never created,
migrated or checkpointed); the commands that change something open it for
writing but never migrate it: a ledger of an older schema is refused, naming
``accelctl ledger upgrade`` (the daemon upgrades it at its start too), which
keeps a backup copy first.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Sequence

from accel_agent.cmd import common, output
from accel_agent.cmd.output import EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse with our usage exit code (2, argparse's own) and a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="accelctl",
        description="Inspect and manage the mediated devices (vGPUs) of this host. "
        "Read-only commands work offline from sysfs; exit 0 ok, 1 error, 2 usage.",
        epilog="The listings (types, mdevs, inventory) reuse what oslo.config resolved "
        "while the config files, config directories, OS_* variables and host name are "
        "unchanged, in /var/cache/accel-agent (root) or $XDG_CACHE_HOME/accel-agent; "
        "ACCEL_AGENT_CACHE_DIR moves that cache and an empty value turns it off.",
    )
    common.add_config_arguments(parser)
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help="override [DEFAULT] sysfs_root (a directory shaped like /sys)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="act directly on sysfs and the ledger even when the daemon runs "
        "(default: go through the daemon's API when it runs)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_commands(subparsers)
    return parser


def _add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Every subcommand, in the order ``accelctl --help`` lists them (and
    argparse's "choose from" names them): that order is part of the help,
    kept as it was before the commands had modules of their own, so a group
    whose commands are not side by side there adds them in two calls."""
    # Here, not at the top: `python -m accel_agent.cmd.ctl` tries the plain
    # listing path first (console_main), which needs none of them.
    from accel_agent.cmd import (
        ctl_config,
        ctl_devices,
        ctl_listings,
        ctl_migration,
        ctl_reconcile,
        ledger_upgrade,
        nova_pci_config,
    )
    from accel_agent.libvirt_xml import cli as xml_cli

    ctl_config.add_check_config(subparsers)
    ctl_listings.register(subparsers)
    ctl_devices.register(subparsers)
    ctl_reconcile.register(subparsers)
    ctl_config.add_reload(subparsers)
    ctl_devices.add_domain_xml(subparsers)
    ctl_migration.register(subparsers)
    nova_pci_config.register(subparsers)
    ledger_upgrade.register(subparsers)
    _add_simulate(subparsers)
    xml_cli.register(subparsers)


# --- simulate: the simulator's own parser --------------------------------------------

SIMULATE_HELP = (
    "Give any machine a simulated GPU host: a kernel-faithful sysfs (mdev types, SR-IOV VFs "
    "from sriov_numvfs, PCI driver binding, NVIDIA vGPU 17+ VFs typed through "
    "nvidia/current_vgpu_type), mounted with FUSE (writes act like the kernel's) or written "
    "as a static tree. Profiles: 'accelctl simulate profiles'. "
    "Run 'accelctl simulate --help' for its commands."
)


def _add_simulate(subparsers: argparse._SubParsersAction) -> None:
    simulate = subparsers.add_parser(
        "simulate",
        help="run a simulated mdev host (FUSE sysfs) for demos and tests",
        description=SIMULATE_HELP,
        add_help=False,
    )
    simulate.add_argument("simulate_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    simulate.set_defaults(func=_simulate)


def simulate_parser() -> argparse.ArgumentParser:
    """What parses ``accelctl simulate ...``, built only when asked for (the
    simulator's imports cost every other command ~20 ms)."""
    try:
        from accel_agent.simulator import cli as simulator_cli
    except ModuleNotFoundError as exc:
        # The Debian package ships the simulator apart (accel-agent-simulator):
        # a production host has no use for it.
        if exc.name != "accel_agent.simulator":
            raise
        from accel_agent import exception

        raise exception.AccelAgentException(
            "the simulator is not installed: install the accel-agent-simulator package "
            "(a host with real GPUs does not need it)"
        ) from None

    parser = _Parser(prog="accelctl simulate", description=SIMULATE_HELP)
    simulator_cli.add_commands(parser)
    return parser


def _simulate(args: argparse.Namespace) -> int:
    parser = simulate_parser()
    sub_args = parser.parse_args(args.simulate_args)
    if not getattr(sub_args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(sub_args.func(sub_args))


# --- running a command -----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "simulate":
        # Everything after the word goes to the simulator's own parser
        # (argparse's REMAINDER would reject a leading option such as --help).
        args.simulate_args = argv[argv.index("simulate") + 1 :]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.sysfs_root is not None:
        if not args.sysfs_root:
            parser.error("--sysfs-root needs a directory")
        # Relative to where accelctl runs, as a shell user means it.
        args.sysfs_root = os.path.abspath(args.sysfs_root)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return output.exit_status(lambda: int(args.func(args)))


def run(argv: Sequence[str] | None = None) -> int:
    """main(), then skip the interpreter's final collection over every
    object still alive (8 ms of a 256-GPU listing); reference counting has
    already freed what the command built."""
    status = main(argv)
    gc.freeze()
    return status


def console_main() -> int:
    """``python -m accel_agent.cmd.ctl``: as the ``accelctl`` console script
    (accel_agent.cmd.accelctl), a plain listing from the daemon first."""
    from accel_agent.cmd import plain_listing

    status = plain_listing.answer(sys.argv[1:])
    return run() if status is None else status


if __name__ == "__main__":
    sys.exit(console_main())
