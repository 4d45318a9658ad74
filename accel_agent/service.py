"""The daemon's threads, signals and systemd notifications.

:class:`AgentService` is an ``oslo_service.service.Service`` whose thread
group runs the API server (cheroot on the unix socket), the rescan
scheduler and the Placement loop, plus the udev watcher, around one
:class:`~accel_agent.daemon.core.AgentCore` (the agent without threads: the
device manager's use cases, the rescans, reload and health;
accel_agent.daemon says how it is cut).

Why not ``oslo_service.service.launch()``: with the threading backend it
either forks a worker under cotyledon (``ServiceLauncher``), whose master
reports ``READY=1`` before the worker has recovered anything or bound the
socket, and answers SIGHUP by restarting the worker, so a refused reload
could not keep the old configuration; or, with ``no_fork``, it turns SIGHUP
into an exception.  So :func:`run` uses the backend's plain ``Launcher``
(no fork, no signal handling of its own) and handles the signals itself:
they only write to a wake-up pipe that the main thread reads, so nothing
runs inside a signal handler.

Readiness (``Type=notify``): ``READY=1`` once the configuration is valid,
recovery ran and the socket listens; ``RELOADING=1``/``READY=1`` around a
SIGHUP; ``STOPPING=1`` on SIGTERM, which closes the socket, lets in-flight
requests finish (``[api] shutdown_timeout``) and exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from oslo_config import cfg

import accel_agent
from accel_agent import events, exception
from accel_agent.config import registry, startchecks, values
from accel_agent.daemon import logs
from accel_agent.daemon.core import AgentCore
from accel_agent.daemon.reloads import ReloadOutcome, load_new_config, refusal_reason
from accel_agent.daemon.rescans import helper_guards

LOG = logging.getLogger(__name__)


# --- the service ---------------------------------------------------------------------


def _service_base() -> type:
    from oslo_service import backend

    with warnings.catch_warnings():
        # futurist (the threading backend's timers) imports eventlet when it is
        # installed (oslo.privsep pulls it in), and eventlet announces its own
        # deprecation on import.  Nothing here uses eventlet: no monkey-patching.
        warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
        backend.init_backend(backend.BackendType.THREADING)
        from oslo_service import service as os_service

    return os_service.Service


class AgentService(_service_base()):  # type: ignore[misc]
    """oslo.service Service: API server, rescan scheduler, Placement loop, udev."""

    def __init__(
        self,
        conf: cfg.ConfigOpts,
        config_files: Sequence[str] = (),
        config_dirs: Sequence[str] = (),
        *,
        rescan_interval: float | None = None,
        writer: Any = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(threads=16)
        self.conf = conf
        self.config_files = list(config_files)
        self.config_dirs = list(config_dirs)
        self._rescan_interval_override = rescan_interval
        self._writer = writer
        self._on_fatal = on_fatal or (lambda reason: None)
        self.core: AgentCore | None = None
        self.server: Any = None
        self.metrics_http: Any = None  # [metrics] listen (reporting.metrics_server)
        self.scheduler: events.RescanScheduler | None = None
        self.udev: events.UdevWatcher | None = None
        self._socket: socket.socket | None = None
        self._socket_path = conf.api.socket_path
        self._socket_identity: tuple[int, int, int] | None = None
        self._placement_wake = threading.Event()
        self._stopping = threading.Event()
        self.started = threading.Event()
        self._stopped = False
        self._started_privsep = False
        self._reload_lock = threading.Lock()
        self._scans_interrupted = False
        self._locks: Any = None  # host_lock.AgentLocks, from prepare()
        self._serving: list[threading.Thread] = []  # the API and metrics servers

    # --- life cycle ------------------------------------------------------------------

    def _interval(self, conf: cfg.ConfigOpts) -> float:
        return float(self._rescan_interval_override or conf.rescan_interval)

    def prepare(self) -> None:
        """The start, in the caller's thread.  Raises AccelAgentException.

        Everything that can refuse the start is taken or checked before the
        host is touched (issue 33: a refused start changes nothing): the
        host-wide locks (one agent per host, accel_agent/host_lock.py), the API
        socket and ``[api] socket_group``, the ``[metrics] listen`` port,
        Placement's auth options, the privileged helper.  Only then does
        the core open the ledger (which may upgrade its schema), and the
        API serves health and the listings while recovery, the wait for a
        standing layout's VFs and the first scan run (daemon/starting.py)."""
        from accel_agent import host_lock
        from accel_agent.api.server import bind_socket, socket_identity
        from accel_agent.reporting import metrics_server
        from accel_agent.reporting.metrics import AgentMetrics
        from accel_agent.reporting.placement import PlacementReporter

        conf = self.conf
        self._locks = host_lock.take_agent_locks(
            conf.sysfs_root, conf.state_dir, self.config_files + self.config_dirs,
            conf.api.socket_path,
        )
        # Refuse at once when another agent serves the socket or the place is
        # unsafe.  Clients that connect before the API serves wait in the
        # listen backlog instead of falling back to direct mode.
        self._socket_path = conf.api.socket_path
        self._socket = bind_socket(self._socket_path, conf.api.socket_group or None)
        self._socket_identity = socket_identity(self._socket_path)
        metrics = AgentMetrics()
        self.metrics_http = metrics_server.from_conf(conf.metrics.listen, metrics)
        if self.metrics_http is not None:
            self.metrics_http.prepare()  # binds: a port in use refuses the start
        registry.register(conf)
        reporter = PlacementReporter.from_conf(conf)  # refuses missing auth options
        # The privileged helper now, rather than failing on the first request.
        if self._writer is None:
            from accel_agent import privileged

            privileged.set_call_timeout(conf.privileged_call_timeout)
            if privileged.sysfs_admin.channel is None:
                try:
                    startchecks.check_privileged_helper(conf)  # check-config's words
                    privileged.start_privsep(self.config_files, self.config_dirs)
                except Exception as exc:
                    message = getattr(exc, "message", None) or str(exc)
                    raise exception.AccelAgentException(
                        startchecks.privileged_helper_refusal(message)
                    ) from exc
                self._started_privsep = True
        core = AgentCore(conf, writer=self._writer, reporter=reporter, metrics=metrics)
        self.core = core
        core.starting.begin()
        self._serve_while_starting(core)
        if self._scans_interrupted:  # SIGTERM came while the core was built
            core.interrupt_scans()
        report = core.startup()
        if any(report.to_dict().values()):
            LOG.info(
                "start-up recovery: %s",
                "; ".join(f"{k} {len(v)}" for k, v in report.to_dict().items() if v),
            )
        self.scheduler = events.RescanScheduler(
            core.rescan, self._interval(conf), conf.event_debounce
        )
        core.request_rescan = self.scheduler.request
        core.rescans.wake_placement = self._placement_wake.set
        core.reloads.requested = self._reload_from_api

    def _serve_while_starting(self, core: AgentCore) -> None:
        """The API (and ``[metrics] listen``) serve from now on: health says
        ``starting``, the listings answer, the rest is 503 AgentStarting
        until :meth:`start` ends the start."""
        from accel_agent.api.app import ApiApplication
        from accel_agent.api.server import ApiServer

        conf = self.conf
        self.server = ApiServer(
            self._socket,
            ApiApplication(core),
            threads=conf.api.threads,
            shutdown_timeout=conf.api.shutdown_timeout,
            request_timeout=conf.api.request_timeout,
        )
        self.server.prepare()
        servers: list[tuple[str, Callable[[], None]]] = [("api-server", self._serve)]
        if self.metrics_http is not None:
            servers.append(("metrics-server", self.metrics_http.serve))
        for name, target in servers:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._serving.append(thread)

    def _reload_from_api(self) -> ReloadOutcome:
        """``POST /v1/reload`` (accelctl reload): as SIGHUP does, with systemd told."""
        sd_notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            return self.reload_config()
        finally:
            sd_notify("READY=1")

    def start(self) -> None:
        assert self.core is not None and self.scheduler is not None, "prepare() first"
        super().start()
        self.tg.add_thread(self.scheduler.run)
        self.tg.add_thread(self._placement_loop)
        if events.wants_udev(self.conf.sysfs_root, self.conf.udev_events):
            self.udev = events.UdevWatcher(self.scheduler.request)
            self.udev.start()
        self._placement_wake.set()  # first sync right away
        self.core.starting.end()  # the API takes changes from now on
        self.started.set()

    def _serve(self) -> None:
        try:
            self.server.serve()
        except Exception as exc:
            LOG.exception("the API server failed")
            if not self._stopping.is_set():
                self._on_fatal(f"API server failed: {exc}")

    def _placement_loop(self) -> None:
        core = self.core
        assert core is not None
        while not self._stopping.is_set():
            self._placement_wake.wait(core.placement_delay())
            self._placement_wake.clear()
            if self._stopping.is_set():
                return
            try:
                core.placement_sync()
            except Exception:  # the reporter never raises; a bug must not end the loop
                LOG.exception("Placement sync failed unexpectedly")

    def reload_config(self) -> ReloadOutcome:
        """SIGHUP, ``accelctl reload``: re-read the config files; apply, or
        refuse and keep running as is.  Never raises: whatever goes wrong is
        a refused reload (health degraded, counted, logged once)."""
        with self._reload_lock:
            return self._reload_config()

    def _reload_config(self) -> ReloadOutcome:
        assert self.core is not None and self.scheduler is not None
        LOG.info("reloading the configuration from %s",
                 ", ".join(self.config_files + self.config_dirs) or "the default files")
        refused: exception.ReloadRefused | None = None
        try:
            new_conf = load_new_config(self.config_files, self.config_dirs)
            # Every value converted once, named by file and line: nothing read
            # from new_conf below can raise after this.
            bad = values.value_errors(new_conf)
            if bad:
                raise exception.ReloadRefused(reason="; ".join(bad))
            interval, debounce, call_timeout = self._service_settings(new_conf)
        except exception.ReloadRefused as exc:
            refused = exc
        if refused is not None:
            # Refused before core.reload saw it (unreadable files, a bad value).
            # Logged here, outside the except clause: oslo.log appends the
            # exception being handled to a warning or error logged inside one,
            # which would say the refusal twice on one line.
            LOG.error("%s", refused.message)
            self.core.reloads.failed(refusal_reason(refused))
            return ReloadOutcome(False, refusal_reason(refused))
        try:
            notes = self.core.reload(new_conf)  # records a refusal itself
        except exception.ReloadRefused as exc:
            refused = exc
        except Exception as exc:  # a bug must not take the running agent down
            LOG.exception("configuration reload failed; the running configuration is kept")
            reason = (f"reload failed unexpectedly ({type(exc).__name__}); the running "
                      "configuration is kept; see the agent's log")
            self.core.reloads.failed(reason)
            return ReloadOutcome(False, reason)
        if refused is not None:
            LOG.error("%s", refused.message)
            return ReloadOutcome(False, refusal_reason(refused))
        old_conf = self.conf
        self.conf = new_conf
        # The logging options that apply on reload (debug, log_config_append),
        # before the notes, so that they are logged as the new settings say.
        notes = [*notes, *logs.apply_reload(old_conf, new_conf)]
        for note in notes:
            LOG.warning("%s", note)
        self.scheduler.configure(interval, debounce)
        if self._writer is None:
            from accel_agent import privileged

            privileged.set_call_timeout(call_timeout)
        self._placement_wake.set()
        LOG.info(
            "configuration reloaded: %d mdev type(s) enabled",
            len(self.core.devices.policy.types),
        )
        return ReloadOutcome(True, None, tuple(notes))

    def _service_settings(self, conf: cfg.ConfigOpts) -> tuple[float, float, float]:
        """The rescan interval, event debounce and privileged call timeout of
        ``conf``, read before anything is applied: oslo.config converts a
        value when it is first read, so a bad one must fail here, not after
        the switch."""
        try:
            return (
                self._interval(conf),
                float(conf.event_debounce),
                float(conf.privileged_call_timeout),
            )
        except (cfg.Error, ValueError) as exc:
            raise exception.ReloadRefused(reason=str(exc)) from None

    def interrupt_scans(self) -> None:
        """SIGTERM: the scans of start-up and of the rescan thread stop at
        their next parent, so that stopping does not wait for a whole scan."""
        self._scans_interrupted = True
        if self.core is not None:
            self.core.interrupt_scans()

    def stop(self, graceful: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self.interrupt_scans()
        LOG.info("stopping: no new connections, letting in-flight requests finish")
        self.stop_serving()  # drains in-flight requests (shutdown_timeout)
        if self.udev is not None:
            self.udev.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        self._placement_wake.set()
        super().stop(graceful=True)
        # A reload that runs (SIGHUP's or the API's) ends before the core
        # closes under it; the stop's deadline bounds the wait.
        with self._reload_lock:
            self.close()

    def stop_serving(self) -> None:
        """Stop the API and metrics servers (each lets its in-flight
        requests finish), whether or not the start completed."""
        for server in (self.server, self.metrics_http):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
        self.server = None
        self.metrics_http = None
        for thread in self._serving:
            thread.join(timeout=1.0)
        self._serving = []

    def close(self) -> None:
        """Release what prepare() took (also after a failed prepare); the
        host-wide locks last, once nothing of this agent acts any more."""
        self.stop_serving()
        self.close_socket()
        if self.core is not None:
            with contextlib.suppress(Exception):
                self.core.close()
        if self._started_privsep:
            self.stop_helpers()
            self._started_privsep = False
        if self._locks is not None:
            self._locks.release()
            self._locks = None

    def close_socket(self) -> None:
        from accel_agent.api.server import remove_socket

        if self._socket is not None:
            remove_socket(self._socket_path, self._socket, self._socket_identity)
            self._socket = None

    def stop_helpers(self) -> None:
        """Stop every privileged helper (the net one starts on first use):
        calls still waiting on one fail at once."""
        for guard in helper_guards():
            with contextlib.suppress(Exception):
                guard.stop()


# --- systemd and signals -------------------------------------------------------------


# How long a notification may wait for room on systemd's socket.  systemd
# drains it at once; a full queue means a manager that stopped reading, and
# the signal loop (which sends RELOADING=1/READY=1 around every SIGHUP) must
# not block on it forever: that would silently end all later reloads.
NOTIFY_TIMEOUT = 5.0


def sd_notify(*fields: str) -> bool:
    """Send ``fields`` to systemd's notify socket (no-op outside systemd).

    Never blocks longer than :data:`NOTIFY_TIMEOUT`: a notification that
    finds the manager's queue full that long is dropped with a warning."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(NOTIFY_TIMEOUT)
            sock.connect(address)
            sock.sendall("\n".join(fields).encode("utf-8"))
        return True
    except TimeoutError:
        LOG.warning("systemd's notify socket %s took no notification for %g s (is the "
                    "service manager reading it?); dropped: %s", address.lstrip("\0"),
                    NOTIFY_TIMEOUT, " ".join(fields))
        return False
    except OSError as exc:
        LOG.debug("systemd notification failed: %s", exc)
        return False


_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_FATAL = 0  # a byte on the wake-up pipe that is no signal number
_PREPARED = 255  # start-up ended (the thread that ran it says so on the pipe)


# Open files the daemon allows itself (soft limit, up to the hard one): every
# API connection is a descriptor, and systemd's default soft limit of 1024
# would let a thousand idle clients exhaust them.
OPEN_FILES = 65536


def raise_open_files_limit(wanted: int = OPEN_FILES) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards ``wanted``; returns the new one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        failure: Exception | None = None
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            failure = exc  # logged outside the except clause (see _reload_config)
        if failure is None:
            soft = target
        else:
            LOG.warning("cannot raise the open files limit from %d to %d: %s", soft, target,
                        failure)
    return soft


def run(
    conf: cfg.ConfigOpts,
    config_files: Sequence[str],
    config_dirs: Sequence[str],
    rescan_interval: float | None = None,
    report_error: Callable[[str], None] = lambda message: LOG.error("%s", message),
) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit code.

    ``report_error``: how a refusal to start reaches the operator (the
    console script passes its stderr printer: the CLI's error lines).

    Signals are honoured from the first instant: the console script blocks
    SIGHUP in its first statement (accel_agent.cmd.agent), and it is
    unblocked here once its handler and the wake-up pipe are in place, so a
    ``systemctl reload`` right after the start is a reload, never the end
    of the process.  Start-up (recovery, the first scan: minutes on a host
    with thousands of parents) runs in a thread while this one waits for it
    or for a signal.  SIGTERM then ends the daemon within ``[api]
    shutdown_timeout`` whatever is stuck (see :class:`_StopDeadline`), and
    goes ahead of any reload still waiting (:class:`_Reloads`)."""
    from oslo_service import service as os_service

    raise_open_files_limit()

    wake_read, wake_write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(wake_write, False)
    previous_fd = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    for signum in _HANDLED:
        signal.signal(signum, lambda *_: None)  # the byte on the pipe is what counts
    # A SIGHUP that came while it was blocked is delivered now, onto the pipe.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)

    def wake(byte: int) -> None:
        with contextlib.suppress(OSError):
            os.write(wake_write, bytes([byte]))

    def fatal(reason: str) -> None:
        LOG.error("%s", reason)
        wake(_FATAL)

    agent = AgentService(
        conf, config_files, config_dirs, rescan_interval=rescan_interval, on_fatal=fatal
    )
    try:
        starting = _Start(agent, lambda: wake(_PREPARED))
        starting.start()
        early = _wait_for_start(wake_read, starting)
        if early is not None:  # SIGTERM/SIGINT while starting, or the API server failed
            LOG.info("%s during start-up: stopping without finishing it",
                     signal.Signals(early).name if early != _FATAL else "a failure")
            agent.interrupt_scans()
            _StopDeadline(agent.conf.api.shutdown_timeout, agent).start()
            agent.stop_helpers()
            agent.stop_serving()
            agent.close_socket()
            starting.join(agent.conf.api.shutdown_timeout / 2)
            if starting.is_alive():
                _hard_exit(0 if early != _FATAL else 1)  # the ledger is crash-safe
            agent.close()
            return 0 if early != _FATAL else 1
        if starting.error is not None:
            return _refused_to_start(agent, starting.error, report_error)
        launcher = os_service.Launcher(conf, restart_method="mutate")
        launcher.launch_service(agent)
        if not agent.started.wait(60):
            report_error("the service did not start")
            launcher.stop()
            return 1
        socket_path = conf.api.socket_path
        sd_notify("READY=1", f"STATUS=serving the API on {socket_path}", f"MAINPID={os.getpid()}")
        LOG.info("accel-agent %s ready: API on %s, pid %d", accel_agent.__version__,
                 socket_path, os.getpid())
        reloads = _Reloads(agent)
        reloads.start()
        if starting.reload_pending:
            reloads.request()
        try:
            code = _signal_loop(agent, wake_read, reloads)
        except Exception:
            LOG.exception("the daemon's main loop failed; stopping")
            code = 1
        # From here the stop is bounded: whatever is stuck (a request in a
        # privileged call, a scan of a huge host, a reload), the process ends
        # in time.  A reload that waited is not run.
        reloads.close()
        _StopDeadline(agent.conf.api.shutdown_timeout, agent).start()
        sd_notify("STOPPING=1")
        launcher.stop()
        launcher.wait()
        reloads.join()  # the one running, if any: within the deadline
        LOG.info("accel-agent stopped")
        return code
    finally:
        signal.set_wakeup_fd(previous_fd)
        os.close(wake_read)
        os.close(wake_write)


class _Start(threading.Thread):
    """``agent.prepare()`` (privileged helper, recovery, first scan, socket)
    in a thread of its own, so that the main thread keeps answering signals."""

    def __init__(self, agent: AgentService, done: Callable[[], None]) -> None:
        super().__init__(name="start-up", daemon=True)
        self._agent = agent
        self._done = done
        self.error: BaseException | None = None
        self.reload_pending = False

    def run(self) -> None:
        try:
            self._agent.prepare()
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self._done()


def _wait_for_start(wake_read: int, starting: _Start) -> int | None:
    """Wait until start-up ends (None) or SIGTERM/SIGINT arrives (its number;
    _FATAL when the API server failed).  SIGHUPs meanwhile, even one read
    together with the end of start-up, are one reload once the agent is ready."""
    while True:
        data = os.read(wake_read, _READ_SIZE)
        for byte in data:
            if byte in (signal.SIGTERM, signal.SIGINT, _FATAL):
                return byte
        if signal.SIGHUP in data:
            LOG.info("SIGHUP during start-up: the configuration is reloaded once ready")
            starting.reload_pending = True
        if _PREPARED in data:
            starting.join()
            return None


def _refused_to_start(
    agent: AgentService, error: BaseException, report_error: Callable[[str], None]
) -> int:
    if isinstance(error, exception.ConfigErrors):
        report_error("refusing to start: recovery needs a configuration change")
        for item in error.errors:
            report_error(item.message)
    elif isinstance(error, exception.AccelAgentException):
        report_error(error.message)
    else:
        LOG.error("start-up failed", exc_info=error)
        report_error(f"start-up failed: {error!r}")
    agent.close()
    return 1


class _StopDeadline(threading.Thread):
    """SIGTERM's promise: the process ends within ``shutdown_timeout``.

    In-flight requests get most of it to finish; at 80 % the privileged
    helpers are stopped, so that a request stuck in a privileged call fails
    (503) instead of holding the stop; at 100 % the process exits whatever
    still runs.  The ledger is crash-safe, so the hard exit loses nothing
    that was acknowledged: what was in flight is settled at the next start."""

    def __init__(self, timeout: float, agent: AgentService) -> None:
        super().__init__(name="stop-deadline", daemon=True)
        self._timeout = max(1.0, float(timeout))
        self._agent = agent

    def run(self) -> None:
        time.sleep(0.8 * self._timeout)
        LOG.warning("still stopping after %.0f s: stopping the privileged helpers",
                    0.8 * self._timeout)
        self._agent.stop_helpers()
        time.sleep(0.2 * self._timeout)
        LOG.error("accel-agent did not stop within [api] shutdown_timeout (%g s); exiting "
                  "now (the ledger settles what was in flight at the next start)",
                  self._timeout)
        _hard_exit(1)


def _hard_exit(code: int) -> None:
    """End the process now, threads and all, after the logs are out."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)


class _Reloads(threading.Thread):
    """SIGHUP's reloads, in a thread of their own, coalesced.

    A reload asked for while one runs, or while one already waits, adds
    nothing: the one that waits reads the files as they are when it runs.
    So a burst of SIGHUPs is at most two reloads (the one running and one
    after it), never a queue; and the main thread, which only asks, is
    free to act on SIGTERM at once (:func:`_signal_loop`)."""

    def __init__(self, agent: Any) -> None:
        super().__init__(name="sighup-reloads", daemon=True)
        self._agent = agent
        self._changed = threading.Condition()
        self._wanted = False
        self._running = False
        self._closed = False
        self.runs = 0  # reloads run (tests)

    @property
    def busy(self) -> bool:
        """A reload runs or waits."""
        with self._changed:
            return self._wanted or self._running

    def request(self) -> None:
        with self._changed:
            if self._closed:
                return
            if self._running and not self._wanted:
                LOG.info("SIGHUP while a reload runs: one more reload follows it (more "
                         "SIGHUPs meanwhile are that same one)")
            self._wanted = True
            self._changed.notify()

    def close(self) -> None:
        """No reload starts any more (one that runs finishes)."""
        with self._changed:
            self._closed = True
            self._changed.notify()

    def run(self) -> None:
        while True:
            with self._changed:
                while not self._wanted and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                self._wanted = False
                self._running = True
            sd_notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
            try:
                self._agent.reload_config()  # never raises: a failure is a refused reload
            except Exception:  # a bug must not end the reloads
                LOG.exception("configuration reload failed unexpectedly")
            finally:
                sd_notify("READY=1")
                with self._changed:
                    self.runs += 1
                    self._running = False


# Bytes read from the wake-up pipe at once: every signal that queued up is
# seen in one read, so that a SIGTERM behind reloads is not left waiting.
_READ_SIZE = 4096


def _signal_loop(agent: Any, wake_read: int, reloads: _Reloads | None = None) -> int:
    """Until SIGTERM/SIGINT (0) or a fatal failure (1).  SIGHUP asks
    ``reloads`` for a reload (coalesced); a SIGTERM read with SIGHUPs
    wins over them."""
    own = reloads is None
    if reloads is None:
        reloads = _Reloads(agent)
        reloads.start()
    try:
        while True:
            data = os.read(wake_read, _READ_SIZE)  # PEP 475: retried after each handler
            for signum in (signal.SIGTERM, signal.SIGINT):
                if signum in data:
                    LOG.info("%s received", signal.Signals(signum).name)
                    return 0
            if _FATAL in data:
                return 1
            if signal.SIGHUP in data:
                reloads.request()
    finally:
        if own:
            reloads.close()
