"""Run the REAL ``accel-agent`` daemon as a subprocess in a test.

    daemon = AgentDaemon(config_file, socket_path, workdir)
    daemon.start()                 # waits for READY=1 on a fake NOTIFY_SOCKET
    daemon.client().health()       # the API over the unix socket
    daemon.sighup(); daemon.kill(); daemon.stop()   # SIGTERM, returns the exit code
    daemon.log()                   # stdout + stderr of every run so far

The daemon is started the production way (``python -m accel_agent.cmd.agent
--config-file F``), so it starts the real privsep daemon (tests run as root)
and serves the API with cheroot.  Readiness is what systemd would see: the
fixture binds a datagram socket, passes it as ``NOTIFY_SOCKET`` and waits
for ``READY=1``; every notification is kept in :attr:`notifications`.
Unix socket paths are limited to 107 bytes, so both sockets live in a short
private directory under /tmp (``short_dir``), not under pytest's tmp_path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from accel_agent.api.client import ApiClient

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0
# nvidia-35 the default type of every GPU, mtty-2 on the mtty parent: the
# config of the daemon tests on the nvidia-pf + mtty simulated host.
BOTH = """
[devices]
enabled_mdev_types = nvidia-35, mtty-2
[mdev_nvidia-35]
[mdev_mtty-2]
device_addresses = mtty
"""
# The mtty sample parent with one type: the daemon tests that need one parent.
MTTY = """
[devices]
enabled_mdev_types = mtty-2
[mdev_mtty-2]
device_addresses = mtty
"""
_T = TypeVar("_T")


@contextlib.contextmanager
def short_dir(prefix: str = "aa-") -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def agent_config(
    path: Path,
    sysfs_root: str,
    state_dir: str,
    socket_path: str,
    body: str,
    rescan_interval: float = 60.0,
    extra: str = "",
) -> Path:
    """A daemon config: host ``testhost``, no libvirt, the given sockets and dirs."""
    path.write_text(
        textwrap.dedent(
            f"""\
            [DEFAULT]
            host = testhost
            sysfs_root = {sysfs_root}
            state_dir = {state_dir}
            rescan_interval = {rescan_interval}
            event_debounce = 0.05
            debug = true
            [api]
            socket_path = {socket_path}
            [libvirt]
            uri =
            """
        )
        + textwrap.dedent(body)
        + textwrap.dedent(extra)
    )
    return path


def wait_for(
    predicate: Callable[[], _T], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> _T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}: {last!r}")


class AgentDaemon:
    def __init__(
        self,
        config_file: Path,
        socket_path: str,
        workdir: Path,
        command: list[str] | None = None,
    ) -> None:
        """``command``: an installed ``accel-agent`` to run instead of this
        checkout's module (the real-kernel lab runs the wheel in its venv)."""
        self.config_file = Path(config_file)
        self.socket_path = socket_path
        self.workdir = Path(workdir)
        self.command = command
        self.log_path = self.workdir / "agent.log"
        self.notify_path = str(Path(socket_path).parent / "notify.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        self.notifications: list[str] = []
        self._notify: socket.socket | None = None
        self.runs = 0

    # --- life cycle -------------------------------------------------------------------

    def spawn(self, *extra_args: str) -> subprocess.Popen[bytes]:
        """Start the process without waiting (for tests of refused starts)."""
        assert not self.running, "already running"
        self._open_notify()
        self.read_notifications()  # what an earlier run sent
        self.notifications = []
        env = dict(os.environ)
        env["NOTIFY_SOCKET"] = self.notify_path
        if self.command is None:
            command = [sys.executable, "-m", "accel_agent.cmd.agent"]
            cwd = REPO_ROOT
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
            )
        else:
            command, cwd = self.command, self.workdir
        env.pop("LISTEN_PID", None)
        self.runs += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== run {self.runs} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*command, "--config-file", str(self.config_file), *extra_args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(cwd),
            )
        return self.proc

    def start(self, *extra_args: str, timeout: float = START_TIMEOUT) -> AgentDaemon:
        self.spawn(*extra_args)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until READY=1 arrives on the notify socket (and the API answers)."""
        deadline = time.monotonic() + timeout
        assert self._notify is not None
        while "READY=1" not in self.notifications:
            if not self.running:
                raise AssertionError(
                    f"accel-agent exited with {self.proc.returncode if self.proc else '?'} "
                    f"before READY=1:\n{self.log()[-6000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"accel-agent not ready in {timeout} s:\n{self.log()[-6000:]}")
            self.read_notifications(0.2)
        self.client().health()

    def read_notifications(self, timeout: float = 0.0) -> list[str]:
        """Collect pending sd_notify datagrams (waiting at most ``timeout`` for one)."""
        assert self._notify is not None
        self._notify.settimeout(timeout if timeout > 0 else 0.0001)
        with contextlib.suppress(TimeoutError, BlockingIOError):
            while True:
                data = self._notify.recv(4096)
                self.notifications += data.decode().split("\n")
                self._notify.settimeout(0.0001)
        return self.notifications

    def _open_notify(self) -> None:
        if self._notify is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.notify_path)
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(self.notify_path)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def sighup(self) -> None:
        # As systemd does: its notify socket is drained all the time, so the
        # daemon's RELOADING=1/READY=1 around each reload never find it full.
        if self._notify is not None:
            self.read_notifications()
        self.signal(signal.SIGHUP)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code (idempotent)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"accel-agent ignored SIGTERM:\n{self.log()[-4000:]}"
                ) from None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, like a crash (the privsep daemon notices and exits on its own)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._notify is not None:
                self._notify.close()
                self._notify = None

    def __enter__(self) -> AgentDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- talking to it ---------------------------------------------------------------

    def client(self, timeout: float | None = None) -> ApiClient:
        return ApiClient(self.socket_path, timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def health(self) -> dict[str, Any]:
        return self.client().health()

    def metric(self, name: str, **labels: str) -> float:
        """The first sample of GET /metrics named ``name`` whose labels include
        ``labels`` (0.0 when there is none)."""
        text = self.client().call("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, _, value = line.rpartition(" ")
            sample, _, label_text = key.partition("{")
            found = dict(
                (part.split("=", 1)[0], part.split("=", 1)[1].strip('"'))
                for part in label_text.rstrip("}").split(",")
                if "=" in part
            )
            if sample == name and labels.items() <= found.items():
                return float(value)
        return 0.0


class SimAgent:
    """A daemon for a simulated host: its config (``body`` under the usual
    [DEFAULT] and [api], rewritten by :meth:`write`), its API socket in a short
    directory, its log in ``workdir``.  Not started: ``agent.daemon.start()``."""

    def __init__(self, host: Any, workdir: Path, sockdir: Path, body: str = BOTH) -> None:
        self.host = host
        self.workdir = workdir
        self.body = body
        self.socket_path = str(sockdir / "api.sock")
        self.config = workdir / "agent.conf"
        self.write()
        self.daemon = AgentDaemon(self.config, self.socket_path, workdir)

    def write(self, extra: str = "", sysfs_root: str | None = None) -> None:
        agent_config(self.config, sysfs_root or self.host.root, self.host.state_dir,
                     self.socket_path, self.body, extra=extra)

    def helper_pid(self) -> int | None:
        """The running privsep helper's pid; None while there is none (or two)."""
        from tests.functional.privsep_fixture import _find_daemon_pid

        try:
            return _find_daemon_pid(self.config.resolve())
        except RuntimeError:
            return None


