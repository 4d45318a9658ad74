"""What can refuse the daemon's start, checked without starting it.

``accelctl check-config``, ``accel-agent --check`` (the unit's
``ExecStartPre``), the start itself and every reload run these checks through
:func:`accel_agent.config.check.check`, so that a configuration that passes the
check is one the start takes.  Each check calls the very function the start's
own action calls, so the two cannot disagree, and say the same words:

* another agent: the host-wide locks of the sysfs root and the state
  directory (``host_lock.held_locks``: the refusal of the start's first
  action, ``host_lock.take``, read from ``/proc/locks`` without locking);
* logging: ``log_config_append`` or the log file's directory
  (:func:`logging_problems`, which the start calls before oslo.log opens
  them);
* the API socket: its group (``api.server.socket_group_gid``, as
  ``bind_socket``) and its place (``api.server.socket_path_state``, as
  ``check_socket_path``): a directory anyone may write to, something that is
  not a socket in the way, another agent serving it;
* the privileged helper: the program of ``[accel_agent_privileged]
  helper_command`` (:func:`check_privileged_helper`, which the start calls
  before it starts the helper);
* Placement: its auth options (``build_adapter``, the loader
  ``PlacementReporter.from_conf`` calls; no request is sent);
* ``[metrics] listen``: bound and let go at once
  (``metrics_server.check_bind``, which the start's bind calls first);
* the ledger: SQLite's quick_check, read-only (``Ledger.verify``, as the
  start runs it);
* recovery: a device an instance holds that would get another owner
  (``devices.recovery.owner_refusals``, as recovery and a reload refuse it);
* mixed-size layouts: each GPU of a ``[gpu_layout_<name>]`` on this host
  holds its layout, asked of NVML (:func:`layout_fit`:
  ``devices.gpu_layout_fit``, whose planner the start's placement calls).

``running``: the pid of the agent that already runs with these places
(``check-config`` beside it, a reload inside it): its own socket and metrics
port are not in the way.  None before a start, where anything at those
places refuses it.  Which process is the running agent is read from the
socket (SO_PEERCRED), and whether a port is its own from its descriptors in
/proc; when those cannot be read (``check-config`` as another user) the port
counts as the agent's: a best effort, never a false refusal.  For the same
reason a check run by another user than root leaves out what only root can
try (a socket it may not connect to, a port below 1024).

A small module that imports the daemon's rooms only where a check needs them:
it is read by accelctl too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from typing import TYPE_CHECKING

from accel_agent import exception

if TYPE_CHECKING:
    from oslo_config import cfg

    from accel_agent.wiring import HostState

def start_problems(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    """The start's refusals that do not depend on the host's devices: the API
    socket, the privileged helper, Placement's auth, the metrics address.  An
    option whose value cannot be read was reported by the value check and is
    skipped here."""
    from oslo_config import cfg

    errors: list[str] = []
    for check in (
        _agent_locks, _logging, _api_socket, _privileged_helper, _placement_auth,
        _metrics_address,
    ):
        try:
            errors += check(conf, running)
        except (ValueError, cfg.Error):
            continue  # a value that cannot be read: named with its file and line already
    return errors


def serving_pid(socket_path: str) -> int | None:
    """The pid of the process serving the API at ``socket_path`` (the running
    agent), None when nobody does or the place cannot be read."""
    from accel_agent.api import server

    try:
        state, pid = server.socket_path_state(socket_path)
    except exception.AccelAgentException:
        return None
    return pid if state == "served" else None


def _agent_locks(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    """Another agent on this host (its lock of the sysfs root or the state
    directory, accel_agent/host_lock.py): what the start's first action
    refuses, with its words and the other agent's pid and config; the
    running agent's own locks are not in the way."""
    from accel_agent import host_lock

    return [
        held.message for pid, held in host_lock.held_locks(conf.sysfs_root, conf.state_dir)
        if pid != running
    ]


