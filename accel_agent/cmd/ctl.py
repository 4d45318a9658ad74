"""``accelctl``: the operator's view of the host's mediated devices.

This module assembles the parser and runs the command; each group of
subcommands is a module of its own that adds its subparsers and runs them:

=====================  ==========================================================
``ctl_config``         ``check-config``, ``reload``
``ctl_status``         ``health``, ``status``
``ctl_listings``       ``types``, ``mdevs``, ``inventory``
``ctl_devices``        ``allocate``, ``release``, ``attach``, ``detach``, ``domain-xml``
``ctl_reconcile``      ``adopt`` (and ``--from-libvirt``), ``recover``
``ctl_migration``      ``migration claim|commit|abort``
``nova_pci_config``    ``nova-pci-config``
``ledger_upgrade``     ``ledger upgrade``
``ctl_explain``        ``explain``
(here)                 ``simulate`` (the simulator's own parser), ``xml`` (libvirt_xml.cli)
=====================  ==========================================================

The command modules import none of each other: this module is the only one
that knows them all (tests/unit/test_house.py).  What they share is in
``daemon`` (going through the running daemon), ``loading`` (the config and,
acting directly, the manager), ``output`` and ``listings``.

Exit codes (a public contract, docs/design.md §6.2): 0 ok, 1 error (each error on
its own line on stderr, naming the offending value), 2 usage.

The global options (``--config-file``, ``--config-dir``, ``--sysfs-root``,
``--offline``, ``-v``) are taken before the command and after it alike.
Without any configuration (none given, neither the packaged file nor its
directory present) a command that reads it is an error (1, naming the paths
looked at), never an answer from the defaults; ``--sysfs-root`` alone reads a
tree with the defaults, and ``simulate`` and ``xml`` read no configuration.

Imports stay light at module level, here and in the command modules: every
invocation pays for what is imported, so libvirt, lxml, the API client and
Placement code are imported inside the commands that use them.

One writer (docs/design.md §6.2): when the daemon runs, every command that changes
something (allocate, release, adopt, recover) and the listings go through its
API on the unix socket ``[api] socket_path``.  When there is no daemon (no
socket, or nobody listening on it) they act directly, as the daemon would;
the manager's file lock still serialises them.  ``--offline`` forces direct
mode.  A daemon that is there but cannot be reached (permission denied, no
answer) is an error, never a fallback.

The ledger (docs/design.md §5.2): while the daemon runs, accelctl asks it instead
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
from typing import Any

from accel_agent.cmd import common, output
from accel_agent.cmd.output import EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse with our usage exit code (2, argparse's own) and a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)

    def _get_option_tuples(self, option_string: str) -> list:  # type: ignore[override]
        """An abbreviation a command took before the global options were
        added after it (``check-config --s`` for ``--strict``) still means
        what it meant: the global copies match an abbreviation only when none
        of the command's own options does (``types --offl`` still works)."""
        matches = super()._get_option_tuples(option_string)
        own = [m for m in matches if not m[0].dest.endswith(AFTER)]
        return own or matches


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
    _add_global_options(parser)
    common.add_version_argument(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_commands(subparsers)
    for command in _leaf_commands(parser):
        _add_global_options(command, after=True)
    return parser


# --- global options: before the command, or after it -------------------------------

# Written after the command, a global option is stored under its own name with
# this suffix, then merged with the one before (main): argparse gives each
# subcommand a namespace of its own and copies it over the main one, which
# would replace a --config-file list given before the command.
AFTER = "__after"
# Commands that read no configuration: no config file is needed to run them.
CONFIGLESS = frozenset({"simulate", "xml"})


def _add_global_options(parser: argparse.ArgumentParser, after: bool = False) -> None:
    """accelctl's options that apply to every command: on the main parser
    (before the command) and on each command's own (``after`` it), where
    they are stored under their name + AFTER and have no default, so that
    only what was given is recorded."""
    target: Any = parser
    suffix = ""
    extra: dict[str, Any] = {}
    if after:
        target = parser.add_argument_group("global options (also accepted before the command)")
        suffix = AFTER
        extra = {"default": argparse.SUPPRESS}
    common.add_config_arguments(target, dest_suffix=suffix)
    target.add_argument(
        "--sysfs-root",
        dest="sysfs_root" + suffix,
        metavar="DIR",
        help="override [DEFAULT] sysfs_root (a directory shaped like /sys)",
        **extra,
    )
    target.add_argument(
        "--offline",
        dest="offline" + suffix,
        action="store_true",
        help="act directly on sysfs and the ledger even when the daemon runs "
        "(default: go through the daemon's API when it runs)",
        **extra,
    )
    target.add_argument(
        "-v", "--verbose", dest="verbose" + suffix, action="store_true",
        help="log debug messages", **extra,
    )


def _leaf_commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser of every command that runs (``types``, ``migration claim``),
    not the groups above them (``migration``); ``simulate`` hands its words to
    the simulator's own parser and takes no global option after it."""
    leaves = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name == "simulate":
                    continue
                below = _leaf_commands(sub)
                leaves += below or [sub]
    return leaves


def _merge_global_options(args: argparse.Namespace) -> None:
    """The global options given after the command join the ones given before:
    the repeatable ones in the order given, the others as argparse would
    (a switch on if given anywhere, the last value wins)."""
    for name in ("config_file", "config_dir"):
        getattr(args, name).extend(vars(args).pop(name + AFTER, []))
    for name in ("offline", "verbose"):
        if vars(args).pop(name + AFTER, False):
            setattr(args, name, True)
    if "sysfs_root" + AFTER in vars(args):
        args.sysfs_root = vars(args).pop("sysfs_root" + AFTER)


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
        ctl_explain,
        ctl_listings,
        ctl_migration,
        ctl_reconcile,
        ctl_status,
        ledger_upgrade,
        nova_pci_config,
    )
    from accel_agent.libvirt_xml import cli as xml_cli

    ctl_config.add_check_config(subparsers)
    ctl_listings.register(subparsers)
    ctl_devices.register(subparsers)
    ctl_reconcile.register(subparsers)
    ctl_config.add_reload(subparsers)
    ctl_status.register(subparsers)
    ctl_devices.add_domain_xml(subparsers)
    ctl_migration.register(subparsers)
    nova_pci_config.register(subparsers)
    ledger_upgrade.register(subparsers)
    ctl_explain.register(subparsers)
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


def parse(
    argv: Sequence[str], parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """accelctl's command line as the command sees it: the global options
    merged wherever they were given; a usage error exits (2)."""
    argv = list(argv)
    parser = parser or build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "simulate":
        # Everything after the word goes to the simulator's own parser
        # (argparse's REMAINDER would reject a leading option such as --help).
        args.simulate_args = argv[argv.index("simulate") + 1 :]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _merge_global_options(args)
    if args.sysfs_root is not None:
        if not args.sysfs_root:
            parser.error("--sysfs-root needs a directory")
        # Relative to where accelctl runs, as a shell user means it.
        args.sysfs_root = os.path.abspath(args.sysfs_root)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(sys.argv[1:] if argv is None else argv, parser)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command not in CONFIGLESS and not args.sysfs_root:
        # An error (1), not a usage error (2): the command line is right, the
        # host lacks its configuration; the same words work on a configured host.
        missing = common.missing_config(args.config_file, args.config_dir)
        if missing:
            output.error(
                f"{missing}, before or after the command; or --sysfs-root DIR to read a "
                "sysfs tree with the default options"
            )
            return output.EXIT_ERROR
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
