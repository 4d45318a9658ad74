"""The sync loop's state: how the last syncs went, when the next may run, the health document.

Placement being down never raises into the caller's loop: a failed sync is
recorded here, logged as one warning, and the next attempt waits
``sync_interval * 2**(failures - 1)`` (at most ``max_backoff``), drawn
between half of that and all of it (:func:`jittered`); a success clears the
back-off.  :meth:`SyncHealth.document` is what ``/v1/health`` shows as
``reporting`` and the metrics export.

Why the jitter is that wide: a fleet's agents fail together (Placement went
away for all of them; a fleet-wide reload woke them all at one instant), and
an agent's retries keep the phase of its first failure.  Drawn from
``[delay/2, delay]``, the retries of agents that failed at one instant are
spread over half the delay by the first retry, and never come before half of
it (Placement that just came back is not hit by everyone within a second);
a jitter of a fifth of the delay (as before issue 38) spread 50 agents that
failed together over 12 s at the first retry.

A sync in progress shows too, while it runs, not only once it ends:
``syncing_since`` is when it began, and once it has run longer than its
deadline (``stuck_after``: ``[placement] sync_interval`` or ``timeout``,
the longer) the state is ``syncing``, whatever the last result was, until
it ends.  Every answer has its own deadline (.deadline), so a sync can only
be that long when Placement is slow at every request: reporting is then
behind, and health says so at once instead of "ok" with ``last_success``
frozen.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from accel_agent.reporting.placement.result import SyncResult

# Every wait the reporter schedules (a retry, the next verification) is drawn
# from [delay * JITTER_LOW, delay]: see the module's docstring.
JITTER_LOW = 0.5


def jittered(delay: float, rng: random.Random) -> float:
    """``delay`` spread: a value in ``[delay * JITTER_LOW, delay]``."""
    return delay * rng.uniform(JITTER_LOW, 1.0)


def iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC).isoformat()


class SyncHealth:
    """Failures in a row, back-off, last success and error; thread-safe (the
    syncing thread records, any thread reads)."""

    def __init__(
        self,
        *,
        sync_interval: float,
        max_backoff: float,
        clock: Callable[[], float],
        log: logging.Logger | logging.LoggerAdapter[Any],
        stuck_after: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._sync_interval = sync_interval
        self.stuck_after = max(sync_interval, stuck_after or 0.0)
        self._syncing_since: float | None = None
        self._max_backoff = max_backoff
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._next_attempt_at = 0.0
        self._providers = 0
        self._rng = rng or random.Random()

    @property
    def next_attempt_at(self) -> float:
        with self._lock:
            return self._next_attempt_at

    @property
    def failures(self) -> int:
        with self._lock:
            return self._failures

    @property
    def providers(self) -> int:
        with self._lock:
            return self._providers

    def carry_from(self, other: SyncHealth) -> None:
        """``other``'s record (a reload's new reporter): the failures in a row
        and their back-off go on, so that a fleet-wide reload during an outage
        does not make every agent retry at once."""
        with other._lock:
            kept = (other._last_success, other._last_error, other._failures,
                    other._next_attempt_at, other._providers)
        with self._lock:
            (self._last_success, self._last_error, self._failures,
             self._next_attempt_at, self._providers) = kept

    def begin(self) -> None:
        """A sync starts (it ends with :meth:`record`)."""
        with self._lock:
            self._syncing_since = self._clock()

    def document(self, *, enabled: bool) -> dict[str, Any]:
        with self._lock:
            state = "failing" if self._failures else "ok"
            since = self._syncing_since
            if since is not None and self._clock() - since > self.stuck_after:
                state = "syncing"  # past its deadline, still running
            if not enabled:
                state = "disabled"
            return {
                "enabled": enabled,
                "state": state,
                "syncing_since": iso(since),
                "sync_deadline": self.stuck_after,
                "last_success": iso(self._last_success),
                "last_error": self._last_error,
                "consecutive_failures": self._failures,
                "providers": self._providers,
                "next_attempt_at": iso(self._next_attempt_at) if self._failures else None,
            }

    def record(self, result: SyncResult) -> None:
        now = self._clock()
        with self._lock:
            self._syncing_since = None
            if result.ok:
                self._last_success = now
                self._failures = 0
                self._next_attempt_at = 0.0
            else:
                self._failures += 1
                self._last_error = result.error or "; ".join(
                    f"{name}: {why}" for name, why in sorted(result.failures.items())
                )
                # Jitter spreads a fleet's retries once Placement comes back.
                delay = min(self._sync_interval * 2 ** (self._failures - 1), self._max_backoff)
                self._next_attempt_at = now + jittered(delay, self._rng)
            if result.error is None:
                self._providers = result.providers
        if not result.ok:
            self._log.warning(
                "Placement sync failed (%d in a row, next attempt in %.0f s): %s",
                self._failures,
                self._next_attempt_at - now,
                self._last_error,
            )
        elif result.changed:
            self._log.info(
                "Placement sync: %d created, %d updated, %d drained, %d deleted (%d writes)",
                len(result.created),
                len(result.updated),
                len(result.drained),
                len(result.deleted),
                result.writes,
            )
