"""The daemon: oslo.service (threading backend), the API, rescans, reloads.

Two layers:

* :class:`AgentCore` is the agent without threads: the one
  :class:`~accel_agent.devices.manager.DeviceManager` (every mutation goes through
  it and its lock), the rescan (sysfs + ledger -> inventory, metrics,
  recovery of vanished mdevs, expired claims), Placement sync, health, and
  config reload.  It is the API's backend; tests build it in-process.
* :class:`AgentService` is an ``oslo_service.service.Service`` whose thread
  group runs the API server (cheroot on the unix socket), the rescan
  scheduler, the Placement loop; plus the udev watcher.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from oslo_config import cfg

import accel_agent
from accel_agent import conf as agent_conf
from accel_agent import config_values, events, exception, wiring
from accel_agent.devices import inventory as inventory_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.reporting import placement_opts, views
from accel_agent.reporting.metrics import AgentMetrics, MdevInfo, ProviderSample
from accel_agent.sysfs.rescan import ScanStopped, interruptible

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.results import Allocation, Attachment, RecoveryReport, TakeoverPlan
    from accel_agent.libvirt_xml.devices import DeviceDescription
    from accel_agent.libvirt_xml.rewrite import DomainRewriteResult
    from accel_agent.reporting.placement import PlacementReporter
    from accel_agent.sysfs.model import HostSnapshot, Parent

LOG = logging.getLogger(__name__)

# Options read once at start: changing them needs a restart, so a reload
# that changes them is refused (the running agent would disagree with its
# privsep daemon, its ledger or its Placement subtree).
RESTART_OPTIONS = (("DEFAULT", "sysfs_root"), ("DEFAULT", "state_dir"), ("DEFAULT", "host"))
# Options whose change is logged and ignored until the next restart.
RESTART_LATER = (
    ("api", "socket_path"),
    ("api", "socket_group"),
    ("api", "threads"),
    ("api", "request_timeout"),
)


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC).isoformat()


def _opt(conf: cfg.ConfigOpts, group: str, name: str) -> Any:
    return getattr(conf, name) if group == "DEFAULT" else getattr(conf[group], name)


# --- the agent without threads -----------------------------------------------------------


@dataclass
class RescanView:
    """What the last rescan saw."""

    at: float | None = None
    count: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    providers: int = 0
    missing: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    error: str | None = None
    inventory: inventory_mod.Inventory | None = None
    # Owned-looking mdevs found while the ledger was missing, still unrecorded.
    unrecorded: tuple[str, ...] = ()


@dataclass
class RecoveryView:
    at: float | None = None
    recreated: tuple[str, ...] = ()
    error: str | None = None


@dataclass
class ReloadView:
    loaded_at: float
    at: float | None = None
    result: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ReloadOutcome:
    """What one reload did: applied (with notes for the operator) or refused."""

    applied: bool
    reason: str | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": "applied" if self.applied else "refused",
            "reason": self.reason,
            "notes": list(self.notes),
        }


def refusal_reason(exc: exception.ReloadRefused) -> str:
    """Why a reload was refused, without the "reload refused" preamble the
    exception's message adds (health and the API say that themselves)."""
    return str(exc.kwargs.get("reason") or exc.message)


def _no_reload() -> ReloadOutcome:
    raise exception.ReloadRefused(reason="this agent runs without its daemon's service loop")


def record_state(record: DeviceRecord, present: bool) -> str:
    """The ``state`` label of a recorded mdev (accel_agent_mdevs, _mdev_info)."""
    if record.state is not DeviceState.PRESENT or record.intent_id is not None:
        return "transient"
    if not present:
        return "missing"
    if record.owner_kind is OwnerKind.CLAIM:
        return "claimed"
    if record.owner is not None:
        return "assigned"
    return "free"


def count_mdevs(records: Iterable[DeviceRecord], snapshot: HostSnapshot) -> dict[str, int]:
    """The ``accel_agent_mdevs{state}`` gauge: every record and sysfs mdev once."""
    counts = dict.fromkeys(("assigned", "claimed", "free", "foreign", "missing", "transient"), 0)
    recorded = set()
    for record in records:
        recorded.add(record.uuid)
        counts[record_state(record, record.uuid in snapshot.mdevs)] += 1
    counts["foreign"] = sum(1 for uuid in snapshot.mdevs if uuid not in recorded)
    return counts