def _root() -> bool:
    """Whether this check runs as the agent does (root).  check-config run by
    another user cannot probe a socket or bind a port the agent can: it says
    nothing of those rather than refuse what the start takes."""
    return os.geteuid() == 0


# --- logging --------------------------------------------------------------------------


def logging_problems(conf: cfg.ConfigOpts) -> list[str]:
    """The files oslo.log opens at the start, which it would fail on with a
    traceback: ``[DEFAULT] log_config_append`` (a regular file; looked at,
    never loaded here: loading runs its handlers) or, without it, the log
    file's directory (``log_file``, ``log_dir``).  The start
    (cmd/agent.py) calls this before it sets logging up."""
    append = conf.log_config_append
    if append:
        try:
            found = os.stat(append)
        except OSError as exc:
            return [f"cannot read [DEFAULT] log_config_append {append}: {exc.strerror}"]
        if not stat.S_ISREG(found.st_mode):
            return [f"cannot read [DEFAULT] log_config_append {append}: not a regular file"]
        return []  # oslo.log reads only that file then, no log file of its own
    from oslo_log import log as oslo_log

    path = oslo_log._get_log_file_path(conf)  # the path oslo.log opens (log_dir/log_file)
    if not path:
        return []
    # Only its directory: the file's name may depend on the program's (log_dir alone).
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return [f"cannot open a log file in {directory} ([DEFAULT] log_file, log_dir): "
                "no such directory"]
    return []


