"""``accel-agent``: the daemon's entry point.

It refuses to start, with exactly the messages of ``accelctl check-config``,
when the configuration is invalid: a host that silently ignores a GPU is
worse than one whose agent does not start.  Then it recovers (sysfs and the
ledger agree again), serves the API on its unix socket and keeps the
inventory fresh (accel_agent.service).
"""

from __future__ import annotations

import signal
import sys

# SIGHUP's default action ends the process, and `systemctl reload` may send
# one right after the start (exit 129, the unit restarted).  So SIGHUP is
# blocked from the agent process's first statement, before the imports and
# the configuration's check, and unblocked by service.run once its handler
# is in place: a SIGHUP meanwhile waits, and is then one reload.  Only in the
# agent's own process (the console script, python -m): a program that merely
# imports this module (a test, the man page generator) keeps its signal mask,
# which its children would inherit.
if __name__ == "__main__" or sys.argv[0].rsplit("/", 1)[-1] == "accel-agent":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})

import argparse
import logging
from collections.abc import Sequence

from accel_agent import exception, wiring
from accel_agent.cmd import common, output

LOG = logging.getLogger("accel_agent")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="accel-agent",
        description="Host agent that owns the mediated devices (vGPUs) of this KVM host: "
        "validates its config (refusing to start on errors, with the messages of "
        "'accelctl check-config'), recovers the mdevs it recorded, then serves its API on "
        "[api] socket_path. SIGHUP reloads the config, SIGTERM stops after in-flight "
        "requests. Exit status: 0 stopped cleanly, 1 refused to start or failed.",
    )
    common.add_config_arguments(parser)
    common.add_version_argument(parser)
    parser.add_argument(
        "--check", action="store_true", help="validate the configuration and exit"
    )
    parser.add_argument(
        "--rescan-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="periodic rescan of sysfs (safety net behind udev events); overrides "
        "[DEFAULT] rescan_interval",
    )
    return parser.parse_args(argv)


def _register_daemon_opts() -> None:
    """Every option the daemon reads (oslo.log's, Placement's, ...), before
    its files are parsed (config/registry.py)."""
    from accel_agent.config import options, registry

    registry.register(options.CONF)


def _setup_logging() -> None:
    from accel_agent.config.options import CONF
    from accel_agent.daemon import logs

    logs.setup(CONF)


def _load_config(args: argparse.Namespace) -> list[str]:
    """Parse the files into the global CONF; the errors, when they cannot be."""
    from accel_agent.config.load import load_config

    try:
        load_config(args.config_file, args.config_dir, prog="accel-agent")
    except exception.AccelAgentException as exc:
        return [exc.message]
    return []


def startup_check(args: argparse.Namespace) -> bool:
    """Validate config against the host; print every error; True when fine.

    The check is config.check's, as check-config's; its first two steps
    (parse, every value) also run before it, because the logging set-up
    reads oslo.log's values and opens its files, and the check logs."""
    from accel_agent.config import startchecks, values
    from accel_agent.config.options import CONF

    conf = CONF
    errors = _load_config(args)
    # Before the logging set-up, which reads oslo.log's values and opens its
    # files (check-config says the same of them: config/startchecks.py).
    errors = errors or values.value_errors(conf)
    errors = errors or startchecks.logging_problems(conf)
    if errors:
        output.error("refusing to start: invalid configuration")
        for error in errors:
            output.error(error)
        return False
    _setup_logging()
    try:
        errors, warnings = _check(conf)
    except exception.LedgerError as exc:
        output.error(f"refusing to start: {exc.message}")
        return False
    for warning in warnings:
        LOG.warning("%s", warning)
    if errors:
        output.error("refusing to start: invalid configuration")
        for error in errors:
            output.error(error)
        return False
    return True


def _check(conf) -> tuple[list[str], list[str]]:
    """config.check.check, the start's own check (config/startchecks.py: the
    socket, the privileged helper, Placement's auth, the metrics address, the
    ledger's quick_check and what recovery would refuse), reading the ledger
    read-only (the daemon opens its own connection only after this one is
    closed).  A ledger of an older schema is the daemon's to upgrade when it
    opens it (after a backup copy): the check then runs without its rows, and
    what recovery refuses in them the start says itself, in the same words
    (devices.recovery.owner_refusals)."""
    from accel_agent.config.check import check
    from accel_agent.devices.ledger import LedgerSchemaOld

    try:
        errors, warnings, _state = check(conf)
        return errors, warnings
    except LedgerSchemaOld as exc:
        old = exc
    # Logged outside the except clause: oslo.log appends the exception being
    # handled to a WARNING, which would repeat the message.
    LOG.warning(
        "the mdev ledger %s has schema version %s: accel-agent upgrades it to %s when it "
        "starts, after a backup copy beside it",
        old.kwargs["path"], old.kwargs["found"], old.kwargs["supported"],
    )
    errors, warnings, _state = check(conf, ledger=wiring.LedgerView())
    return errors, warnings


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _register_daemon_opts()
    if not startup_check(args):
        return 1
    if args.check:
        return 0
    from accel_agent import service
    from accel_agent.config.options import CONF

    # The files actually parsed (the packaged default when none was given):
    # the privsep daemon and SIGHUP reloads read the same ones.
    files = list(CONF.config_file or args.config_file)
    dirs = list(CONF.config_dir or args.config_dir)
    return service.run(CONF, files, dirs, args.rescan_interval, report_error=output.error)


if __name__ == "__main__":
    sys.exit(main())
