"""Where the agent's start is, for the API that answers while it starts.

The start (recovery, the wait for a standing layout's VFs, the layouts, the
first scan) can take minutes: ``[devices] standing_vf_wait`` alone may be
several.  The API serves meanwhile: ``GET /v1/health`` says ``starting``
with the phase and what it waits for, the listings answer, and every other
request gets 503 ``AgentStarting`` naming the same (accel_agent.api.app).
``READY=1`` still comes only once the start is complete.

A core built without the daemon (tests, in-process tools) never begins a
start: its state is ready from the first instant, and the phases its
``startup()`` walks through change nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from accel_agent.daemon.counts import iso

# The phases, in the order a start walks through them (each may be skipped).
PREPARING = "preparing"
LEDGER_CHECK = "checking the ledger"
RECOVERY = "recovery"
WAITING_FOR_VFS = "waiting for VFs"
LAYOUT = "placing the standing layouts"
FIRST_SCAN = "first scan"
SERVICES = "starting the services"


@dataclass(frozen=True)
class StartPhase:
    phase: str
    since: float  # when this phase began (epoch seconds)
    began: float  # when the start began
    # The GPUs a standing layout waits for (WAITING_FOR_VFS), and until when.
    waiting_for: tuple[str, ...] = ()
    until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``starting`` of GET /v1/health."""
        return {
            "phase": self.phase,
            "since": iso(self.since),
            "started_at": iso(self.began),
            "waiting_for": list(self.waiting_for),
            "until": iso(self.until) if self.until is not None else None,
        }

    def describe(self) -> str:
        """One line: what the start is doing, for an error or a status line."""
        if self.phase == WAITING_FOR_VFS and self.waiting_for:
            until = f", at most until {iso(self.until)}" if self.until is not None else ""
            return (
                f"waiting for VFs of GPU(s) {', '.join(self.waiting_for)} (standing layout, "
                f"[devices] standing_vf_wait{until})"
            )
        return f"{self.phase} (since {iso(self.since)})"


class StartState:
    """The start's phase, thread-safe: written by the start-up thread, read
    by the API's workers."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._phase: StartPhase | None = None

    def begin(self) -> None:
        now = self._clock()
        with self._lock:
            self._phase = StartPhase(PREPARING, now, now)

    def enter(self, phase: str, waiting_for: Iterable[str] = (),
              until: float | None = None) -> None:
        """A new phase; nothing while no start is going on."""
        with self._lock:
            if self._phase is not None:
                self._phase = StartPhase(
                    phase, self._clock(), self._phase.began, tuple(waiting_for), until
                )

    def waiting_for(self, gpus: Iterable[str]) -> None:
        """The GPUs still missing, as the wait for VFs sees them."""
        with self._lock:
            if self._phase is not None:
                self._phase = replace(self._phase, waiting_for=tuple(gpus))

    def end(self) -> None:
        with self._lock:
            self._phase = None

    def current(self) -> StartPhase | None:
        """The phase while the agent starts; None once it is ready."""
        with self._lock:
            return self._phase
