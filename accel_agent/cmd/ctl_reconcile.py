"""``accelctl adopt`` (one foreign mdev, or with ``--from-libvirt`` every
mdev of a host Nova ran) and ``accelctl recover`` (after a crash or a host
reboot): the ledger and the host made to agree.

Through the daemon's API while it runs, else directly through the manager
(accel_agent.cmd.loading), as accel_agent.cmd.ctl_devices.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from accel_agent.cmd import daemon, loading, output


def register(subparsers: argparse._SubParsersAction) -> None:
    """``adopt`` and ``recover``, in this order."""
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
    adopt.set_defaults(func=adopt_mdevs)

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
    recover.set_defaults(func=recover_host)


def adopt_mdevs(args: argparse.Namespace) -> int:
    if args.from_libvirt == bool(args.uuid):
        sys.stderr.write("accelctl adopt: error: give either UUID or --from-libvirt\n")
        return output.EXIT_USAGE
    if not args.from_libvirt and (args.all or args.dry_run or args.json):
        sys.stderr.write("accelctl adopt: error: --all, --dry-run and --json go with "
                         "--from-libvirt\n")
        return output.EXIT_USAGE
    conf = loading.load_config_for_writes(args)
    if args.from_libvirt:
        return _takeover(args, conf)
    record = daemon.via_api(args, conf.api.socket_path, lambda api: api.adopt(args.uuid))
    if record is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            adopted = manager.adopt(args.uuid)
        record = {"uuid": adopted.uuid, "parent": adopted.parent, "mdev_type": adopted.device_type}
    print(f"adopted {record['uuid']} ({record['mdev_type']} on {record['parent']})")
    return output.EXIT_OK


_TAKEOVER_WORDS = {
    "adopt": "adopt  ",
    "assign": "assign ",
    "none": "already",
    "foreign": "foreign",
}


def _takeover(args: argparse.Namespace, conf: Any) -> int:
    """``adopt --from-libvirt``: every libvirt domain's mdevs become its instance's."""
    plan = daemon.via_api(
        args,
        conf.api.socket_path,
        lambda api: api.takeover(adopt_unused=args.all, dry_run=args.dry_run),
    )
    if plan is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            plan = manager.takeover(adopt_unused=args.all, dry_run=args.dry_run).to_dict()
    if args.json:
        output.emit_json(plan)
        return output.EXIT_ERROR if plan["problems"] else output.EXIT_OK

    def line(mdev: dict[str, Any]) -> str:
        text = f"  {_TAKEOVER_WORDS.get(mdev['action'], mdev['action'])} {mdev['uuid']}"
        text += f"  {mdev['mdev_type']} on {mdev['parent']}"
        if mdev.get("libvirt"):
            text += f"  libvirt: {mdev['libvirt']}"  # "undefine": its definition goes
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
        return output.EXIT_OK
    if plan["problems"]:
        print(f"dry run: nothing changed; the takeover would be refused "
              f"({len(plan['problems'])} problem(s))")
        return output.EXIT_ERROR
    print(f"dry run: nothing changed; would take over {taken} mdev(s) of "
          f"{len(plan['domains'])} domain(s) and adopt {free} unused mdev(s)")
    return output.EXIT_OK


def recover_host(args: argparse.Namespace) -> int:
    conf = loading.load_config_for_writes(args)
    report = daemon.via_api(args, conf.api.socket_path, lambda api: api.recover(check=args.check))
    if report is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            report = manager.recover(full_check=args.check).to_dict()
    if report.get("unrecorded"):
        from accel_agent.devices.ledger import LEDGER_FILENAME
        from accel_agent.devices.recovery import unrecorded_warning

        ledger = os.path.join(conf.state_dir, LEDGER_FILENAME)
        output.warning(unrecorded_warning(ledger, report["unrecorded"]))
    if args.json:
        output.emit_json(report)
        return output.EXIT_OK
    for key, uuids in report.items():
        if uuids:
            print(f"{key.replace('_', ' ')}: {', '.join(uuids)}")
    print("recovery done: sysfs and the ledger agree")
    return output.EXIT_OK
