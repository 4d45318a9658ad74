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

    document = views.mdevs_document(
        state.snapshot, state.policy, state.host, state.ledger.owners, state.ledger.owned
    )
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


def _load_for_writes(args: argparse.Namespace):
    """Mutating commands: the privileged helper reads sysfs_root from the
    config files, so a command-line override would write somewhere else."""
    if args.sysfs_root:
        raise exception.InvalidConfig(
            reason="--sysfs-root applies to read-only commands; set [DEFAULT] sysfs_root "
            "in the config file for commands that create or remove mdevs"
        )
    return _load(args)


def _print_allocation(args: argparse.Namespace, allocation) -> None:
    if args.json:
        output.emit_json(allocation.to_dict())
        return
    output.table(
        ("uuid", "parent", "type"),
        [(m.uuid, m.parent, m.mdev_type) for m in allocation.mdevs],
    )


def cmd_allocate(args: argparse.Namespace) -> int:
    manager = common.build_manager(_load_for_writes(args))
    allocation = manager.allocate(args.instance, args.count, args.parent, args.type)
    _print_allocation(args, allocation)
    return EXIT_OK


def cmd_release(args: argparse.Namespace) -> int:
    manager = common.build_manager(_load_for_writes(args))
    released = manager.release(args.instance, remove=args.remove)
    if args.json:
        output.emit_json({"instance": args.instance, "released": released, "removed": args.remove})
    elif released:
        verb = "released and removed" if args.remove else "released"
        print(f"{verb} {len(released)} mdev(s) of {args.instance}: {', '.join(released)}")
    else:
        print(f"instance {args.instance} holds no mdev; nothing to do")
    return EXIT_OK


def cmd_adopt(args: argparse.Namespace) -> int:
    manager = common.build_manager(_load_for_writes(args))
    record = manager.adopt(args.uuid)
    print(f"adopted {record.uuid} ({record.mdev_type} on {record.parent})")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    manager = common.build_manager(_load_for_writes(args))
    report = manager.recover()
    if args.json:
        output.emit_json(report.to_dict())
        return EXIT_OK
    for key, uuids in report.to_dict().items():
        if uuids:
            print(f"{key.replace('_', ' ')}: {', '.join(uuids)}")
    print("recovery done: sysfs and the ledger agree")
    return EXIT_OK


def cmd_domain_xml(args: argparse.Namespace) -> int:
    from accel_agent.libvirt_xml import domain_hostdevs_xml

    manager = common.build_manager(_load(args))
    allocation = manager.allocation(args.instance)
    if not allocation.mdevs:
        raise exception.MdevNotFound(uuid=f"(any, for instance {args.instance})")
    print(domain_hostdevs_xml(allocation.uuids))
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

    allocate = subparsers.add_parser(
        "allocate",
        help="give an instance N mdevs (reuse free ones, else create), all or nothing",
        description="Allocate COUNT mdevs of the configured type to INSTANCE. Free mdevs the "
        "agent owns are reused first; new ones are created on the least used GPU that can "
        "hold them all, else spread over GPUs. Nothing is left behind on failure. Asking "
        "again for the same allocation returns it.",
    )
    allocate.add_argument("instance", metavar="INSTANCE", help="instance id (e.g. its UUID)")
    allocate.add_argument("--count", type=int, required=True, metavar="N")
    allocate.add_argument("--parent", metavar="ADDR", help="only this parent or physical GPU")
    allocate.add_argument("--type", metavar="TYPE", help="only this mdev type")
    allocate.add_argument("--json", action="store_true")
    allocate.set_defaults(func=cmd_allocate)

    release = subparsers.add_parser(
        "release",
        help="free an instance's mdevs (kept for reuse), or remove them",
        description="Release the mdevs of INSTANCE. They stay, free for reuse, unless "
        "--remove is given; an mdev a libvirt domain still references is never removed. "
        "Releasing an instance that holds nothing succeeds.",
    )
    release.add_argument("instance", metavar="INSTANCE")
    release.add_argument("--remove", action="store_true", help="also remove the mdevs")
    release.add_argument("--json", action="store_true")
    release.set_defaults(func=cmd_release)

    adopt = subparsers.add_parser(
        "adopt",
        help="take ownership of a foreign mdev",
        description="Record an existing mdev the agent did not create as owned, so it can "
        "be allocated and removed. Foreign mdevs are otherwise never touched.",
    )
    adopt.add_argument("uuid", metavar="UUID")
    adopt.set_defaults(func=cmd_adopt)

    recover = subparsers.add_parser(
        "recover",
        help="make sysfs match the ledger (after a crash or a host reboot)",
        description="Finish or undo operations a crash interrupted and re-create every "
        "recorded mdev missing from sysfs with the same UUID, parent and type. Refuses, "
        "changing nothing, when an assigned mdev's type is no longer configured for its "
        "parent.",
    )
    recover.add_argument("--json", action="store_true")
    recover.set_defaults(func=cmd_recover)

    domain_xml = subparsers.add_parser(
        "domain-xml",
        help="libvirt <hostdev> XML of an instance's mdevs",
        description="Print the <hostdev type='mdev'> elements for INSTANCE's mdevs.",
    )
    domain_xml.add_argument("instance", metavar="INSTANCE")
    domain_xml.set_defaults(func=cmd_domain_xml)

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
