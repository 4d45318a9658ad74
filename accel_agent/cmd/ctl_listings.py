"""``accelctl types``, ``mdevs`` and ``inventory`` on accelctl's parser path:
from the running daemon (GET ``/v1/<listing>``), else from a scan of sysfs
and the ledger opened read-only (accel_agent.cmd.listings); printed as a
table or as JSON.

``accelctl LISTING --json`` into a pipe is usually answered before this
module is imported (accel_agent.cmd.plain_listing); what it declines comes
here and must print the same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from accel_agent import wiring
from accel_agent.cmd import daemon, listings, output

Table = tuple[Sequence[str], list[tuple[Any, ...]]]


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, table, text in (
        ("types", _types_table, "mdev types offered by each parent, with counters"),
        ("mdevs", _mdevs_table, "existing mediated devices, owned and foreign"),
        ("inventory", _inventory_table, "inventory per physical GPU (resource providers)"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.set_defaults(func=_listing(name, table))


def _listing(
    name: str, table: Callable[[dict[str, Any]], Table]
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
            document = daemon.OFFLINE
        else:
            path = f"/v1/{name}"
            document = daemon.via_api(
                args,
                listing.api_socket_path,
                lambda api: api.call_json_bytes("GET", path) if as_sent else api.call("GET", path),
            )
        if isinstance(document, bytes):
            output.emit_json_bytes(document)
            return output.EXIT_OK
        with listings.collector_paused():
            if document is daemon.OFFLINE:
                document = listings.offline_document(name, listing, errors)
            if args.json:
                output.emit_json(document)
            else:
                output.table(*table(document))
            return output.EXIT_OK

    return run


def _types_table(document: dict[str, Any]) -> Table:
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


def _mdevs_table(document: dict[str, Any]) -> Table:
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


def _inventory_table(document: dict[str, Any]) -> Table:
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


def _members(parents: tuple[str, ...]) -> str:
    """Short form for a card's VFs: first..last (count)."""
    if len(parents) <= 2:
        return ",".join(parents)
    return f"{parents[0]}..{parents[-1]} ({len(parents)})"
