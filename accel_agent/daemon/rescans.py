"""A rescan, and the recovery's bookkeeping.

A rescan reads sysfs and the ledger; settles work a failed privileged helper
(or a crash of another process) left; re-creates recorded devices that
vanished while their parent is there; frees expired migration claims;
refreshes the metrics; wakes the Placement loop when the reported inventory
changed.  Once the agent is stopping (``interrupt_scans``), a rescan stops
at its next parent and changes nothing.

Every recovery the daemon runs (start-up, a rescan's, ``POST /v1/recover``)
goes through :meth:`Rescans.run_recover`, which keeps what health reports:
the last run, what it re-created, its error (logged once, not at every
rescan that meets it again).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from accel_agent import events, exception
from accel_agent.daemon import layout_in_use
from accel_agent.daemon.counts import (
    RecoveryView,
    RescanView,
    count_mdevs,
    mdev_infos,
    placement_signature,
)
from accel_agent.devices import layout
from accel_agent.devices.ledger import DeviceRecord, DeviceState
from accel_agent.reporting.metrics import AgentMetrics, ProviderSample
from accel_agent.sysfs.rescan import ScanStopped, interruptible

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.results import RecoveryReport
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LayoutView:
    """The standing layouts as the last converge left them (health), in
    devices/layout.py's own terms (layout.state_of)."""

    draining: tuple[str, ...] = ()
    # (GPU, what it lacks) where the layout is incomplete on a GPU of the host.
    short: tuple[tuple[str, layout.Short], ...] = ()
    # Configured GPUs not on the host (their VFs not enabled): after the
    # start-up's wait for them ([devices] standing_vf_wait), and at every
    # converge after it.
    missing_gpus: tuple[str, ...] = ()
    error: str | None = None
    # When the devices now draining started to (this process's clock);
    # None while nothing drains.
    draining_since: float | None = None
    # (type, GPU, devices held open) of the layout devices, counted by the
    # rescan after each converge (daemon/layout_in_use.py); None: not known
    # (/proc unreadable).
    in_use: layout_in_use.InUse | None = ()


def helper_guards() -> list:
    """The privileged helpers' guards, once accel_agent.privileged is loaded
    (a core built with a test writer never loads it: no helper to watch)."""
    import sys

    privileged = sys.modules.get("accel_agent.privileged")
    return privileged.guards() if privileged is not None else []


