"""Prometheus metrics of the daemon, served by ``GET /metrics``.

One :class:`AgentMetrics` per daemon, with its own ``CollectorRegistry`` (not
prometheus-client's global one), so that tests can build several agents in
one process and no library's default collectors leak into our output; the
process collector (``process_*``: CPU, memory, open files, start time) is
added to it on purpose.

Every counter has its samples from the start, at 0, for every label value
it can take (each error code, rescan reason, helper, result): ``rate()`` and
``increase()`` need a first sample before the first event, or the first
error of a node's life is invisible to an alert.

Names follow Prometheus' conventions: seconds for durations, ``_total`` on
every counter (prometheus-client appends it), ``_info`` on the series whose
value is always 1 and whose labels carry the information.  Every metric is
documented in docs/metrics.md; the Grafana dashboard beside it is checked
against :func:`exported_names` by a test, so renaming one here fails there.

Label values are bounded: error codes are exception class names, routes are
the API's path templates (``/v1/instances/{id}/allocation``, never the id),
mdev states and sync states are fixed sets.  The per-mdev and per-provider
series have one series per mdev or physical GPU of the host (hundreds at
most), which is what an operator needs to join them with DCGM's GPU metrics.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import InfoMetricFamily

import accel_agent
from accel_agent import exception
from accel_agent.reporting.health_metrics import HealthCollector, HealthSource
from accel_agent.sysfs import address

# ``<name>_created`` beside every counter and histogram is the time the
# process created it: noise on a dashboard, and a series per label set.
prometheus_client.disable_created_metrics()

PREFIX = "accel_agent"
# The classic text format every Prometheus understands (generate_latest writes it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MDEV_STATES = ("assigned", "claimed", "free", "foreign", "missing", "transient", "standing")
SYNC_STATES = ("disabled", "ok", "failing")
HELPERS = ("sysfs", "net", "nvml")  # the privsep contexts (accel_agent.privileged.guard)
# What asks for a rescan (accel_agent.events, daemon.core, daemon.reloads).
RESCAN_REASONS = ("startup", "periodic", "udev", "api", "reload", "helper")
RELOAD_RESULTS = ("applied", "refused")
SYNC_RESULTS = ("ok", "failed")
RELEASE_REMOVE = ("true", "false")
# Error codes that are no exception class (api.errors.code_for, daemon.core).
OTHER_ERROR_CODES = ("InternalError", "PlacementSyncFailed")
# Local calls over a unix socket: most answer in milliseconds, a create or a
# remove through privsep in tens, a remove blocked by a VM in seconds.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


# Labels of accel_agent_mdev_info and of the per-provider gauges that an
# operator joins with NVIDIA's dcgm-exporter, which labels every GPU metric
# with ``Hostname`` (the node's host name) and ``pci_bus_id`` (NVML's form,
# ``00000000:84:00.0``).  See docs/metrics.md.
# ``instance_id``, not ``instance``: Prometheus gives every scraped series its
# own ``instance`` label (the target's address), which would push ours aside
# as ``exported_instance``.
MDEV_INFO_LABELS = (
    "uuid",
    "instance_id",
    "parent",
    "physical_gpu",
    "pci_bus_id",
    "mdev_type",
    "state",
    "Hostname",
)
PROVIDER_LABELS = (
    "provider",
    "physical_gpu",
    "pci_bus_id",
    "mdev_type",
    "resource_class",
    "Hostname",
)


def error_codes() -> tuple[str, ...]:
    """Every ``code`` of accel_agent_errors_total: the agent's exception
    class names (api.errors.code_for) and the few codes that are not one."""
    found: set[str] = set()
    pending = [exception.AccelAgentException]
    while pending:
        cls = pending.pop()
        found.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return tuple(sorted(found | set(OTHER_ERROR_CODES)))


def dcgm_pci_bus_id(physical_gpu: str) -> str:
    """A physical GPU's PCI address as NVML and dcgm-exporter write it: eight
    hex digits of domain, upper-case hex (``0000:84:00.0`` ->
    ``00000000:84:00.0``); empty for a virtual parent (``mtty``), which DCGM
    does not know."""
    if not address.is_pci_address(physical_gpu):
        return ""
    domain, bus, rest = address.parse_pci_address(physical_gpu).split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


@dataclass(frozen=True)
class MdevInfo:
    """One ``accel_agent_mdev_info`` series (value 1)."""

    uuid: str
    instance: str  # the owning instance; empty when free, foreign or a layout's
    parent: str
    physical_gpu: str
    mdev_type: str
    state: str  # one of MDEV_STATES

    def labels(self, hostname: str) -> list[str]:
        return [
            self.uuid,
            self.instance,
            self.parent,
            self.physical_gpu,
            dcgm_pci_bus_id(self.physical_gpu),
            self.mdev_type,
            self.state,
            hostname,
        ]


_MDEV_INFO_HELP = (
    "One series per mdev on the host at the last rescan (value 1): its instance_id (empty "
    "when free, foreign or a standing layout's), parent, physical GPU (and its pci_bus_id "
    "as DCGM writes it), type, state, and the node's Hostname as dcgm-exporter labels it."
)


class _MdevInfoCollector:
    """``accel_agent_mdev_info``: the mdevs of the last rescan.  A collector
    rather than a labelled Gauge: the whole set is replaced at each rescan,
    so a released or removed mdev's old series simply stops."""

    def __init__(self, hostname: str) -> None:
        self._hostname = hostname
        self._lock = threading.Lock()
        self._rows: tuple[MdevInfo, ...] = ()

    def set(self, rows: Iterable[MdevInfo]) -> None:
        with self._lock:
            self._rows = tuple(rows)

    def describe(self) -> Iterator[InfoMetricFamily]:
        yield InfoMetricFamily(
            "accel_agent_mdev", _MDEV_INFO_HELP, labels=MDEV_INFO_LABELS
        )

    def collect(self) -> Iterator[InfoMetricFamily]:
        family = InfoMetricFamily(
            "accel_agent_mdev", _MDEV_INFO_HELP, labels=MDEV_INFO_LABELS
        )
        with self._lock:
            rows = self._rows
        for row in rows:
            family.add_metric(row.labels(self._hostname), {})
        yield family


