"""A fleet of real agents reporting to one Placement (the fleet test and benchmark).

Each :class:`FleetAgent` is the daemon as production starts it (its privsep
helper included), with a state directory, an API socket and a host of its
own: a static tree of ``gpus`` Tesla M60 GPUs (the simulator's nvidia-pf
profile written out as plain files: the agent reads it as it reads /sys, and
no FUSE process serves it).  Its ``[DEFAULT] host`` is its name, so its root
provider is its own, and its noauth2 token is ``admin:<name>``, so that
Placement's request log (placement_pg.py) knows which agent sent what.

:meth:`FleetAgent.set_type` rewrites the configuration with another mdev
type for every GPU (``nvidia-35``: 16 per GPU, ``nvidia-15``: 8) and sends
SIGHUP: the fleet-wide change of the benchmark and the test.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accel_agent.simulator import build_spec, materialise
from tests.functional.daemon_fixture import AgentDaemon, agent_config

# What each type gives per GPU (the M60's max_instance, the simulator's profile).
PER_GPU = {"nvidia-35": 16, "nvidia-15": 8}
OWNER = "CUSTOM_OWNER_ACCEL_AGENT"


def placement_section(endpoint: str, agent: str, *, sync_interval: int = 1,
                      max_backoff: int = 4, refresh_interval: int = 3600,
                      timeout: int = 10) -> str:
    return f"""
[placement]
enabled = true
create_root_provider = true
sync_interval = {sync_interval}
max_backoff = {max_backoff}
refresh_interval = {refresh_interval}
timeout = {timeout}
auth_type = admin_token
endpoint = {endpoint}
token = admin:{agent}
"""


class FleetAgent:
    def __init__(self, name: str, workdir: Path, endpoint: str, *, gpus: int = 2,
                 placement: dict[str, int] | None = None) -> None:
        self.name = name
        self.workdir = workdir
        self.gpus = gpus
        self.endpoint = endpoint
        self.placement = placement or {}
        self.mdev_type = "nvidia-35"
        workdir.mkdir(parents=True, exist_ok=True)
        self.root = materialise(build_spec(["nvidia-pf"], gpus=gpus), workdir / "sys")
        # A unix socket's path has at most 107 bytes: the sockets in a short directory.
        self.sockdir = Path(tempfile.mkdtemp(prefix="aa-fl-", dir="/tmp"))
        self.socket_path = str(self.sockdir / "api.sock")
        self.config = workdir / "agent.conf"
        self._write()
        self.daemon = AgentDaemon(self.config, self.socket_path, workdir)

    def _write(self) -> None:
        agent_config(
            self.config, self.root, str(self.workdir / "state"), self.socket_path,
            f"[devices]\nenabled_mdev_types = {self.mdev_type}\n",
            extra=f"[DEFAULT]\nhost = {self.name}\ndebug = false\n"
            + placement_section(self.endpoint, self.name, **self.placement),
        )

    def set_type(self, mdev_type: str) -> None:
        """Every GPU of the host to ``mdev_type``: the config rewritten, SIGHUP."""
        self.mdev_type = mdev_type
        self._write()
        self.daemon.sighup()

    def expected(self) -> dict[str, Any]:
        """What Placement must hold under this host's root, written out."""
        total = PER_GPU[self.mdev_type]
        trait = "CUSTOM_MDEV_" + self.mdev_type.upper().replace("-", "_")
        return {
            f"{self.name}_pci_0000_{0x84 + i:02x}_00_0": (
                {"VGPU": {"total": total, "reserved": 0, "min_unit": 1, "max_unit": total,
                          "step_size": 1, "allocation_ratio": 1.0}},
                sorted([trait, OWNER]),
            )
            for i in range(self.gpus)
        }

    def reporting(self) -> dict[str, Any]:
        return dict(self.daemon.health()["reporting"])

    def close(self) -> None:
        try:
            self.daemon.close()
        finally:
            shutil.rmtree(self.sockdir, ignore_errors=True)


@contextlib.contextmanager
def fleet(count: int, workdir: Path, endpoint: str, *, gpus: int = 2,
          placement: dict[str, int] | None = None, start_timeout: float = 300,
          prefix: str = "fleet") -> Iterator[list[FleetAgent]]:
    """``count`` agents, all started (spawned together, then each awaited),
    all stopped afterwards whatever happened."""
    agents: list[FleetAgent] = []
    try:
        for i in range(count):
            agents.append(FleetAgent(f"{prefix}-{i:03d}", workdir / f"{prefix}-{i:03d}",
                                     endpoint, gpus=gpus, placement=placement))
        for agent in agents:
            agent.daemon.spawn()
        for agent in agents:
            agent.daemon.wait_ready(start_timeout)
        yield agents
    finally:
        for agent in agents:
            with contextlib.suppress(Exception):
                agent.close()


def subtree(admin: Any, host: str) -> dict[str, Any] | None:
    """What Placement holds under ``host``'s root, in :meth:`FleetAgent.expected`'s
    shape; None while it cannot be read whole (changing, or Placement away)."""
    try:
        root = admin.provider(host)
        if root is None:
            return None
        tree = admin.call("GET", f"/resource_providers?in_tree={root['uuid']}")
        held = {}
        for rp in tree["resource_providers"]:
            if rp["uuid"] == root["uuid"]:
                continue
            base = f"/resource_providers/{rp['uuid']}"
            held[rp["name"]] = (
                admin.call("GET", f"{base}/inventories")["inventories"],
                sorted(admin.call("GET", f"{base}/traits")["traits"]),
            )
        return held
    except Exception:  # a provider gone between two reads, Placement away: not exact yet
        return None


def wait_exact(admin: Any, agents: list[FleetAgent], timeout: float) -> float:
    """Seconds until Placement holds every agent's :meth:`~FleetAgent.expected`;
    AssertionError after ``timeout`` naming the hosts that are not."""
    start = time.monotonic()
    waiting = list(agents)
    while waiting:
        waiting = [a for a in waiting if subtree(admin, a.name) != a.expected()]
        if not waiting:
            break
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"Placement not exact after {timeout} s for {len(waiting)} host(s): "
                + ", ".join(a.name for a in waiting[:5])
            )
        time.sleep(0.2)
    return time.monotonic() - start
