"""Kills at the crash points of an order (``DeviceManager.on_step``).

A manager calls ``on_step(name)`` at each crash point it passes (after the
mode was set, after an intent, after a type write, ...).  :class:`StepKiller`
counts them and SIGKILLs its own process the n-th time one is reached; the
random-kill harness's child (kill_child.py) and the tests that kill a layout's
bring-up at every point (test_mixed_layout.py, test_mig_layout.py) share it,
and those tests share the scene around each kill and the checks after it
(:func:`points_of_a_bring_up`, :func:`kill_bring_up_at`,
:func:`assert_nothing_leaked_and_settled`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests import ledger_sql

if TYPE_CHECKING:
    from accel_agent.daemon.core import AgentCore
    from accel_agent.devices.manager import DeviceManager

Point = tuple[str, int]  # a crash point's name and the how-many-th passing
# A test's bring-up in a child (host, kill, record) -> its wait status:
# recover_in_child over the test's own manager.
Child = Callable[..., int]


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


def _scene(host: Any, child: Child, reboot_first: bool) -> None:
    """A clean simulated host, or one whose layout was brought up and then
    rebooted away (``reboot_first``): what the bring-up starts from."""
    host.reset()
    if reboot_first:
        assert child(host, None) == 0
        host.sim.reboot()


def points_of_a_bring_up(host: Any, child: Child, record: str,
                         reboot_first: bool) -> list[Point]:
    """The crash points one whole bring-up passes from its scene."""
    _scene(host, child, reboot_first)
    assert child(host, None, record) == 0
    return read_points(record)


def kill_bring_up_at(host: Any, child: Child, kill: Point, reboot_first: bool) -> None:
    """The bring-up from its scene, SIGKILLed at ``kill``."""
    _scene(host, child, reboot_first)
    assert child(host, kill) == signal.SIGKILL, kill


def assert_nothing_leaked_and_settled(host: Any, core: AgentCore,
                                      on_host: Callable[[Any], dict[str, Any]],
                                      kill: Point) -> None:
    """After the next start: every device on the host (``on_host``: VF ->
    what the simulated driver holds) is in the ledger and no row is
    unsettled; a second recovery changes nothing."""
    rows = ledger_sql.rows(host.state_dir)
    assert {r.parent for r in rows} == set(on_host(host)), kill  # nothing leaked, nothing lost
    assert {(r.state, r.intent_id) for r in rows} == {("present", None)}, kill
    before = on_host(host)
    report = core.devices.recover()
    assert (report.recreated, report.layout_made, report.layout_removed) == ([], [], [])
    assert on_host(host) == before
