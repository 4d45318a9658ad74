"""The ledger as its file says, read with plain SQL: for tests that check what
the agent recorded without the Ledger class under test, and without a second
Ledger in a process that has one open (docs/design.md §5.2: closing any descriptor of
the file drops the live connection's POSIX locks).  Read-only (SQLite's
``mode=ro``): never creates, migrates or checkpoints the file."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILENAME = "ledger.sqlite3"  # accel_agent.devices.ledger.LEDGER_FILENAME


@dataclass(frozen=True)
class Row:
    uuid: str
    parent: str
    mdev_type: str
    state: str
    owner: str | None
    owner_kind: str | None
    intent_id: int | None
    backend: str


def connect(state_dir: str | os.PathLike[str]) -> sqlite3.Connection:
    path = Path(os.path.abspath(Path(state_dir) / LEDGER_FILENAME))
    return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30)


def query(state_dir: str | os.PathLike[str], sql: str, params: tuple = ()) -> list[tuple]:
    conn = connect(state_dir)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def rows(state_dir: str | os.PathLike[str]) -> list[Row]:
    """Every device row with its assignment ([] when there is no ledger)."""
    if not os.path.exists(Path(state_dir) / LEDGER_FILENAME):
        return []
    found = query(
        state_dir,
        "SELECT m.uuid, m.parent, m.mdev_type, m.state, a.owner, a.owner_kind, m.intent_id, "
        "m.backend FROM mdevs m LEFT JOIN assignments a ON a.uuid = m.uuid "
        "ORDER BY m.created_at, m.uuid",
    )
    return [Row(*row) for row in found]


def owners(state_dir: str | os.PathLike[str]) -> dict[str, str | None]:
    """uuid -> owner (None: free) of every recorded device."""
    return {row.uuid: row.owner for row in rows(state_dir)}


def pending_intents(state_dir: str | os.PathLike[str]) -> int:
    """Operations begun and never finished."""
    return int(query(state_dir, "SELECT count(*) FROM intents")[0][0])


def unsettled(state_dir: str | os.PathLike[str]) -> list[str]:
    """Rows whose sysfs write may or may not have happened."""
    return [r.uuid for r in rows(state_dir) if r.state in ("creating", "removing")]
