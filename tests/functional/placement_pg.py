"""OpenStack Placement as production runs it, for the fleet test and benchmark.

Not the functional tier's usual Placement (placement_fixture.py: one cheroot
thread over SQLite), which cannot say what a fleet costs: here Placement's
WSGI application runs under gunicorn with several worker processes on a
PostgreSQL server from Debian, on loopback.

* :class:`PostgresServer` — a cluster of its own (``initdb``) in a directory
  of its own, listening on 127.0.0.1 only, on a free port, without a unix
  socket.  PostgreSQL refuses to run as root: its files belong to the
  ``postgres`` user the Debian package creates, and its programs run as it.
  ``trust`` authentication: nothing but this machine's loopback reaches it,
  and it lives as long as the test.
* :class:`PlacementService` — ``placement-manage db sync`` once, then
  gunicorn with ``workers`` sync workers: pre-forked processes serving one
  request at a time each, what devstack's uwsgi (``processes``, one thread)
  runs.  gunicorn rather than Debian's uwsgi: it installs from PyPI into the
  project's venv, pinned by constraints.txt, and runs the venv's own Python;
  Debian's uwsgi plugin is built for the system's.  The application is
  wrapped by :class:`RequestLog`: one line per request (when, which agent,
  method, path with its UUIDs and names folded, status, milliseconds), the
  agent being the project of its ``noauth2`` token (``admin:<agent>``).
  While the file named by ``ACCEL_FLEET_UNAVAILABLE`` exists, the wrapper
  answers 503 to every request, as a load balancer in front of Placement
  does when no backend is up.

:func:`postgres_missing` says why a PostgreSQL server cannot run here (none
installed, not root); :func:`install_postgres` installs it with apt.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0
LOG_ENV = "ACCEL_FLEET_REQUEST_LOG"
UNAVAILABLE_ENV = "ACCEL_FLEET_UNAVAILABLE"
DATABASE = "placement"


# --- PostgreSQL -------------------------------------------------------------------------


def _postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's program directory (Debian's layout)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(re.sub(r"\D", "", Path(p).parts[-3]) or 0),
    )
    return Path(found[-1]).parent if found else None


def postgres_missing() -> str | None:
    """Why a PostgreSQL server cannot run here; None when it can."""
    if os.geteuid() != 0:
        return "PostgreSQL runs as the postgres user: starting it needs root"
    if _postgres_bin() is None:
        return "no PostgreSQL server installed (apt-get install postgresql)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user (Debian's postgresql package creates it)"
    return None


def install_postgres() -> None:
    """Install Debian's PostgreSQL server when it is missing (root)."""
    if _postgres_bin() is not None:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_of(pid: int, children: bool) -> float:
    """User + system CPU seconds of ``pid`` (and of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in Path(task).read_text().split()]
    return found


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of a server: its main process, its children alive or reaped."""
    if pid is None:
        return 0.0
    return _cpu_of(pid, children=True) + sum(_cpu_of(c, children=False) for c in _children(pid))


class PostgresServer:
    """One private cluster in a directory of its own (removed by :meth:`cleanup`)."""

    def __init__(self) -> None:
        missing = postgres_missing()
        if missing:
            raise RuntimeError(missing)
        self.bin = _postgres_bin()
        # Under /tmp, not a test's tmp_path: every directory on the way must be
        # searchable by the postgres user.
        self.home = Path(tempfile.mkdtemp(prefix="accel-pg-", dir="/tmp"))
        self.data = self.home / "data"
        self.log_path = self.home / "postgres.log"
        self.port = free_port()
        user = pwd.getpwnam("postgres")
        os.chown(self.home, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert self.bin is not None
        done = subprocess.run(
            [str(self.bin / program), *args], capture_output=True, text=True, timeout=120,
            user="postgres", group="postgres", cwd=str(self.home),
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stdout}{done.stderr}\n{self.log_tail()}")
        return done

    def start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "60",
            "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
            "start",
        )
        with self.connect("postgres") as conn:
            cur = conn.cursor()
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {DATABASE}")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` (clients disconnected, a clean shutdown) or ``immediate`` (a crash)."""
        if self.pid is not None:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
            return pid
        return None

    def cpu_seconds(self) -> float:
        return tree_cpu(self.pid)

    @contextlib.contextmanager
    def connect(self, database: str = DATABASE) -> Iterator[Any]:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                                dbname=database, connect_timeout=10)
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()

    def database_bytes(self) -> int:
        with self.connect() as conn:
            cur = conn.cursor()
            cur.execute("SELECT pg_database_size(%s)", (DATABASE,))
            return int(cur.fetchone()[0])

    def rows(self, tables: Iterable[str]) -> dict[str, int]:
        counts = {}
        with self.connect() as conn:
            cur = conn.cursor()
            for table in tables:
                cur.execute(f"SELECT count(*) FROM {table}")  # names are ours, not input
                counts[table] = int(cur.fetchone()[0])
        return counts

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


# --- Placement under gunicorn -----------------------------------------------------------


