"""The ledger file deleted, replaced, corrupt or on a full disk: refused and
reported as what it is, never a write into the void."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from accel_agent import exception
from accel_agent.devices.ledger import LEDGER_FILENAME, Ledger

U1 = "11111111-2222-4333-8444-555555555555"
U2 = "22222222-2222-4333-8444-555555555555"


def test_a_ledger_deleted_under_an_open_one_refuses_every_write(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.record_create_intent(U1, "mtty", "mtty-1")
        assert ledger.identity_problem() is None
        os.unlink(tmp_path / LEDGER_FILENAME)
        assert ledger.identity_problem() == "the file is gone"
        with pytest.raises(exception.LedgerReplaced, match="deleted or replaced"):
            ledger.record_create_intent(U2, "mtty", "mtty-1")
        with pytest.raises(exception.LedgerReplaced):
            ledger.settle_created(U1)


def test_a_ledger_replaced_under_an_open_one_refuses_every_write(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.record_create_intent(U1, "mtty", "mtty-1")
        shutil.copy(tmp_path / LEDGER_FILENAME, tmp_path / "copy")
        os.replace(tmp_path / "copy", tmp_path / LEDGER_FILENAME)
        assert ledger.identity_problem() == "another file is at its path now"
        with pytest.raises(exception.LedgerReplaced):
            ledger.settle_created(U1)


def test_a_file_that_is_no_database_is_a_corrupt_ledger(tmp_path):
    (tmp_path / LEDGER_FILENAME).write_bytes(os.urandom(8192))
    with pytest.raises(exception.LedgerCorrupt, match="is corrupt") as info:
        Ledger(tmp_path)
    assert "invalid configuration" not in info.value.message


def _damage(path, at: int, size: int = 512) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(b"\xa5" * size)


def _populated(tmp_path) -> None:
    with Ledger(tmp_path) as ledger:
        for i in range(200):
            ledger.record_create_intent(f"{i:08x}-2222-4333-8444-555555555555", "mtty", "mtty-1")
    # Everything in the main file, so that damage there is damage to the data.
    with sqlite3.connect(tmp_path / LEDGER_FILENAME) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_a_damaged_page_is_found_by_quick_check_and_integrity_check(tmp_path):
    _populated(tmp_path)
    size = (tmp_path / LEDGER_FILENAME).stat().st_size
    for page in range(2, size // 4096):  # the b-tree header of every page but the first
        _damage(tmp_path / LEDGER_FILENAME, page * 4096, 16)
    with Ledger(tmp_path) as ledger:  # the header is intact: it opens
        for full in (False, True):
            with pytest.raises(exception.LedgerCorrupt, match="is corrupt"):
                ledger.verify(full=full)


def test_a_healthy_ledger_passes_both_checks(tmp_path):
    _populated(tmp_path)
    with Ledger(tmp_path) as ledger:
        ledger.verify()
        ledger.verify(full=True)


def test_a_full_disk_is_reported_until_a_write_succeeds(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.record_create_intent(U1, "mtty", "mtty-1")
        pages = ledger._conn.execute("PRAGMA page_count").fetchone()[0]
        # SQLite's own "disk full": no page beyond what the file has.
        ledger._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(exception.LedgerWriteFailed, match="full"):
            for i in range(500):
                ledger.record_create_intent(f"{i:08x}-2222-4333-8444-555555555555", "p" * 200,
                                            "mtty-1")
        assert ledger.write_error is not None and "full" in ledger.write_error
        ledger._conn.execute("PRAGMA max_page_count = 1073741823")
        ledger.record_create_intent(U2, "mtty", "mtty-1")
        assert ledger.write_error is None


def test_a_ledger_is_lost_when_the_state_directory_shows_the_agent_ran_there(tmp_path):
    state = tmp_path / "state"
    with Ledger(state) as ledger:  # a first start: no state directory yet
        assert ledger.created and not ledger.lost
    (state / "accel-agent-mdevs").touch()  # the manager's lock file
    with Ledger(state) as ledger:
        assert not ledger.created and not ledger.lost
    for name in os.listdir(state):
        if name.startswith(LEDGER_FILENAME):
            os.unlink(state / name)
    with Ledger(state) as ledger:
        assert ledger.created and ledger.lost