def mdev_infos(records: Iterable[DeviceRecord], snapshot: HostSnapshot) -> list[MdevInfo]:
    """One accel_agent_mdev_info series per mdev in sysfs (foreign ones too)."""
    by_uuid = {r.uuid: r for r in records}
    rows = []
    for mdev in snapshot.mdevs.values():
        record = by_uuid.get(mdev.uuid)
        parent = snapshot.parents.get(mdev.parent)
        rows.append(
            MdevInfo(
                uuid=mdev.uuid,
                instance=(record.owner or "") if record else "",
                parent=mdev.parent,
                physical_gpu=parent.physical_gpu if parent else mdev.parent,
                mdev_type=mdev.mdev_type or "",
                state=record_state(record, True) if record else "foreign",
            )
        )
    return rows


def _same_inputs(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """Snapshot and policy (the first two) by identity, the rest by value."""
    return (
        len(old) == len(new)
        and all(a is b for a, b in zip(old[:2], new[:2], strict=True))
        and old[2:] == new[2:]
    )


def placement_signature(inventory: inventory_mod.Inventory) -> tuple[Any, ...]:
    """What Placement is told: everything but ``used`` (allocations are Nova's)."""
    return tuple(
        (p.name, p.resource_class, p.total, p.traits, p.parent_provider)
        for p in inventory.providers
    )


class AgentCore:
    """The agent's state and operations; the API's backend (thread-safe)."""

    def __init__(
        self,
        conf: cfg.ConfigOpts,
        *,
        manager: DeviceManager | None = None,
        writer: Any = None,
        reporter: PlacementReporter | None = None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        placement_opts.register_opts(conf)
        self.conf = conf
        self.metrics = metrics or AgentMetrics()
        self._clock = clock
        self.manager = manager or wiring.build_manager(conf, writer=writer)
        self.manager.on_kept_in_use = lambda uuid: self.metrics.kept_in_use.inc()
        for guard in _helper_guards():
            guard.on_event = self._helper_event
        if reporter is None:
            from accel_agent.reporting.placement import PlacementReporter

            reporter = PlacementReporter.from_conf(conf, logger=LOG)
        self.reporter = reporter
        self.started_at = clock()
        self._state_lock = threading.Lock()
        self._rescan_lock = threading.Lock()
        self._rescan = RescanView()
        self._recovery = RecoveryView()
        self._reload_view = ReloadView(loaded_at=self.started_at)
        self._last_recover_error: str | None = None
        self._synced_signature: tuple[Any, ...] | None = None
        # Mdevs recovery found looking like ours while the ledger was missing.
        self._unrecorded: frozenset[str] = frozenset()
        # listing name -> (the inputs it was built from, its JSON body)
        self._listings: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        # Wired by AgentService; plain calls (no threads) by default.
        self.request_rescan: Callable[[str], None] = lambda reason: None
        self.wake_placement: Callable[[], None] = lambda: None
        self.reload_requested: Callable[[], ReloadOutcome] = _no_reload
        self.metrics.set_placement(self.reporter.health())

    @property
    def host(self) -> str:
        return self.manager.host

    def _helper_event(self, helper: str, event: str) -> None:
        if event == "restart":
            self.metrics.helper_restarts.labels(helper=helper).inc()
        self.metrics.error("PrivilegedHelperUnavailable")
        # Work the failed helper left half-done is settled by the next rescan.
        self.request_rescan("helper")

    @property
    def qemu_globals(self) -> list[str]:
        """``[libvirt] qemu_globals``, read per call: a reload applies at once."""
        return list(self.conf.libvirt.qemu_globals)

    def close(self) -> None:
        self.manager.ledger.close()

    # --- start ---------------------------------------------------------------------------

    def startup(self) -> RecoveryReport:
        """Check the ledger (SQLite's quick_check: a corrupt one raises
        LedgerCorrupt and the daemon refuses to start rather than allocate
        over it), recover (raises ConfigErrors when an assigned mdev's type is
        gone from the config), then a first rescan."""
        self.manager.ledger.verify()
        # SIGTERM stops start-up's scans between two parents (ScanStopped
        # reaches run(), which then stops without finishing the start).
        with interruptible():
            report = self._run_recover(raise_config_errors=True)
            self._rescan_now(frozenset({"startup"}))
        return report

    def interrupt_scans(self) -> None:
        """SIGTERM: the scans of start-up and of the rescan thread stop at
        their next parent (a whole scan of a large host takes seconds, and
        minutes behind a slow FUSE tree); the API's short ones finish."""
        self.manager.interrupt_scans()

    # --- reads (the API's GETs and accelctl's JSON) --------------------------------------
    #
    # Each listing is answered from a snapshot that re-read only what can
    # have changed (Rescanner.listing), and its encoded body is kept with
    # the inputs it was built from: when the snapshot object, the policy
    # object and the ledger's view are the same, so is the answer, and the
    # bytes are sent again without building or encoding anything.

    def types_json(self) -> bytes:
        snapshot = self.manager.scan_all()
        policy = self.manager.policy
        return self._listing_body(
            "types",
            (snapshot, policy),
            lambda: views.types_document(snapshot, policy, self.host),
        )

    def mdevs_json(self) -> bytes:
        # The ledger is read each time: accelctl --offline may write it
        # behind the daemon (serialised by the manager's file lock).
        records = self.manager.ledger.all()
        snapshot = self.manager.scan_all()
        policy = self.manager.policy
        owners = {r.uuid: r.owner for r in records}
        return self._listing_body(
            "mdevs",
            (snapshot, policy, owners),
            lambda: views.mdevs_document(snapshot, policy, self.host, owners, owners),
        )

    def inventory_json(self) -> bytes:
        snapshot = self.manager.scan_all()
        policy = self.manager.policy
        free = self.manager.free_uuids()
        return self._listing_body(
            "inventory",
            (snapshot, policy, free, self.manager.outside_state()),
            lambda: views.inventory_document(
                self.manager.reported_inventory(
                    snapshot, frozenset(u for u in free if u in snapshot.mdevs)
                )
            ),
        )

    def _listing_body(
        self, name: str, inputs: tuple[Any, ...], build: Callable[[], dict[str, Any]]
    ) -> bytes:
        """The encoded listing for ``inputs``: snapshot and policy compared by
        identity (a new object is a new state), anything else by value."""
        with self._state_lock:
            cached = self._listings.get(name)
        if cached is not None and _same_inputs(cached[0], inputs):
            return cached[1]
        body = views.encode(build())
        with self._state_lock:
            self._listings[name] = (inputs, body)
        return body

    def allocation(self, instance: str) -> Allocation:
        return self.manager.allocation(instance)

    def guest_devices(self, records: Iterable[DeviceRecord]) -> list[DeviceDescription]:
        """What a guest is given for each device (``domain-xml``)."""
        return self.manager.guest_devices(records)

    # --- mutations: all through the manager (its lock serialises them) -----------------

    def allocate(
        self,
        instance: str,
        count: int,
        parent: str | None = None,
        mdev_type: str | None = None,
    ) -> Allocation:
        try:
            allocation = self.manager.allocate(instance, count, parent, mdev_type)
        finally:
            self.request_rescan("api")
        self.metrics.allocations.inc()
        return allocation

    def release(self, instance: str, remove: bool = False) -> list[str]:
        try:
            released = self.manager.release(instance, remove=remove)
        finally:
            self.request_rescan("api")
        self.metrics.releases.labels(remove=str(bool(remove)).lower()).inc()
        return released

    def attachment(self, instance: str) -> Attachment:
        return self.manager.attachment(instance)

    def attach(self, instance: str, raw_requests: Any) -> Attachment:
        """Every accelerator of the instance in one call (DESIGN.md §11);
        the requests are checked whole before anything is prepared."""
        requests = wiring.attach_requests(self.manager, raw_requests)
        try:
            attachment = self.manager.attach(instance, requests)
        finally:
            self.request_rescan("api")
        self.metrics.allocations.inc()
        return attachment

    def adopt(self, uuid: str) -> DeviceRecord:
        try:
            return self.manager.adopt(uuid)
        finally:
            self.request_rescan("api")

    def takeover(self, adopt_unused: bool = False, dry_run: bool = False) -> TakeoverPlan:
        try:
            return self.manager.takeover(adopt_unused=adopt_unused, dry_run=dry_run)
        finally:
            if not dry_run:
                self.request_rescan("api")

    def recover(self, check: bool = False) -> RecoveryReport:
        try:
            return self._run_recover(
                raise_config_errors=True, raise_errors=True, full_check=check
            )
        finally:
            self.request_rescan("api")

    # --- live migration (accel_agent.migration) ----------------------------------------

    def _destination(self) -> Any:
        from accel_agent.migration.destination import MigrationDestination

        return MigrationDestination.from_conf(self.conf, self.manager)

    def migration_claim(
        self, instance: str, mdevs: dict[str, str], source_versions: dict[str, Any] | None
    ) -> dict[str, Any]:
        destination = self._destination()
        try:
            mapping = destination.claim(instance, mdevs, source_versions)
        finally:
            self.request_rescan("api")
        return {
            "instance": instance,
            "mapping": mapping,
            "pci_addresses": destination.pci_addresses(instance),
        }

    def migration_rewrite(
        self, xml: str, mapping: dict[str, str], pci_addresses: dict[str, str]
    ) -> DomainRewriteResult:
        """The source side's rewrite of ``xml`` for the destination's claim
        (``mapping``, ``pci_addresses``), this host's ledger saying which of the
        domain's PCI devices are the agent's VFs."""
        from accel_agent.migration.source import ManagerAgent, domain_vfs, rewrite_for_destination

        vfs = domain_vfs(xml, ManagerAgent(self.manager))
        return rewrite_for_destination(xml, mapping, pci_addresses, vfs)

    def migration_commit(self, instance: str) -> Allocation:
        try:
            return self._destination().commit(instance)
        finally:
            self.request_rescan("api")

    def migration_abort(self, instance: str, remove: bool = False) -> list[str]:
        try:
            return self._destination().abort(instance, remove)
        finally:
            self.request_rescan("api")

    def _run_recover(
        self,
        *,
        raise_config_errors: bool = False,
        raise_errors: bool = False,
        full_check: bool = False,
    ) -> RecoveryReport:
        from accel_agent.devices.results import RecoveryReport

        now = self._clock()
        try:
            report = self.manager.recover(full_check=full_check)
        except exception.AccelAgentException as exc:
            text = exc.message
            with self._state_lock:
                self._recovery = RecoveryView(at=now, error=text)
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
            LOG.info("recovery re-created %d mdev(s): %s", len(report.recreated),
                     ", ".join(report.recreated))
        with self._state_lock:
            self._recovery = RecoveryView(at=now, recreated=tuple(report.recreated))
        return report

    # --- rescan -----------------------------------------------------------------------

    def rescan(self, reasons: Iterable[str] = ("periodic",)) -> RescanView:
        """Scan sysfs and the ledger; re-create recorded mdevs that vanished
        (their parent is there); free expired claims; refresh the metrics;
        wake the Placement loop when the reported inventory changed.

        Once :meth:`interrupt_scans` was called (the agent is stopping), a
        rescan stops at its next parent and changes nothing."""
        try:
            with interruptible():
                return self._rescan_now(frozenset(reasons))
        except ScanStopped:
            LOG.info("rescan stopped: the agent is stopping")
            with self._state_lock:
                return self._rescan

    def _rescan_now(self, reasons: frozenset[str]) -> RescanView:
        with self._rescan_lock:
            started = time.monotonic()
            for reason in reasons:
                self.metrics.rescans.labels(reason=reason).inc()
            try:
                view = self._rescan_once(full=events.PERIODIC in reasons)
            except exception.AccelAgentException as exc:
                self.metrics.error(type(exc).__name__)
                LOG.error("rescan failed: %s", exc.message)
                with self._state_lock:
                    self._rescan = RescanView(
                        at=self._rescan.at,
                        count=self._rescan.count,
                        counts=self._rescan.counts,
                        providers=self._rescan.providers,
                        inventory=self._rescan.inventory,
                        error=exc.message,
                    )
                    return self._rescan
            self.metrics.rescan_duration.observe(time.monotonic() - started)
            self.metrics.last_rescan.set(view.at or 0)
            LOG.debug(
                "rescan (%s): %s; %d provider(s)",
                events.reasons_text(reasons),
                ", ".join(f"{k} {v}" for k, v in view.counts.items() if v),
                view.providers,
            )
            return view

    def _missing(
        self, records: list[DeviceRecord], snapshot: HostSnapshot
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
        for guard in _helper_guards():
            guard.ensure()
        ledger = self.manager.ledger
        if ledger.pending_intents() or ledger.unsettled():
            self._run_recover()

    def _rescan_once(self, full: bool = False) -> RescanView:
        self._settle_interrupted_work()
        # Ledger first: a row settled as present was created before it was
        # read, so only a concurrent remove can make it look missing, and
        # recover() re-checks under the manager's lock anyway.
        # A pool's VFs are not in the snapshot: left out here (their backend
        # and recovery account for them).
        records = self.manager.scanned_records(self.manager.ledger.all())
        # The periodic rescan reads every counter and mdev again: the bound on
        # what no mdev change announces (accel_agent.sysfs.rescan).
        snapshot = self.manager.scan_full() if full else self.manager.scan()
        recoverable, waiting = self._missing(records, snapshot)
        if recoverable:
            # Look twice: an mdev removed by a release between our two reads
            # looks missing once; a vanished one stays missing.
            again, _ = self._missing(
                self.manager.scanned_records(self.manager.ledger.all()), self.manager.scan()
            )
            gone = {r.uuid for r in again}
            recoverable = [r for r in recoverable if r.uuid in gone]
        if recoverable:
            LOG.warning(
                "recorded mdev(s) missing from sysfs: %s; recovering",
                ", ".join(r.uuid for r in recoverable),
            )
            self._run_recover()
            records = self.manager.scanned_records(self.manager.ledger.all())
            snapshot = self.manager.scan()
            recoverable, waiting = self._missing(records, snapshot)
        if self._release_expired_claims():
            records = self.manager.scanned_records(self.manager.ledger.all())
        counts = count_mdevs(records, snapshot)
        recorded = {r.uuid for r in records}
        unrecorded = tuple(
            sorted(u for u in self._unrecorded if u in snapshot.mdevs and u not in recorded)
        )
        free = {r.uuid for r in records if r.free and r.uuid in snapshot.mdevs}
        inventory = self.manager.reported_inventory(snapshot, free)
        self.metrics.set_mdev_counts(counts)
        self.metrics.set_mdevs(mdev_infos(records, snapshot))
        self.metrics.set_providers(
            ProviderSample(p.name, p.physical_gpu, p.mdev_type, p.resource_class, p.total, p.used)
            for p in inventory.providers
        )
        with self._state_lock:
            previous = self._rescan.inventory
            self._rescan = RescanView(
                at=self._clock(),
                count=self._rescan.count + 1,
                counts=counts,
                providers=len(inventory.providers),
                missing=tuple(r.uuid for r in recoverable),
                waiting=tuple(r.uuid for r in waiting),
                inventory=inventory,
                unrecorded=unrecorded,
            )
            view = self._rescan
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
        if not self.manager.ledger.expired_claims():
            return []
        released = list(self.manager.release_expired_claims())
        if released:
            LOG.warning("released %d expired migration claim(s): %s", len(released),
                        ", ".join(released))
        return released

    # --- Placement -------------------------------------------------------------------------

    def placement_delay(self) -> float | None:
        """Seconds until the Placement loop should sync again; None: only when woken."""
        reporter = self.reporter
        if not reporter.enabled:
            return None
        health = reporter.health()
        if health["state"] == "failing":
            return max(0.05, reporter.next_attempt_at - time.time())
        return float(reporter.sync_interval)

    def placement_sync(self, force: bool = False) -> Any:
        reporter = self.reporter
        with self._state_lock:
            inventory = self._rescan.inventory
        if inventory is None or not reporter.enabled:
            return None
        result = reporter.sync(inventory, force=force)
        if result.attempted:
            self.metrics.placement_syncs.labels(result="ok" if result.ok else "failed").inc()
            if result.ok:
                self._synced_signature = placement_signature(inventory)
            else:
                self.metrics.error("PlacementSyncFailed")
        self.metrics.set_placement(reporter.health())
        return result

    # --- reload ---------------------------------------------------------------------------

    def request_reload(self) -> ReloadOutcome:
        """``POST /v1/reload``: re-read the config files, as SIGHUP does;
        ReloadRefused (409) when the reload was refused."""
        outcome = self.reload_requested()
        if not outcome.applied:
            raise exception.ReloadRefused(reason=outcome.reason or "see the agent's log")
        return outcome

    def reload_failed(self, reason: str) -> None:
        """A reload that failed before it reached :meth:`reload` (the files
        could not be read or parsed, or a bug): health says so too."""
        self.metrics.reloads.labels(result="refused").inc()
        with self._state_lock:
            self._reload_view = ReloadView(
                self._reload_view.loaded_at, self._clock(), "refused", reason
            )

    def reload(self, new_conf: cfg.ConfigOpts) -> list[str]:
        """Apply ``new_conf`` (already parsed) or raise ReloadRefused, keeping
        the running configuration.  Returns notes for the log."""
        now = self._clock()
        try:
            notes = self._reload(new_conf)
        except exception.ReloadRefused as exc:
            self.metrics.reloads.labels(result="refused").inc()
            with self._state_lock:
                self._reload_view = ReloadView(
                    self._reload_view.loaded_at, now, "refused", refusal_reason(exc)
                )
            raise
        self.metrics.reloads.labels(result="applied").inc()
        with self._state_lock:
            self._reload_view = ReloadView(now, now, "applied", None)
        self.request_rescan("reload")
        return notes

    def _reload(self, new_conf: cfg.ConfigOpts) -> list[str]:
        placement_opts.register_opts(new_conf)
        errors, _warnings = wiring.validate(new_conf, ledger=self.manager.ledger)
        if errors:
            raise exception.ReloadRefused(reason="; ".join(errors))
        for group, name in RESTART_OPTIONS:
            old, new = _opt(self.conf, group, name), _opt(new_conf, group, name)
            if old != new:
                raise exception.ReloadRefused(
                    reason=f"[{group}] {name} changed from {old!r} to {new!r}, which needs a "
                    "restart"
                )
        notes = [
            f"[{group}] {name} changed; it applies at the next restart"
            for group, name in RESTART_LATER
            if _opt(self.conf, group, name) != _opt(new_conf, group, name)
        ]
        from accel_agent.sriov.pools import build_pools

        # validate() above refused a bad pool config; a changed one needs the
        # pool service rebuilt with its privileged writers: at the next start.
        if build_pools(new_conf) != build_pools(self.conf):
            notes.append(
                "the VF pools ([devices] enabled_vf_pools, [vf_pool_*]) changed; "
                "they apply at the next restart"
            )
        try:
            policy = policy_mod.build_policy(new_conf)
        except exception.ConfigErrors as exc:
            raise exception.ReloadRefused(
                reason="; ".join(e.message for e in exc.errors)
            ) from None
        try:
            from accel_agent.reporting.placement import PlacementReporter

            reporter = PlacementReporter.from_conf(new_conf, logger=LOG)
        except exception.AccelAgentException as exc:
            raise exception.ReloadRefused(reason=exc.message) from None
        domains = _domains(new_conf)
        # NOTE: the check and the switch happen under the manager's lock, so
        # that no allocation made with the old policy slips in between.
        with self.manager.locked():
            assigned = self.manager.scanned_records(self.manager.ledger.assigned())
            orphans = orphaned(assigned, policy, self.manager.scan().parents)
            if orphans:
                raise exception.ReloadRefused(reason="; ".join(orphans))
            self.manager.set_policy(policy)
            self.manager.domains = domains
            self.manager.remove_timeout = new_conf.remove_timeout
        self.conf = new_conf
        self.reporter = reporter
        self.metrics.set_placement(reporter.health())
        return notes

    # --- health -----------------------------------------------------------------------

    def _ledger_problems(self, rescan: RescanView) -> list[str]:
        """What keeps the ledger from recording the agent's work, now."""
        from accel_agent.devices.recovery import unrecorded_warning

        ledger = self.manager.ledger
        problems = []
        replaced = ledger.identity_problem()
        if replaced is not None:
            problems.append(
                f"the mdev ledger {ledger.path} was deleted or replaced while the agent had it "
                f"open ({replaced}): every change is refused; restart the agent"
            )
        if ledger.write_error is not None:
            problems.append(f"the mdev ledger {ledger.path} cannot be written: "
                            f"{ledger.write_error}")
        if _no_space_left(str(ledger.state_dir)):
            problems.append(f"no space left on the filesystem of {ledger.state_dir}: the mdev "
                            "ledger cannot record new work")
        if rescan.unrecorded:
            problems.append(unrecorded_warning(str(ledger.path), list(rescan.unrecorded)))
        return problems

    def health(self) -> dict[str, Any]:
        with self._state_lock:
            rescan, recovery, reload = self._rescan, self._recovery, self._reload_view
        reporting = self.reporter.health()
        problems: list[str] = []
        if reporting["state"] == "failing":
            problems.append(f"Placement sync failing: {reporting['last_error']}")
        if rescan.error:
            problems.append(f"last rescan failed: {rescan.error}")
        if recovery.error:
            problems.append(f"last recovery failed: {recovery.error}")
        if rescan.missing:
            problems.append(
                f"{len(rescan.missing)} recorded mdev(s) are missing from sysfs and could not "
                "be re-created"
            )
        if rescan.waiting:
            problems.append(
                f"{len(rescan.waiting)} recorded mdev(s) wait for their parent to come back"
            )
        if reload.result == "refused":
            problems.append(f"configuration reload refused: {reload.reason}")
        helpers = [guard.health() for guard in _helper_guards()]
        problems += [
            f"privileged helper {h.name} is {h.state}: {h.last_error or 'no answer yet'}"
            for h in helpers
            if not h.ok
        ]
        problems += self._ledger_problems(rescan)
        return {
            "status": "degraded" if problems else "ok",
            "version": accel_agent.__version__,
            "host": self.host,
            "pid": os.getpid(),
            "started_at": _iso(self.started_at),
            "last_rescan": _iso(rescan.at),
            "rescans": rescan.count,
            "mdevs": dict(rescan.counts),
            "providers": rescan.providers,
            "reporting": reporting,
            "recovery": {
                "last_run": _iso(recovery.at),
                "recreated": list(recovery.recreated),
                "error": recovery.error,
                "missing": list(rescan.missing),
                "waiting_for_parent": list(rescan.waiting),
            },
            "config": {
                "loaded_at": _iso(reload.loaded_at),
                "last_reload": _iso(reload.at),
                "last_reload_result": reload.result,
                "last_reload_error": reload.reason,
            },
            "privileged_helpers": {h.name: h.to_dict() for h in helpers},
            "problems": problems,
        }


def _helper_guards() -> list[Any]:
    """The privileged helpers' guards, once accel_agent.privileged is loaded
    (a core built with a test writer never loads it: no helper to watch)."""
    import sys

    privileged = sys.modules.get("accel_agent.privileged")
    return privileged.guards() if privileged is not None else []


def _no_space_left(directory: str) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    # f_bavail: what an unprivileged writer has; root may still use the reserve.
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) == 0


def orphaned(
    assigned: Iterable[DeviceRecord],
    policy: policy_mod.MdevPolicy,
    parents: Mapping[str, Parent] | None = None,
) -> list[str]:
    """Why ``policy`` would orphan assigned mdevs (their parent gets another
    type or none); ``parents``: the host's, so that a VF finds its GPU's type."""
    reasons = []
    for record in assigned:
        new_type = policy.type_for_name(record.parent, parents or {})
        if new_type != record.mdev_type:
            becomes = f"type {new_type}" if new_type else "no type"
            reasons.append(
                f"mdev {record.uuid} of {record.owner_kind or 'owner'} {record.owner} is "
                f"{record.mdev_type} on parent {record.parent}, which would get {becomes}"
            )
    return reasons


def _domains(conf: cfg.ConfigOpts) -> Any:
    from accel_agent.devices import domains

    uri = conf.libvirt.uri
    return domains.LibvirtDomains(uri) if uri else domains.NoDomains()


def load_new_config(
    config_files: Sequence[str], config_dirs: Sequence[str]
) -> cfg.ConfigOpts:
    """A fresh ConfigOpts from the same files (never the running one)."""
    new_conf = cfg.ConfigOpts()
    agent_conf.register_opts(new_conf)
    placement_opts.register_opts(new_conf)
    try:
        return wiring.load_config(
            list(config_files), list(config_dirs), prog="accel-agent", conf=new_conf
        )
    except exception.AccelAgentException as exc:
        raise exception.ReloadRefused(reason=exc.message) from None


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

    # --- life cycle ------------------------------------------------------------------

    def _interval(self, conf: cfg.ConfigOpts) -> float:
        return float(self._rescan_interval_override or conf.rescan_interval)

    def prepare(self) -> None:
        """Everything that may refuse to start, in the caller's thread: the
        privsep daemon, recovery, the socket.  Raises AccelAgentException."""
        from accel_agent.api.app import ApiApplication
        from accel_agent.api.server import ApiServer, bind_socket, socket_identity

        conf = self.conf
        # The socket first: refuse at once when another agent serves it or the
        # place is unsafe.  Clients that connect while recovery runs wait in
        # the listen backlog instead of falling back to direct mode.
        self._socket_path = conf.api.socket_path
        self._socket = bind_socket(self._socket_path, conf.api.socket_group or None)
        self._socket_identity = socket_identity(self._socket_path)
        # The privileged helper now, rather than failing on the first request.
        if self._writer is None:
            from accel_agent import privileged

            privileged.set_call_timeout(conf.privileged_call_timeout)
            if privileged.sysfs_admin.channel is None:
                try:
                    privileged.start_privsep(self.config_files, self.config_dirs)
                except Exception as exc:
                    message = getattr(exc, "message", None) or str(exc)
                    raise exception.AccelAgentException(
                        f"cannot start the privileged helper (privsep-helper): {message}"
                    ) from exc
                self._started_privsep = True
        core = AgentCore(conf, writer=self._writer)
        self.core = core
        if self._scans_interrupted:  # SIGTERM came while the core was built
            core.interrupt_scans()
        report = core.startup()
        if any(report.to_dict().values()):
            LOG.info(
                "start-up recovery: %s",
                "; ".join(f"{k} {len(v)}" for k, v in report.to_dict().items() if v),
            )
        self.server = ApiServer(
            self._socket,
            ApiApplication(core),
            threads=conf.api.threads,
            shutdown_timeout=conf.api.shutdown_timeout,
            request_timeout=conf.api.request_timeout,
        )
        self.scheduler = events.RescanScheduler(
            core.rescan, self._interval(conf), conf.event_debounce
        )
        core.request_rescan = self.scheduler.request
        core.wake_placement = self._placement_wake.set
        core.reload_requested = self._reload_from_api
        self.server.prepare()

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
        self.tg.add_thread(self._serve)
        self.tg.add_thread(self.scheduler.run)
        self.tg.add_thread(self._placement_loop)
        if events.wants_udev(self.conf.sysfs_root, self.conf.udev_events):
            self.udev = events.UdevWatcher(self.scheduler.request)
            self.udev.start()
        self._placement_wake.set()  # first sync right away
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
        try:
            new_conf = load_new_config(self.config_files, self.config_dirs)
            # Every value converted once, named by file and line: nothing read
            # from new_conf below can raise after this.
            bad = config_values.value_errors(new_conf)
            if bad:
                raise exception.ReloadRefused(reason="; ".join(bad))
            interval, debounce, call_timeout = self._service_settings(new_conf)
        except exception.ReloadRefused as exc:
            # Refused before core.reload saw it (unreadable files, a bad value).
            LOG.error("%s", exc.message)
            self.core.reload_failed(refusal_reason(exc))
            return ReloadOutcome(False, refusal_reason(exc))
        try:
            notes = self.core.reload(new_conf)  # records a refusal itself
        except exception.ReloadRefused as exc:
            LOG.error("%s", exc.message)
            return ReloadOutcome(False, refusal_reason(exc))
        except Exception as exc:  # a bug must not take the running agent down
            LOG.exception("configuration reload failed; the running configuration is kept")
            reason = (f"reload failed unexpectedly ({type(exc).__name__}); the running "
                      "configuration is kept; see the agent's log")
            self.core.reload_failed(reason)
            return ReloadOutcome(False, reason)
        for note in notes:
            LOG.warning("%s", note)
        self.conf = new_conf
        self.scheduler.configure(interval, debounce)
        if self._writer is None:
            from accel_agent import privileged

            privileged.set_call_timeout(call_timeout)
        self._placement_wake.set()
        LOG.info(
            "configuration reloaded: %d mdev type(s) enabled",
            len(self.core.manager.policy.types),
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
        if self.server is not None:
            self.server.stop()  # drains in-flight requests (shutdown_timeout)
        if self.udev is not None:
            self.udev.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        self._placement_wake.set()
        super().stop(graceful=True)
        self.close()

    def close(self) -> None:
        """Release what prepare() took (also after a failed prepare)."""
        self.close_socket()
        if self.core is not None:
            with contextlib.suppress(Exception):
                self.core.close()
        if self._started_privsep:
            self.stop_helpers()
            self._started_privsep = False

    def close_socket(self) -> None:
        from accel_agent.api.server import remove_socket

        if self._socket is not None:
            remove_socket(self._socket_path, self._socket, self._socket_identity)
            self._socket = None

    def stop_helpers(self) -> None:
        """Stop every privileged helper (the net one starts on first use):
        calls still waiting on one fail at once."""
        for guard in _helper_guards():
            with contextlib.suppress(Exception):
                guard.stop()


# --- systemd and signals -------------------------------------------------------------


def sd_notify(*fields: str) -> bool:
    """Send ``fields`` to systemd's notify socket (no-op outside systemd)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode("utf-8"))
        return True
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
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            LOG.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
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

    Signals are honoured from the first instant: start-up (recovery, the
    first scan: minutes on a host with thousands of parents) runs in a
    thread while this one waits for it or for a signal.  SIGTERM then ends
    the daemon within ``[api] shutdown_timeout`` whatever is stuck (see
    :class:`_StopDeadline`)."""
    from oslo_service import service as os_service

    raise_open_files_limit()

    wake_read, wake_write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(wake_write, False)
    for signum in _HANDLED:
        signal.signal(signum, lambda *_: None)  # the byte on the pipe is what counts
    previous_fd = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)

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
        if early is not None:  # SIGTERM/SIGINT while starting
            LOG.info("%s during start-up: stopping without finishing it",
                     signal.Signals(early).name)
            agent.interrupt_scans()
            _StopDeadline(agent.conf.api.shutdown_timeout, agent).start()
            agent.stop_helpers()
            agent.close_socket()
            starting.join(agent.conf.api.shutdown_timeout / 2)
            if starting.is_alive():
                _hard_exit(0)  # start-up cannot be interrupted; the ledger is crash-safe
            agent.close()
            return 0
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
        if starting.reload_pending:
            agent.reload_config()
        try:
            code = _signal_loop(agent, wake_read)
        except Exception:
            LOG.exception("the daemon's main loop failed; stopping")
            code = 1
        # From here the stop is bounded: whatever is stuck (a request in a
        # privileged call, a scan of a huge host), the process ends in time.
        _StopDeadline(agent.conf.api.shutdown_timeout, agent).start()
        sd_notify("STOPPING=1")
        launcher.stop()
        launcher.wait()
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
    """Wait until start-up ends (None) or SIGTERM/SIGINT arrives (its number).
    A SIGHUP meanwhile is applied once the agent is ready."""
    while True:
        data = os.read(wake_read, 64)
        for byte in data:
            if byte in (signal.SIGTERM, signal.SIGINT):
                return byte
            if byte == signal.SIGHUP:
                LOG.info("SIGHUP during start-up: the configuration is reloaded once ready")
                starting.reload_pending = True
            elif byte == _PREPARED:
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


def _signal_loop(agent: AgentService, wake_read: int) -> int:
    while True:
        data = os.read(wake_read, 64)  # PEP 475: retried after each signal handler
        for signum in data:
            if signum == signal.SIGHUP:
                sd_notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
                try:
                    agent.reload_config()  # never raises: a failure is a refused reload
                finally:
                    sd_notify("READY=1")
            elif signum in (signal.SIGTERM, signal.SIGINT):
                LOG.info("%s received", signal.Signals(signum).name)
                return 0
            elif signum == _FATAL:
                return 1
