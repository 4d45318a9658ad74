"""``accel-agent``: the daemon's entry point.

It refuses to start, with exactly the messages of ``accelctl check-config``,
when the configuration is invalid: a host that silently ignores a GPU is
worse than one whose agent does not start.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from accel_agent import exception
from accel_agent.cmd import common, output

LOG = logging.getLogger("accel_agent")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="accel-agent",
        description="Host agent that owns the mediated devices (vGPUs) of this KVM host.",
    )
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    parser.add_argument(
        "--check", action="store_true", help="validate the configuration and exit"
    )
    parser.add_argument(
        "--rescan-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="periodic rescan of sysfs (safety net behind udev events)",
    )
    return parser.parse_args(argv)


def startup_check(args: argparse.Namespace) -> bool:
    """Validate config against the host; print every error; True when fine."""
    try:
        conf = common.load_config(args.config_file, args.config_dir, prog="accel-agent")
    except exception.AccelAgentException as exc:
        output.error(exc.message)
        return False
    errors, warnings = common.validate(conf)
    for warning in warnings:
        LOG.warning("%s", warning)
    if errors:
        output.error("refusing to start: invalid configuration")
        for error in errors:
            output.error(error)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not startup_check(args):
        return 1
    if args.check:
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    from accel_agent.conf import CONF

    while not stop.is_set():
        state = common.host_state(CONF)
        inventory = state.inventory()
        LOG.info(
            "rescan: %d parent(s), %d mdev(s), %d provider(s)",
            len(state.snapshot.parents),
            len(state.snapshot.mdevs),
            len(inventory.providers),
        )
        stop.wait(args.rescan_interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
