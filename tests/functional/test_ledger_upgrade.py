"""Who may change the ledger file, through the real accelctl and daemon
(docs/design.md §5.2, issue 21 item 1): readers never create, migrate or write it
and refuse an older schema in one line; offline writers refuse it naming
``accelctl ledger upgrade``; that command and the daemon's start migrate it
after a backup copy; while the daemon runs accelctl does not open it.

The files are read with plain SQL (tests/ledger_sql.py) and ``os.stat``."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.devices.ledger import MIGRATIONS, SCHEMA_VERSION, Ledger
from tests import ledger_sql
from tests.functional.daemon_fixture import MTTY, REPO_ROOT, SimAgent, ctl, sim_agent
from tests.functional.privsep_fixture import _find_daemon_pid, skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

LEDGER = "ledger.sqlite3"
OLD = 3  # the schema before attach requests and per-device settings
OLD_MDEV = "0ddc0ffe-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("upgrade"), ["mtty"]) as host:
        yield host


class Agent(SimAgent):
    @property
    def state_dir(self) -> Path:
        return Path(self.host.state_dir)

    @property
    def ledger(self) -> Path:
        return self.state_dir / LEDGER

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return ctl(self.config, *args)

    def write_old_ledger(self) -> None:
        """A ledger of schema OLD, as an agent of that time left it: one mdev
        (in sysfs too) assigned to vm-old, everything in the main file."""
        with Ledger(self.state_dir, migrations=MIGRATIONS[:OLD]):
            pass  # a new file: given schema OLD
        conn = sqlite3.connect(self.ledger, isolation_level=None)
        conn.execute(
            "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at, backend) "
            "VALUES (?, 'mtty', 'mtty-2', 'present', 1, 1, 'mdev')",
            (OLD_MDEV,),
        )
        conn.execute(
            "INSERT INTO assignments (uuid, owner, owner_kind, assigned_at) "
            "VALUES (?, 'vm-old', 'instance', 1)",
            (OLD_MDEV,),
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        self.host.create_foreign("mtty", "mtty-2", OLD_MDEV)

    def files(self) -> dict[str, tuple[int, int, str]]:
        """Every file of the state directory: (size, mtime_ns, sha256).  Left
        out: the -shm (SQLite's shared index of the WAL, rebuilt from it) and
        an empty -wal, which SQLite makes for any reader of a WAL file that
        finds none (it holds nothing; the next writer uses it)."""
        found = {}
        for path in sorted(self.state_dir.iterdir()):
            st = path.stat()
            if path.name.endswith("-shm") or (path.name.endswith("-wal") and not st.st_size):
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[path.name] = (st.st_size, st.st_mtime_ns, digest)
        return found

    def backups(self) -> list[Path]:
        return sorted(self.state_dir.glob(f"{LEDGER}.v*.bak"))


@pytest.fixture
def agent(sim, tmp_path) -> Iterator[Agent]:
    with sim_agent(sim, tmp_path, MTTY, kind=Agent) as setup:
        yield setup  # type: ignore[misc]


def one_line_refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


READERS = {
    "offline-mdevs": ("--offline", "mdevs", "--json"),
    "offline-inventory": ("--offline", "inventory"),
    "mdevs-plain": ("mdevs", "--json"),  # no daemon: the plain listing path acts directly
    "check-config": ("check-config",),
    "nova-pci-config": ("nova-pci-config",),
}


@pytest.mark.parametrize("reader", list(READERS), ids=list(READERS))
def test_a_reader_refuses_an_old_schema_in_one_line_and_changes_nothing(agent, reader):
    agent.write_old_ledger()
    agent.ctl("types", "--json")  # the plain path needs the config cached first
    before = agent.files()
    line = one_line_refusal(agent.ctl(*READERS[reader]))
    assert f"schema version {OLD}, older than this agent's ({SCHEMA_VERSION})" in line
    assert "accelctl ledger upgrade" in line
    assert agent.files() == before
    assert ledger_sql.query(agent.state_dir, "PRAGMA user_version") == [(OLD,)]


def test_a_reader_never_creates_a_ledger(agent):
    for args in READERS.values():
        assert agent.ctl(*args).returncode == 0, args
    assert not agent.state_dir.exists()


@pytest.mark.parametrize("end", ["stopped", "killed"])
def test_a_reader_of_a_current_ledger_writes_nothing(agent, end):
    """Stopped: the daemon's last close checkpointed and removed the WAL.
    Killed: its last commits are only in the WAL, which a reader must
    neither checkpoint into the ledger nor remove."""
    agent.daemon.start()
    assert agent.ctl("allocate", "vm-1", "--count", "1").returncode == 0
    if end == "stopped":
        assert agent.daemon.stop() == 0
    else:
        helper = _find_daemon_pid(agent.config.resolve())
        agent.daemon.kill()
        os.kill(helper, signal.SIGKILL)
        assert Path(f"{agent.ledger}-wal").stat().st_size > 0
    before = agent.files()
    for args in READERS.values():
        assert agent.ctl(*args).returncode == 0, args
    assert agent.files() == before


OFFLINE_WRITERS = {
    "allocate": ("allocate", "vm-new", "--count", "1"),  # no daemon: acts directly
    "offline-recover": ("--offline", "recover"),
    "offline-release": ("--offline", "release", "vm-old"),
}


@pytest.mark.parametrize("writer", list(OFFLINE_WRITERS), ids=list(OFFLINE_WRITERS))
def test_an_offline_writer_refuses_an_old_schema_naming_the_upgrade(agent, writer):
    agent.write_old_ledger()
    before, in_sysfs = agent.files(), agent.host.sysfs_uuids()
    line = one_line_refusal(agent.ctl(*OFFLINE_WRITERS[writer]))
    assert f"schema version {OLD}" in line and "'accelctl ledger upgrade'" in line
    assert agent.files() == before
    assert agent.host.sysfs_uuids() == in_sysfs


def test_ledger_upgrade_keeps_a_backup_of_the_old_schema(agent):
    agent.write_old_ledger()
    old_rows = ledger_sql.query(agent.state_dir, "SELECT * FROM mdevs")
    proc = agent.ctl("ledger", "upgrade", "--json")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    (backup,) = agent.backups()
    assert answer == {
        "ledger": str(agent.ledger), "found": OLD, "schema": SCHEMA_VERSION,
        "upgraded": True, "backup": str(backup),
    }
    assert backup.name.startswith(f"{LEDGER}.v{OLD}-")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # The backup opens on its own, of the old schema, with the old rows.
    uri = f"{backup.as_uri()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as copy:
        assert copy.execute("PRAGMA user_version").fetchone() == (OLD,)
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("SELECT * FROM mdevs").fetchall() == old_rows
    copy.close()
    assert ledger_sql.query(agent.state_dir, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert ledger_sql.owners(agent.state_dir) == {OLD_MDEV: "vm-old"}
    # Now readers and writers accept it.
    listed = json.loads(agent.ctl("--offline", "mdevs", "--json").stdout)["mdevs"]
    assert [(m["uuid"], m["owned"], m["instance"]) for m in listed] == [
        (OLD_MDEV, True, "vm-old")
    ]
    # Again: nothing to do, no second backup.
    again = agent.ctl("ledger", "upgrade")
    assert again.returncode == 0, again.stderr
    assert f"is at schema {SCHEMA_VERSION} already: nothing to do" in again.stdout
    assert agent.backups() == [backup]


def test_ledger_upgrade_without_a_ledger_creates_none(agent):
    proc = agent.ctl("ledger", "upgrade")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to upgrade" in proc.stdout
    assert not agent.state_dir.exists()


def test_ledger_upgrade_is_refused_while_the_daemon_runs(agent):
    agent.daemon.start()
    before = agent.files()
    for args in (("ledger", "upgrade"), ("--offline", "ledger", "upgrade")):
        line = one_line_refusal(agent.ctl(*args))
        assert "accel-agent is running" in line and "restart it" in line
    assert {k: v for k, v in agent.files().items() if k == LEDGER} == {
        k: v for k, v in before.items() if k == LEDGER
    }
    assert agent.backups() == []


def test_the_daemons_start_upgrades_an_old_ledger_after_a_backup(agent):
    agent.write_old_ledger()
    daemon = agent.daemon.start()
    (backup,) = agent.backups()
    said = f"upgraded from schema {OLD} to {SCHEMA_VERSION}; a copy of it as it was is at {backup}"
    assert said in daemon.log()
    assert ledger_sql.query(agent.state_dir, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    uri = f"{backup.as_uri()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as copy:
        assert copy.execute("PRAGMA user_version").fetchone() == (OLD,)
    copy.close()
    assert [m["uuid"] for m in daemon.client().allocation("vm-old")["mdevs"]] == [OLD_MDEV]
    assert daemon.health()["status"] == "ok"


# A probe: accelctl's main() in a process whose read_ledger and Ledger fail
# loudly, to show that a command did not open the ledger.
NO_LEDGER = """
import sys
from accel_agent import wiring
from accel_agent.cmd import ctl
from accel_agent.devices import ledger

def refuse(*args, **kwargs):
    raise AssertionError("accelctl opened the ledger while the daemon runs")

wiring.read_ledger = refuse
ledger.Ledger = refuse
sys.exit(ctl.main({argv!r}))
"""


# check-config opens the ledger beside the daemon too, read-only only: what a
# reload or the next start would refuse depends on its rows (config/startchecks.py).
READ_ONLY_LEDGER = """
import sys
from accel_agent.cmd import ctl
from accel_agent.devices import ledger

opened = ledger.Ledger

def read_only(*args, **kwargs):
    assert kwargs.get("read_only"), "accelctl opened the ledger for writing while the daemon runs"
    return opened(*args, **kwargs)

ledger.Ledger = read_only
sys.exit(ctl.main({argv!r}))
"""


def test_check_config_opens_the_running_daemon_s_ledger_read_only(agent):
    agent.daemon.start()
    assert agent.ctl("allocate", "vm-1", "--count", "1").returncode == 0
    argv = ["--config-file", str(agent.config), "check-config"]
    probe = subprocess.run(
        [sys.executable, "-c", READ_ONLY_LEDGER.format(argv=argv)],
        capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT),
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert probe.returncode == 0, probe.stderr
    assert agent.daemon.health()["status"] == "ok"


@pytest.mark.parametrize("command", [("nova-pci-config",)], ids=["nova-pci-config"])
def test_accelctl_asks_the_daemon_instead_of_opening_its_ledger(agent, command):
    agent.daemon.start()
    assert agent.ctl("allocate", "vm-1", "--count", "1").returncode == 0
    argv = ["--config-file", str(agent.config), *command]
    probe = subprocess.run(
        [sys.executable, "-c", NO_LEDGER.format(argv=argv)],
        capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT),
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert probe.returncode == 0, probe.stderr
    # The same command reads the ledger itself with --offline.
    offline = subprocess.run(
        [sys.executable, "-c", NO_LEDGER.format(argv=[argv[0], argv[1], "--offline", *command])],
        capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT),
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert offline.returncode == 1 and "opened the ledger" in offline.stderr, offline.stderr
