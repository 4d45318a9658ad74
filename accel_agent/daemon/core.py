"""The agent without threads: the API's backend (thread-safe), built once by
the daemon and in-process by tests.

It is composed, not a second copy of the device manager's surface: the API
calls the use cases on ``core.devices`` (the one
:class:`~accel_agent.devices.manager.DeviceManager`, whose lock serialises
every change); every change made through it asks for a rescan (the
manager's ``on_changed``).  The core adds what only the daemon has: the
listings' kept bodies, the rescans and the recovery's bookkeeping, the
reload, health, the Placement sync, the live-migration glue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from oslo_config import cfg

from accel_agent import wiring
from accel_agent.config import registry
from accel_agent.daemon import health as health_mod
from accel_agent.daemon import layout_wait, starting
from accel_agent.daemon.counts import RescanView, placement_signature
from accel_agent.daemon.listings import Listings
from accel_agent.daemon.reloads import ReloadOutcome, Reloads
from accel_agent.daemon.rescans import Rescans, helper_guards
from accel_agent.reporting.metrics import AgentMetrics
from accel_agent.sysfs.rescan import interruptible

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.results import Allocation, RecoveryReport
    from accel_agent.libvirt_xml.rewrite import DomainRewriteResult
    from accel_agent.reporting.placement import PlacementReporter

LOG = logging.getLogger(__name__)


class AgentCore:
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
        registry.register(conf)  # a core built by a test from its own ConfigOpts
        self.conf = conf
        self.metrics = metrics or AgentMetrics()
        self.devices = manager or wiring.build_manager(conf, writer=writer)
        self.devices.on_kept_in_use = lambda uuid: self.metrics.kept_in_use.inc()
        self.devices.on_changed = lambda: self.request_rescan("api")
        for guard in helper_guards():
            guard.on_event = self._helper_event
        if reporter is None:
            from accel_agent.reporting.placement import PlacementReporter

            reporter = PlacementReporter.from_conf(conf)
        self.reporter = reporter
        self.started_at = clock()
        # Where the daemon's start is (API answers meanwhile); never begun
        # for a core built without the daemon: ready at once.
        self.starting = starting.StartState(clock)
        self.listings = Listings(self.devices)
        self.rescans = Rescans(self.devices, self.metrics, clock)
        self.reloads = Reloads(self, clock)
        # Wired by AgentService; plain calls (no threads) by default.
        self.request_rescan: Callable[[str], None] = lambda reason: None
        self.metrics.set_placement(self.reporter.health())
        self.metrics.watch_health(self.health)  # accel_agent_healthy, read per scrape

    @property
    def host(self) -> str:
        return self.devices.host

    @property
    def qemu_globals(self) -> list[str]:
        """``[libvirt] qemu_globals``, read per call: a reload applies at once."""
        return list(self.conf.libvirt.qemu_globals)

    def _helper_event(self, helper: str, event: str) -> None:
        if event == "restart":
            self.metrics.helper_restarts.labels(helper=helper).inc()
        self.metrics.error("PrivilegedHelperUnavailable")
        # Work the failed helper left half-done is settled by the next rescan.
        self.request_rescan("helper")

    def close(self) -> None:
        self.devices.ledger.close()

    # --- start and stop -----------------------------------------------------------------

    def startup(self) -> RecoveryReport:
        """Check the ledger (SQLite's quick_check: a corrupt one raises
        LedgerCorrupt and the daemon refuses to start rather than allocate
        over it), recover (raises ConfigErrors when an assigned device's type
        is gone from the config), then a first rescan.  Each phase is told
        to :attr:`starting` (GET /v1/health while the daemon starts)."""
        phase = self.starting.enter
        phase(starting.LEDGER_CHECK)
        self.devices.ledger.verify()
        # SIGTERM stops start-up's scans between two parents (ScanStopped
        # reaches run(), which then stops without finishing the start).
        with interruptible():
            phase(starting.RECOVERY)
            report = self.rescans.run_recover(raise_config_errors=True)
            policy = self.devices.policy
            if any(t.standing > 0 for t in policy.types) or policy.gpu_layouts:
                # Before READY: a consumer ordered after the agent (nova-compute)
                # must never see a GPU without its standing layout.
                wait = float(self.conf.devices.standing_vf_wait)
                until = time.time() + wait
                waited, missing = layout_wait.wait_for_gpus(
                    self.devices, wait,
                    on_missing=lambda gpus: phase(starting.WAITING_FOR_VFS, gpus, until),
                )
                if waited:
                    # VFs came while the agent waited: recovery re-creates the
                    # recorded devices on them first (the same UUIDs and VFs).
                    phase(starting.RECOVERY)
                    self.rescans.run_recover()
                phase(starting.LAYOUT)
                self.rescans.run_layout(missing_gpus=missing)
            phase(starting.FIRST_SCAN)
            self.rescans.rescan_now(frozenset({"startup"}))
        phase(starting.SERVICES)
        return report

    def interrupt_scans(self) -> None:
        """SIGTERM: the scans of start-up and of the rescan thread stop at
        their next parent (a whole scan of a large host takes seconds, and
        minutes behind a slow FUSE tree); the API's short ones finish."""
        self.devices.interrupt_scans()

    # --- what the daemon adds to the use cases ------------------------------------------

    def health(self) -> dict[str, Any]:
        document = health_mod.health(self)
        phase = self.starting.current()
        if phase is not None:
            # Whatever else it says: the agent is not ready yet (no READY=1).
            document["status"] = "starting"
            document["starting"] = phase.to_dict()
        return document

    def rescan(self, reasons: Iterable[str] = ("periodic",)) -> RescanView:
        return self.rescans.rescan(reasons)

    def recover(self, check: bool = False) -> RecoveryReport:
        """``POST /v1/recover``: errors raised (to the caller), and health told."""
        return self.rescans.run_recover(
            raise_config_errors=True, raise_errors=True, full_check=check
        )

    def reload(self, new_conf: cfg.ConfigOpts) -> list[str]:
        return self.reloads.apply(new_conf)

    def request_reload(self) -> ReloadOutcome:
        return self.reloads.request()

    # --- Placement ------------------------------------------------------------------------

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
        inventory = self.rescans.views()[0].inventory
        if inventory is None or not reporter.enabled:
            return None
        result = reporter.sync(inventory, force=force)
        if result.attempted:
            self.metrics.placement_syncs.labels(result="ok" if result.ok else "failed").inc()
            if result.ok:
                self.synced_signature = placement_signature(inventory)
            else:
                self.metrics.error("PlacementSyncFailed")
        self.metrics.set_placement(reporter.health())
        return result

    # --- live migration (accel_agent.migration) ----------------------------------------

    def _destination(self) -> Any:
        from accel_agent.migration.destination import MigrationDestination

        return MigrationDestination.from_conf(self.conf, self.devices)

    def migration_claim(
        self, instance: str, mdevs: dict[str, str], source_versions: dict[str, Any] | None
    ) -> dict[str, Any]:
        destination = self._destination()
        mapping = destination.claim(instance, mdevs, source_versions)
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

        vfs = domain_vfs(xml, ManagerAgent(self.devices))
        return rewrite_for_destination(xml, mapping, pci_addresses, vfs)

    def migration_commit(self, instance: str) -> Allocation:
        return self._destination().commit(instance)

    def migration_abort(self, instance: str, remove: bool = False) -> list[str]:
        return self._destination().abort(instance, remove)
