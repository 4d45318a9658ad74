"""``accelctl``: the operator's view of the host's mediated devices.

Exit codes (a public contract, DESIGN.md §6): 0 ok, 1 error (each error on
its own line on stderr, naming the offending value), 2 usage.

Imports stay light at module level: every invocation pays for what is
imported here, so libvirt, lxml, the API client and Placement code are
imported inside the commands that use them.

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
keeps a backup copy first.  ``check-config`` reads no ledger while the daemon
runs: nothing it reports depends on the ledger's rows (it would only catch a
damaged file, which the daemon checks itself at its start and reports in
``/v1/health``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from accel_agent import exception, wiring
from accel_agent.cmd import common, daemon, listings, output
from accel_agent.cmd.daemon import OFFLINE as _OFFLINE
from accel_agent.cmd.daemon import via_api as _via_api

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

LOG = logging.getLogger("accelctl")


@contextlib.contextmanager
def offline_manager(conf) -> Iterator[Any]:
    """The manager for a command acting directly (no daemon, or --offline):
    its ledger is never migrated here (LedgerSchemaOld names the command that
    upgrades it), and is closed when the command is done."""
    manager = wiring.build_manager(conf, upgrade_ledger=False)
    try:
        yield manager
    finally:
        manager.ledger.close()


def _listing(
    name: str,
    table: Callable[[dict[str, Any]], tuple[Sequence[str], list[tuple[Any, ...]]]],
) -> Callable[[argparse.Namespace], int]:
    """A read-only listing: from the daemon (GET ``path``) when it runs, else
    from sysfs + ledger; printed as JSON or as the rows of ``table``."""

    def run(args: argparse.Namespace) -> int:
        listing, errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
        # JSON into a pipe is printed as the daemon sent it (the same compact
        # encoding as ours): no decoding and re-encoding of megabytes.
        as_sent = args.json and not sys.stdout.isatty()
        if args.sysfs_root:
            listing = dataclasses.replace(listing, sysfs_root=args.sysfs_root)
            document = _OFFLINE
        else:
            path = f"/v1/{name}"
            document = _via_api(
                args,
                listing.api_socket_path,
                lambda api: api.call_json_bytes("GET", path) if as_sent else api.call("GET", path),
            )
        if isinstance(document, bytes):
            output.emit_json_bytes(document)
            return EXIT_OK
        with listings.collector_paused():
            if document is _OFFLINE:
                document = listings.offline_document(name, listing, errors)
            if args.json:
                output.emit_json(document)
            else:
                output.table(*table(document))
            return EXIT_OK

    return run


def _load(args: argparse.Namespace):
    conf = wiring.load_config(args.config_file, args.config_dir, prog="accelctl")
    if args.sysfs_root:
        conf.set_override("sysfs_root", args.sysfs_root)
    return conf


# --- commands ------------------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    conf = _load(args)
    # The running daemon's ledger is its own (see the module's docstring).
    running = not args.offline and daemon.runs(conf.api.socket_path)
    ledger = wiring.LedgerView() if running else None
    errors, warnings, state = wiring.check(conf, strict=args.strict, ledger=ledger)
    for warning in warnings:
        output.warning(warning)
    if errors or state is None:
        for error in errors:
            output.error(error)
        return EXIT_ERROR
    providers = state.inventory().providers
    print(
        f"configuration OK: {len(state.policy.types)} mdev type(s) enabled, "
        f"{len(providers)} provider(s) on {len(state.snapshot.parents)} mdev parent(s)"
    )
    return EXIT_OK


def _types_table(document: dict[str, Any]) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
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
    return ("parent", "type", "name", "api", "available", "mdevs", "configured"), rows


def _mdevs_table(document: dict[str, Any]) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
    rows = [
        (
            m["uuid"],
            m["parent"],
            m["mdev_type"],
            m["type_name"],
            m["iommu_group"],
            "yes" if m["owned"] else "no (foreign)",
            m["instance"],
        )
        for m in document["mdevs"]
    ]
    # For a vGPU VF the parent is the VF itself: its PCI address.
    return ("uuid", "parent", "type", "name", "iommu group", "owned", "instance"), rows


def _inventory_table(document: dict[str, Any]) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
    rows = [
        (
            p["name"],
            p["mdev_type"],
            p["resource_class"],
            p["inventory"]["total"],
            p["used"],
            _members(tuple(p.get("parent_devices") or [p["parent_device"]])),
            p.get("numa_node"),
        )
        for p in document["providers"]
    ]
    return ("provider", "type", "class", "total", "used", "parents", "numa"), rows


def _load_for_writes(args: argparse.Namespace):
    """Mutating commands: the privileged helper reads sysfs_root from the
    config files, so a command-line override would write somewhere else."""
    if args.sysfs_root:
        raise exception.InvalidConfig(
            reason="--sysfs-root applies to read-only commands; set [DEFAULT] sysfs_root "
            "in the config file for commands that create or remove mdevs"
        )
    return _load(args)


def _print_allocation(args: argparse.Namespace, allocation: dict[str, Any]) -> None:
    if args.json:
        output.emit_json(allocation)
        return
    output.table(
        ("uuid", "parent", "type"),
        [(m["uuid"], m["parent"], m["mdev_type"]) for m in allocation["mdevs"]],
    )


def cmd_allocate(args: argparse.Namespace) -> int:
    conf = _load_for_writes(args)
    allocation = _via_api(
        args,
        conf.api.socket_path,
        lambda api: api.allocate(args.instance, args.count, args.parent, args.type),
    )
    if allocation is _OFFLINE:
        with offline_manager(conf) as manager:
            allocation = manager.allocate(
                args.instance, args.count, args.parent, args.type
            ).to_dict()
    _print_allocation(args, allocation)
    return EXIT_OK


def _vf_request(text: str) -> dict[str, Any]:
    """``--vf POOL[,KEY=VALUE...]``: a VF request; integers and on/off/true/false
    as JSON would give them (the agent checks each field)."""
    pool, _, rest = text.partition(",")
    request: dict[str, Any] = {"pool": pool}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: expected KEY=VALUE")
        lowered = value.lower()
        if lowered in ("on", "true", "yes"):
            request[key] = True
        elif lowered in ("off", "false", "no"):
            request[key] = False
        elif value.isdigit():
            request[key] = int(value)
        else:
            request[key] = value
    return request


def _vgpu_request(text: str) -> dict[str, Any]:
    """``--vgpu CLASS[:COUNT]`` (CUSTOM_* and VGPU are resource classes, anything
    else an mdev type)."""
    name, _, count = text.partition(":")
    if count and not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: COUNT must be a number")
    key = "resource_class" if name == "VGPU" or name.startswith("CUSTOM_") else "mdev_type"
    return {key: name, "count": int(count) if count else 1}


def _json_request(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _print_attachment(args: argparse.Namespace, attachment: dict[str, Any]) -> None:
    if args.json:
        output.emit_json(attachment)
        return
    output.table(
        ("request", "backend", "uuid", "parent", "type", "address"),
        [
            (h["request"], h["backend"], h["uuid"], h["parent"], h["type"], h["address"] or "-")
            for h in attachment["attachments"]
        ],
    )


def cmd_attach(args: argparse.Namespace) -> int:
    requests = list(args.request or [])
    if not requests:
        raise exception.InvalidAttachRequest(
            field="requests", reason="give at least one --vgpu, --vf or --request"
        )
    conf = _load_for_writes(args)
    answer = _via_api(args, conf.api.socket_path, lambda api: api.attach(args.instance, requests))
    if answer is _OFFLINE:
        with offline_manager(conf) as manager:
            parsed = wiring.attach_requests(manager, requests)
            answer = manager.attach(args.instance, parsed).to_dict()
    _print_attachment(args, answer)
    return EXIT_OK


def _release_all(args: argparse.Namespace, call: Callable[[Any], Any]) -> list[str]:
    """What ``release``/``detach`` gave back: through the daemon's ``call``,
    or offline through the manager (both release the same way)."""
    conf = _load_for_writes(args)
    answer = _via_api(args, conf.api.socket_path, call)
    if answer is _OFFLINE:
        with offline_manager(conf) as manager:
            return manager.release(args.instance, remove=args.remove)
    return answer["released"]


def _print_released(args: argparse.Namespace, released: list[str], verb: str, noun: str) -> int:
    if args.json:
        output.emit_json({"instance": args.instance, "released": released, "removed": args.remove})
    elif released:
        print(f"{verb} {len(released)} {noun}(s) of {args.instance}: {', '.join(released)}")
    else:
        print(f"instance {args.instance} holds no {noun}; nothing to do")
    return EXIT_OK


def cmd_detach(args: argparse.Namespace) -> int:
    released = _release_all(args, lambda api: api.detach(args.instance, remove=args.remove))
    return _print_released(args, released, "detached", "device")


def cmd_release(args: argparse.Namespace) -> int:
    released = _release_all(args, lambda api: api.release(args.instance, remove=args.remove))
    verb = "released and removed" if args.remove else "released"
    return _print_released(args, released, verb, "mdev")


@contextlib.contextmanager
def _destination(conf) -> Iterator[Any]:
    """The destination side, offline (the daemon builds the same one)."""
    from accel_agent.migration.destination import MigrationDestination

    with offline_manager(conf) as manager:
        yield MigrationDestination.from_conf(conf, manager)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise exception.InvalidMigrationRequest(reason=f"{what} {item!r} is not KEY=VALUE")
        if key in pairs:
            # Which of the two was meant?  (The API refuses a repeated key too.)
            raise exception.InvalidMigrationRequest(reason=f"{what} {key!r} is given twice")
        pairs[key] = value
    return pairs


def cmd_migration_claim(args: argparse.Namespace) -> int:
    conf = _load_for_writes(args)
    mdevs = _pairs(args.mdev, "--mdev")
    versions = _pairs(args.source_version, "--source-version") if args.source_version else None
    answer = _via_api(
        args, conf.api.socket_path, lambda api: api.migration_claim(args.instance, mdevs, versions)
    )
    if answer is _OFFLINE:
        with _destination(conf) as destination:
            mapping = destination.claim(args.instance, mdevs, versions)
            answer = {
                "instance": args.instance,
                "mapping": mapping,
                "pci_addresses": destination.pci_addresses(args.instance),
            }
    if args.json:
        output.emit_json(answer)
        return EXIT_OK
    addresses = answer.get("pci_addresses") or {}
    if addresses:
        # A VF-backed device is moved by its PCI address: say which VF it lands on.
        rows = [(s, d, addresses.get(s, "")) for s, d in sorted(answer["mapping"].items())]
        output.table(("source uuid", "destination uuid", "destination address"), rows)
    else:
        output.table(("source uuid", "destination uuid"), sorted(answer["mapping"].items()))
    return EXIT_OK


def cmd_migration_commit(args: argparse.Namespace) -> int:
    conf = _load_for_writes(args)
    allocation = _via_api(
        args, conf.api.socket_path, lambda api: api.migration_commit(args.instance)
    )
    if allocation is _OFFLINE:
        with _destination(conf) as destination:
            allocation = destination.commit(args.instance).to_dict()
    _print_allocation(args, allocation)
    return EXIT_OK


def cmd_migration_abort(args: argparse.Namespace) -> int:
    conf = _load_for_writes(args)
    answer = _via_api(
        args, conf.api.socket_path, lambda api: api.migration_abort(args.instance, args.remove)
    )
    if answer is _OFFLINE:
        with _destination(conf) as destination:
            released = destination.abort(args.instance, args.remove)
        answer = {"instance": args.instance, "released": released, "removed": args.remove}
    if args.json:
        output.emit_json(answer)
    else:
        done = "removed" if args.remove else "freed"
        uuids = ", ".join(answer["released"]) or "none"
        print(f"claim of {args.instance} aborted; {done}: {uuids}")
    return EXIT_OK


def _register_migration(subparsers: argparse._SubParsersAction) -> None:
    migration = subparsers.add_parser(
        "migration",
        help="live migration with mdevs (destination side)",
        description="Destination side of a live migration: claim one mdev per source mdev "
        "of the same type (checks libvirt >= 8.6.0, QEMU >= 8.1.0, kernel >= 5.18 and the "
        "types), then commit the claim as the instance's allocation once the migration "
        "landed, or abort it. Unfinished claims expire ([migration] claim_timeout).",
    )
    sub = migration.add_subparsers(dest="migration_command", metavar="ACTION", required=True)
    claim = sub.add_parser(
        "claim",
        help="hold destination mdevs for an incoming instance",
        description="Prints {source uuid: destination uuid}, and for a vGPU VF the destination "
        "VF's PCI address the source moves its VF to; asking again returns the same.",
    )
    claim.add_argument("instance", metavar="INSTANCE")
    claim.add_argument(
        "--mdev",
        action="append",
        required=True,
        metavar="SRC_UUID=TYPE",
        help="a source device (mdev or vGPU VF, by its UUID) and its type (repeatable), "
        "from the source host",
    )
    claim.add_argument(
        "--source-version",
        action="append",
        metavar="COMPONENT=VERSION",
        help="the source host's libvirt=, qemu= and kernel= versions, checked too",
    )
    claim.add_argument("--json", action="store_true")
    claim.set_defaults(func=cmd_migration_claim)
    commit = sub.add_parser("commit", help="the claim becomes the instance's allocation")
    commit.add_argument("instance", metavar="INSTANCE")
    commit.add_argument("--json", action="store_true")
    commit.set_defaults(func=cmd_migration_commit)
    abort = sub.add_parser(
        "abort",
        help="free the claimed mdevs (idempotent)",
        description="Free the claimed mdevs for reuse, or remove them (--remove): a failed "
        "incoming migration may leave a device in the state the failed load left it.",
    )
    abort.add_argument("instance", metavar="INSTANCE")
    abort.add_argument("--remove", action="store_true", help="remove the mdevs, not only free them")
    abort.add_argument("--json", action="store_true")
    abort.set_defaults(func=cmd_migration_abort)


def cmd_adopt(args: argparse.Namespace) -> int:
    if args.from_libvirt == bool(args.uuid):
        sys.stderr.write("accelctl adopt: error: give either UUID or --from-libvirt\n")
        return EXIT_USAGE
    if not args.from_libvirt and (args.all or args.dry_run or args.json):
        sys.stderr.write("accelctl adopt: error: --all, --dry-run and --json go with "
                         "--from-libvirt\n")
        return EXIT_USAGE
    conf = _load_for_writes(args)
    if args.from_libvirt:
        return _takeover(args, conf)
    record = _via_api(args, conf.api.socket_path, lambda api: api.adopt(args.uuid))
    if record is _OFFLINE:
        with offline_manager(conf) as manager:
            adopted = manager.adopt(args.uuid)
        record = {"uuid": adopted.uuid, "parent": adopted.parent, "mdev_type": adopted.mdev_type}
    print(f"adopted {record['uuid']} ({record['mdev_type']} on {record['parent']})")
    return EXIT_OK


_TAKEOVER_WORDS = {
    "adopt": "adopt  ",
    "assign": "assign ",
    "none": "already",
    "foreign": "foreign",
}


def _takeover(args: argparse.Namespace, conf: Any) -> int:
    """``adopt --from-libvirt``: every libvirt domain's mdevs become its instance's."""
    plan = _via_api(
        args,
        conf.api.socket_path,
        lambda api: api.takeover(adopt_unused=args.all, dry_run=args.dry_run),
    )
    if plan is _OFFLINE:
        with offline_manager(conf) as manager:
            plan = manager.takeover(adopt_unused=args.all, dry_run=args.dry_run).to_dict()
    if args.json:
        output.emit_json(plan)
        return EXIT_ERROR if plan["problems"] else EXIT_OK

    def line(mdev: dict[str, Any]) -> str:
        text = f"  {_TAKEOVER_WORDS.get(mdev['action'], mdev['action'])} {mdev['uuid']}"
        text += f"  {mdev['mdev_type']} on {mdev['parent']}"
        return text + (f"  ({mdev['reason']})" if mdev.get("reason") else "")

    for domain in plan["domains"]:
        print(f"domain {domain['name']} -> instance {domain['uuid']}")
        for mdev in domain["mdevs"]:
            print(line(mdev))
    if plan["unused"]:
        print("used by no domain" + ("" if plan["all"] else " (--all adopts them, free)"))
        for mdev in plan["unused"]:
            print(line(mdev))
    for problem in plan["problems"]:
        print(f"problem: {problem}")
    taken = sum(m["action"] in ("adopt", "assign") for d in plan["domains"] for m in d["mdevs"])
    free = sum(m["action"] == "adopt" for m in plan["unused"])
    if plan["applied"]:
        print(f"took over {taken} mdev(s) of {len(plan['domains'])} domain(s), "
              f"adopted {free} unused mdev(s)")
        return EXIT_OK
    if plan["problems"]:
        print(f"dry run: nothing changed; the takeover would be refused "
              f"({len(plan['problems'])} problem(s))")
        return EXIT_ERROR
    print(f"dry run: nothing changed; would take over {taken} mdev(s) of "
          f"{len(plan['domains'])} domain(s) and adopt {free} unused mdev(s)")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    conf = _load_for_writes(args)
    report = _via_api(args, conf.api.socket_path, lambda api: api.recover(check=args.check))
    if report is _OFFLINE:
        with offline_manager(conf) as manager:
            report = manager.recover(full_check=args.check).to_dict()
    if report.get("unrecorded"):
        from accel_agent.devices.ledger import LEDGER_FILENAME
        from accel_agent.devices.recovery import unrecorded_warning

        ledger = os.path.join(conf.state_dir, LEDGER_FILENAME)
        output.warning(unrecorded_warning(ledger, report["unrecorded"]))
    if args.json:
        output.emit_json(report)
        return EXIT_OK
    for key, uuids in report.items():
        if uuids:
            print(f"{key.replace('_', ' ')}: {', '.join(uuids)}")
    print("recovery done: sysfs and the ledger agree")
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    """Ask the running daemon to reload its configuration, as SIGHUP does,
    and say what happened: 0 applied, 1 refused (the reason on stderr) or
    no daemon."""
    listing, _errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
    from accel_agent.api.client import ApiClient

    socket_path = listing.api_socket_path
    try:
        # Validating a configuration scans the host: give a large one time.
        outcome = ApiClient(socket_path, timeout=RELOAD_TIMEOUT).call("POST", "/v1/reload")
    except exception.AgentNotRunning:
        output.error(f"accel-agent is not running (no API socket at {socket_path}): nothing "
                     "to reload; the configuration is read when it starts")
        return EXIT_ERROR
    if args.json:
        output.emit_json(outcome)
        return EXIT_OK
    for note in outcome.get("notes", []):
        output.warning(note)
    print("configuration reloaded")
    return EXIT_OK


# Seconds `accelctl reload` waits for the daemon's answer.
RELOAD_TIMEOUT = 300.0


def cmd_domain_xml(args: argparse.Namespace) -> int:
    from accel_agent.libvirt_xml import instance_devices_xml

    conf = _load(args)
    xml = (
        _OFFLINE
        if args.sysfs_root
        else _via_api(args, conf.api.socket_path, lambda api: api.domain_xml(args.instance))
    )
    if xml is not _OFFLINE:
        print(str(xml).rstrip("\n"))
        return EXIT_OK
    with offline_manager(conf) as manager:
        allocation = manager.allocation(args.instance)
        if not allocation.mdevs:
            raise exception.MdevNotFound(uuid=f"(any, for instance {args.instance})")
        devices = manager.guest_devices(allocation.mdevs)
    print(instance_devices_xml(devices, conf.libvirt.qemu_globals))
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

    for name, table, text in (
        ("types", _types_table, "mdev types offered by each parent, with counters"),
        ("mdevs", _mdevs_table, "existing mediated devices, owned and foreign"),
        ("inventory", _inventory_table, "inventory per physical GPU (resource providers)"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.set_defaults(func=_listing(name, table))

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

    attach = subparsers.add_parser(
        "attach",
        help="give an instance all its accelerators in one call (vGPUs and VFs), all or nothing",
        description="Prepare every device INSTANCE asks for: vGPUs (mdevs or vendor-VFIO "
        "VFs) by resource class or type, SR-IOV VFs of a configured pool with their network "
        "settings (set through rtnetlink before the VF is handed to vfio-pci). If any device "
        "fails, every device this call prepared is undone before the error is printed. "
        "Every field is checked before anything is prepared: a bad one is named "
        "(requests[1].vlan) and nothing changes. Asking again with the same requests prints "
        "the same handles. Each handle carries its guest XML (--json).",
        epilog="examples: accelctl attach vm1 --vgpu VGPU --vf "
        "nic_a,mac=52:54:00:12:34:56,vlan=100 --json; "
        "accelctl attach vm1 --request '{\"resource_class\": \"VGPU\", \"count\": 2}'",
    )
    attach.add_argument("instance", metavar="INSTANCE", help="instance id (e.g. its UUID)")
    attach.add_argument(
        "--vgpu", dest="request", action="append", type=_vgpu_request, metavar="CLASS[:N]",
        help="N (default 1) vGPUs of resource class CLASS (VGPU, CUSTOM_*) or of mdev type CLASS",
    )
    attach.add_argument(
        "--vf", dest="request", action="append", type=_vf_request, metavar="POOL[,K=V...]",
        help="one VF of pool POOL; K=V: pf, mac, vlan, qos, spoofchk, trust, link_state, "
        "max_tx_rate, min_tx_rate (e.g. nic_a,mac=52:54:00:12:34:56,vlan=100,trust=on)",
    )
    attach.add_argument(
        "--request", dest="request", action="append", type=_json_request, metavar="JSON",
        help="one device request as the API takes it (repeatable, in order with the others)",
    )
    attach.add_argument("--json", action="store_true", help="the handles with their XML")
    attach.set_defaults(func=cmd_attach)

    detach = subparsers.add_parser(
        "detach",
        help="unprepare every device of an instance (VFs reset and returned to their driver)",
        description="Release every device of INSTANCE: SR-IOV VFs go back to their own "
        "driver with their network settings reset; mdevs stay free for reuse unless "
        "--remove. A VF whose VFIO group a VM still holds is kept with its settings (exit 1, "
        "accelctl recover returns it once free). Detaching an instance that holds nothing "
        "succeeds.",
    )
    detach.add_argument("instance", metavar="INSTANCE")
    detach.add_argument("--remove", action="store_true", help="also remove the mdevs")
    detach.add_argument("--json", action="store_true")
    detach.set_defaults(func=cmd_detach)

    adopt = subparsers.add_parser(
        "adopt",
        help="take ownership of a foreign mdev, or of a Nova host's (--from-libvirt)",
        description="Record an existing mdev the agent did not create as owned, so it can "
        "be allocated and removed. Foreign mdevs are otherwise never touched. "
        "--from-libvirt takes over a host Nova ran: every libvirt domain's ([libvirt] uri) "
        "mdevs are adopted and assigned to the instance named by the domain's UUID; all or "
        "nothing: an mdev missing, of a type the config does not give its parent, used by "
        "two domains or assigned to another instance refuses the whole takeover.",
    )
    adopt.add_argument("uuid", metavar="UUID", nargs="?")
    adopt.add_argument(
        "--from-libvirt", action="store_true", help="take over every libvirt domain's mdevs"
    )
    adopt.add_argument(
        "--all", action="store_true", help="also adopt, free, the mdevs no domain uses"
    )
    adopt.add_argument(
        "--dry-run", action="store_true", help="print the plan (and its problems); change nothing"
    )
    adopt.add_argument("--json", action="store_true", help="the plan as JSON")
    adopt.set_defaults(func=cmd_adopt)

    recover = subparsers.add_parser(
        "recover",
        help="make sysfs match the ledger (after a crash or a host reboot)",
        description="Finish or undo operations a crash interrupted and re-create every "
        "recorded mdev missing from sysfs with the same UUID, parent and type. Refuses, "
        "changing nothing, when an assigned mdev's type is no longer configured for its "
        "parent.",
    )
    recover.add_argument(
        "--check",
        action="store_true",
        help="first run SQLite's full integrity_check on the ledger (the daemon runs the "
        "quicker quick_check at every start); a corrupt ledger exits 1, changing nothing",
    )
    recover.add_argument("--json", action="store_true")
    recover.set_defaults(func=cmd_recover)

    reload = subparsers.add_parser(
        "reload",
        help="make the running daemon re-read its configuration files (like SIGHUP) and "
        "say whether it applied them",
        description="Ask the running accel-agent to reload its configuration, as SIGHUP "
        "(systemctl reload) does, and wait for the result. The daemon checks the files "
        "exactly as at start-up (every value and range, named by file and line) and "
        "refuses a configuration that would orphan an assigned device or that changes an "
        "option needing a restart; a refused reload keeps the running configuration. "
        "Exit status: 0 applied, 1 refused (the reason on stderr) or no daemon running.",
    )
    reload.add_argument("--json", action="store_true", help="the daemon's answer as JSON")
    reload.set_defaults(func=cmd_reload)

    domain_xml = subparsers.add_parser(
        "domain-xml",
        help="libvirt <hostdev> XML of an instance's mdevs",
        description="Print the <hostdev type='mdev'> elements for INSTANCE's mdevs (for "
        "<devices>), then, when [libvirt] qemu_globals is set, one <qemu:commandline> "
        "element with those -global settings (for <domain> itself).",
    )
    domain_xml.add_argument("instance", metavar="INSTANCE")
    domain_xml.set_defaults(func=cmd_domain_xml)

    _register_migration(subparsers)
    _register_optional(subparsers)
    return parser


def _cmd_simulate(args: argparse.Namespace) -> int:
    """``accelctl simulate ...``: the simulator's own parser, built only when
    asked for (the simulator's imports cost every other command ~20 ms)."""
    from accel_agent.simulator import cli as simulator_cli

    parser = _Parser(prog="accelctl simulate", description=SIMULATE_HELP)
    simulator_cli.add_commands(parser)
    sub_args = parser.parse_args(args.simulate_args)
    if not getattr(sub_args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(sub_args.func(sub_args))


SIMULATE_HELP = (
    "Give any machine a simulated GPU host: a kernel-faithful sysfs (mdev types, SR-IOV VFs "
    "from sriov_numvfs, PCI driver binding, NVIDIA vGPU 17+ VFs typed through "
    "nvidia/current_vgpu_type), mounted with FUSE (writes act like the kernel's) or written "
    "as a static tree. Profiles: 'accelctl simulate profiles'. "
    "Run 'accelctl simulate --help' for its commands."
)


def _register_optional(subparsers: argparse._SubParsersAction) -> None:
    """Subcommands owned by other packages (each module keeps its imports lazy)."""
    from accel_agent.cmd import ledger_upgrade, nova_pci_config
    from accel_agent.libvirt_xml import cli as xml_cli

    nova_pci_config.register(subparsers)
    ledger_upgrade.register(subparsers)

    simulate = subparsers.add_parser(
        "simulate",
        help="run a simulated mdev host (FUSE sysfs) for demos and tests",
        description=SIMULATE_HELP,
        add_help=False,
    )
    simulate.add_argument("simulate_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    simulate.set_defaults(func=_cmd_simulate)
    xml_cli.register(subparsers)


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
