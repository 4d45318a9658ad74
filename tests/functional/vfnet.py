"""The network half of a VF for the FUSE simulator, which has no netlink: each
VF's settings are kept in a JSON file, as the PF's driver would hold them, so
that a test (or another process: a killed worker, a later ``recover``) reads
them back independently of the agent.  It refuses what igb refuses
(``link_state``: EOPNOTSUPP, docs/design.md §10.4) the way
the real algorithm does: nothing of the request is left set.

The rtnetlink calls themselves are proven against a real netlink socket
(test_vf_netlink.py) and on a real igb driver (the igb lab); this stands in
for them only where the simulator's netdevs do not exist in the kernel.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
from collections.abc import Mapping
from typing import Any

from accel_agent import exception
from accel_agent.sriov import vfconfig

RESET = vfconfig.RESET.to_dict()


class StateFileNet:
    def __init__(self, path: str) -> None:
        self.path = path

    def _update(self, key: str, value: dict[str, Any], event: str) -> None:
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.read(self.path)
            state.setdefault("vfs", {})[key] = value
            state.setdefault("events", []).append(event)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(state, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)

    @staticmethod
    def read(path: str) -> dict[str, Any]:
        try:
            with open(path) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return {}

    def settings(self, pf: str, vf: int) -> dict[str, Any]:
        """What the "driver" holds for VF ``vf`` of ``pf`` (RESET if never set)."""
        return self.read(self.path).get("vfs", {}).get(f"{pf}/{vf}", dict(RESET))

    def apply(
        self, pf_netdev: str, vf: int, settings: Mapping[str, Any], pf: str
    ) -> dict[str, dict[str, Any]]:
        before = self.settings(pf, vf)
        if "link_state" in settings:
            raise exception.VfSettingRefused(
                pf=pf, vf=vf, setting="link_state", value=settings["link_state"],
                errno="EOPNOTSUPP", error="Operation not supported", rollback="nothing set",
            )
        after = {**RESET, **settings}  # a clean apply: on top of the reset state
        self._update(f"{pf}/{vf}", after, f"apply {pf}/{vf}")
        if os.environ.get("ACCEL_TEST_VFNET_KILL_AFTER_APPLY"):
            # A crash between a VF's settings and its hand-over to vfio-pci.
            os.kill(os.getpid(), signal.SIGKILL)
        return {"before": before, "after": {"vf": vf, **after}}

    def reset(self, pf_netdev: str, vf: int, pf: str) -> dict[str, dict[str, Any]]:
        before = self.settings(pf, vf)
        self._update(f"{pf}/{vf}", dict(RESET), f"reset {pf}/{vf}")
        return {"before": before, "after": {"vf": vf, **RESET}}
