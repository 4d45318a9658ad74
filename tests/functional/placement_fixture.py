"""A real OpenStack Placement on 127.0.0.1 for functional tests.

docs/design.md §8.2: ``openstack-placement`` configured
only by environment variables (SQLite file, schema synced at start-up,
``noauth2``, so clients send ``X-Auth-Token: admin``), served by cheroot in a
subprocess.  A subprocess, not a thread, so that a test can kill it like a
crashed server and start it again on the same port and database.

Run directly (``python placement_fixture.py --port 0 --port-file F``) it is
the server side; imported, :class:`PlacementServer` drives it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

STARTUP_TIMEOUT = 60.0


def placement_available() -> bool:
    return importlib.util.find_spec("placement") is not None


class PlacementServer:
    """One Placement process at a time over one SQLite database in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.database = self.workdir / "placement.sqlite"
        self.log_path = self.workdir / "placement.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        assert self.port is not None, "server never started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> str:
        """Start (again, on the same port and database once it has run); wait until ready."""
        assert not self.running, "already running"
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        # An empty config dir shields the server from any /etc/placement on the host.
        (self.workdir / "placement.conf").touch()
        env = {
            **os.environ,
            "OS_PLACEMENT_CONFIG_DIR": str(self.workdir),
            "OS_PLACEMENT_DATABASE__CONNECTION": f"sqlite:///{self.database}",
            "OS_PLACEMENT_DATABASE__SYNC_ON_STARTUP": "true",
            "OS_API__AUTH_STRATEGY": "noauth2",
        }
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--port",
                    str(self.port or 0),
                    "--port-file",
                    str(port_file),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.port = self._wait_for_port(port_file)
        self._wait_ready()
        return self.endpoint

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server; SIGKILL by default, as a crash would (idempotent)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> PlacementServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if not self.running:
            raise RuntimeError(f"Placement exited during start-up:\n{self._log_tail()}")

    def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            text = port_file.read_text() if port_file.exists() else ""
            if text.endswith("\n"):
                return int(text)
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Placement did not bind a port:\n{self._log_tail()}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                # "/" needs no token and answers once the app (and its DB) is up.
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Placement not ready at {self.endpoint}:\n{self._log_tail()}")


def _serve(port: int, port_file: Path) -> None:
    from cheroot import wsgi
    from placement import wsgi as placement_wsgi

    # Builds the app, syncs the schema (sync_on_startup) and reads the env config.
    app = placement_wsgi.init_application()
    if port == 0:
        # cheroot sets SO_REUSEADDR only on an explicit port, and a restart on the
        # same port needs it on the first server too (its killed connections
        # linger in FIN_WAIT/TIME_WAIT): pick a free port, then bind it explicitly.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    # One thread: SQLite does not like concurrent writers, and the tests
    # orchestrate their races explicitly rather than rely on server threads.
    server = wsgi.Server(("127.0.0.1", port), app, numthreads=1)
    server.prepare()
    bound = server.bind_addr[1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{bound}\n")
    tmp.rename(port_file)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.serve()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args(argv)
    _serve(args.port, args.port_file)


if __name__ == "__main__":
    main()
