"""The helpers' lives: one guard per context, every call through it, and how
a helper is started and stopped.

Every privileged call goes through its context's :class:`~.guard.Guard`
(guard.py): a deadline of ``[DEFAULT] privileged_call_timeout`` plus what
the call itself may wait for in the helper; a helper that misses one or dies
is killed and started again.  A helper is started with oslo.privsep's
ROOTWRAP method: the command :func:`helper_command` builds (this
interpreter, ``-m accel_agent.privileged.helper``, the agent's config
files), unless the operator set ``[<section>] helper_command``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from oslo_config import cfg
from oslo_privsep import priv_context

from accel_agent.privileged import guard as guard_mod
from accel_agent.privileged.context import (
    CFG_SECTION,
    NET_CFG_SECTION,
    NVML_CFG_SECTION,
    _priv_net_pid,
    _priv_nvml_pid,
    _priv_sysfs_pid,
    net_admin,
    nvml_admin,
    sysfs_admin,
)
from accel_agent.privileged.wire import WireError, from_wire

# One guard per privsep context: every call has a deadline, a helper that
# misses one or dies is killed and started again.
_guards: dict[int, guard_mod.Guard] = {}
# [DEFAULT] privileged_call_timeout, as the agent runs with it (set_call_timeout).
_call_timeout = [guard_mod.DEFAULT_CALL_TIMEOUT]


def set_call_timeout(seconds: float) -> None:
    """The deadline of every privileged call from now on (start and reload)."""
    _call_timeout[0] = float(seconds)


def register_guard(
    context: priv_context.PrivContext, name: str, section: str, pid_entrypoint: Callable[..., int]
) -> guard_mod.Guard:
    guard = guard_mod.Guard(
        context,
        name,
        start=lambda: _start_raw(context, section),
        pid_entrypoint=pid_entrypoint,
        call_timeout=lambda: _call_timeout[0],
    )
    _guards[id(context)] = guard
    return guard


def guard_of(context: priv_context.PrivContext) -> guard_mod.Guard:
    return _guards[id(context)]


def guards() -> list[guard_mod.Guard]:
    return list(_guards.values())


def call(entrypoint: Callable[..., Any], *args: Any, wait: float = 0.0, **kwargs: Any) -> Any:
    """``entrypoint`` through its context's guard (a deadline of the call
    timeout plus ``wait``, what the call itself may wait for in the helper)."""
    context = getattr(entrypoint, priv_context._ENTRYPOINT_ATTR)
    try:
        return guard_of(context).call(entrypoint, *args, wait=wait, **kwargs)
    except WireError as wire:
        raise from_wire(wire) from None


# --- starting the daemons ----------------------------------------------------------


def helper_command(
    config_files: Sequence[str], config_dirs: Sequence[str] = (), as_root: bool | None = None
) -> str:
    """The command that starts privsep-helper with the agent's configuration.

    oslo.privsep appends ``--privsep_context`` and ``--privsep_sock_path``.
    The helper runs in this interpreter (not whatever ``privsep-helper`` is
    first on PATH) through accel_agent.privileged.helper, oslo.privsep's
    helper_main without eventlet's deprecation notice; ``sudo`` only when
    we are not root.
    """
    cmd = [sys.executable, "-m", "accel_agent.privileged.helper"]
    if as_root is None:
        as_root = os.geteuid() == 0
    if not as_root:
        cmd.insert(0, "sudo")
    for path in config_files:
        cmd += ["--config-file", os.path.abspath(path)]
    for path in config_dirs:
        cmd += ["--config-dir", os.path.abspath(path)]
    return shlex.join(cmd)


def start_context(
    context: priv_context.PrivContext,
    section: str,
    config_files: Sequence[str] | None = None,
    config_dirs: Sequence[str] | None = None,
) -> None:
    """Start one of the agent's privsep daemons now (ROOTWRAP method: exec
    privsep-helper), the same way for each context.

    Without arguments, the files CONF was parsed from are passed on.  An
    operator's ``[<section>] helper_command`` wins over ours.
    """
    _set_helper_command(section, config_files, config_dirs)
    guard_of(context).start()


def _set_helper_command(
    section: str, config_files: Sequence[str] | None, config_dirs: Sequence[str] | None
) -> None:
    if config_files is None:
        config_files = _conf_list("config_file")
    if config_dirs is None:
        config_dirs = _conf_list("config_dir")
    cfg.CONF.set_default("helper_command", helper_command(config_files, config_dirs), group=section)
    _commands_set.add(section)


# The sections whose helper command start_context set (else a first start by
# a call sets it from the files CONF was parsed from).
_commands_set: set[str] = set()


def _start_raw(context: priv_context.PrivContext, section: str) -> None:
    """What a guard runs to start its helper: oslo.privsep's start, with the
    command :func:`start_context` set (or, for a first start by a call, the
    files CONF was parsed from)."""
    if section not in _commands_set:
        _set_helper_command(section, None, None)
    context.start(priv_context.Method.ROOTWRAP)


def _conf_list(name: str) -> list[str]:
    try:
        return list(getattr(cfg.CONF, name) or [])
    except cfg.NoSuchOptError:
        return []


def start_privsep(
    config_files: Sequence[str] | None = None, config_dirs: Sequence[str] | None = None
) -> None:
    """Start the sysfs writer's daemon (no capability): :func:`start_context`."""
    start_context(sysfs_admin, CFG_SECTION, config_files, config_dirs)


def stop_privsep() -> None:
    """Tell the daemon to exit (EOF on its channel); killed if it lingers."""
    guard_of(sysfs_admin).stop()


def start_net_privsep(
    config_files: Sequence[str] | None = None, config_dirs: Sequence[str] | None = None
) -> None:
    """Start the CAP_NET_ADMIN daemon now (:func:`start_context`); an
    operator's ``[accel_agent_net_privileged] helper_command`` wins."""
    start_context(net_admin, NET_CFG_SECTION, config_files, config_dirs)


def ensure_net_privsep() -> None:
    """Nothing to do any more: the guard starts the daemon on the first call
    (with the command :func:`start_net_privsep` set, else from CONF's files)."""


def stop_net_privsep() -> None:
    guard_of(net_admin).stop()


register_guard(sysfs_admin, "sysfs", CFG_SECTION, _priv_sysfs_pid)
register_guard(net_admin, "net", NET_CFG_SECTION, _priv_net_pid)
# The NVML writer's helper starts on its first call, like the net one.
register_guard(nvml_admin, "nvml", NVML_CFG_SECTION, _priv_nvml_pid)
