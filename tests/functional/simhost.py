"""A FUSE-mounted simulated host plus an agent config and ledger, for lifecycle tests."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices import manager as manager_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from accel_agent.simulator import build_spec
from accel_agent.simulator import testing as sim_testing
from tests.configutil import make_conf, write_conf


def skip_without_fuse() -> None:
    if not sim_testing.fuse_available():
        pytest.skip(f"FUSE unavailable: {sim_testing.fuse_unavailable_reason()}")


@dataclass
class SimHost:
    sim: sim_testing.MountedSimulator
    root: str
    work: Path

    @property
    def state_dir(self) -> str:
        return str(self.work / "state")

    def config(self, ini: str, name: str = "agent.conf") -> str:
        path = str(self.work / name)
        write_conf(path, ini + f"\n[DEFAULT]\nstate_dir = {self.state_dir}\n", self.root)
        return path

    def manager(self, ini: str, **kwargs) -> manager_mod.DeviceManager:
        conf = make_conf(ini, sysfs_root=self.root)
        return manager_mod.DeviceManager(
            sysfs_root=self.root,
            policy=policy_mod.build_policy(conf),
            host="testhost",
            ledger=ledger_mod.Ledger(self.state_dir),
            writer=kwargs.pop("writer", None) or writers.DirectWriter(self.root),
            **kwargs,
        )

    def reset(self) -> None:
        """A clean host: no mdevs (simulated reboot), no ledger."""
        self.sim.reboot()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def sysfs_uuids(self) -> set[str]:
        return set(os.listdir(os.path.join(self.root, "bus", "mdev", "devices")))

    def available(self, parent: str, mdev_type: str) -> int:
        path = os.path.join(
            self.root,
            "class",
            "mdev_bus",
            parent,
            "mdev_supported_types",
            mdev_type,
            "available_instances",
        )
        with open(path) as handle:
            return int(handle.read())

    def create_foreign(self, parent: str, mdev_type: str, uuid: str) -> None:
        path = os.path.join(
            self.root, "class", "mdev_bus", parent, "mdev_supported_types", mdev_type, "create"
        )
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, uuid.encode())
        finally:
            os.close(fd)


@contextlib.contextmanager
def simulated_host(tmp: Path, profiles: list[str], **options) -> Iterator[SimHost]:
    skip_without_fuse()
    mountpoint = tmp / "sys"
    mountpoint.mkdir()
    os.environ.setdefault("ACCEL_SIM_RUNDIR", str(tmp / "run"))
    with sim_testing.mounted(build_spec(profiles, **options), mountpoint) as sim:
        yield SimHost(sim=sim, root=str(mountpoint), work=tmp)
