"""Test helpers: a FUSE-mounted or materialised simulated host in a ``with``.

    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with mounted(profiles.mtty(), tmp_path / "sys") as sim:
        ...                       # the agent reads/writes sim.root like /sys
        sim.hold(uuid); sim.reboot(); sim.status()
        sim.reboot(vfs_disabled=True); sim.enable_vfs("ALL")   # vGPU 17+ VFs

``mounted`` runs the simulator as a subprocess (so FUSE callbacks never share
the test's GIL and a test failure cannot leave a server thread behind) and
always unmounts and reaps it on exit, whatever happened inside the block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from accel_agent.simulator import control, daemon
from accel_agent.simulator.control import SimulatorClient, fuse_unavailable_reason
from accel_agent.simulator.spec import HostSpec
from accel_agent.simulator.static import materialise

__all__ = ["MountedSimulator", "fuse_available", "fuse_unavailable_reason", "materialised",
           "mounted"]


def fuse_available() -> bool:
    """True when a FUSE simulator can be mounted here (see fuse_unavailable_reason)."""
    return fuse_unavailable_reason() is None


class MountedSimulator(SimulatorClient):
    """A client of one mounted simulator, plus where things are."""

    def __init__(self, root: str, rundir: str, process: subprocess.Popen[bytes]) -> None:
        paths = control.instance_paths(root, rundir)
        super().__init__(paths["socket"], root)
        self.root = root
        self.rundir = rundir
        self.process = process
        self.log_path = paths["log"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)


@contextlib.contextmanager
def mounted(spec: HostSpec, directory: str | os.PathLike[str], *, timeout: float = 30.0,
            remove_block_timeout: float | None = None) -> Iterator[MountedSimulator]:
    """Mount ``spec`` at ``directory`` (created if missing) in a subprocess and
    yield its client; unmount and reap on exit even when the block raised."""
    reason = fuse_unavailable_reason()
    if reason:
        from accel_agent import exception

        raise exception.FuseUnavailable(reason=reason)
    root = control.canonical_mountpoint(os.fspath(directory))
    os.makedirs(root, exist_ok=True)
    # A short private run dir: unix socket paths are limited to 107 bytes, and
    # pytest's tmp_path can be longer than that.
    rundir = tempfile.mkdtemp(prefix="accel-sim-", dir="/tmp")
    proc = daemon.spawn(spec, root, rundir=rundir, remove_block_timeout=remove_block_timeout)
    try:
        daemon.wait_mounted(proc, root, rundir=rundir, timeout=timeout)
        yield MountedSimulator(root, rundir, proc)
    finally:
        try:
            if proc.poll() is None or control.is_mounted(root):
                daemon.stop(root, rundir=rundir)
        except Exception:  # cleanup must go on: kill and unmount below
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            if control.mount_fstype(root) == control.FSTYPE:
                control.fusermount_unmount(root, lazy=True)
            shutil.rmtree(rundir, ignore_errors=True)


@contextlib.contextmanager
def materialised(spec: HostSpec, directory: str | os.PathLike[str]) -> Iterator[str]:
    """A static tree of ``spec`` under ``directory`` (removed again on exit)."""
    root = materialise(spec, directory)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
