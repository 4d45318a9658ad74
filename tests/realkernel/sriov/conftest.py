"""Lab 3 (tests/realkernel/labs/igb.sh): these tests run only in its guest, where
QEMU's 82576 (``-device igb``) is driven by Debian's igb/igbvf behind an emulated
Intel IOMMU.  Anywhere else they are skipped with the reason (the other labs do
not collect this directory).

One session starts both privsep daemons of the agent (the capability-less
sysfs writer and the CAP_NET_ADMIN netlink one), exactly as the agent does,
and enables the pool's VFs once (~4 s under TCG); every test starts and ends
with every VF on igbvf and in the reset state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realkernel import labonly
from tests.realkernel.sriov import igblab

HERE = Path(__file__).resolve().parent
LAB = "igb"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    labonly.skip_outside(
        LAB, HERE, items, how=f"ACCEL_REALKERNEL_LABS={LAB} tests/realkernel/run.sh"
    )


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[igblab.Lab]:
    with igblab.started(tmp_path_factory.mktemp("igb")) as started:
        yield started


@pytest.fixture(autouse=True)
def clean_vfs(lab: igblab.Lab) -> Iterator[None]:
    lab.clean()
    yield
    lab.clean()
