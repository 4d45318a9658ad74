"""The daemon's logging: oslo.log's set-up at start, and what a reload changes.

oslo.log marks two options mutable, ``debug`` and ``log_config_append``, and
applies them from a hook that oslo.config runs when the *running*
ConfigOpts re-reads its files (``mutate_config_files``).  A reload of the
agent never mutates the running configuration: it reads the files into a
new ConfigOpts, checks it whole and switches to it, or refuses it and keeps
the old one (accel_agent.daemon.reloads).  So that hook never runs, and
:func:`apply_reload` does what it would: the root logger's level from
``debug`` (DEBUG or INFO, as oslo.log sets it), the logging configuration
file read again when ``log_config_append`` names one.  The other logging
options (the log file, journal, syslog, formats) take effect at the next
start; a reload that changes one says so in a note, as it does for
``[api] socket_path``.

``log_config_append`` names a file whose handlers oslo.log builds, and so
runs code, as root: a file that is not a regular one, or that someone other
than root could change, is refused (config.lint.named_file_errors, at the
start, in every reload's check and in ``check-config``); :func:`setup` and
:func:`apply_reload` check it again where it is used (a value whose
``$``-substitution only oslo.config resolves, a file changed since).

``use_journal = true`` needs the systemd Python bindings (``systemd-python``,
the ``journal`` extra); without them the daemon refuses to start saying so
(config/values.py checks the value), instead of oslo.log's traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from oslo_config import cfg

import accel_agent

PRODUCT = "accel-agent"
# Applied by a reload (oslo.log's mutable options).
RELOADED = ("debug", "log_config_append")


def log_config_problem(conf: cfg.ConfigOpts) -> str | None:
    """Why the file ``log_config_append`` names must not be loaded (no
    regular file, or one someone other than root could change); None when
    it may be, or when none is named."""
    from accel_agent.config import files as safe_files

    path = _value(conf, "log_config_append")
    if not path:
        return None
    what = "the logging configuration (log_config_append)"
    try:
        safe_files.require_regular(path, what)
    except safe_files.Refused as exc:
        return str(exc)
    problem = safe_files.trust_problem(path)
    return None if problem is None else safe_files.refusal(what, path, problem)


def setup(conf: cfg.ConfigOpts) -> None:
    """oslo.log's set-up for the daemon (after the values were checked);
    refuses the start when the logging configuration must not be loaded."""
    from oslo_log import log as oslo_logging

    problem = log_config_problem(conf)
    if problem is not None:
        # Before any logging exists: the one line on stderr, as every refusal.
        raise SystemExit(f"error: refusing to start: {problem}")
    oslo_logging.setup(conf, PRODUCT, version=accel_agent.__version__)


def _value(conf: cfg.ConfigOpts, name: str) -> Any:
    try:
        return conf[name]
    except (cfg.Error, ValueError):
        return None


def _logging_options(conf: cfg.ConfigOpts) -> list[str]:
    """The names of oslo.log's [DEFAULT] options registered on ``conf``."""
    from accel_agent.config.registry import oslo_log_opts

    return [
        opt.dest
        for group, opts in oslo_log_opts()
        if group in (None, "DEFAULT")
        for opt in opts
        if opt.dest in conf
    ]


def apply_reload(old: cfg.ConfigOpts, new: cfg.ConfigOpts) -> list[str]:
    """Apply ``new``'s ``debug`` and ``log_config_append`` (as oslo.log's
    mutate hook does); notes for the other logging options that changed."""
    notes = []
    if bool(_value(new, "debug")) != bool(_value(old, "debug")):
        # oslo.log's own rule (_refresh_root_level): DEBUG, or INFO.
        logging.getLogger().setLevel(logging.DEBUG if new.debug else logging.INFO)
    problem = log_config_problem(new)
    if problem is not None:
        notes.append(f"[DEFAULT] log_config_append: {problem}; the logging is unchanged")
    elif _value(new, "log_config_append"):
        from oslo_log import log as oslo_logging

        try:
            # With log_config_append, oslo.log's set-up reads that file again
            # when it changed since it was last read (and nothing else).
            oslo_logging.setup(new, PRODUCT, version=accel_agent.__version__)
        except oslo_logging.LogConfigError as exc:
            notes.append(f"[DEFAULT] log_config_append: {exc}; the logging is unchanged")
    for name in _logging_options(new):
        if name in RELOADED or name not in old:
            continue
        if _value(old, name) != _value(new, name):
            notes.append(f"[DEFAULT] {name} changed; it applies at the next restart")
    return notes
