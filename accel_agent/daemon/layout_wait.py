"""The start-up's bounded wait for the GPUs a standing layout names.

After a host reboot or an NVIDIA driver reload the SR-IOV VFs of a vGPU 17+
GPU do not exist until NVIDIA's ``nvidia-sriov.service`` runs ``sriov-manage
-e`` ("the virtual functions … are disabled after the hypervisor host is
rebooted or if the driver is reloaded", NVIDIA's documentation); an mdev
parent may likewise register after the agent started (mdevctl issue 82, the
boot race).  The unit is ordered after ``nvidia-sriov.service`` where it
exists, and this wait covers the rest: the layout is placed before READY
whenever the devices come in time, so nova-compute, ordered after the
agent, never sees an untyped VF.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from accel_agent.devices import layout

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager

LOG = logging.getLogger(__name__)
POLL_SECONDS = 1.0


def missing_gpus(m: DeviceManager) -> tuple[str, ...]:
    """The configured addresses of standing types that are neither an mdev
    parent nor the PF of one (its VFs are not there): what health names
    after the wait too (devices/layout.py)."""
    return layout.missing_gpus(m.scan(), m.policy)


def wait_for_gpus(
    m: DeviceManager, timeout: float, sleep=time.sleep, clock=time.monotonic,
    on_missing: Callable[[tuple[str, ...]], None] | None = None,
) -> tuple[bool, tuple[str, ...]]:
    """Wait up to ``timeout`` seconds for them: (whether any was missing at
    first, those still missing).  ``on_missing``: told the GPUs still
    missing before each wait (what GET /v1/health says while it waits)."""
    missing = missing_gpus(m)
    if not missing:
        return False, ()
    tell = on_missing or (lambda gpus: None)
    LOG.info("standing layout: waiting up to %g s for %s (their VFs or parents are not "
             "there yet)", timeout, ", ".join(missing))
    deadline = clock() + timeout
    while missing and clock() < deadline:
        tell(missing)
        sleep(POLL_SECONDS)
        missing = missing_gpus(m)
    if missing:
        LOG.warning("standing layout: %s still missing after %g s; health is degraded "
                    "(layout_gpus_missing) and their layouts are placed when they appear",
                    ", ".join(missing), timeout)
    else:
        LOG.info("standing layout: every configured GPU is there")
    return True, missing
