"""Lab 2 (tests/realkernel/labs/trixie.sh) only: libvirt's mdev definitions against
the real node-device driver of libvirt 11, mdevctl and udev.  Anywhere else the tests
are skipped with the reason.

One module-scoped host (udevd, a libvirtd, an agent's two configs); the tests are the
steps of one story in order (Nova defines, the agent takes over and removes, the host
"reboots"), and the host's teardown leaves no mdev, no definition and no process for
the migration tests that follow in the same guest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realkernel import labonly

HERE = Path(__file__).resolve().parent
LAB = "trixie"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    labonly.skip_outside(LAB, HERE, items)


@pytest.fixture(autouse=True)
def idle_mtty() -> Iterator[None]:
    """Overrides lab 1's per-test clean-up (which removes mdevs behind the agent's
    back): these tests carry their mdevs from one step to the next."""
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed step carries the tails of the agent's and libvirtd's logs (the full
    ones, and udevd's, are in the results share: logs/)."""
    report = yield
    host = getattr(item, "funcargs", {}).get("host")
    if report.failed and host is not None:
        report.sections.append(("agent log (tail)", host.agent.log()[-4000:]))
        report.sections.append(("libvirtd log (tail)", host.libvirtd.log()))
        report.sections.append(("udevd log (tail)", host.udevd.log()[-3000:]))
    return report
