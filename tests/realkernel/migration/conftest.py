"""Lab 2 (tests/realkernel/labs/trixie.sh): these tests run only in its guest, where
trixie's QEMU 10 and libvirt 11 and Debian's 6.12 kernel (mtty with migration
support) are.  Anywhere else they are skipped with the reason (the lab 1 guest
does not even collect them: labs/host.sh ignores this directory).

One session starts the two "hosts" once (two libvirtds, two agents: ~30 s under
TCG); every test starts and ends with no domain, no mdev and empty ledgers, and
cleans up through the agents themselves, so a test that leaks fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.devices.ledger import OwnerKind
from tests.realkernel import labonly, mdevlab
from tests.realkernel.migration import migrationlab
from tests.realkernel.migration.migrationlab import Hosts

HERE = Path(__file__).resolve().parent
LAB = "trixie"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    labonly.skip_outside(LAB, HERE, items)


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    with migrationlab.two_hosts() as started:
        yield started


def clean_up(hosts: Hosts) -> None:
    """What an operator would do, through the agents: stop the domains, then
    release (with remove) every instance and abort (with remove) every claim;
    free mdevs are taken back by an allocation and released with remove."""
    for libvirtd in (hosts.libvirt_a, hosts.libvirt_b):
        libvirtd.destroy_all()
    for agent in hosts.agents:
        client = agent.client()
        for record in agent.ledger():
            if record.owner is None:
                continue
            if record.owner_kind is OwnerKind.CLAIM:
                client.migration_abort(record.owner, remove=True)
            else:
                client.release(record.owner, remove=True)
        free = [r for r in agent.ledger() if r.free]
        if free:
            client.allocate("lab-clean-up", len(free))
            client.release("lab-clean-up", remove=True)


@pytest.fixture(autouse=True)
def idle_mtty(hosts: Hosts) -> Iterator[None]:
    """Overrides the lab 1 fixture (which removes mdevs behind the agent's back):
    every test starts with no mdev and empty ledgers, and must leave them so
    once its domains are gone and its instances released through the agents."""
    clean_up(hosts)
    assert mdevlab.mdevs() == {}
    assert [agent.ledger() for agent in hosts.agents] == [[], []]
    yield
    clean_up(hosts)
    assert mdevlab.mdevs() == {}, "an mdev outlived its clean-up: leaked"
    assert [agent.ledger() for agent in hosts.agents] == [[], []]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test carries the tails of both agents' and both libvirtds' logs
    (the full ones are in the results share: logs/)."""
    report = yield
    if report.failed and "hosts" in getattr(item, "funcargs", {}):
        hosts: Hosts = item.funcargs["hosts"]
        for agent in hosts.agents:
            report.sections.append((f"agent {agent.name} log (tail)", agent.log()[-4000:]))
        for libvirtd in (hosts.libvirt_a, hosts.libvirt_b):
            report.sections.append((f"libvirtd {libvirtd.name} log (tail)", libvirtd.log()))
        report.sections.append(("logs", f"full logs: {migrationlab.LOG_DIR}"))
    return report