class Rescans:
    def __init__(
        self,
        devices: DeviceManager,
        metrics: AgentMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.devices = devices
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()  # the views
        self._rescan_lock = threading.Lock()  # one rescan at a time
        self.view = RescanView()
        self.recovery = RecoveryView()
        self._last_recover_error: str | None = None
        # The standing layouts' last converge (devices/layout.py), for health.
        self.layout: LayoutView = LayoutView()
        self._last_layout_error: str | None = None
        # Devices recovery found looking like ours while the ledger was missing.
        self._unrecorded: frozenset[str] = frozenset()
        # Wired by the core: the Placement loop is woken when the inventory changed.
        self.wake_placement: Callable[[], None] = lambda: None

    def now(self) -> float:
        """The clock the views are stamped with (health compares with it)."""
        return self._clock()

    def views(self) -> tuple[RescanView, RecoveryView]:
        with self._lock:
            return self.view, self.recovery

    # --- recovery ------------------------------------------------------------------------

    def run_recover(
        self,
        *,
        raise_config_errors: bool = False,
        raise_errors: bool = False,
        full_check: bool = False,
    ) -> RecoveryReport:
        from accel_agent.devices.results import RecoveryReport

        now = self._clock()
        try:
            report = self.devices.recover(full_check=full_check)
        except exception.AccelAgentException as exc:
            text = exc.message
            with self._lock:
                self.recovery = RecoveryView(at=now, error=text)
            self.metrics.error(type(exc).__name__)
            if text != self._last_recover_error:
                LOG.error("recovery failed: %s", text)
            else:
                LOG.debug("recovery failed again: %s", text)
            self._last_recover_error = text
            if raise_errors or (raise_config_errors and isinstance(exc, exception.ConfigErrors)):
                raise
            return RecoveryReport()
        self._last_recover_error = None
        self._unrecorded |= set(report.unrecorded)
        if report.recreated:
            self.metrics.recreated.inc(len(report.recreated))
            ledger = self.devices.ledger
            backends = [getattr(ledger.get(u), "backend", "") for u in report.recreated]
            LOG.info("recovery re-created %d %s: %s", len(report.recreated),
                     self.devices.device_kinds(backends), ", ".join(report.recreated))
        with self._lock:
            self.recovery = RecoveryView(at=now, recreated=tuple(report.recreated))
        return report

    # --- standing layouts ----------------------------------------------------------------

    def run_layout(self, missing_gpus: tuple[str, ...] = ()) -> LayoutView:
        """Converge the standing layouts; what is left is kept for health and
        the metrics.  ``missing_gpus``: configured GPUs the start-up waited
        for in vain, named whatever the converge could do (it names every
        configured GPU it does not find itself)."""
        if not layout.has_layouts(self.devices) and not missing_gpus:
            view = LayoutView()
        else:
            try:
                report = self.devices.converge_layout()
            except exception.AccelAgentException as exc:
                if exc.message != self._last_layout_error:
                    LOG.error("standing layout: converge failed: %s", exc.message)
                self._last_layout_error = exc.message
                self.metrics.error(type(exc).__name__)
                view = dataclasses.replace(self.layout, error=exc.message,
                                           missing_gpus=self.layout.missing_gpus or missing_gpus)
            else:
                self._last_layout_error = None
                view = LayoutView(
                    draining=tuple(report.draining),
                    short=tuple(sorted(report.short.items())),
                    missing_gpus=tuple(dict.fromkeys((*missing_gpus, *report.missing))),
                    error="; ".join(f"GPU {gpu}: {why}" for gpu, why in sorted(
                        report.failed.items())) or None,
                )
        return self._keep_layout(view)

    def _keep_layout(self, view: LayoutView) -> LayoutView:
        """``view`` for health and the gauges, with the last in-use count
        (until the rescan that follows counts again) and since when what
        drains has been draining."""
        with self._lock:
            since = self.layout.draining_since if self.layout.draining else None
            if view.draining and since is None:
                since = self._clock()
            view = dataclasses.replace(
                view, in_use=self.layout.in_use, draining_since=since if view.draining else None
            )
            self.layout = view
        self.metrics.set_layout(
            len(view.draining), len({gpu for gpu, _ in view.short} | set(view.missing_gpus))
        )
        return view

    def after_converge(self, records: list[DeviceRecord], snapshot: HostSnapshot) -> None:
        """What a rescan tells health and the metrics after its converge, from
        its own ledger read and scan: the layouts (:meth:`keep_state`) and
        the layout's devices a consumer holds open (:meth:`count_in_use`)."""
        self.keep_state(records, snapshot)
        self.count_in_use(records, snapshot)

    def keep_state(self, records: list[DeviceRecord], snapshot: HostSnapshot) -> None:
        """The layouts as ``records`` and ``snapshot`` show them
        (layout.state_of: the definition the listings use too)."""
        state = layout.state_of_records(snapshot, self.devices.policy, records,
                                        reasons=self.devices.mixed_reasons)
        self._keep_layout(dataclasses.replace(
            self.layout,
            draining=tuple(sorted(state.draining)),
            short=tuple(sorted(state.short.items())),
            missing_gpus=state.missing,
        ))

    def count_in_use(self, records: list[DeviceRecord], snapshot: HostSnapshot) -> None:
        """The layout's devices a consumer holds open, in health and the
        metrics: counted after each converge from the rescan's own ledger
        read and scan (daemon/layout_in_use.py)."""
        in_use = layout_in_use.read(self.devices, records, snapshot)
        with self._lock:
            self.layout = dataclasses.replace(self.layout, in_use=in_use)
        self.metrics.set_layout_in_use(
            None if in_use is None else layout_in_use.by_type(in_use)
        )

    # --- rescan --------------------------------------------------------------------------

    def rescan(self, reasons: Iterable[str] = ("periodic",)) -> RescanView:
        """One rescan; once the agent is stopping, it stops at its next parent
        and changes nothing (the last view is kept)."""
        try:
            with interruptible():
                return self.rescan_now(frozenset(reasons))
        except ScanStopped:
            LOG.info("rescan stopped: the agent is stopping")
            with self._lock:
                return self.view

    def rescan_now(self, reasons: frozenset[str]) -> RescanView:
        with self._rescan_lock:
            started = time.monotonic()
            for reason in reasons:
                self.metrics.rescans.labels(reason=reason).inc()
            failure: exception.AccelAgentException | None = None
            try:
                view = self._rescan_once(full=events.PERIODIC in reasons)
            except exception.AccelAgentException as exc:
                failure = exc
            if failure is not None:
                self.metrics.error(type(failure).__name__)
                # Outside the except clause: oslo.log would append the
                # exception to the line again.
                LOG.error("rescan failed: %s", failure.message)
                with self._lock:
                    self.view = RescanView(
                        at=self.view.at,
                        count=self.view.count,
                        counts=self.view.counts,
                        providers=self.view.providers,
                        inventory=self.view.inventory,
                        error=failure.message,
                    )
                    return self.view
            self.metrics.rescan_duration.observe(time.monotonic() - started)
            self.metrics.last_rescan.set(view.at or 0)
            LOG.debug(
                "rescan (%s): %s; %d provider(s)",
                events.reasons_text(reasons),
                ", ".join(f"{k} {v}" for k, v in view.counts.items() if v),
                view.providers,
            )
            return view

    @staticmethod
    def _missing(
        records: list[DeviceRecord], snapshot: HostSnapshot
    ) -> tuple[list[DeviceRecord], list[DeviceRecord]]:
        gone = [
            r for r in records if r.state is DeviceState.PRESENT and r.uuid not in snapshot.mdevs
        ]
        recoverable = [r for r in gone if r.parent in snapshot.parents]
        waiting = [r for r in gone if r.parent not in snapshot.parents]
        return recoverable, waiting

    def _settle_interrupted_work(self) -> None:
        """Run recovery when the ledger holds work no operation is doing any
        more: an intent or a half-done row that a failed privileged helper
        left (an operation in flight has one too; recovery then waits for its
        lock, finds it finished, and changes nothing).  A failed helper is
        started again first."""
        for guard in helper_guards():
            guard.ensure()
        ledger = self.devices.ledger
        if ledger.pending_intents() or ledger.unsettled():
            self.run_recover()

    def _records(self) -> list[DeviceRecord]:
        # A pool's VFs are not in the snapshot: left out here (their backend
        # and recovery account for them).
        return self.devices.scanned_records(self.devices.ledger.all())

    def _rescan_once(self, full: bool = False) -> RescanView:
        devices = self.devices
        self._settle_interrupted_work()
        # Ledger first: a row settled as present was created before it was
        # read, so only a concurrent remove can make it look missing, and
        # recover() re-checks under the manager's lock anyway.
        records = self._records()
        # The periodic rescan reads every counter and mdev again: the bound on
        # what no mdev change announces (accel_agent.sysfs.rescan).
        snapshot = devices.scan_full() if full else devices.scan()
        recoverable, waiting = self._missing(records, snapshot)
        if recoverable:
            # Look twice: an mdev removed by a release between our two reads
            # looks missing once; a vanished one stays missing.
            again, _ = self._missing(self._records(), devices.scan())
            gone = {r.uuid for r in again}
            recoverable = [r for r in recoverable if r.uuid in gone]
        if recoverable:
            LOG.warning(
                "recorded %s missing from sysfs: %s; recovering",
                devices.device_kinds(r.backend for r in recoverable),
                ", ".join(r.uuid for r in recoverable),
            )
            self.run_recover()
            records = self._records()
            snapshot = devices.scan()
            recoverable, waiting = self._missing(records, snapshot)
        if self._release_expired_claims():
            records = self._records()
        if self.layout != LayoutView() or layout.has_layouts(devices):
            self.run_layout()
            records = self._records()
            snapshot = devices.scan()
            self.after_converge(records, snapshot)
        return self._publish(records, snapshot, recoverable, waiting)

    def _publish(
        self,
        records: list[DeviceRecord],
        snapshot: HostSnapshot,
        recoverable: list[DeviceRecord],
        waiting: list[DeviceRecord],
    ) -> RescanView:
        """The new view and metrics; the Placement loop woken when what it
        reports changed."""
        counts = count_mdevs(records, snapshot)
        recorded = {r.uuid for r in records}
        unrecorded = tuple(
            sorted(u for u in self._unrecorded if u in snapshot.mdevs and u not in recorded)
        )
        free = {r.uuid for r in records if r.free and r.uuid in snapshot.mdevs}
        inventory = self.devices.reported_inventory(snapshot, free)
        self.metrics.set_mdev_counts(counts)
        self.metrics.set_mdevs(mdev_infos(records, snapshot))
        self.metrics.set_providers(
            ProviderSample(p.name, p.physical_gpu, p.device_type, p.resource_class, p.total, p.used)
            for p in inventory.providers
        )
        with self._lock:
            previous = self.view.inventory
            self.view = RescanView(
                at=self._clock(),
                count=self.view.count + 1,
                counts=counts,
                providers=len(inventory.providers),
                missing=tuple(r.uuid for r in recoverable),
                waiting=tuple(r.uuid for r in waiting),
                inventory=inventory,
                unrecorded=unrecorded,
            )
            view = self.view
        if previous is None or placement_signature(previous) != placement_signature(inventory):
            if previous is not None:
                LOG.info(
                    "inventory changed: %s",
                    ", ".join(f"{p.name} total {p.total}" for p in inventory.providers) or
                    "no provider",
                )
            self.wake_placement()
        return view

    def _release_expired_claims(self) -> list[str]:
        """Free expired live-migration claims (a cheap query when there are none)."""
        if not self.devices.ledger.expired_claims():
            return []
        released = list(self.devices.release_expired_claims())
        if released:
            LOG.warning("released %d expired migration claim(s): %s", len(released),
                        ", ".join(released))
        return released