@dataclass(frozen=True)
class ProviderSample:
    name: str
    physical_gpu: str
    mdev_type: str
    resource_class: str
    total: int
    used: int

    def labels(self, hostname: str) -> tuple[str, ...]:
        return (
            self.name,
            self.physical_gpu,
            dcgm_pci_bus_id(self.physical_gpu),
            self.mdev_type,
            self.resource_class,
            hostname,
        )


# The sample names of each metric type in the text format.
_SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum", ""),
    "info": ("_info",),
}


def exported_names(metrics: AgentMetrics) -> set[str]:
    """Every sample name ``GET /metrics`` can carry, also for metrics that
    have no sample yet (a labelled counter nobody incremented): what a
    dashboard query may name."""
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))
    }


class AgentMetrics:
    """Every metric of the agent; thread-safe (prometheus-client is)."""

    def __init__(self, hostname: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info(
            f"{PREFIX}_build", "The agent's version (value 1).", registry=r
        )
        self.build_info.info({"version": accel_agent.__version__})
        # dcgm-exporter's Hostname is Go's os.Hostname(): the kernel's node name.
        self.hostname = hostname or os.uname().nodename
        self.mdev_info = _MdevInfoCollector(self.hostname)
        r.register(self.mdev_info)
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
            "missing (recorded but absent from sysfs), transient (being created/removed), "
            "standing (a standing layout's, no instance holds it).",
            ["state"],
            registry=r,
        )
        self.layout_draining = Gauge(
            f"{PREFIX}_layout_draining",
            "Devices a standing layout ([mdev_<type>] standing) no longer wants that are "
            "still in use or held by an instance: removed once free.",
            registry=r,
        )
        self.layout_gpus_short = Gauge(
            f"{PREFIX}_layout_gpus_short",
            "Physical GPUs with fewer devices than their standing layout: no room, blocked "
            "by devices of another type, or not on the host (VFs not enabled), counted from "
            "the end of the start-up's wait for them ([devices] standing_vf_wait).",
            registry=r,
        )
        self.layout_in_use = Gauge(
            f"{PREFIX}_layout_in_use",
            "Devices of a standing layout whose VFIO group a process (a VM's QEMU) holds "
            "open, by type, read from /proc at each converge; no sample while not known "
            "(/proc not readable) or the type has no layout device.",
            ["mdev_type"],  # the label of the provider metrics, to join on
            registry=r,
        )
        self.providers = Gauge(
            f"{PREFIX}_providers",
            "Resource providers (physical GPUs with a configured type and capacity).",
            registry=r,
        )
        self.capacity = Gauge(
            f"{PREFIX}_provider_capacity",
            "Inventory total per provider (physical GPU) at the last rescan: the mdevs "
            "of its configured type it can hold.",
            PROVIDER_LABELS,
            registry=r,
        )
        self.used = Gauge(
            f"{PREFIX}_provider_used",
            "Mdevs of the configured type assigned or claimed per provider at the last "
            "rescan.",
            PROVIDER_LABELS,
            registry=r,
        )
        self.rescans = Counter(
            f"{PREFIX}_rescans",
            "sysfs rescans, by what triggered them (startup, periodic, udev, api, reload, "
            "helper).",
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
            "domain referencing it, or a remove that timed out): kept as free mdevs; counted "
            "once per device and reason (a draining device tried at every converge counts "
            "once until it is removed or taken).",
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
        self.helper_restarts = Counter(
            f"{PREFIX}_privileged_helper_restarts",
            "Privileged helpers killed and started again because they missed a call's "
            "deadline or died, by helper (sysfs, net, nvml).",
            ["helper"],
            registry=r,
        )
        self.health = HealthCollector()
        r.register(self.health)
        ProcessCollector(registry=r)
        self._initialise_counters()
        self.placement_state.state("disabled")
        for state in MDEV_STATES:
            self.mdevs.labels(state=state).set(0)
        self._providers_seen: set[tuple[str, ...]] = set()
        self._in_use_types: set[str] = set()

    def _initialise_counters(self) -> None:
        """Every label set of every counter at 0 (see the module's docstring)."""
        for helper in HELPERS:
            self.helper_restarts.labels(helper=helper)
        for remove in RELEASE_REMOVE:
            self.releases.labels(remove=remove)
        for code in error_codes():
            self.errors.labels(code=code)
        for reason in RESCAN_REASONS:
            self.rescans.labels(reason=reason)
        for result in RELOAD_RESULTS:
            self.reloads.labels(result=result)
        for result in SYNC_RESULTS:
            self.placement_syncs.labels(result=result)

    def watch_health(self, source: HealthSource) -> None:
        """accel_agent_healthy and _health_problem read ``source`` (the daemon's
        GET /v1/health document) at each scrape."""
        self.health.watch(source)

    # --- updates ---------------------------------------------------------------------

    def set_mdev_counts(self, counts: Mapping[str, int]) -> None:
        for state in MDEV_STATES:
            self.mdevs.labels(state=state).set(counts.get(state, 0))

    def set_providers(self, providers: Iterable[ProviderSample]) -> None:
        """The providers of the last rescan; those that left are dropped."""
        providers = list(providers)
        self.providers.set(len(providers))
        current = {p.labels(self.hostname) for p in providers}
        for labels in self._providers_seen - current:
            for gauge in (self.capacity, self.used):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        for provider in providers:
            labels = provider.labels(self.hostname)
            self.capacity.labels(*labels).set(provider.total)
            self.used.labels(*labels).set(provider.used)
        self._providers_seen = current

    def set_layout(self, draining: int, gpus_short: int) -> None:
        self.layout_draining.set(draining)
        self.layout_gpus_short.set(gpus_short)

    def set_layout_in_use(self, by_type: Mapping[str, int] | None) -> None:
        """The layout devices in use per type (None: not known, no sample);
        a type that left is dropped."""
        current = set(by_type or ())
        for mdev_type in self._in_use_types - current:
            with contextlib.suppress(KeyError):
                self.layout_in_use.remove(mdev_type)
        for mdev_type, n in (by_type or {}).items():
            self.layout_in_use.labels(mdev_type=mdev_type).set(n)
        self._in_use_types = current

    def set_mdevs(self, rows: Iterable[MdevInfo]) -> None:
        self.mdev_info.set(rows)

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
