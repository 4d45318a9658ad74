"""A configuration reload (SIGHUP, ``accelctl reload``): checked whole, as a
start checks it, then applied under the manager's lock, or refused and the
running configuration kept.

Refused: whatever the start would refuse (config.check.check: a value the
daemon cannot use, named by file and line; a socket group, Placement auth or
metrics address it cannot have; a device an instance holds that would get
another owner: its parent another type or none, its type reported by Nova),
an option that needs a restart (``sysfs_root``, ``state_dir``,
``host``).  Options that change only at the next restart (the API socket
and its workers, the VF pools) are noted, not refused, once the start's
check passes them (a restart that would refuse them is no restart to defer
to).  Health and
``accel_agent_config_reloads_total`` say what the last reload did.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oslo_config import cfg

from accel_agent import exception
from accel_agent.config import check, load, registry
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.ledger import DeviceRecord
from accel_agent.devices.protocol import Existing

if TYPE_CHECKING:
    from accel_agent.daemon.core import AgentCore

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
    ("metrics", "listen"),
)


def _opt(conf: cfg.ConfigOpts, group: str, name: str) -> Any:
    return getattr(conf, name) if group == "DEFAULT" else getattr(conf[group], name)


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


def orphaned(
    assigned: Iterable[DeviceRecord], policy: policy_mod.DevicePolicy, devices: Existing
) -> list[str]:
    """Why ``policy`` would hand devices instances hold to another owner (their
    parent another type or none, their type reported by Nova): recovery's
    rule (:func:`accel_agent.devices.recovery.owner_refusals`), which the
    start and ``check-config`` apply too, in the same words."""
    from accel_agent.devices import recovery

    return [e.message for e in recovery.owner_refusals(assigned, policy, devices)]


def load_new_config(
    config_files: Sequence[str], config_dirs: Sequence[str]
) -> cfg.ConfigOpts:
    """A fresh ConfigOpts from the same files (never the running one), with
    every option the daemon reads registered (config/registry.py)."""
    new_conf = cfg.ConfigOpts()
    registry.register(new_conf)
    try:
        return load.load_config(
            list(config_files), list(config_dirs), prog="accel-agent", conf=new_conf
        )
    except exception.AccelAgentException as exc:
        raise exception.ReloadRefused(reason=exc.message) from None


def _domains(conf: cfg.ConfigOpts) -> Any:
    from accel_agent.devices import domains

    return domains.for_conf(conf)


class Reloads:
    """The reload of one core, and what health says of the last one."""

    def __init__(self, core: AgentCore, clock: Callable[[], float] = time.time) -> None:
        self._core = core
        self._clock = clock
        self._lock = threading.Lock()
        self.view = ReloadView(loaded_at=clock())
        # Wired by AgentService (the reload needs its files and scheduler).
        self.requested: Callable[[], ReloadOutcome] = _no_reload

    def current(self) -> ReloadView:
        with self._lock:
            return self.view

    def request(self) -> ReloadOutcome:
        """``POST /v1/reload``: as SIGHUP does; ReloadRefused (409) when refused."""
        outcome = self.requested()
        if not outcome.applied:
            raise exception.ReloadRefused(reason=outcome.reason or "see the agent's log")
        return outcome

    def failed(self, reason: str) -> None:
        """A reload that failed before it reached :meth:`apply` (the files
        could not be read or parsed, a value error, or a bug)."""
        self._core.metrics.reloads.labels(result="refused").inc()
        with self._lock:
            self.view = ReloadView(self.view.loaded_at, self._clock(), "refused", reason)

    def apply(self, new_conf: cfg.ConfigOpts) -> list[str]:
        """Apply ``new_conf`` (already parsed) or raise ReloadRefused, keeping
        the running configuration.  Returns notes for the log."""
        now = self._clock()
        metrics = self._core.metrics
        try:
            notes = self._apply(new_conf)
        except exception.ReloadRefused as exc:
            metrics.reloads.labels(result="refused").inc()
            with self._lock:
                self.view = ReloadView(self.view.loaded_at, now, "refused", refusal_reason(exc))
            raise
        metrics.reloads.labels(result="applied").inc()
        with self._lock:
            self.view = ReloadView(now, now, "applied", None)
        self._core.request_rescan("reload")
        return notes

    def _apply(self, new_conf: cfg.ConfigOpts) -> list[str]:
        core = self._core
        devices = core.devices
        # The start's own check, inside the running agent: its socket and
        # metrics port are its own, not in the way.
        errors, _warnings, _state = check.check(
            new_conf, ledger=devices.ledger, running=os.getpid()
        )
        if errors:
            raise exception.ReloadRefused(reason="; ".join(errors))
        for group, name in RESTART_OPTIONS:
            old, new = _opt(core.conf, group, name), _opt(new_conf, group, name)
            if old != new:
                raise exception.ReloadRefused(
                    reason=f"[{group}] {name} changed from {old!r} to {new!r}, which needs a "
                    "restart"
                )
        notes = [
            f"[{group}] {name} changed; it applies at the next restart"
            for group, name in RESTART_LATER
            if _opt(core.conf, group, name) != _opt(new_conf, group, name)
        ]
        from accel_agent.sriov.pools import build_pools

        # The check above refused a bad pool config; a changed one needs the
        # pool service rebuilt with its privileged writers: at the next start.
        if build_pools(new_conf) != build_pools(core.conf):
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

            reporter = PlacementReporter.from_conf(new_conf)
        except exception.AccelAgentException as exc:
            raise exception.ReloadRefused(reason=exc.message) from None
        # NOTE: the check and the switch happen under the manager's lock, so
        # that no allocation made with the old policy slips in between.
        with devices.locked():
            # The check judged the ledger above; this is the same rule
            # again under the lock, for what an allocation changed meanwhile.
            # The pools are the running ones (new ones apply at the next
            # start, and the check judged those).
            existing = Existing(devices.scan(), {
                name: backend.outside_devices()
                for name, backend in devices.backends.items() if backend.outside_snapshot
            })
            orphans = orphaned(devices.ledger.assigned(), policy, existing)
            if orphans:
                raise exception.ReloadRefused(reason="; ".join(orphans))
            devices.set_policy(policy)
            # Built here, not before: it sets the URI's [libvirt] call_timeout,
            # which a refused reload must leave as it was.
            devices.domains = _domains(new_conf)
            devices.define_mdevs = new_conf.libvirt.define_mdevs
            devices.remove_timeout = new_conf.remove_timeout
        core.conf = new_conf
        # What it knew of Placement, and its back-off, go on (reporter.carry_from).
        reporter.carry_from(core.reporter)
        core.reporter = reporter
        core.metrics.set_placement(reporter.health())
        return notes
