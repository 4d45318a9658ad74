"""Who may change the ledger file (docs/design.md §5.2, issue 21 item 1): a reader
(``read_only``) never creates, writes, migrates or checkpoints it; a writer
refuses an older schema unless it was asked to upgrade, and an upgrade keeps
a backup copy made with SQLite's backup API; opening never closes a
descriptor of a ledger the process already has open.

The files are looked at with plain ``sqlite3`` and ``os.stat``, not through
the Ledger class under test."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel_agent import exception, wiring
from accel_agent.devices.ledger import (
    LEDGER_FILENAME,
    MIGRATIONS,
    SCHEMA_VERSION,
    Ledger,
    LedgerSchemaOld,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
U1 = "00000000-0000-4000-8000-000000000001"
U2 = "00000000-0000-4000-8000-000000000002"


def fingerprint(path: Path) -> dict[str, tuple[int, int, str] | None]:
    """(size, mtime_ns, sha256) of the ledger and its -wal/-shm (None: absent)."""
    found: dict[str, tuple[int, int, str] | None] = {}
    for suffix in ("", "-wal"):
        name = Path(f"{path}{suffix}")
        if name.exists():
            st = name.stat()
            digest = hashlib.sha256(name.read_bytes()).hexdigest()
            found[suffix] = (st.st_size, st.st_mtime_ns, digest)
        else:
            found[suffix] = None
    return found


def assert_untouched(path: Path, before: dict[str, tuple[int, int, str] | None]) -> None:
    """The ledger file and its WAL as ``before``.  SQLite cannot read a WAL
    database without a -wal and -shm file: a reader that found none leaves
    an empty one (no data; the next writer uses it)."""
    after = fingerprint(path)
    assert after[""] == before[""], "the ledger file changed"
    if before["-wal"] is None:
        assert after["-wal"] is None or after["-wal"][0] == 0, after
    else:
        assert after["-wal"] == before["-wal"], "the WAL changed"


def sql(path: Path, query: str) -> list[tuple]:
    uri = path.resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def write_v1_ledger(state_dir: Path) -> Path:
    """A ledger of schema 1 with one assigned mdev, everything checkpointed
    into the main file."""
    with Ledger(state_dir, migrations=MIGRATIONS[:1]) as old:
        old._conn.execute(
            "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at) "
            "VALUES (?, 'mtty', 'mtty-1', 'present', 0, 0)",
            (U1,),
        )
        old._conn.execute(
            "INSERT INTO assignments (uuid, owner, owner_kind, assigned_at) "
            "VALUES (?, 'vm-old', 'instance', 0)",
            (U1,),
        )
        old._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return state_dir / LEDGER_FILENAME


# --- readers ---------------------------------------------------------------------------


def test_a_reader_never_creates_the_ledger_nor_its_directory(tmp_path):
    state = tmp_path / "state"
    with pytest.raises(exception.LedgerError, match="cannot open"):
        Ledger(state, read_only=True)
    assert not state.exists()
    state.mkdir()
    with pytest.raises(exception.LedgerError, match="cannot open"):
        Ledger(state, read_only=True)
    assert os.listdir(state) == []


def test_a_reader_beside_a_live_writer_neither_writes_nor_checkpoints(tmp_path):
    with Ledger(tmp_path) as writer:
        writer.record_create_intent(U1, "mtty", "mtty-1")
        writer.settle_created(U1)
        writer.assign(U1, "vm-1")
        path = writer.path
        before = fingerprint(path)
        assert before["-wal"] is not None and before["-wal"][0] > 0  # the commits are in it
        with Ledger(tmp_path, read_only=True) as reader:
            assert [(r.uuid, r.owner) for r in reader.all()] == [(U1, "vm-1")]
            with pytest.raises(exception.LedgerError, match="read-only"):
                reader.record_create_intent(U2, "mtty", "mtty-1")
        assert_untouched(path, before)
        # The writer is unaffected: it still commits into the same WAL.
        writer.release(U1)
        assert sql(path, "SELECT count(*) FROM assignments") == [(0,)]


def test_the_last_reader_to_close_leaves_the_wal_to_the_writer(tmp_path):
    """A writer that died (SIGKILL) left its commits in the WAL: a reader's
    close must not checkpoint them into the main file nor unlink the WAL."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from accel_agent.devices.ledger import Ledger
        led = Ledger(sys.argv[1])
        led.record_create_intent({U1!r}, "mtty", "mtty-1")
        os._exit(0)  # no close: as a crash leaves it
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=REPO_ROOT,
                   env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    path = tmp_path / LEDGER_FILENAME
    before = fingerprint(path)
    assert before["-wal"] is not None and before["-wal"][0] > 0
    for _ in range(2):
        with Ledger(tmp_path, read_only=True) as reader:
            assert [r.uuid for r in reader.all()] == [U1]
    assert_untouched(path, before)