@contextlib.contextmanager
def sim_agent(host: Any, workdir: Path, body: str = BOTH,
              kind: type[SimAgent] = SimAgent) -> Iterator[SimAgent]:
    """A :class:`SimAgent` (or ``kind``) on ``host`` made clean (its reset),
    its daemon stopped afterwards whatever happened."""
    host.reset()
    with short_dir() as sockdir:
        agent = kind(host, workdir, sockdir, body)
        try:
            yield agent
        finally:
            agent.daemon.close()


def ctl(config: Path | str, *args: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``accelctl --config-file config ARGS`` as a process."""
    return subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO_ROOT),
        env=env,
    )


# --- load generator (run as a separate process) ------------------------------------------


def load_worker(
    socket_path: str, out_path: str, seed: int, requests: int, instances: list[str]
) -> None:
    """``requests`` PUT/DELETE calls on ``instances``, one at a time, each
    answer appended to ``out_path`` as a JSON line (flushed).  Stops at the
    first call that gets no answer (the daemon died), recording it with
    ``error``: that call may or may not have happened."""
    import json
    import random

    from accel_agent import exception
    from accel_agent.api.client import quote

    rng = random.Random(seed)
    client = ApiClient(socket_path, timeout=120)
    with open(out_path, "a") as out:
        for i in range(requests):
            instance = rng.choice(instances)
            roll = rng.random()
            record: dict[str, Any] = {"i": i, "instance": instance}
            url = f"/v1/instances/{quote(instance)}/allocation"
            try:
                if roll < 0.5:
                    record.update(op="PUT", count=rng.randint(1, 3))
                    status, ctype, data = client.request("PUT", url, {"count": record["count"]})
                else:
                    remove = roll >= 0.75
                    record.update(op="DELETE", remove=remove)
                    query = "?remove=true" if remove else "?remove=false"
                    status, ctype, data = client.request("DELETE", url + query)
            except exception.AccelAgentException as exc:
                record["error"] = exc.message
                out.write(json.dumps(record) + "\n")
                out.flush()
                return
            record.update(status=status, content_type=ctype)
            try:
                record["body"] = json.loads(data)
            except ValueError:
                record["body"] = data.decode("utf-8", "replace")
            out.write(json.dumps(record) + "\n")
            out.flush()


def spawn_load(
    socket_path: str, out_path: Path, seed: int, requests: int, instances: list[str]
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.functional.daemon_fixture",
            "load",
            socket_path,
            str(out_path),
            str(seed),
            str(requests),
            ",".join(instances),
        ],
        cwd=str(REPO_ROOT),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def read_records(path: Path) -> list[dict[str, Any]]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "load":
    load_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                sys.argv[6].split(","))
