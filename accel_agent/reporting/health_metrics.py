"""``accel_agent_healthy`` and ``accel_agent_health_problem``: ``GET
/v1/health`` as series a fleet alerts on.

Read from the health document itself at each scrape (a collector, not
gauges set here and there), so the metric and ``/v1/health`` cannot
disagree: healthy is 1 exactly when the document's status is one of
:data:`HEALTHY_STATUSES` (``ok``, and ``converging``: a planned drain of a
standing layout is a state, not a failure, and must not page through
AccelAgentUnhealthy; its own alert, AccelAgentLayoutDrainingLong, says when
it lasts, and after a day the status is ``degraded``), and
``accel_agent_health_problem{problem=<kind>}`` is 1 exactly for the kinds in
its ``problem_kinds``.  Every kind has a series, 0 while it is not reported,
so that an alert on one kind sees it appear as a change of value rather
than a new series, and the label values are the fixed words of
:mod:`accel_agent.reporting.health_kinds`, never the free-text messages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily

from accel_agent.reporting.health_kinds import PROBLEM_KINDS

LOG = logging.getLogger(__name__)

HealthSource = Callable[[], Mapping[str, Any]]

# The statuses of GET /v1/health that are no failure (accel_agent_healthy 1).
HEALTHY_STATUSES = ("ok", "converging")

_HEALTHY_HELP = (
    "1 when GET /v1/health says ok or converging (a standing layout draining after a "
    "planned change, for up to a day), 0 when it says degraded (or cannot be computed); "
    "no sample before the daemon's core is built."
)
_PROBLEM_HELP = (
    "1 for each kind of problem GET /v1/health reports now (its problem_kinds), 0 for the "
    "others: " + ", ".join(PROBLEM_KINDS) + "."
)


class HealthCollector:
    """The two families, read from ``source`` (the daemon's health) per scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: HealthSource | None = None

    def watch(self, source: HealthSource) -> None:
        with self._lock:
            self._source = source

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("accel_agent_healthy", _HEALTHY_HELP),
            GaugeMetricFamily("accel_agent_health_problem", _PROBLEM_HELP, labels=["problem"]),
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        healthy, problem = self._families()
        with self._lock:
            source = self._source
        kinds: set[str] = set()
        if source is not None:
            try:
                document = source()
                ok = document.get("status") in HEALTHY_STATUSES
                kinds = set(document.get("problem_kinds") or ())
            except Exception:  # a scrape must still answer: say unhealthy, log why
                LOG.exception("cannot compute the health for the metrics")
                ok = False
            healthy.add_metric([], 1.0 if ok else 0.0)
        for kind in PROBLEM_KINDS:
            problem.add_metric([kind], 1.0 if kind in kinds else 0.0)
        yield healthy
        yield problem
