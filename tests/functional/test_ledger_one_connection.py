"""One ledger connection per process (docs/design.md §5.2, issue 21 item 1), against
the real daemon on the FUSE-simulated mtty host with the real privsep helper.

Closing ANY descriptor of a file drops every POSIX lock the process holds on
it.  When the daemon's process opened its live ledger a second time (a
SIGHUP reload validating the config read it through a new connection, and
the 0600 creation did ``os.close(os.open(path))``), its locks were gone, and
another process's close then checkpointed and unlinked the WAL the daemon
still wrote to: an allocation answered 200 was lost at the next crash.

The ledger is read here with plain SQL (``sqlite3``, read-only), never with
the project's Ledger class: the check must not share the code it checks.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.functional.daemon_fixture import MTTY, SimAgent, ctl, sim_agent, wait_for
from tests.functional.privsep_fixture import _find_daemon_pid, skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

LEDGER = "ledger.sqlite3"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("one-connection"), ["mtty"]) as host:
        yield host


class Agent(SimAgent):
    @property
    def ledger_path(self) -> Path:
        return Path(self.host.state_dir) / LEDGER

    def ctl(self, *args: str) -> str:
        proc = ctl(self.config, *args)
        assert proc.returncode == 0, f"accelctl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def allocate(self, instance: str) -> str:
        answer = json.loads(self.ctl("allocate", instance, "--count", "1", "--json"))
        return answer["mdevs"][0]["uuid"]

    def reload(self) -> None:
        """SIGHUP, then wait for its result in /v1/health (valid config: applied)."""
        before = self.daemon.health()["config"]["last_reload"]
        self.daemon.sighup()
        config = wait_for(
            lambda: (c := self.daemon.health()["config"])["last_reload"] != before and c,
            what="the reload's result",
        )
        assert config["last_reload_result"] == "applied", config

    def crash(self) -> None:
        """SIGKILL the daemon and its privsep helper: nothing gets to clean up."""
        helper = _find_daemon_pid(self.config.resolve())
        self.daemon.kill()
        os.kill(helper, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{helper}"), what="the helper to die")

    def owners(self) -> dict[str, str]:
        """uuid -> owner, as the ledger file says after the crash (plain SQL)."""
        uri = self.ledger_path.resolve().as_uri() + "?mode=ro"
        with sqlite3.connect(uri, uri=True) as conn:
            rows = conn.execute("SELECT uuid, owner FROM assignments").fetchall()
        conn.close()
        return dict(rows)


@pytest.fixture
def agent(sim, tmp_path) -> Iterator[Agent]:
    with sim_agent(sim, tmp_path, MTTY, kind=Agent) as setup:
        yield setup  # type: ignore[misc]


OFFLINE = {
    "check-config": ("check-config",),
    "offline-mdevs": ("--offline", "mdevs", "--json"),
    "offline-inventory": ("--offline", "inventory", "--json"),
    # A writer in another process: the case that checkpointed and unlinked
    # the WAL when the daemon's locks were gone.
    "offline-recover": ("--offline", "recover"),
}


@pytest.mark.parametrize("command", list(OFFLINE), ids=list(OFFLINE))
def test_an_allocation_after_a_reload_and_another_process_survives_a_crash(agent, command):
    """The operator's sequence of issue 21 item 1."""
    agent.daemon.start()
    first = agent.allocate("r-1")
    agent.reload()
    agent.ctl(*OFFLINE[command])
    second = agent.allocate("r-2")  # answered 200
    agent.ctl(*OFFLINE[command])
    agent.crash()
    owners = agent.owners()
    assert owners.get(first) == "r-1", owners
    assert owners.get(second) == "r-2", (
        f"r-2's assignment (answered 200) is not in the ledger after the crash: {owners}"
    )
    assert second in agent.host.sysfs_uuids()


def ledger_descriptors(pid: int, ledger: Path) -> list[str]:
    """What the process's descriptors of the ledger and its -wal/-shm point
    to (``(deleted)`` included)."""
    found = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile
        if target.startswith(str(ledger)):
            found.append(target)
    return sorted(found)


def test_the_daemon_holds_one_descriptor_of_its_ledger_after_reloads_and_listings(agent):
    daemon = agent.daemon.start()
    agent.allocate("r-1")
    ledger = agent.ledger_path.resolve()
    for _ in range(2):
        agent.reload()
        for listing in ("types", "mdevs", "inventory"):
            agent.ctl(listing, "--json")  # through the daemon
            agent.ctl("--offline", listing, "--json")
        agent.ctl("check-config")
    agent.allocate("r-2")
    held = ledger_descriptors(daemon.pid, ledger)
    assert held.count(str(ledger)) == 1, held
    assert not [t for t in held if t.endswith("(deleted)")], held
    # The WAL the daemon writes is the one at the ledger's path.
    assert f"{ledger}-wal" in held, held
