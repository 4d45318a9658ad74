"""``accelctl nova-pci-config``: Nova ``[pci]`` lines for the vGPU VFs of
this host, and ``--check FILE`` for drift (reporting/nova_pci.py)."""

from __future__ import annotations

import argparse
import dataclasses

from accel_agent import wiring
from accel_agent.cmd import output

DESCRIPTION = (
    "For operators who hand NVIDIA vGPU 17+ VFs to Nova as PCI passthrough devices: print "
    "the nova.conf [pci] device_spec lines (\"managed\": \"no\", one resource_class per "
    "vGPU type, \"live_migratable\": \"yes\") and alias lines for the VFs the agent has "
    "typed, or would type with "
    "--per-gpu N. With --check FILE, compare FILE's [pci] section with the host instead: "
    "each difference on one line, exit 1 when there is any. Reads sysfs, the ledger and "
    "the config (the ledger through the daemon when it runs); changes nothing."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "nova-pci-config",
        help="Nova [pci] device_spec/alias lines for the typed vGPU VFs (--check FILE: drift)",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "--per-gpu",
        type=_count,
        metavar="N",
        help="also list the untyped VFs the agent would type until each GPU has N",
    )
    parser.add_argument(
        "--check",
        metavar="FILE",
        help="report where FILE (a nova.conf) differs from this host, and each GPU it "
        "would count twice (as check-config --nova-conf does); exit 1 on drift",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="the device_spec and alias values as JSON objects (with --check: "
        "{file, matches, problems}); same exit status",
    )
    parser.add_argument(
        "--live-migratable",
        choices=("auto", "yes", "no"),
        default="auto",
        help="tag the lines live_migratable (Nova 34: HW_PCI_LIVE_MIGRATABLE, live "
        "migration of the flavor's VFs). auto (default): only where this host's libvirt "
        "and QEMU, asked at [libvirt] uri, meet Nova's floor for it (libvirt 10.0.0, "
        "QEMU 8.2.2: nova-compute refuses to start below it)",
    )
    parser.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if not 0 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 4096")
    return value


def _daemons_view(
    args: argparse.Namespace, listing: wiring.ListingConfig
) -> wiring.LedgerView | None:
    """Which devices the agent owns, as the running daemon says (GET
    /v1/mdevs): its ledger is not opened while it runs.  None without a
    daemon (or with --offline, --sysfs-root): the ledger is read read-only."""
    from accel_agent.cmd import daemon

    if args.sysfs_root:
        return None
    answer = daemon.via_api(args, listing.api_socket_path, lambda api: api.call("GET", "/v1/mdevs"))
    if answer is daemon.OFFLINE:
        return None
    owned = [m for m in answer["mdevs"] if m["owned"]]
    return wiring.LedgerView(owners={m["uuid"]: m["instance"] for m in owned})


def run(args: argparse.Namespace) -> int:
    from accel_agent.reporting import nova_pci

    listing, errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
    if args.sysfs_root:
        listing = dataclasses.replace(listing, sysfs_root=args.sysfs_root)
    state = wiring.host_state(listing, errors, ledger=_daemons_view(args, listing))
    specs = nova_pci.plan(state.snapshot, state.policy, state.ledger.owned, args.per_gpu)
    if args.check is None:
        if args.live_migratable == "auto":
            tag, why_not = nova_pci.live_migratable_here(listing.libvirt_uri)
        else:
            tag, why_not = args.live_migratable == "yes", "--live-migratable no"
        if args.json:
            output.emit_json(_document(specs, state.host, tag))
        else:
            print(nova_pci.render(specs, state.host, tag, why_not), end="")
        return output.EXIT_OK
    found = nova_pci.read_nova_conf(args.check)
    problems = nova_pci.drift(
        specs, found, nova_pci.host_vfs(state.snapshot),
        nova_pci.agent_reported(state.snapshot, state.policy),
    )
    for problem in problems:
        output.error(problem)
    if args.json:
        output.emit_json(
            {"file": args.check, "matches": not problems, "problems": problems,
             "vfs": len(specs)}
        )
    elif not problems:
        print(f"{args.check}: [pci] matches the {len(specs)} vGPU VF(s) of this host")
    return output.EXIT_ERROR if problems else output.EXIT_OK


def _document(specs: list, host: str, live_migratable: bool = True) -> dict:
    """``nova-pci-config --json``: what the [pci] lines say, as objects.

    ``device_spec`` and ``alias`` hold the values of those nova.conf options
    (one object per line of the text form, in its order; both carry
    ``"live_migratable": "yes"`` when ``live_migratable`` is true: see
    nova_pci.live_migratable_here and ``--live-migratable``); ``vfs`` says, for
    each device_spec, its type and GPU and whether the agent has typed it yet
    (false: one that ``--per-gpu`` adds, typed when asked)."""
    from accel_agent.reporting import nova_pci

    return {
        "host": host,
        "device_spec": [nova_pci.device_spec(spec, live_migratable) for spec in specs],
        "alias": nova_pci.aliases(specs, live_migratable),
        "live_migratable": live_migratable,
        "vfs": [
            {"address": spec.address, "mdev_type": spec.mdev_type,
             "resource_class": spec.resource_class, "physical_gpu": spec.physical_gpu,
             "typed": spec.typed}
            for spec in specs
        ],
    }
