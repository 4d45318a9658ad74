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
from accel_agent.sysfs.address import normalise_parent

Table = tuple[Sequence[str], list[tuple[Any, ...]]]


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, table, text in (
        ("types", _types_table, "mdev types offered by each parent, with counters"),
        ("mdevs", _mdevs_table, "existing mediated devices, owned and foreign"),
        ("inventory", _inventory_table, "inventory per physical GPU (resource providers)"),
    ):
        sub = subparsers.add_parser(name, help=text, description=text)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "types":
            _add_type_filters(sub)
        sub.set_defaults(func=_listing(name, table))


def _add_type_filters(sub: argparse.ArgumentParser) -> None:
    """A vGPU 17+ host lists every creatable type of every VF (2 GPUs x 32
    VFs: ~1,500 rows): these narrow it.  Both the table and ``--json`` keep
    only the matching parents and types (the document's shape is the same)."""
    sub.description = (
        f"{sub.description}. Filters combine (all must match); --json keeps the same shape "
        "with only what matches."
    )
    sub.add_argument(
        "--type", dest="types", action="append", metavar="TYPE", default=[],
        help="only this type id (repeatable), e.g. nvidia-1150",
    )
    sub.add_argument(
        "--parent", dest="parents", action="append", metavar="ADDR", default=[],
        help="only this parent (repeatable): its name or PCI address, or a physical GPU's "
        "address for all of its VFs (short forms such as 84:00.0 work)",
    )
    sub.add_argument(
        "--configured", action="store_true",
        help="only the type the configuration gives each parent (parents without one are "
        "left out)",
    )


def _listing(
    name: str, table: Callable[[dict[str, Any]], Table]
) -> Callable[[argparse.Namespace], int]:
    """A read-only listing: from the daemon (GET ``path``) when it runs, else
    from sysfs + ledger; printed as JSON or as the rows of ``table``."""

    def run(args: argparse.Namespace) -> int:
        listing, errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
        # JSON into a pipe is printed as the daemon sent it (the same compact
        # encoding as ours): no decoding and re-encoding of megabytes.
        filtered = _type_filter(args)
        as_sent = args.json and not sys.stdout.isatty() and filtered is None
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
            if filtered is not None:
                document = filtered(document)
            if args.json:
                output.emit_json(document)
            else:
                output.table(*table(document))
            return output.EXIT_OK

    return run


def _type_filter(
    args: argparse.Namespace,
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """What ``types``' filters keep of its document; None without filters."""
    types = set(getattr(args, "types", None) or ())
    parents = {normalise_parent(p) for p in getattr(args, "parents", None) or ()}
    configured = bool(getattr(args, "configured", False))
    if not (types or parents or configured):
        return None

    def parent_matches(parent: dict[str, Any]) -> bool:
        names = {parent.get("name"), parent.get("pci_address"), parent.get("physical_gpu")}
        return not parents or bool(parents & names)

    def type_matches(parent: dict[str, Any], offered: dict[str, Any]) -> bool:
        if types and offered["type_id"] not in types:
            return False
        return not configured or offered["type_id"] in configured_types(parent)

    def keep(document: dict[str, Any]) -> dict[str, Any]:
        kept = []
        for parent in document["parents"]:
            if not parent_matches(parent):
                continue
            offered = [t for t in parent["types"] if type_matches(parent, t)]
            if offered:
                kept.append({**parent, "types": offered})
        return {**document, "parents": kept}

    return keep


def configured_types(parent: dict[str, Any]) -> list[str]:
    """The types the configuration gives a parent of the types document
    (``configured_types``; an agent before mixed-size layouts said only
    ``configured_type``)."""
    found = parent.get("configured_types")
    if found is not None:
        return list(found)
    return [parent["configured_type"]] if parent.get("configured_type") else []


def _types_table(document: dict[str, Any]) -> Table:
    rows = [
        (
            parent["name"],
            t["type_id"],
            t["name"],
            t["device_api"],
            t["available_instances"],
            t["mdevs"],
            "yes" if t["type_id"] in configured_types(parent) else "",
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
