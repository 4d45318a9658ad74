"""``accelctl explain [ADDRESS]``: each GPU and accelerator of the host (or
the one at ADDRESS), what it offers, and what stands in the way, with the
next step (accel_agent.explain).

Through the running daemon (``GET /v1/explain``) when it runs, else read
here: from sysfs, ``/proc`` and the configuration files.  Exit 0 when it
could explain, 1 for an address that is not on the host (or a daemon that
cannot be reached), 2 for a malformed address.
"""

from __future__ import annotations

import argparse
from typing import Any

from accel_agent.cmd import daemon, loading, output

HELP = "explain each GPU and accelerator: what it offers, what is missing, what to do next"


def _address(text: str) -> str:
    from accel_agent import exception
    from accel_agent.explain import normalise_address

    try:
        return normalise_address(text)
    except exception.InvalidPciAddress:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a PCI address (0000:84:00.0, 84:00.0) nor an mdev parent's "
            "name (mtty)"
        ) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "explain",
        help=HELP,
        description=HELP + ". For every PCI function of class 03xx (display) or 12xx "
        "(accelerator) and every mdev parent, or the one ADDRESS: its name (pci.ids), driver, "
        "NUMA node, IOMMU group, SR-IOV and VFs, mdev types, NVIDIA vGPU state, what the "
        "configuration asks of it, and a verdict. Reads only; exit 0 explained, 1 an address "
        "not on this host, 2 usage.",
    )
    sub.add_argument("address", nargs="?", type=_address, metavar="ADDRESS",
                     help="one device: a PCI address (0000:84:00.0 or 84:00.0) or a virtual "
                     "mdev parent's name (mtty)")
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    sub.set_defaults(func=_explain)


def offline_document(args: argparse.Namespace, conf: Any) -> dict[str, Any]:
    """The document read here: sysfs, /proc and the configuration."""
    from accel_agent import backends, exception, explain
    from accel_agent.backends.host import scan_host
    from accel_agent.devices import policy as policy_mod

    problems: list[str] = []
    try:
        policy = policy_mod.build_policy(conf)
    except exception.ConfigErrors as exc:
        policy = None
        problems.append(exc.errors[0].message if exc.errors else exc.message)
    pools = None
    try:
        from accel_agent.sriov.pools import build_pools

        pools = build_pools(conf)
    except exception.AccelAgentException as exc:
        problems.append(exc.message)
    asks = explain.Asks.of(
        policy, pools,
        f"{problems[0]}; accelctl check-config lists every error" if problems else None,
    )
    snapshot = scan_host(conf.sysfs_root, backends.for_reading(), state_dir=conf.state_dir)
    return explain.explain(snapshot, asks, args.address, host_name=conf.host)


def _explain(args: argparse.Namespace) -> int:
    conf = loading.load_config(args)
    document: Any = daemon.OFFLINE
    if not args.sysfs_root:
        path = "/v1/explain"
        if args.address:
            import urllib.parse  # here: building the parser must not pay for it

            path += "?" + urllib.parse.urlencode({"address": args.address})
        document = daemon.via_api(args, conf.api.socket_path, lambda api: api.call("GET", path))
    if document is daemon.OFFLINE:
        document = offline_document(args, conf)
    if args.json:
        output.emit_json(document)
    else:
        from accel_agent.explain import render

        print(render.text(document), end="")
    return output.EXIT_OK
