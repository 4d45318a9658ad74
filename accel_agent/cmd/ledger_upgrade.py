"""``accelctl ledger upgrade``: migrate the mdev ledger to this code's schema,
on purpose, after a backup copy (docs/design.md §5.2).

Nothing else in accelctl migrates the ledger: its readers open it read-only
and its offline writers refuse an older schema, naming this command.  The
daemon upgrades it the same way when it starts; while it runs this command
refuses (the daemon has the ledger open, and may be older code than this)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from accel_agent.cmd import daemon, output
from accel_agent.config import load as config_load

DESCRIPTION = (
    "Bring the mdev ledger (<state_dir>/ledger.sqlite3) to the schema this accel-agent "
    "uses. First a copy of the ledger as it is is written beside it with SQLite's backup "
    "API (ledger.sqlite3.v<OLD>-<UTC time>.bak, mode 0600), then the migration runs in one "
    "transaction: it is applied whole or not at all. A ledger already at this schema, or no "
    "ledger, is left alone. Refused while accel-agent runs (restart it instead: it upgrades "
    "its ledger the same way when it starts). Other accelctl commands never migrate the "
    "ledger: readers refuse an older schema and say to run this. To go back, stop the agent "
    "and put the backup in the ledger's place (docs/operations.md). "
    "Exit status: 0 upgraded or nothing to do, 1 refused or failed."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    ledger = subparsers.add_parser(
        "ledger",
        help="the mdev ledger itself: 'ledger upgrade' migrates it after a backup",
        description="Commands on the mdev ledger file itself.",
    )
    sub = ledger.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    upgrade = sub.add_parser(
        "upgrade",
        help="migrate the ledger to this agent's schema, keeping a backup copy",
        description=DESCRIPTION,
    )
    upgrade.add_argument("--json", action="store_true", help="the result as JSON")
    upgrade.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from accel_agent.devices.ledger import LEDGER_FILENAME, SCHEMA_VERSION, Ledger

    conf = config_load.load_config(args.config_file, args.config_dir, prog="accelctl")
    if daemon.runs(conf.api.socket_path):
        output.error(
            f"accel-agent is running (it serves {conf.api.socket_path}) and has the ledger "
            "open: restart it instead (it upgrades its ledger when it starts, after the same "
            "backup), or stop it and run 'accelctl ledger upgrade' again"
        )
        return output.EXIT_ERROR
    path = os.path.join(conf.state_dir, LEDGER_FILENAME)
    result: dict[str, Any] = {
        "ledger": path, "found": None, "schema": SCHEMA_VERSION, "upgraded": False, "backup": None
    }
    if not os.path.lexists(path):
        text = f"no mdev ledger at {path} (the agent has not run here): nothing to upgrade"
    else:
        with Ledger(conf.state_dir, upgrade=True) as book:
            result["found"] = book.found_schema
            result["upgraded"] = book.found_schema != SCHEMA_VERSION
            result["backup"] = str(book.backup_path) if book.backup_path else None
        if not result["upgraded"]:
            text = f"the mdev ledger {path} is at schema {SCHEMA_VERSION} already: nothing to do"
        else:
            text = (
                f"upgraded the mdev ledger {path} from schema {result['found']} to "
                f"{SCHEMA_VERSION}"
            )
            if result["backup"]:
                text += f"; the old one is kept at {result['backup']}"
    if args.json:
        output.emit_json(result)
    else:
        print(text)
    return output.EXIT_OK