def _logging(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    return logging_problems(conf)


# --- the API socket ------------------------------------------------------------------


def _api_socket(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    from accel_agent.api import server

    errors = []
    group = conf.api.socket_group
    if group:
        try:
            server.socket_group_gid(group)
        except exception.InvalidConfig as exc:
            errors.append(exc.message)
    path = os.path.abspath(conf.api.socket_path)
    directory = os.path.dirname(path)
    if not os.path.lexists(directory):
        # The start makes it (api.server.make_socket_dir) when its parent exists.
        unmakeable = server.socket_dir_unmakeable(path)
        return errors + ([unmakeable.message] if unmakeable is not None else [])
    try:
        if not _root() and os.path.lexists(path) and not os.access(path, os.W_OK):
            return errors  # cannot probe it as this user; the agent (root) can
        state, pid = server.socket_path_state(path)
    except exception.AccelAgentException as exc:
        return [*errors, exc.message]
    except OSError:
        return errors  # this user may not look there; the agent (root) may
    if state == "served" and (running is None or pid != running):
        errors.append(exception.AgentAlreadyRunning(path=path).message)
    return errors


# --- the privileged helper -----------------------------------------------------------


def helper_command_problem(conf: cfg.ConfigOpts) -> str | None:
    """Why ``[accel_agent_privileged] helper_command`` cannot start the helper
    (its program is not on this host), None when it can or is not set (the
    agent's own command: this interpreter)."""
    from oslo_config import cfg

    from accel_agent.privileged import CFG_SECTION

    try:
        command = conf[CFG_SECTION].helper_command
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        return None  # not registered (a reload's configuration): the running helper stays
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"[{CFG_SECTION}] helper_command {command!r}: {exc}"
    if not words or shutil.which(words[0]) is None:
        program = words[0] if words else ""
        return (f"[{CFG_SECTION}] helper_command {command!r}: no program {program!r} on this "
                "host (a path, or a name on PATH)")
    return None


def check_privileged_helper(conf: cfg.ConfigOpts) -> None:
    """The start's check before it starts the helper: AccelAgentException
    with :func:`helper_command_problem`'s words."""
    problem = helper_command_problem(conf)
    if problem is not None:
        raise exception.AccelAgentException(problem)


def privileged_helper_refusal(problem: str) -> str:
    """The start's message when the helper cannot be started (service.py)."""
    return f"cannot start the privileged helper (privsep-helper): {problem}"


def _privileged_helper(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    problem = helper_command_problem(conf)
    return [privileged_helper_refusal(problem)] if problem else []


# --- Placement -----------------------------------------------------------------------


def _placement_auth(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    from oslo_config import cfg

    try:
        enabled = conf.placement.enabled
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        return []  # [placement] not registered: not read by this configuration
    if not enabled:
        return []
    from accel_agent.reporting.placement.client import build_adapter

    try:
        build_adapter(conf)
    except exception.InvalidConfig as exc:
        return [exc.message]
    return []


# --- [metrics] listen ----------------------------------------------------------------


def _metrics_address(conf: cfg.ConfigOpts, running: int | None) -> list[str]:
    from accel_agent.config.types import parse_listen

    listen = parse_listen(conf.metrics.listen)
    if listen is None or (not _root() and listen.port < 1024):
        return []  # a privileged port: only the agent (root) can tell by binding it
    from accel_agent.reporting import metrics_server

    try:
        metrics_server.check_bind(listen, held_by=running)
    except exception.AccelAgentException as exc:
        return [exc.message]
    return []


# --- the ledger and recovery ---------------------------------------------------------


def verify_ledger(state_dir: str) -> None:
    """SQLite's quick_check of ``state_dir``'s ledger, read-only, as the start
    runs it: LedgerCorrupt naming the problems.  Nothing when there is none."""
    from accel_agent.devices import ledger

    if not os.path.exists(os.path.join(state_dir, ledger.LEDGER_FILENAME)):
        return
    with ledger.Ledger(state_dir, read_only=True) as book:
        book.verify()


def owner_problems(conf: cfg.ConfigOpts, state: HostState) -> list[str]:
    """What recovery (and a reload) would refuse in ``state``'s ledger under
    ``state``'s policy: a device an instance holds that would get another
    owner (devices.recovery.owner_refusals)."""
    from accel_agent.devices import recovery
    from accel_agent.devices.protocol import Existing

    records = state.ledger.records
    if not any(r.assigned for r in records):
        return []
    devices = Existing(state.snapshot, _outside_devices(conf))
    return [e.message for e in recovery.owner_refusals(records, state.policy, devices)]


def _outside_devices(conf: cfg.ConfigOpts) -> dict[str, dict[str, tuple[str, bool]]]:
    """The devices of every backend outside the host scan (a VF pool's VFs,
    an out-of-tree backend's), read from sysfs as the start's recovery sees
    them: {backend: {device: (its pool, in use)}}.  The backends are built
    as the start builds them (wiring.build_backends), writing nothing."""
    from accel_agent import wiring

    try:
        built = wiring.build_backends(conf)
    except exception.AccelAgentException:
        return {}  # a backend's configuration refused: an error of its own (config.check)
    return {
        name: dict(backend.outside_devices())
        for name, backend in built.items() if backend.outside_snapshot
    }


# --- mixed-size layouts --------------------------------------------------------------


def layout_fit(conf: cfg.ConfigOpts, state: HostState) -> tuple[list[str], list[str]]:
    """(errors, warnings): whether every GPU of every mixed-size layout on
    this host can hold it (mixed-size capable, its types supported, a plan
    of placements for every vGPU), asked of the NVML that serves
    ``sysfs_root`` (``nvml.for_sysfs_root``: the host's, or a simulated
    host's).  NVML not available: a warning saying the fit was not checked
    and why (devices/gpu_layout_fit.py)."""
    if not state.policy.gpu_layouts:
        return [], []
    from oslo_config import cfg

    from accel_agent import nvml
    from accel_agent.devices import gpu_layout_fit

    try:
        gpus = nvml.for_sysfs_root(conf.sysfs_root, conf)
    except (ValueError, cfg.Error):  # [nvml] unregistered or unreadable (named by step 2)
        gpus = nvml.for_sysfs_root(conf.sysfs_root)
    try:
        return gpu_layout_fit.layout_fit_problems(
            conf.sysfs_root, state.policy.gpu_layouts, gpus)
    finally:
        gpus.close()
