"""The mdev ledger's schema: the statements of each version and the
migrations between them (``PRAGMA user_version`` is the version).

Append only: MIGRATIONS[n] takes the schema from version n to n + 1, and a
migration runs only where asked for, after a backup copy (accel_agent.devices.
ledger, docs/design.md §5.2).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

Migration = Callable[[sqlite3.Connection], None]

_V1 = (
    """CREATE TABLE intents (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL CHECK (kind IN ('allocate', 'release', 'claim', 'recover')),
        owner TEXT CHECK (owner IS NULL OR length(owner) BETWEEN 1 AND 255),
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE mdevs (
        uuid TEXT PRIMARY KEY NOT NULL CHECK (length(uuid) = 36 AND uuid = lower(uuid)),
        parent TEXT NOT NULL CHECK (length(parent) BETWEEN 1 AND 255),
        mdev_type TEXT NOT NULL CHECK (length(mdev_type) BETWEEN 1 AND 255),
        state TEXT NOT NULL CHECK (state IN ('creating', 'present', 'removing')),
        intent_id INTEGER REFERENCES intents(id) ON DELETE SET NULL,
        adopted INTEGER NOT NULL DEFAULT 0 CHECK (adopted IN (0, 1)),
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    "CREATE INDEX mdevs_by_parent_type ON mdevs (parent, mdev_type, state)",
    "CREATE INDEX mdevs_by_intent ON mdevs (intent_id)",
    # PRIMARY KEY (uuid): one owner per mdev, enforced by the database.
    # ON DELETE RESTRICT: an assigned mdev cannot be forgotten.
    """CREATE TABLE assignments (
        uuid TEXT PRIMARY KEY NOT NULL REFERENCES mdevs (uuid) ON DELETE RESTRICT,
        owner TEXT NOT NULL CHECK (length(owner) BETWEEN 1 AND 255),
        owner_kind TEXT NOT NULL CHECK (owner_kind IN ('instance', 'claim')),
        claim_expires_at REAL,
        assigned_at REAL NOT NULL,
        CHECK ((owner_kind = 'claim') = (claim_expires_at IS NOT NULL))
    )""",
    "CREATE INDEX assignments_by_owner ON assignments (owner)",
    """CREATE TRIGGER assign_only_present BEFORE INSERT ON assignments
       WHEN (SELECT state FROM mdevs WHERE uuid = NEW.uuid) IS NOT 'present'
       BEGIN SELECT RAISE(ABORT, 'only a present mdev can be assigned'); END""",
    """CREATE TRIGGER assigned_stays_present BEFORE UPDATE OF state ON mdevs
       WHEN NEW.state != 'present'
            AND EXISTS (SELECT 1 FROM assignments WHERE uuid = NEW.uuid)
       BEGIN SELECT RAISE(ABORT, 'release an assigned mdev before changing its state'); END""",
)


def _migrate_v0_to_v1(conn: sqlite3.Connection) -> None:
    # Statement by statement: executescript() would COMMIT the migration's
    # transaction halfway.
    for statement in _V1:
        conn.execute(statement)


def _migrate_v1_to_v2(conn: sqlite3.Connection) -> None:
    # A live-migration claim remembers which source mdev each destination
    # mdev stands in for, so the {src: dst} mapping survives a restart and a
    # repeated claim returns the same answer.
    conn.execute(
        "ALTER TABLE assignments ADD COLUMN source_uuid TEXT "
        "CHECK (source_uuid IS NULL OR (length(source_uuid) = 36 "
        "AND source_uuid = lower(source_uuid)))"
    )


def _migrate_v2_to_v3(conn: sqlite3.Connection) -> None:
    # Which backend (accel_agent.backends) made each device, so that it is
    # removed and re-created by the same one even when its parent is gone.
    # Every row before this schema was an mdev.
    conn.execute(
        "ALTER TABLE mdevs ADD COLUMN backend TEXT NOT NULL DEFAULT 'mdev' "
        "CHECK (length(backend) BETWEEN 1 AND 64)"
    )


def _migrate_v3_to_v4(conn: sqlite3.Connection) -> None:
    # A device's per-instance settings (issue 15: an SR-IOV VF's network
    # settings), as JSON: what recovery re-applies after a reboot.
    conn.execute(
        "ALTER TABLE mdevs ADD COLUMN settings TEXT "
        "CHECK (settings IS NULL OR (length(settings) <= 4096 AND json_valid(settings)))"
    )
    # What an instance's attach call asked for and which device answers which
    # request (docs/design.md §11): written in the transaction that assigns the
    # devices, dropped with them, so a repeated call is recognised after a
    # restart and gets the same handles.
    conn.execute(
        """CREATE TABLE attach_requests (
            owner TEXT PRIMARY KEY NOT NULL CHECK (length(owner) BETWEEN 1 AND 255),
            document TEXT NOT NULL CHECK (length(document) <= 65536 AND json_valid(document)),
            created_at REAL NOT NULL
        )"""
    )


_ASSIGN_ONLY_PRESENT = """CREATE TRIGGER assign_only_present BEFORE INSERT ON assignments
       WHEN (SELECT state FROM mdevs WHERE uuid = NEW.uuid) IS NOT 'present'
       BEGIN SELECT RAISE(ABORT, 'only a present mdev can be assigned'); END"""
_ASSIGNED_STAYS_PRESENT = """CREATE TRIGGER assigned_stays_present BEFORE UPDATE OF state ON mdevs
       WHEN NEW.state != 'present'
            AND EXISTS (SELECT 1 FROM assignments WHERE uuid = NEW.uuid)
       BEGIN SELECT RAISE(ABORT, 'release an assigned mdev before changing its state'); END"""


def _migrate_v4_to_v5(conn: sqlite3.Connection) -> None:
    # Standing layouts (issue 23): a device the layout holds while no
    # instance does is assigned to owner kind 'standing', so that nothing
    # takes it for free (Nova may be using it).  SQLite cannot change a
    # CHECK constraint in place: the table is rebuilt, as its manual says
    # (lang_altertable.html, "other kinds of table schema changes"), with
    # its index and triggers made again; the trigger on mdevs that reads it
    # goes first, so that no trigger ever names a missing table.
    conn.execute("DROP TRIGGER assigned_stays_present")
    # A standing layout's device, also while an instance holds it: its
    # release gives it back to the layout, or removes it once the layout no
    # longer wants it (draining), where another device is kept free.
    conn.execute(
        "ALTER TABLE mdevs ADD COLUMN layout INTEGER NOT NULL DEFAULT 0 CHECK (layout IN (0, 1))"
    )
    conn.execute(
        """CREATE TABLE assignments_v5 (
            uuid TEXT PRIMARY KEY NOT NULL REFERENCES mdevs (uuid) ON DELETE RESTRICT,
            owner TEXT NOT NULL CHECK (length(owner) BETWEEN 1 AND 255),
            owner_kind TEXT NOT NULL CHECK (owner_kind IN ('instance', 'claim', 'standing')),
            claim_expires_at REAL,
            assigned_at REAL NOT NULL,
            source_uuid TEXT CHECK (source_uuid IS NULL OR (length(source_uuid) = 36
                AND source_uuid = lower(source_uuid))),
            CHECK ((owner_kind = 'claim') = (claim_expires_at IS NOT NULL))
        )"""
    )
    conn.execute(
        "INSERT INTO assignments_v5 (uuid, owner, owner_kind, claim_expires_at, assigned_at, "
        "source_uuid) SELECT uuid, owner, owner_kind, claim_expires_at, assigned_at, "
        "source_uuid FROM assignments"
    )
    conn.execute("DROP TABLE assignments")
    conn.execute("ALTER TABLE assignments_v5 RENAME TO assignments")
    conn.execute("CREATE INDEX assignments_by_owner ON assignments (owner)")
    conn.execute(_ASSIGN_ONLY_PRESENT)
    conn.execute(_ASSIGNED_STAYS_PRESENT)


def _migrate_v5_to_v6(conn: sqlite3.Connection) -> None:
    # Mixed-size vGPU layouts (issue 36): each vGPU's placement on its GPU, as
    # the agent planned it (devices/placements.py): what recovery writes again
    # after a reboot and what every converge compares the read-back with.
    # NULL for a device without one (an mdev, a VF of a one-size GPU).
    conn.execute(
        "ALTER TABLE mdevs ADD COLUMN placement_id INTEGER "
        "CHECK (placement_id IS NULL OR placement_id BETWEEN 0 AND 65536)"
    )


def _migrate_v6_to_v7(conn: sqlite3.Connection) -> None:
    # MIG-backed layouts (issue 37): the GPU instances the agent made, by GPU
    # and placement start (two never share a start), with their profile and
    # owning layout: what recovery rebuilds, at the same placements, before
    # it re-types the vGPUs on them (devices/gpu_layout_mig.py).
    conn.execute(
        """CREATE TABLE gpu_instances (
            gpu TEXT NOT NULL CHECK (length(gpu) = 12),
            start INTEGER NOT NULL CHECK (start BETWEEN 0 AND 255),
            size INTEGER NOT NULL CHECK (size BETWEEN 1 AND 255),
            profile_id INTEGER NOT NULL CHECK (profile_id BETWEEN 0 AND 255),
            owner TEXT NOT NULL CHECK (length(owner) BETWEEN 1 AND 64),
            created_at REAL NOT NULL,
            PRIMARY KEY (gpu, start)
        )"""
    )


# MIGRATIONS[n] takes the schema from version n to n + 1.  Append only.
MIGRATIONS: tuple[Migration, ...] = (
    _migrate_v0_to_v1,
    _migrate_v1_to_v2,
    _migrate_v2_to_v3,
    _migrate_v3_to_v4,
    _migrate_v4_to_v5,
    _migrate_v5_to_v6,
    _migrate_v6_to_v7,
)
SCHEMA_VERSION = len(MIGRATIONS)
