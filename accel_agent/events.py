"""What makes the daemon rescan: kernel uevents, its own writes, a periodic timer.

* :class:`RescanScheduler` runs the rescan in one thread: at once (after a
  short debounce) when something asks for it, and every ``interval`` seconds
  regardless, as a safety net for events nobody announced (a FUSE-simulated
  tree, a lost uevent, an operator's manual write).
* :class:`UdevWatcher` listens to the real ``/sys``'s uevents with pyudev
  and asks for a rescan when an mdev appears or goes (subsystem ``mdev``) or
  a parent (un)registers with the mdev core (a ``change`` event carrying
  ``MDEV_STATE=registered|unregistered`` on the parent device).

Neither knows what a rescan does; the service wires them to
``AgentCore.rescan``.  Reasons are kept (``udev``, ``api``, ``periodic``,
``reload``) so that metrics show what drives the rescans.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

LOG = logging.getLogger(__name__)

PERIODIC = "periodic"
UDEV = "udev"
UDEV_CONTROL = "/run/udev/control"


class RescanScheduler:
    """Coalesces rescan requests; runs ``rescan(reasons)`` in :meth:`run`'s thread."""

    def __init__(
        self,
        rescan: Callable[[frozenset[str]], Any],
        interval: float,
        debounce: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rescan = rescan
        self._interval = float(interval)
        self._debounce = float(debounce)
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._first_request: float | None = None
        self._stopped = False
        self._last_run = clock()
        self._running = False
        self.runs = 0

    @property
    def interval(self) -> float:
        return self._interval

    def configure(self, interval: float, debounce: float) -> None:
        with self._cond:
            self._interval = float(interval)
            self._debounce = float(debounce)
            self._cond.notify_all()

    def request(self, reason: str) -> None:
        """Ask for a rescan soon; cheap and safe from any thread (not from a
        signal handler)."""
        with self._cond:
            if self._first_request is None:
                self._first_request = self._clock()
            self._pending.add(reason)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def busy(self) -> bool:
        """A rescan is running or requested: what a caller that wants the host
        left alone by the agent (the udev tests) waits out."""
        with self._cond:
            return self._running or bool(self._pending)

    def _next_batch(self) -> frozenset[str] | None:
        """Wait for a request (debounced) or the periodic deadline; None once stopped."""
        with self._cond:
            while not self._stopped and not self._pending:
                # Recomputed on every wake-up: configure() applies at once.
                remaining = self._last_run + self._interval - self._clock()
                if remaining <= 0:
                    return frozenset({PERIODIC})
                self._cond.wait(remaining)
            if self._stopped:
                return None
            # Let a burst finish: wait ``debounce`` after the first request.
            assert self._first_request is not None
            while not self._stopped:
                remaining = self._first_request + self._debounce - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._stopped:
                return None
            reasons = frozenset(self._pending)
            self._pending.clear()
            self._first_request = None
            self._running = True
            return reasons

    def run(self) -> None:
        self._last_run = self._clock()
        while True:
            reasons = self._next_batch()
            if reasons is None:
                return
            try:
                self._rescan(reasons)
            except Exception:  # the loop must survive a bad rescan
                LOG.exception("rescan failed")
            with self._cond:
                self.runs += 1
                self._running = False
            self._last_run = self._clock()


def is_relevant(device: Any) -> bool:
    """An mdev came or went, or a parent (un)registered with the mdev core."""
    if getattr(device, "subsystem", None) == "mdev":
        return True
    properties = getattr(device, "properties", None) or {}
    try:
        return bool(properties.get("MDEV_STATE"))
    except Exception:  # a device that vanished while we read it
        return False


class UdevWatcher:
    """pyudev monitor of the real /sys, feeding :meth:`handle`."""

    def __init__(self, on_event: Callable[[str], None]) -> None:
        self._on_event = on_event
        self._observer: Any = None
        self.events = 0
        self.source: str | None = None

    def handle(self, device: Any) -> None:
        """The monitor's callback (also fed synthetic events by tests)."""
        if not is_relevant(device):
            return
        self.events += 1
        LOG.debug(
            "uevent %s %s (%s)",
            getattr(device, "action", "?"),
            getattr(device, "sys_path", getattr(device, "sys_name", "?")),
            getattr(device, "subsystem", "?"),
        )
        self._on_event(UDEV)

    def start(self) -> bool:
        """Start listening; False (logged) when uevents cannot be had here."""
        try:
            import pyudev
        except ImportError:
            LOG.warning("pyudev is not installed: relying on the periodic rescan")
            return False
        # udevd re-broadcasts each event once its rules ran; without udevd
        # (containers, early boot) the kernel's own broadcast is all there is.
        self.source = "udev" if os.path.exists(UDEV_CONTROL) else "kernel"
        try:
            context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(context, source=self.source)
            # No filter_by: kernel-sourced messages are not filtered by libudev,
            # and parents are pci (or virtual) devices; is_relevant() decides.
            self._observer = pyudev.MonitorObserver(
                monitor, callback=self._safe_handle, name="accel-agent-udev"
            )
            self._observer.daemon = True
            self._observer.start()
        except (OSError, ValueError) as exc:
            LOG.warning("cannot listen to uevents (%s): relying on the periodic rescan", exc)
            self._observer = None
            return False
        LOG.info("listening to %s uevents for mdev changes", self.source)
        return True

    def _safe_handle(self, device: Any) -> None:
        try:
            self.handle(device)
        except Exception:
            LOG.exception("handling a uevent failed")

    def stop(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            try:
                observer.send_stop()
                observer.join(timeout=5)
            except Exception:
                LOG.debug("stopping the uevent observer failed", exc_info=True)

    @property
    def running(self) -> bool:
        return self._observer is not None


def wants_udev(sysfs_root: str, enabled: bool) -> bool:
    """uevents describe the real /sys only; a simulated tree has none."""
    return enabled and os.path.realpath(sysfs_root) == "/sys"


def reasons_text(reasons: Iterable[str]) -> str:
    return ", ".join(sorted(reasons))
