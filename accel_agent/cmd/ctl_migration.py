"""``accelctl migration claim|commit|abort``: the destination side of a live
migration with mdevs or vGPU VFs (accel_agent.migration.destination).

Through the daemon's API while it runs, else directly with the destination
the daemon would build, over the offline manager (accel_agent.cmd.loading).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from accel_agent import exception
from accel_agent.cmd import daemon, loading, output


def register(subparsers: argparse._SubParsersAction) -> None:
    migration = subparsers.add_parser(
        "migration",
        help="live migration with mdevs (destination side)",
        description="Destination side of a live migration: claim one mdev per source mdev "
        "of the same type (checks libvirt >= 8.6.0, QEMU >= 8.1.0, kernel >= 5.18, the "
        "types and, for NVIDIA vGPUs, equal vGPU manager versions), then commit the claim "
        "as the instance's allocation once the migration landed, or abort it. Unfinished "
        "claims expire ([migration] claim_timeout).",
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
        help="the source host's libvirt=, qemu= and kernel= versions, checked too, and "
        "nvidia_vgpu_manager= (its NVIDIA vGPU manager's), which must equal this host's "
        "for vGPUs",
    )
    claim.add_argument("--json", action="store_true")
    claim.set_defaults(func=claim_devices)
    commit = sub.add_parser("commit", help="the claim becomes the instance's allocation")
    commit.add_argument("instance", metavar="INSTANCE")
    commit.add_argument("--json", action="store_true")
    commit.set_defaults(func=commit_claim)
    abort = sub.add_parser(
        "abort",
        help="free the claimed mdevs (idempotent)",
        description="Free the claimed mdevs for reuse, or remove them (--remove): a failed "
        "incoming migration may leave a device in the state the failed load left it.",
    )
    abort.add_argument("instance", metavar="INSTANCE")
    abort.add_argument("--remove", action="store_true", help="remove the mdevs, not only free them")
    abort.add_argument("--json", action="store_true")
    abort.set_defaults(func=abort_claim)


@contextlib.contextmanager
def _destination(conf: Any) -> Iterator[Any]:
    """The destination side, offline (the daemon builds the same one)."""
    from accel_agent.migration.destination import MigrationDestination

    with loading.offline_manager(conf) as manager:
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


def claim_devices(args: argparse.Namespace) -> int:
    conf = loading.load_config_for_writes(args)
    mdevs = _pairs(args.mdev, "--mdev")
    versions = _pairs(args.source_version, "--source-version") if args.source_version else None
    answer = daemon.via_api(
        args, conf.api.socket_path, lambda api: api.migration_claim(args.instance, mdevs, versions)
    )
    if answer is daemon.OFFLINE:
        with _destination(conf) as destination:
            mapping = destination.claim(args.instance, mdevs, versions)
            answer = {
                "instance": args.instance,
                "mapping": mapping,
                "pci_addresses": destination.pci_addresses(args.instance),
            }
    if args.json:
        output.emit_json(answer)
        return output.EXIT_OK
    addresses = answer.get("pci_addresses") or {}
    if addresses:
        # A VF-backed device is moved by its PCI address: say which VF it lands on.
        rows = [(s, d, addresses.get(s, "")) for s, d in sorted(answer["mapping"].items())]
        output.table(("source uuid", "destination uuid", "destination address"), rows)
    else:
        output.table(("source uuid", "destination uuid"), sorted(answer["mapping"].items()))
    return output.EXIT_OK


def commit_claim(args: argparse.Namespace) -> int:
    conf = loading.load_config_for_writes(args)
    allocation = daemon.via_api(
        args, conf.api.socket_path, lambda api: api.migration_commit(args.instance)
    )
    if allocation is daemon.OFFLINE:
        with _destination(conf) as destination:
            allocation = destination.commit(args.instance).to_dict()
    output.allocation(allocation, args.json)
    return output.EXIT_OK


def abort_claim(args: argparse.Namespace) -> int:
    conf = loading.load_config_for_writes(args)
    answer = daemon.via_api(
        args, conf.api.socket_path, lambda api: api.migration_abort(args.instance, args.remove)
    )
    if answer is daemon.OFFLINE:
        with _destination(conf) as destination:
            released = destination.abort(args.instance, args.remove)
        answer = {"instance": args.instance, "released": released, "removed": args.remove}
    if args.json:
        output.emit_json(answer)
    else:
        done = "removed" if args.remove else "freed"
        uuids = ", ".join(answer["released"]) or "none"
        print(f"claim of {args.instance} aborted; {done}: {uuids}")
    return output.EXIT_OK
