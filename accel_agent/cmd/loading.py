"""What an accelctl command loads: its configuration (``--sysfs-root``
applied, or refused for a command that writes) and, acting directly (no
daemon, or ``--offline``), the device manager.

The ledger (docs/design.md §5.2): a command acting directly opens it for writing
but never migrates it: a ledger of an older schema is refused, naming
``accelctl ledger upgrade`` (the daemon upgrades it at its start too).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from accel_agent import exception, wiring
from accel_agent.config import load as config_load


def load_config(args: argparse.Namespace) -> Any:
    """The agent's options from ``--config-file``/``--config-dir``, with
    ``--sysfs-root`` over ``[DEFAULT] sysfs_root``."""
    conf = config_load.load_config(args.config_file, args.config_dir, prog="accelctl")
    if args.sysfs_root:
        conf.set_override("sysfs_root", args.sysfs_root)
    return conf


def load_config_for_writes(args: argparse.Namespace) -> Any:
    """Mutating commands: the privileged helper reads sysfs_root from the
    config files, so a command-line override would write somewhere else."""
    if args.sysfs_root:
        raise exception.InvalidConfig(
            reason="--sysfs-root applies to read-only commands; set [DEFAULT] sysfs_root "
            "in the config file for commands that create or remove mdevs"
        )
    return load_config(args)


@contextlib.contextmanager
def offline_manager(conf: Any) -> Iterator[Any]:
    """The manager for a command acting directly (no daemon, or --offline):
    its ledger is never migrated here (LedgerSchemaOld names the command that
    upgrades it), and is closed when the command is done."""
    manager = wiring.build_manager(conf, upgrade_ledger=False)
    try:
        yield manager
    finally:
        manager.ledger.close()
