"""Real-kernel tier: these tests run INSIDE the QEMU guest booted by
tests/realkernel/run.sh (Debian's kernel + the mtty sample mdev driver).

Anywhere else (a normal ``pytest tests/`` on a developer's host) every test in
this directory is skipped with the reason, because the tests create and remove
mdevs with raw sysfs writes and need the mtty parent.  They run only when all
of these hold:

* ``ACCEL_REALKERNEL_GUEST=1`` (set by the guest's /init, tests/realkernel/init.sh);
* ``/sys/class/mdev_bus/mtty`` exists;
* the kernel command line carries the lab's ``lab_out=`` (so that a host which
  happens to have mtty loaded and the variable set is still left alone).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realkernel import mdevlab

HERE = Path(__file__).resolve().parent
GUEST_ENV = "ACCEL_REALKERNEL_GUEST"


def _kernel_cmdline() -> list[str]:
    try:
        with open("/proc/cmdline") as handle:
            return handle.read().split()
    except OSError:
        return []


def skip_reason() -> str | None:
    if os.environ.get(GUEST_ENV) != "1":
        return (
            f"real-kernel tests run inside the QEMU guest of tests/realkernel/run.sh "
            f"({GUEST_ENV} is not 1)"
        )
    if not os.path.isdir(mdevlab.PARENT_DIR):
        return f"no mtty mdev parent ({mdevlab.PARENT_DIR} is missing)"
    if not any(arg.startswith("lab_out=") for arg in _kernel_cmdline()):
        return "not the lab's guest kernel (no lab_out= on /proc/cmdline); not touching mdevs"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.realkernel)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def idle_mtty() -> Iterator[None]:
    """Every test starts and ends with no mdev in the kernel and full counters,
    even after a failure half-way (so one failure does not cascade)."""
    mdevlab.remove_all()
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE
    yield
    mdevlab.remove_all()


@pytest.fixture
def agent_config(tmp_path: Path) -> Path:
    """Config for ``accelctl``: real /sys, ``mtty-2`` on parent ``mtty``, the
    ledger in a fresh state_dir on the guest's tmpfs."""
    return mdevlab.write_config(tmp_path / "accel-agent.conf", tmp_path / "state")
