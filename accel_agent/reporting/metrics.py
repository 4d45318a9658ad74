"""Prometheus metrics of the daemon, served by ``GET /metrics``.

One :class:`AgentMetrics` per daemon, with its own ``CollectorRegistry`` (not
prometheus-client's global one), so that tests can build several agents in
one process and no library's default collectors leak into our output.

Label values are bounded: error codes are exception class names, routes are
the API's path templates (``/v1/instances/{id}/allocation``, never the id),
mdev states and sync states are fixed sets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
)
from prometheus_client.exposition import generate_latest

PREFIX = "accel_agent"
# The classic text format every Prometheus understands (generate_latest writes it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MDEV_STATES = ("assigned", "claimed", "free", "foreign", "missing", "transient")
SYNC_STATES = ("disabled", "ok", "failing")
# Local calls over a unix socket: most answer in milliseconds, a create or a
# remove through privsep in tens, a remove blocked by a VM in seconds.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class AgentMetrics:
    """Every metric of the agent; thread-safe (prometheus-client is)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.allocations = Counter(
            f"{PREFIX}_allocations",
            "Successful allocate requests (an idempotent repeat counts again).",
            registry=r,
        )
        self.releases = Counter(
            f"{PREFIX}_releases",
            "Successful release requests, by whether the mdevs were removed.",
            ["remove"],
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Errors answered or logged, by error code (the exception class name).",
            ["code"],
            registry=r,
        )
        self.request_latency = Histogram(
            f"{PREFIX}_api_request_duration_seconds",
            "API request latency, by method, route template and status.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.mdevs = Gauge(
            f"{PREFIX}_mdevs",
            "Mediated devices at the last rescan, by state: assigned (to an instance), "
            "claimed (migration claim), free (owned, reusable), foreign (not the agent's), "
            "missing (recorded but absent from sysfs), transient (being created/removed).",
            ["state"],
            registry=r,
        )
        self.providers = Gauge(
            f"{PREFIX}_providers",
            "Resource providers (physical GPUs with a configured type and capacity).",
            registry=r,
        )
        self.capacity = Gauge(
            f"{PREFIX}_provider_capacity",
            "Inventory total and used per provider at the last rescan.",
            ["provider", "kind"],
            registry=r,
        )
        self.rescans = Counter(
            f"{PREFIX}_rescans",
            "sysfs rescans, by what triggered them (startup, periodic, udev, api, reload).",
            ["reason"],
            registry=r,
        )
        self.last_rescan = Gauge(
            f"{PREFIX}_last_rescan_timestamp_seconds",
            "Unix time of the last completed rescan.",
            registry=r,
        )
        self.rescan_duration = Histogram(
            f"{PREFIX}_rescan_duration_seconds",
            "Time one rescan took (scan, ledger, inventory).",
            buckets=(0.001, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.recreated = Counter(
            f"{PREFIX}_recreated_mdevs",
            "Recorded mdevs found missing and re-created with the same UUID.",
            registry=r,
        )
        self.kept_in_use = Counter(
            f"{PREFIX}_mdevs_kept_in_use",
            "Removes not done because the mdev was in use (its VFIO group open, a libvirt "
            "domain referencing it, or a remove that timed out): kept as free mdevs.",
            registry=r,
        )
        self.reloads = Counter(
            f"{PREFIX}_config_reloads",
            "SIGHUP reloads, by result (applied, refused).",
            ["result"],
            registry=r,
        )
        self.placement_state = Enum(
            f"{PREFIX}_placement_sync_state",
            "State of the Placement synchronisation.",
            states=list(SYNC_STATES),
            registry=r,
        )
        self.placement_failures = Gauge(
            f"{PREFIX}_placement_sync_consecutive_failures",
            "Placement synchronisations that failed in a row.",
            registry=r,
        )
        self.placement_syncs = Counter(
            f"{PREFIX}_placement_syncs",
            "Placement synchronisations attempted, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.placement_state.state("disabled")
        for state in MDEV_STATES:
            self.mdevs.labels(state=state).set(0)
        self._providers_seen: set[str] = set()

    # --- updates ---------------------------------------------------------------------

    def set_mdev_counts(self, counts: Mapping[str, int]) -> None:
        for state in MDEV_STATES:
            self.mdevs.labels(state=state).set(counts.get(state, 0))

    def set_providers(self, capacity: Mapping[str, tuple[int, int]]) -> None:
        """``{provider name: (total, used)}``; providers that left are dropped."""
        self.providers.set(len(capacity))
        for name in self._providers_seen - set(capacity):
            for kind in ("total", "used"):
                with contextlib.suppress(KeyError):
                    self.capacity.remove(name, kind)
        for name, (total, used) in capacity.items():
            self.capacity.labels(provider=name, kind="total").set(total)
            self.capacity.labels(provider=name, kind="used").set(used)
        self._providers_seen = set(capacity)

    def set_placement(self, health: Mapping[str, object]) -> None:
        state = str(health.get("state", "disabled"))
        self.placement_state.state(state if state in SYNC_STATES else "failing")
        failures = health.get("consecutive_failures", 0)
        self.placement_failures.set(failures if isinstance(failures, int) else 0)

    def error(self, code: str) -> None:
        self.errors.labels(code=code).inc()

    # --- exposition ------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """(body, content type) in the Prometheus text format."""
        return generate_latest(self.registry), CONTENT_TYPE

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's value (tests, health): ``name`` as exposed."""
        return self.registry.get_sample_value(name, dict(labels or {}))
