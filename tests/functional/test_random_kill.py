"""The random-kill harness in ``make test``: at least 50 SIGKILLs at random
instants of every mutating operation, each followed by ``recover`` and the
crash-safety promises checked from sysfs and the ledger (see killharness.py
for what is checked and which deliberate faults it catches; ``make soak``
runs the same harness for 1,000 kills)."""

from __future__ import annotations

import os

import pytest

from tests.functional.killharness import (
    ATTACH,
    MDEV,
    STANDING,
    VFIO,
    DeviceModel,
    KillHarness,
)
from tests.functional.killharness_mig import MIG, MigHarness
from tests.functional.killharness_mixed import MIXED, MixedHarness
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

KILLS = int(os.environ.get("ACCEL_KILLS", "50"))
# The vendor-VFIO model: the same harness and checks on typed VFs (fewer
# kills in make test; make soak runs both models at length).
KILLS_VFIO = int(os.environ.get("ACCEL_KILLS_VFIO", "25"))
# The attach model (issue 15): one call attaching mdevs and an SR-IOV VF
# with its network settings, killed at random instants like allocate.
KILLS_ATTACH = int(os.environ.get("ACCEL_KILLS_ATTACH", "20"))
# The standing model (issue 23): kills while layouts are placed, drained and
# restored after a reboot.
KILLS_STANDING = int(os.environ.get("ACCEL_KILLS_STANDING", "12"))
# The mixed-size layout model (issue 36): a run also goes on until a child
# was killed at each crash point of the order (killharness_mixed.ORDER).
KILLS_MIXED = int(os.environ.get("ACCEL_KILLS_MIXED", "8"))
# The MIG model (issue 37): also killed at each crash point of the MIG order
# (killharness_mig.ORDER), between GPU instance creation and typing included.
KILLS_MIG = int(os.environ.get("ACCEL_KILLS_MIG", "8"))
# A fixed seed makes the sequence of operations and delays repeatable; the
# instants still vary with the machine's load, which is the point.
SEED = int(os.environ.get("ACCEL_KILL_SEED", "20261124"))
# tools/prove-faults.sh: a patched tree only has to show one violation.
STOP_ON_VIOLATION = os.environ.get("ACCEL_KILL_STOP_ON_VIOLATION") == "1"


@pytest.mark.parametrize(
    ("model", "kills"),
    [(MDEV, KILLS), (VFIO, KILLS_VFIO), (ATTACH, KILLS_ATTACH), (STANDING, KILLS_STANDING),
     (MIXED, KILLS_MIXED), (MIG, KILLS_MIG)],
    ids=["mdev", "nvidia_vfio", "attach", "standing", "mixed", "mig"],
)
def test_random_sigkills_then_recover_keep_every_promise(tmp_path, model: DeviceModel, kills):
    skip_unless_root()
    lines: list[str] = []
    with simulated_host(tmp_path, list(model.profiles), **model.host_options) as host:
        harness = (MigHarness if model is MIG else MixedHarness if model is MIXED
                   else KillHarness)(host, SEED, lines.append, model)
        stats = harness.run(kills, stop_on_violation=STOP_ON_VIOLATION)
    summary = stats.to_dict()
    print(summary)
    assert stats.violations == [], "\n".join(stats.violations[:10])
    assert stats.total_kills >= kills, summary
    # Every operation was killed at least once, not only the cheap ones.
    assert set(stats.kills) == set(model.operations), summary
    # ... and (the mixed-size model) at every crash point of the order.
    assert set(model.steps) <= set(stats.step_kills), summary
