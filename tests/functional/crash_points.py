"""Kills at the crash points of an order (``DeviceManager.on_step``).

A manager calls ``on_step(name)`` at each crash point it passes (after the
mode was set, after an intent, after a type write, ...).  :class:`StepKiller`
counts them and SIGKILLs its own process the n-th time one is reached; the
random-kill harness's child (kill_child.py) and the tests that kill a layout's
bring-up at every point (test_mixed_layout.py, test_mig_layout.py) share it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager

Point = tuple[str, int]  # a crash point's name and the how-many-th passing


class StepKiller:
    """An ``on_step`` that records each point passed, in order, and SIGKILLs
    the process at ``kill`` (None: never)."""

    def __init__(self, kill: Point | None = None) -> None:
        self.kill = kill
        self.passed: dict[str, int] = {}
        self.order: list[Point] = []

    def __call__(self, step: str) -> None:
        self.passed[step] = self.passed.get(step, 0) + 1
        self.order.append((step, self.passed[step]))
        if self.kill == self.order[-1]:
            os.kill(os.getpid(), signal.SIGKILL)


def parse_point(text: str) -> Point:
    """``<crash point>:<n>`` (kill_child.py's ``step:`` argument)."""
    name, _, count = text.rpartition(":")
    return name, int(count)


def recover_in_child(build: Callable[[StepKiller], DeviceManager], kill: Point | None,
                     record: str | None = None) -> int:
    """Run ``build(killer).recover()`` (recovery, then the layouts' converge)
    in a forked process SIGKILLed at ``kill``; ``record``: a file to write
    every point passed, one ``name n`` a line.  The child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            killer = StepKiller(kill)
            build(killer).recover()
            if record:
                with open(record, "w") as handle:
                    handle.write("\n".join(f"{s} {n}" for s, n in killer.order))
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return status


def read_points(record: str) -> list[Point]:
    """The points a :func:`recover_in_child` run with ``record`` passed."""
    with open(record) as handle:
        return [(s, int(n)) for s, n in (line.split() for line in handle.read().splitlines())]
