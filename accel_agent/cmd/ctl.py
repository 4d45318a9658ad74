"""``accelctl``: the operator's view of the host's mediated devices.

Exit codes (a public contract, DESIGN.md §6): 0 ok, 1 error (each error on
its own line on stderr, naming the offending value), 2 usage.

Imports stay light at module level: every invocation pays for what is
imported here, so libvirt, lxml, the API client and Placement code are
imported inside the commands that use them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from accel_agent import exception
from accel_agent.cmd import common, output

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def _with_host_state(
    render: Callable[[argparse.Namespace, common.HostState], int],
) -> Callable[[argparse.Namespace], int]:
    """Load config + scan once, turn agent errors into exit 1."""

    def run(args: argparse.Namespace) -> int:
        conf = _load(args)
        state = common.host_state(conf)
        for warning in state.snapshot.warnings:
            output.warning(f"sysfs: {warning}")
        return render(args, state)

    return run


def _load(args: argparse.Namespace):
    conf = common.load_config(args.config_file, args.config_dir, prog="accelctl")
    if args.sysfs_root:
        conf.set_override("sysfs_root", args.sysfs_root)
    return conf


# --- commands ------------------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    conf = _load(args)
    errors, warnings = common.validate(conf, strict=args.strict)
    for warning in warnings:
        output.warning(warning)
    if errors:
        for error in errors:
            output.error(error)
        return EXIT_ERROR
    state = common.host_state(conf)
    providers = state.inventory().providers
    print(
        f"configuration OK: {len(state.policy.types)} mdev type(s) enabled, "
        f"{len(providers)} provider(s) on {len(state.snapshot.parents)} mdev parent(s)"
    )
    return EXIT_OK


def _render_types(args: argparse.Namespace, state: common.HostState) -> int:
    from accel_agent.reporting import views

    document = views.types_document(state.snapshot, state.policy, state.host)
    if args.json:
        output.emit_json(document)
        return EXIT_OK
    rows = [
        (
            parent["name"],
            t["type_id"],
            t["name"],
            t["device_api"],
            t["available_instances"],
            t["mdevs"],
            "yes" if parent["configured_type"] == t["type_id"] else "",
        )
        for parent in document["parents"]
        for t in parent["types"]
    ]
    output.table(
        ("parent", "type", "name", "api", "available", "mdevs", "configured"), rows
    )
    return EXIT_OK


def _render_mdevs(args: argparse.Namespace, state: common.HostState) -> int:
    from accel_agent.reporting import views

    document = views.mdevs_document(state.snapshot, state.policy, state.host)
    if args.json:
        output.emit_json(document)
        return EXIT_OK
    rows = [
        (
            m["uuid"],
            m["parent"],
            m["mdev_type"],
            m["iommu_group"],
            "yes" if m["owned"] else "no (foreign)",
            m["instance"],
        )
        for m in document["mdevs"]
    ]
    output.table(("uuid", "parent", "type", "iommu group", "owned", "instance"), rows)
    return EXIT_OK


def _render_inventory(args: argparse.Namespace, state: common.HostState) -> int:
    inventory = state.inventory()
    for warning in inventory.warnings:
        output.warning(warning)
    if args.json:
        output.emit_json(inventory.to_dict())
        return EXIT_OK
    rows = [
        (
            p.name,
            p.mdev_type,
            p.resource_class,
            p.total,
            p.used,
            _members(p.parent_devices),
            p.numa_node,
        )
        for p in inventory.providers
    ]
    output.table(("provider", "type", "class", "total", "used", "parents", "numa"), rows)
    return EXIT_OK


def _members(parents: tuple[str, ...]) -> str:
    """Short form for a card's VFs: first..last (count)."""
    if len(parents) <= 2:
        return ",".join(parents)
    return f"{parents[0]}..{parents[-1]} ({len(parents)})"


# --- parser --------------------------------------------------------------------------


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
    )
    parser.add_argument(
        "--config-file",
        action="append",
        default=[],
        metavar="FILE",
        help="oslo.config file (repeatable); default /etc/accel-agent/accel-agent.conf",
    )
    parser.add_argument(
        "--config-dir", action="append", default=[], metavar="DIR", help="config directory"
    )
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help="override [DEFAULT] sysfs_root (a directory shaped like /sys)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    check = subparsers.add_parser(
        "check-config",
        help="validate the config against this host's sysfs and print every problem",
        description="Validate [devices] enabled_mdev_types and [mdev_<type>] sections "
        "against the host. Errors (duplicate or malformed addresses, bad mdev_class) "
        "exit 1; warnings (an address that is no mdev parent, a type a parent does not "
        "offer) are printed and become errors with --strict.",
    )
    check.add_argument("--strict", action="store_true", help="treat warnings as errors")
    check.set_defaults(func=cmd_check_config)

    for name, render, text in (
        ("types", _render_types, "mdev types offered by each parent, with counters"),
        ("mdevs", _render_mdevs, "existing mediated devices, owned and foreign"),
        ("inventory", _render_inventory, "inventory per physical GPU (resource providers)"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.set_defaults(func=_with_host_state(render))

    _register_optional(subparsers)
    return parser


def _register_optional(subparsers: argparse._SubParsersAction) -> None:
    """Subcommands owned by other packages (each module keeps its imports lazy)."""
    from accel_agent.libvirt_xml import cli as xml_cli
    from accel_agent.simulator import cli as simulator_cli

    simulator_cli.register(subparsers)
    xml_cli.register(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except exception.ConfigErrors as exc:
        for error in exc.errors:
            output.error(error.message)
        return EXIT_ERROR
    except exception.AccelAgentException as exc:
        output.error(exc.message)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