def test_a_reader_refuses_an_older_schema_saying_what_to_run(tmp_path):
    path = write_v1_ledger(tmp_path)
    before = fingerprint(path)
    with pytest.raises(LedgerSchemaOld) as info:
        Ledger(tmp_path, read_only=True)
    message = info.value.message
    assert "\n" not in message
    assert "schema version 1" in message and f"({SCHEMA_VERSION})" in message
    assert "accelctl ledger upgrade" in message
    assert_untouched(path, before)
    assert sql(path, "PRAGMA user_version") == [(1,)]


def test_a_reader_refuses_a_newer_schema(tmp_path):
    with Ledger(tmp_path):
        pass
    conn = sqlite3.connect(tmp_path / LEDGER_FILENAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(exception.LedgerSchemaTooNew, match="newer than this agent"):
        Ledger(tmp_path, read_only=True)


def test_a_reader_of_a_ledger_not_yet_given_its_schema_sees_version_0(tmp_path):
    """A writer made the file an instant ago and has not given it its tables
    yet: the listings' reader sees nothing recorded, not an error."""
    sqlite3.connect(tmp_path / LEDGER_FILENAME).close()  # an empty file
    with Ledger(tmp_path, read_only=True) as reader:
        assert reader.schema_version == 0
    assert wiring.read_ledger(str(tmp_path)) == wiring.LedgerView()
    assert (tmp_path / LEDGER_FILENAME).stat().st_size == 0


# --- writers: migrations only when asked, after a backup -------------------------------


def test_a_writer_not_asked_to_upgrade_refuses_an_older_schema_unchanged(tmp_path):
    path = write_v1_ledger(tmp_path)
    before = fingerprint(path)
    with pytest.raises(LedgerSchemaOld, match="accelctl ledger upgrade"):
        Ledger(tmp_path)
    assert_untouched(path, before)
    assert [p.name for p in tmp_path.iterdir() if ".bak" in p.name] == []


def test_an_upgrade_keeps_a_backup_of_the_old_schema_beside_the_ledger(tmp_path):
    path = write_v1_ledger(tmp_path)
    with Ledger(tmp_path, upgrade=True, clock=lambda: 1_764_150_000.0) as led:
        assert led.schema_version == SCHEMA_VERSION
        assert led.get(U1).owner == "vm-old"
        backup = led.backup_path
    assert backup is not None and backup.parent == tmp_path
    assert backup.name == f"{LEDGER_FILENAME}.v1-20251126T094000Z.bak"
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # One self-contained file of the old schema, with the old rows.
    assert sql(backup, "PRAGMA user_version") == [(1,)]
    assert sql(backup, "PRAGMA journal_mode") == [("delete",)]
    assert sql(backup, "SELECT uuid, owner FROM assignments") == [(U1, "vm-old")]
    assert sql(backup, "PRAGMA integrity_check") == [("ok",)]
    assert not Path(f"{backup}-wal").exists()
    assert sql(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    # Restoring it (agent stopped) gives back the old file's content.
    restored = tmp_path / "restored"
    restored.mkdir()
    os.replace(backup, restored / LEDGER_FILENAME)
    assert sql(restored / LEDGER_FILENAME, "SELECT * FROM mdevs") == [
        (U1, "mtty", "mtty-1", "present", None, 0, 0, 0)
    ]


def test_an_upgrade_logs_where_the_backup_is_under_the_ledgers_name(tmp_path, caplog):
    """Operators filter on the logger's name: the ledger's lines keep it,
    whichever of the package's modules writes them."""
    write_v1_ledger(tmp_path)
    caplog.set_level("INFO", logger="accel_agent.devices.ledger")
    with Ledger(tmp_path, upgrade=True) as led:
        backup = led.backup_path
    warnings = [(r.name, r.getMessage()) for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [(
        "accel_agent.devices.ledger",
        f"mdev ledger {tmp_path / LEDGER_FILENAME} upgraded from schema 1 to {SCHEMA_VERSION}; "
        f"a copy of it as it was is at {backup}",
    )]


def test_the_older_schema_refusal_is_one_of_the_agents_ledger_errors():
    """Callers catch it from accel_agent.exception or, as before, the ledger."""
    assert LedgerSchemaOld is exception.LedgerSchemaOld
    assert issubclass(LedgerSchemaOld, exception.LedgerError)


def test_a_commit_between_the_backup_and_the_migration_gets_a_new_backup(tmp_path, monkeypatch):
    """The backup cannot be taken inside the migration's write transaction:
    another process's commit in between would be missing from it."""
    write_v1_ledger(tmp_path)
    taken = []
    original = Ledger._backup

    def backup_then_another_commit(self, version):
        path = original(self, version)
        taken.append(path)
        if len(taken) == 1:  # another process writes once, right after the first copy
            other = sqlite3.connect(self.path, isolation_level=None)
            other.execute(
                "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at) "
                "VALUES (?, 'mtty', 'mtty-1', 'present', 0, 0)",
                (U2,),
            )
            other.close()
        return path

    monkeypatch.setattr(Ledger, "_backup", backup_then_another_commit)
    with Ledger(tmp_path, upgrade=True) as led:
        backup = led.backup_path
    assert len(taken) == 2 and backup == taken[1]
    assert sorted(tmp_path.glob("*.bak")) == [backup]  # the stale copy is gone
    assert sql(backup, "SELECT uuid FROM mdevs ORDER BY uuid") == [(U1,), (U2,)]


def test_a_new_ledger_is_given_its_schema_without_a_backup(tmp_path):
    with Ledger(tmp_path, upgrade=True) as led:
        assert led.created and led.backup_path is None
    assert sorted(os.listdir(tmp_path)) == [LEDGER_FILENAME]


def test_an_upgrade_with_nothing_to_do_takes_no_backup(tmp_path):
    Ledger(tmp_path).close()
    with Ledger(tmp_path, upgrade=True) as led:
        assert led.backup_path is None
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".bak")]


# --- one connection per process -----------------------------------------------------------

_OTHER_PROCESS_CLOSES = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1])
    conn.execute("SELECT count(*) FROM mdevs").fetchone()
    conn.close()  # the last connection to close checkpoints and unlinks the WAL
    """
)


def test_opening_never_drops_the_locks_of_a_connection_the_process_has(tmp_path):
    """Closing any descriptor of a file drops the process's POSIX locks on
    it.  Should opening the ledger close one (a raw open/close to set its
    mode), the live connection loses its locks, and another process's close
    checkpoints and unlinks the WAL under it."""
    with Ledger(tmp_path) as live:
        live.record_create_intent(U1, "mtty", "mtty-1")
        wal = Path(f"{live.path}-wal")
        assert wal.exists()
        # What must not happen in the daemon; here it shows whether opening
        # (a writer's, then a reader's) closes a descriptor of the live file.
        Ledger(tmp_path).close()
        Ledger(tmp_path, read_only=True).close()
        subprocess.run([sys.executable, "-c", _OTHER_PROCESS_CLOSES, str(live.path)], check=True)
        assert wal.exists(), "another process unlinked the WAL the live connection writes to"
        live.settle_created(U1)
    assert sql(tmp_path / LEDGER_FILENAME, "SELECT uuid, state FROM mdevs") == [(U1, "present")]
