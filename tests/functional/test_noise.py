"""What the agent and its tools leave behind: no eventlet deprecation notice
in the daemon's log from starting privsep, no file of an unmounted simulator
in its run directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from accel_agent.simulator import control
from tests.functional.daemon_fixture import BOTH, AgentDaemon, agent_config, short_dir
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host, skip_without_fuse

pytestmark = pytest.mark.fuse


@pytest.mark.privsep
def test_starting_privsep_writes_no_eventlet_notice_to_the_agents_log(tmp_path):
    skip_unless_root()
    with simulated_host(tmp_path, ["nvidia-pf", "mtty"], gpus=1) as host, \
            short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(tmp_path / "agent.conf", host.root, host.state_dir,
                              socket_path, BOTH)
        with AgentDaemon(config, socket_path, tmp_path) as daemon:
            daemon.start()
            daemon.client().allocate("vm-1", 1)  # the helper really ran
            log = daemon.log()
    assert "privsep" in log  # the helper ran and its output reached this log
    assert "Eventlet is deprecated" not in log
    assert "EventletDeprecationWarning" not in log


def test_simulate_umount_leaves_nothing_in_the_run_directory(tmp_path):
    skip_without_fuse()
    base = tempfile.mkdtemp(prefix="accel-sim-noise-", dir="/tmp")  # short socket paths
    rundir = os.path.join(base, "accel-agent-simulator")  # as /run/accel-agent-simulator
    env = dict(os.environ, ACCEL_SIM_RUNDIR=rundir)
    mountpoint = str(tmp_path / "sys")
    os.mkdir(mountpoint)
    accelctl = [sys.executable, "-m", "accel_agent.cmd.ctl", "simulate"]
    try:
        mount = subprocess.run([*accelctl, "mount", mountpoint, "--profile", "mtty"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert mount.returncode == 0, mount.stderr
        assert os.listdir(rundir)  # spec, log and socket while it runs
        umount = subprocess.run([*accelctl, "umount", mountpoint], env=env,
                                capture_output=True, text=True, timeout=60)
        assert umount.returncode == 0, umount.stderr
        assert not control.is_mounted(mountpoint)
        left = os.listdir(rundir) if os.path.isdir(rundir) else []
        assert left == [], left
    finally:
        if control.is_mounted(mountpoint):
            control.fusermount_unmount(mountpoint, lazy=True)
        subprocess.run(["rm", "-rf", base], check=False)
