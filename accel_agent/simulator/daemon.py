"""Start, await and stop a simulator process serving a mountpoint.

Shared by ``accelctl simulate mount/umount`` and the test helpers.  The
server is always a separate process (``python -m accel_agent.simulator mount
DIR --spec FILE --foreground``): FUSE callbacks then never compete with the
caller's own threads for the GIL, and a crashed caller cannot take the mount
down half-way.  Its output goes to a log file next to the control socket, so a
failed start can be explained.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import accel_agent
from accel_agent import exception
from accel_agent.simulator import control
from accel_agent.simulator.spec import HostSpec

_POLL = 0.05


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie child of ours is reaped and counts as gone)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def spawn(spec: HostSpec, mountpoint: str, *, rundir: str | None = None,
          remove_block_timeout: float | None = None) -> subprocess.Popen[bytes]:
    """Start the server process (it mounts in the background; see wait_mounted)."""
    mp = control.canonical_mountpoint(mountpoint)
    rundir = rundir or control.run_dir()
    paths = control.instance_paths(mp, rundir)
    os.makedirs(rundir, mode=0o700, exist_ok=True)
    with open(paths["spec"], "w", encoding="utf-8") as f:
        f.write(spec.to_json())
    env = os.environ.copy()
    env[control.RUNDIR_ENV] = rundir
    # The child runs from / (so it never pins the caller's cwd); make sure it finds
    # this very package even when it is not installed.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(accel_agent.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "accel_agent.simulator", "mount", mp,
           "--spec", paths["spec"], "--foreground"]
    if remove_block_timeout is not None:
        cmd += ["--remove-timeout", str(remove_block_timeout)]
    with open(paths["log"], "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd="/", env=env,
                                start_new_session=True, close_fds=True)


def wait_mounted(proc: subprocess.Popen[bytes], mountpoint: str, *, rundir: str | None = None,
                 timeout: float = 30.0) -> dict[str, Any]:
    """Block until the server answers and the kernel shows the mount; on failure
    kill the server and raise with the tail of its log."""
    mp = control.canonical_mountpoint(mountpoint)
    paths = control.instance_paths(mp, rundir)
    client = control.SimulatorClient(paths["socket"], mp, timeout=5.0)
    deadline = time.monotonic() + timeout
    while True:
        rc = proc.poll()
        if rc is not None:
            raise exception.SimulatorError(
                reason=f"simulator for {mp} exited with status {rc}: "
                       f"{log_tail(paths['log']) or 'no output'}")
        try:
            status = client.status(counters=False)
            if status.get("mounted") and control.is_mounted(mp):
                return status
        except exception.SimulatorNotRunning:
            pass
        if time.monotonic() > deadline:
            _kill(proc.pid)
            proc.wait(5)
            raise exception.SimulatorError(
                reason=f"simulator for {mp} not mounted after {timeout:g} s: "
                       f"{log_tail(paths['log']) or 'no output'}")
        time.sleep(_POLL)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop(mountpoint: str, *, rundir: str | None = None, timeout: float = 15.0) -> None:
    """Stop the simulator serving ``mountpoint`` and wait for the unmount.  A
    mount of ours whose server is gone (killed) is unmounted with fusermount3."""
    mp = control.canonical_mountpoint(mountpoint)
    client = control.SimulatorClient.for_mountpoint(mp, rundir)
    client.timeout = 5.0
    pid: int | None = None
    try:
        pid = int(client.status(counters=False)["pid"])
        client.stop()
    except exception.SimulatorNotRunning:
        if control.mount_fstype(mp) != control.FSTYPE:
            raise
        if not control.fusermount_unmount(mp):
            control.fusermount_unmount(mp, lazy=True)
    deadline = time.monotonic() + timeout
    while control.is_mounted(mp) or (pid is not None and pid_alive(pid)):
        if time.monotonic() > deadline:
            # Last resort: never leave a dead mount behind.
            if pid is not None:
                _kill(pid)
            if control.mount_fstype(mp) == control.FSTYPE:
                control.fusermount_unmount(mp, lazy=True)
            raise exception.SimulatorError(
                reason=f"simulator for {mp} did not stop within {timeout:g} s; killed it")
        time.sleep(_POLL)
    _remove_run_files(mp, rundir)


def _remove_run_files(mountpoint: str, rundir: str | None) -> None:
    """After a clean stop nothing of this instance stays in the run
    directory (its spec and log, a socket a killed server left), and the
    directory goes too when it is empty.  A failed stop keeps the log."""
    paths = control.instance_paths(mountpoint, rundir)
    for path in paths.values():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    with contextlib.suppress(OSError):  # not empty: another simulator runs
        os.rmdir(os.path.dirname(paths["socket"]))