class PlacementService:
    """Placement's WSGI application under gunicorn (``workers`` processes) on
    ``database``, its requests logged to ``request_log``."""

    def __init__(self, database: PostgresServer, workdir: Path, workers: int = 4) -> None:
        self.database = database
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.port = free_port()
        self.request_log = self.workdir / "requests.log"
        self.unavailable_flag = self.workdir / "unavailable"
        self.log_path = self.workdir / "gunicorn.log"
        self.config_dir = self.workdir / "etc"
        self.config_dir.mkdir(exist_ok=True)
        (self.config_dir / "placement.conf").write_text(
            f"[placement_database]\nconnection = {database.url}\nsync_on_startup = false\n"
            "[api]\nauth_strategy = noauth2\n"
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._synced = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "OS_PLACEMENT_CONFIG_DIR": str(self.config_dir),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
            ),
            LOG_ENV: str(self.request_log),
            UNAVAILABLE_ENV: str(self.unavailable_flag),
        }

    def start(self) -> str:
        assert not self.running, "already running"
        if not self._synced:
            done = subprocess.run(
                # placement-manage, from the venv this test runs in (its module has
                # no __main__ guard: -m would import it and do nothing).
                [sys.executable, "-c", "import sys; from placement.cmd.manage import main; "
                 "sys.argv[0] = 'placement-manage'; main()", "--config-file",
                 str(self.config_dir / "placement.conf"), "db", "sync"],
                capture_output=True, text=True, timeout=300, env=self._env(),
            )
            if done.returncode != 0:
                raise RuntimeError(f"placement-manage db sync failed:\n{done.stderr[-3000:]}")
            self._synced = True
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn",
                 "--workers", str(self.workers), "--worker-class", "sync",
                 "--bind", f"127.0.0.1:{self.port}", "--timeout", "120",
                 "--graceful-timeout", "5", "--no-control-socket",
                 "tests.functional.placement_pg:logged_application()"],
                env=self._env(), stdout=log, stderr=subprocess.STDOUT, cwd=str(self.workdir),
            )
        self._wait_ready()
        return self.endpoint

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """SIGKILL by default (a crash); the workers die with their master's
        group.  Idempotent."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            workers = _children(self._proc.pid)
            self._proc.send_signal(sig)
            if sig == signal.SIGKILL:
                for worker in workers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker, signal.SIGKILL)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def set_unavailable(self, unavailable: bool) -> None:
        """Every request answered 503 from now on, or no longer."""
        if unavailable:
            self.unavailable_flag.touch()
        else:
            self.unavailable_flag.unlink(missing_ok=True)

    def cpu_seconds(self) -> float:
        return tree_cpu(self.pid)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"gunicorn exited during start-up:\n{self.log_tail()}")
            try:
                # "/" needs no token; every worker answers it once it has loaded the app.
                with urllib.request.urlopen(self.endpoint + "/", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Placement not ready at {self.endpoint}:\n{self.log_tail()}")

    def __enter__(self) -> PlacementService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the request log (runs inside gunicorn's workers) -------------------------------------

_UUID = re.compile(r"[0-9a-fA-F]{8}(-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}")
_NAMED = re.compile(r"^/(traits|resource_classes)/[^/]+$")


def route(path: str, query: str) -> str:
    """``GET /resource_providers/{uuid}/inventories``: what a request was, without its ids."""
    path = _UUID.sub("{uuid}", path)
    path = _NAMED.sub(r"/\1/{name}", path)
    names = sorted({part.partition("=")[0] for part in query.split("&") if part})
    return path + ("?" + "&".join(names) if names else "")


class RequestLog:
    """WSGI middleware: one line per request into ``path`` (appended, one
    write each: lines from several workers do not mix)."""

    def __init__(self, app: Callable[..., Any], path: str, unavailable: str | None) -> None:
        self.app = app
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.unavailable = unavailable

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        started = time.time()
        token = environ.get("HTTP_X_AUTH_TOKEN", "")
        agent = token.partition(":")[2] or "-"
        seen: list[str] = []

        def recording(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            seen.append(status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

        if self.unavailable and os.path.exists(self.unavailable):
            body = json.dumps({"errors": [{"status": 503, "title": "Service Unavailable",
                                           "detail": "no backend is up", "code": "-"}]})
            recording("503 Service Unavailable",
                      [("Content-Type", "application/json"),
                       ("Content-Length", str(len(body)))])
            answer: Iterable[bytes] = [body.encode()]
        else:
            answer = self.app(environ, recording)
        try:
            return list(answer)
        finally:
            close = getattr(answer, "close", None)
            if close is not None:
                close()
            line = (
                f"{started:.3f} {agent} {environ.get('REQUEST_METHOD', '-')} "
                f"{route(environ.get('PATH_INFO', ''), environ.get('QUERY_STRING', ''))} "
                f"{seen[0] if seen else '-'} {(time.time() - started) * 1000:.1f}\n"
            )
            os.write(self.fd, line.encode())


def logged_application() -> Callable[..., Any]:
    """gunicorn's application factory (each worker loads its own app:
    the database pool must not cross a fork)."""
    from placement import wsgi

    return RequestLog(
        wsgi.init_application(), os.environ[LOG_ENV], os.environ.get(UNAVAILABLE_ENV)
    )


def read_log(path: Path) -> list[tuple[float, str, str, str, str]]:
    """(time, agent, method, route, status) of every request logged so far."""
    rows = []
    with contextlib.suppress(FileNotFoundError), open(path) as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 6:
                rows.append((float(parts[0]), parts[1], parts[2], parts[3], parts[4]))
    return rows
