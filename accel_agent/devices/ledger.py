"""The mdev ledger: every mdev the agent owns, crash-safe, in SQLite.

``<state_dir>/ledger.sqlite3`` (directory 0700, file 0600), WAL mode with
``synchronous=FULL`` so a returned commit survives a power cut (intents,
which a durable commit always follows, skip the fsync), schema
versioned by ``PRAGMA user_version`` and migrated in one transaction.

The manager's protocol (DESIGN.md §5) is "intent before every sysfs write,
settled after", so a crash at any instant is repaired at the next start:

* create:  ``record_create_intent`` (state ``creating``) -> privileged create
  -> ``settle_created`` (``present``).  After a crash a ``creating`` row is
  compared with sysfs: the mdev exists -> settle it, else ``forget`` it.
* remove:  ``release`` -> ``record_remove_intent`` (``removing``) ->
  privileged remove -> ``forget``.  After a crash: still in sysfs -> redo the
  remove (or ``cancel_remove``), gone -> ``forget``.
* allocate N (all or nothing): ``begin_intent`` -> ``reserve`` free rows and
  ``record_create_intent`` new ones under that intent -> sysfs creates ->
  ``assign`` all N and ``finish_intent`` in ONE transaction.  A crash before
  that transaction leaves no assignment, only an intent whose rows
  ``pending_intents``/``unsettled`` list for recovery to settle or drop.

Assignments live in their own table whose primary key is the mdev UUID: the
database itself makes a second owner impossible, and triggers refuse to
assign an mdev that is not ``present`` or to change the state of an
assigned one.  ``with ledger.transaction():`` is ``BEGIN IMMEDIATE``: two
processes (agent and an offline ``accelctl``) serialise on SQLite's write
lock, and threads of one process on the ledger's lock.

One connection per process (DESIGN.md §5): the daemon and everything in its
process go through its one Ledger object; other processes that only read
open it ``read_only`` (SQLite's ``mode=ro``: never created, migrated, written
or checkpointed).  A schema migration runs only where asked for
(``upgrade=True``: the daemon's start, ``accelctl ledger upgrade``), after a
backup copy made with SQLite's backup API; every other opener refuses an
older schema with :class:`LedgerSchemaOld`, naming the command to run.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_agent import exception

# The schema's names, for the ledger's users (and its tests) as before.
from accel_agent.devices.ledger_schema import MIGRATIONS, SCHEMA_VERSION, Migration  # noqa: F401

LOG = logging.getLogger(__name__)

LEDGER_FILENAME = "ledger.sqlite3"
MAX_ID_LEN = 255
# SQLite's primary result codes for a damaged file, and for a write the
# filesystem refused (disk full, I/O error, read-only).
_CORRUPT = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_WRITE_FAILED = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY})

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class DeviceState(enum.StrEnum):
    CREATING = "creating"  # intent: the sysfs create may or may not have happened
    PRESENT = "present"  # settled: exists (free unless assigned)
    REMOVING = "removing"  # intent: the sysfs remove may or may not have happened


class OwnerKind(enum.StrEnum):
    INSTANCE = "instance"
    CLAIM = "claim"  # a live-migration destination claim, expires


class IntentKind(enum.StrEnum):
    ALLOCATE = "allocate"
    RELEASE = "release"
    CLAIM = "claim"
    RECOVER = "recover"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    uuid: str
    parent: str
    mdev_type: str
    state: DeviceState
    owner: str | None
    owner_kind: OwnerKind | None
    claim_expires_at: float | None
    intent_id: int | None
    adopted: bool
    created_at: float
    updated_at: float
    # For a migration claim: the source host's mdev this one replaces.
    source_uuid: str | None = None
    # The backend that made it (accel_agent.backends): mdev, nvidia_vfio, ...
    backend: str = "mdev"
    # What the device was prepared with for its instance (an SR-IOV VF's MAC,
    # VLAN, ...): recovery prepares it again the same way, and the guest XML
    # repeats it.  None for a device that has no such settings (an mdev).
    settings: dict[str, Any] | None = None

    @property
    def assigned(self) -> bool:
        return self.owner is not None

    @property
    def free(self) -> bool:
        """Reusable now: present, unowned, not reserved by an operation."""
        return self.state is DeviceState.PRESENT and self.owner is None and self.intent_id is None


@dataclass(frozen=True, slots=True)
class Intent:
    id: int
    kind: IntentKind
    owner: str | None
    created_at: float
    uuids: tuple[str, ...]  # the rows this operation reserved or is creating/removing


class LedgerSchemaOld(exception.LedgerError):
    """A ledger of an older schema, opened by a reader or by a writer that
    may not migrate it (only the daemon and ``accelctl ledger upgrade`` do,
    after a backup)."""

    msg_fmt = (
        "the mdev ledger %(path)s has schema version %(found)s, older than this agent's "
        "(%(supported)s); left unchanged: run 'accelctl ledger upgrade' (it keeps a backup "
        "copy), or restart accel-agent, which upgrades it the same way"
    )


# --- schema (ledger_schema.py) ---------------------------------------------------

_SELECT = """
    SELECT m.uuid, m.parent, m.mdev_type, m.state, a.owner, a.owner_kind,
           a.claim_expires_at, m.intent_id, m.adopted, m.created_at, m.updated_at,
           a.source_uuid, m.backend, m.settings
    FROM mdevs m LEFT JOIN assignments a ON a.uuid = m.uuid
"""
_ORDER = " ORDER BY m.created_at, m.uuid"


# --- validation ----------------------------------------------------------------------


def validate_instance_id(value: Any) -> str:
    """Instance ids come from API callers; they become ledger keys and log text."""
    if not isinstance(value, str):
        raise exception.InvalidInstanceId(instance=value, reason="not a string")
    if not value or not value.strip():
        raise exception.InvalidInstanceId(instance=value, reason="empty")
    if len(value) > MAX_ID_LEN:
        raise exception.InvalidInstanceId(
            instance=value, reason=f"longer than {MAX_ID_LEN} characters"
        )
    if "\x00" in value or not value.isprintable():
        raise exception.InvalidInstanceId(
            instance=value, reason="contains NUL or non-printable characters"
        )
    return value


def _validate_uuid(value: Any) -> str:
    if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
        raise exception.InvalidMdevUUID(
            uuid=value, where=" for the ledger", reason="expected lowercase 8-4-4-4-12 hex"
        )
    return value


def _validate_name(what: str, value: Any) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ID_LEN
        or not value.isprintable()
    ):
        raise exception.LedgerError(reason=f"invalid {what} {value!r}")
    return value


# --- the ledger ----------------------------------------------------------------------


class Ledger:
    """One SQLite connection, safe to share between the threads of one process."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        migrations: Sequence[Migration] = MIGRATIONS,
        upgrade: bool = False,
        read_only: bool = False,
    ) -> None:
        """Open (creating when missing, unless ``read_only``) the ledger of
        ``state_dir``.

        ``upgrade``: migrate a ledger of an older schema, after a backup copy
        beside it (:attr:`backup_path`); only the daemon and ``accelctl
        ledger upgrade`` ask for it.  Without it an older schema raises
        :class:`LedgerSchemaOld`, changing nothing.  A new (empty) ledger is
        given the current schema either way: there is nothing to keep.

        ``read_only``: SQLite's ``mode=ro``, for readers in another process
        than the daemon's: no file is created, nothing migrated, written or
        checkpointed (a read-only connection cannot take the write lock that a
        checkpoint, or the unlink of the WAL at the last close, needs).  A
        schema older or newer than the code's raises; a new ledger not yet
        given its schema (version 0) has no tables: a reader checks
        :attr:`schema_version` first.

        Never open a ledger a second time in a process that has it open
        (DESIGN.md §5): closing ANY descriptor of a file drops every POSIX
        lock the process holds on it, the live connection's included, and
        another process's last close then checkpoints and unlinks the WAL
        the live connection still writes to.
        """
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LEDGER_FILENAME
        self.read_only = read_only
        self._clock = clock
        self._migrations = tuple(migrations)
        self._upgrade = upgrade
        self._lock = threading.RLock()
        self._depth = 0
        # Why the last write failed (disk full, I/O error); None once one succeeds.
        self.write_error: str | None = None
        # Where the copy taken before this open migrated the file, if it did.
        self.backup_path: Path | None = None
        if read_only:
            self.created = self.lost = False
        else:
            # The agent ran here before (its state directory holds something,
            # e.g. the manager's lock file) yet has no ledger: it was lost,
            # with every record (see DeviceManager.unrecorded).  A state
            # directory that is absent or empty is a first start; one wiped
            # whole looks the same.
            ran_before = _has_entries(self.state_dir)
            _ensure_private_dir(self.state_dir)
            # Whether this open made the file.
            self.created = _create_private_file(self.path)
            self.lost = self.created and ran_before
        try:
            # mode=rw: SQLite never creates the file (it would, 0644 & ~umask,
            # had it vanished since); mode=ro: it never writes it.
            self._conn = sqlite3.connect(
                _uri(self.path, "ro" if read_only else "rw"),
                uri=True,
                timeout=busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock
            )
        except sqlite3.Error as err:
            raise exception.LedgerError(reason=f"cannot open {self.path}: {err}") from err
        try:
            # The schema found at the open, before any migration.  A newer
            # one (and, unless upgrading, an older one) is refused before
            # anything writes to the file (switching the journal mode
            # rewrites the header).
            self.found_schema = self._user_version()
            self._check_version(self.found_schema)
            # The file this connection has open: checked before every write
            # (a ledger deleted or replaced under us must not take writes).
            self._identity = self._file_identity()
            if not read_only:
                self._setup_connection()
                self._migrate()
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- connection, transactions, schema ---------------------------------------------

    def _setup_connection(self) -> None:
        mode = self._rows("PRAGMA journal_mode = WAL")[0][0]
        if str(mode).lower() != "wal":
            raise exception.LedgerError(reason=f"{self.path}: cannot enable WAL (got {mode})")
        # FULL: fsync the WAL at every commit; NORMAL could lose the last
        # commits on power loss, i.e. forget an assignment we acknowledged.
        # Only intents relax it (transaction(durable=False)).
        self._execute("PRAGMA synchronous = FULL")
        self._execute("PRAGMA foreign_keys = ON")

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def identity_problem(self) -> str | None:
        """Why the file at the ledger's path is not the one this object has
        open (deleted, replaced), or None."""
        found = self._file_identity()
        if found is None:
            return "the file is gone"
        if found != self._identity:
            return "another file is at its path now"
        return None

    def _check_identity(self) -> None:
        problem = self.identity_problem()
        if problem is not None:
            raise exception.LedgerReplaced(path=str(self.path), detail=problem)

    def verify(self, full: bool = False) -> None:
        """SQLite's ``quick_check`` (``integrity_check`` when ``full``);
        raises LedgerCorrupt listing the first problems it reports."""
        pragma = "integrity_check" if full else "quick_check"
        with self._lock:
            rows = [str(r[0]) for r in self._rows(f"PRAGMA {pragma}")]
        if rows != ["ok"]:
            more = f" (and {len(rows) - 5} more)" if len(rows) > 5 else ""
            raise exception.LedgerCorrupt(path=str(self.path), detail="; ".join(rows[:5]) + more)

    def _user_version(self) -> int:
        return int(self._rows("PRAGMA user_version")[0][0])

    def _check_version(self, found: int) -> None:
        supported = len(self._migrations)
        if found > supported:
            raise exception.LedgerSchemaTooNew(
                path=str(self.path), found=found, supported=supported
            )
        # 0 is a new, empty ledger: any writer makes it current; a reader
        # finds no tables in it (schema_version says so).
        if 0 < found < supported and (self.read_only or not self._upgrade):
            raise LedgerSchemaOld(path=str(self.path), found=found, supported=supported)

    def _migrate(self) -> None:
        while (found := self._user_version()) != len(self._migrations):
            self._check_version(found)
            # A copy of what the migration changes, taken before it (nothing
            # to keep in a new ledger).  SQLite's backup API cannot run inside
            # this connection's write transaction: the migration checks that
            # no other connection wrote since, else a new copy is taken.
            seen = self._data_version()
            backup = self._backup(found) if found else None
            if self._migrate_unless_changed(found, seen):
                self.backup_path = backup
                if backup is not None:
                    LOG.warning(
                        "mdev ledger %s upgraded from schema %d to %d; a copy of it as it "
                        "was is at %s", self.path, found, len(self._migrations), backup,
                    )
                return
            if backup is not None:
                backup.unlink()  # a copy of a state that is gone

    def _migrate_unless_changed(self, found: int, seen: int) -> bool:
        """Migrate from schema ``found`` in one transaction, unless another
        connection committed since ``PRAGMA data_version`` said ``seen``."""
        with self.transaction():
            if self._data_version() != seen:
                return False
            for version in range(found, len(self._migrations)):
                LOG.info("Migrating mdev ledger %s to schema %d", self.path, version + 1)
                self._migrations[version](self._conn)
                # Part of the same transaction: a failed migration leaves the
                # old version and the old schema.
                self._conn.execute(f"PRAGMA user_version = {version + 1:d}")
        return True

    def _data_version(self) -> int:
        return int(self._rows("PRAGMA data_version")[0][0])

    def _backup(self, version: int) -> Path:
        """A copy of the ledger as it is, next to it, named after its schema
        ``version`` and the time (0600, one self-contained file): what the
        operator restores to go back (docs/operations.md)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        target = self.path.with_name(f"{LEDGER_FILENAME}.v{version}-{stamp}.bak")
        for n in range(1, 100):
            if _create_private_file(target):
                break
            target = target.with_name(f"{LEDGER_FILENAME}.v{version}-{stamp}-{n}.bak")
        else:
            raise exception.LedgerError(reason=f"cannot name a backup of {self.path}")
        try:
            copy = sqlite3.connect(_uri(target, "rw"), uri=True, isolation_level=None)
            try:
                with self._lock:
                    self._conn.backup(copy)
                # The copy is a file of its own: no -wal/-shm beside it.
                copy.execute("PRAGMA journal_mode = DELETE")
            finally:
                copy.close()
        except sqlite3.Error as err:
            target.unlink(missing_ok=True)
            raise exception.LedgerWriteFailed(
                path=str(target), detail=f"backup before the migration failed: {err}"
            ) from err
        return target

    @property
    def schema_version(self) -> int:
        with self._lock:
            return self._user_version()

    @contextlib.contextmanager
    def transaction(self, durable: bool = True) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; nested uses become savepoints.

        IMMEDIATE takes the write lock at BEGIN, so a read-then-write here
        can never interleave with another process's; it waits up to
        ``busy_timeout`` for the lock, then raises LedgerError.

        ``durable=False`` commits without the fsync (``synchronous=NORMAL``):
        the commit survives the process dying, not the host losing power.
        For the manager's intents only, which a durable commit always
        follows before anything is acknowledged: a power cut in between
        also takes every mdev with it, so the intent would have nothing
        left to settle, and the ledger falls back to the last acknowledged
        state, which recovery restores.  The fsync of that later commit
        makes this one durable too (one WAL, written in order).
        """
        if self.read_only:
            raise exception.LedgerError(reason=f"{self.path} is open read-only")
        with self._lock:
            savepoint = f"sp{self._depth}" if self._depth else None
            if savepoint is None:
                self._check_identity()
            relaxed = not durable and savepoint is None
            if relaxed:
                self._execute("PRAGMA synchronous = NORMAL")
            try:
                with self._transaction_body(savepoint):
                    yield
            finally:
                if relaxed:
                    self._execute("PRAGMA synchronous = FULL")

    @contextlib.contextmanager
    def _transaction_body(self, savepoint: str | None) -> Iterator[None]:
        """The transaction itself; the caller holds the ledger's lock."""
        self._execute(f"SAVEPOINT {savepoint}" if savepoint else "BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            # SQLite may have rolled back already: a full disk (SQLITE_FULL)
            # or an I/O error ends the transaction itself.
            if self._conn.in_transaction:
                if savepoint:
                    self._conn.execute(f"ROLLBACK TO {savepoint}")
                    self._conn.execute(f"RELEASE {savepoint}")
                else:
                    self._conn.execute("ROLLBACK")
            raise
        self._depth -= 1
        try:
            self._execute(f"RELEASE {savepoint}" if savepoint else "COMMIT")
        except BaseException:
            if not savepoint and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        if not savepoint:
            self.write_error = None

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.IntegrityError as err:
            # The API checks first and raises precise errors; reaching a
            # constraint means a bug or a hand-edited file, never user input.
            raise exception.LedgerError(reason=f"{self.path}: constraint failed: {err}") from err
        except sqlite3.Error as err:
            raise self._error(err) from err

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of a query: fetching reads pages too, and a damaged
        one must raise the agent's error, not SQLite's."""
        cursor = self._execute(sql, params)
        try:
            return cursor.fetchall()
        except sqlite3.Error as err:
            raise self._error(err) from err

    def _error(self, err: sqlite3.Error) -> exception.LedgerError:
        """SQLite's error as the agent's: a corrupt file, a failed write
        (remembered for /v1/health until a write succeeds), anything else."""
        primary = (getattr(err, "sqlite_errorcode", 0) or 0) & 0xFF
        if primary in _CORRUPT:
            return exception.LedgerCorrupt(path=str(self.path), detail=str(err))
        if primary in _WRITE_FAILED:
            self.write_error = str(err)
            return exception.LedgerWriteFailed(path=str(self.path), detail=str(err))
        return exception.LedgerError(reason=f"{self.path}: {err}")

    def check_integrity(self) -> str:
        """``ok`` or SQLite's list of problems."""
        with self._lock:
            rows = self._rows("PRAGMA integrity_check")
        return "\n".join(str(r[0]) for r in rows)

    # --- reading ------------------------------------------------------------------

    @staticmethod
    def _record(row: Sequence[Any]) -> DeviceRecord:
        return DeviceRecord(
            uuid=row[0],
            parent=row[1],
            mdev_type=row[2],
            state=DeviceState(row[3]),
            owner=row[4],
            owner_kind=OwnerKind(row[5]) if row[5] is not None else None,
            claim_expires_at=row[6],
            intent_id=row[7],
            adopted=bool(row[8]),
            created_at=row[9],
            updated_at=row[10],
            source_uuid=row[11],
            backend=row[12],
            settings=json.loads(row[13]) if row[13] is not None else None,
        )

    def _select(self, where: str = "", params: Sequence[Any] = ()) -> list[DeviceRecord]:
        sql = _SELECT + (f" WHERE {where}" if where else "") + _ORDER
        with self._lock:
            return [self._record(r) for r in self._rows(sql, params)]

    def get(self, uuid: str) -> DeviceRecord | None:
        rows = self._select("m.uuid = ?", (_validate_uuid(uuid),))
        return rows[0] if rows else None

    def _require(self, uuid: str) -> DeviceRecord:
        record = self.get(uuid)
        if record is None:
            raise exception.MdevNotFound(uuid=uuid)
        return record

    def all(self) -> list[DeviceRecord]:
        return self._select()

    def in_state(self, state: DeviceState) -> list[DeviceRecord]:
        return self._select("m.state = ?", (DeviceState(state).value,))

    def unsettled(self) -> list[DeviceRecord]:
        """Rows whose sysfs write may or may not have happened (creating/removing)."""
        return self._select("m.state IN ('creating', 'removing')")

    def assigned(self) -> list[DeviceRecord]:
        return self._select("a.owner IS NOT NULL")

    def by_owner(self, owner: str, owner_kind: OwnerKind | None = None) -> list[DeviceRecord]:
        validate_instance_id(owner)
        if owner_kind is None:
            return self._select("a.owner = ?", (owner,))
        return self._select("a.owner = ? AND a.owner_kind = ?", (owner, OwnerKind(owner_kind)))

    def free_of_type(self, parent: str, mdev_type: str) -> list[DeviceRecord]:
        """Present, unassigned, unreserved mdevs of ``mdev_type`` on ``parent``."""
        return self._select(
            "m.parent = ? AND m.mdev_type = ? AND m.state = 'present' "
            "AND a.uuid IS NULL AND m.intent_id IS NULL",
            (parent, mdev_type),
        )

    def claims(self) -> list[DeviceRecord]:
        return self._select("a.owner_kind = 'claim'")

    def expired_claims(self, now: float | None = None) -> list[DeviceRecord]:
        now = self._clock() if now is None else now
        return self._select("a.owner_kind = 'claim' AND a.claim_expires_at <= ?", (now,))

    def pending_intents(self) -> list[Intent]:
        """Operations that began and never finished (a crash, or in flight)."""
        with self._lock:
            intents = self._rows(
                "SELECT id, kind, owner, created_at FROM intents ORDER BY id"
            )
            members = self._rows(
                "SELECT intent_id, uuid FROM mdevs WHERE intent_id IS NOT NULL ORDER BY uuid"
            )
        by_intent: dict[int, list[str]] = {}
        for intent_id, uuid in members:
            by_intent.setdefault(intent_id, []).append(uuid)
        return [
            Intent(i, IntentKind(kind), owner, created, tuple(by_intent.get(i, ())))
            for i, kind, owner, created in intents
        ]

    # --- operations (intents) ------------------------------------------------------

    def begin_intent(self, kind: IntentKind, owner: str | None = None) -> int:
        if owner is not None:
            validate_instance_id(owner)
        with self.transaction():
            cur = self._execute(
                "INSERT INTO intents (kind, owner, created_at) VALUES (?, ?, ?)",
                (IntentKind(kind).value, owner, self._clock()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def finish_intent(self, intent_id: int) -> None:
        """Drop the intent; its rows stay, no longer reserved (FK ON DELETE SET NULL)."""
        with self.transaction():
            self._execute("DELETE FROM intents WHERE id = ?", (intent_id,))

    def _require_intent(self, intent_id: int | None) -> None:
        if intent_id is None:
            return
        rows = self._rows("SELECT 1 FROM intents WHERE id = ?", (intent_id,))
        if not rows:
            raise exception.LedgerError(reason=f"no pending intent {intent_id}")

    # --- operations (mdev rows) ----------------------------------------------------

    def record_create_intent(
        self,
        uuid: str,
        parent: str,
        mdev_type: str,
        *,
        intent_id: int | None = None,
        backend: str = "mdev",
        settings: Mapping[str, Any] | None = None,
    ) -> DeviceRecord:
        """Before the sysfs create write: a ``creating`` row (with the
        device's per-instance ``settings``, when it has any)."""
        return self._insert(uuid, parent, mdev_type, DeviceState.CREATING, False, intent_id,
                            action="record a create intent for", backend=backend,
                            settings=settings)

    def adopt(self, uuid: str, parent: str, mdev_type: str, backend: str = "mdev") -> DeviceRecord:
        """Take ownership of an existing (foreign) mdev: it may then be reused or removed."""
        return self._insert(uuid, parent, mdev_type, DeviceState.PRESENT, True, None,
                            action="adopt", backend=backend)

    def _insert(
        self,
        uuid: str,
        parent: str,
        mdev_type: str,
        state: DeviceState,
        adopted: bool,
        intent_id: int | None,
        *,
        action: str,
        backend: str = "mdev",
        settings: Mapping[str, Any] | None = None,
    ) -> DeviceRecord:
        _validate_uuid(uuid)
        encoded = None if settings is None else json.dumps(dict(settings), sort_keys=True)
        _validate_name("parent", parent)
        _validate_name("mdev type", mdev_type)
        _validate_name("backend", backend)
        with self.transaction():
            existing = self.get(uuid)
            if existing is not None:
                raise exception.LedgerConflict(
                    action=action, uuid=uuid, reason=f"already recorded ({existing.state})"
                )
            self._require_intent(intent_id)
            now = self._clock()
            self._execute(
                "INSERT INTO mdevs (uuid, parent, mdev_type, state, intent_id, adopted, "
                "created_at, updated_at, backend, settings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (uuid, parent, mdev_type, state.value, intent_id, int(adopted), now, now,
                 backend, encoded),
            )
            return self._require(uuid)

    def _set_state(self, uuid: str, state: DeviceState, **extra: Any) -> None:
        sets = ", ".join(["state = ?", "updated_at = ?", *(f"{k} = ?" for k in extra)])
        self._execute(
            f"UPDATE mdevs SET {sets} WHERE uuid = ?",
            (state.value, self._clock(), *extra.values(), uuid),
        )

    def settle_created(self, uuid: str) -> DeviceRecord:
        """After the sysfs create succeeded (or recovery found the mdev): ``present``."""
        with self.transaction():
            record = self._require(uuid)
            if record.state is not DeviceState.CREATING:
                raise exception.LedgerConflict(
                    action="settle the creation of", uuid=uuid, reason=f"it is {record.state}"
                )
            self._set_state(uuid, DeviceState.PRESENT)
            return self._require(uuid)

    def reserve(self, uuid: str, intent_id: int) -> DeviceRecord:
        """Hold a free mdev for an operation (allocate reusing it), so no one else takes it."""
        with self.transaction():
            record = self._require(uuid)
            self._require_intent(intent_id)
            if not record.free:
                raise exception.LedgerConflict(
                    action="reserve", uuid=uuid, reason="it is not free"
                )
            self._execute(
                "UPDATE mdevs SET intent_id = ?, updated_at = ? WHERE uuid = ?",
                (intent_id, self._clock(), uuid),
            )
            return self._require(uuid)

    def assign(
        self,
        uuid: str,
        owner: str,
        *,
        owner_kind: OwnerKind = OwnerKind.INSTANCE,
        claim_expires_at: float | None = None,
        intent_id: int | None = None,
        source_uuid: str | None = None,
    ) -> DeviceRecord:
        """Give a present mdev to an instance (or a migration claim, with an expiry).

        ``intent_id``: the operation that reserved it; a row reserved by
        another operation is refused.
        """
        validate_instance_id(owner)
        owner_kind = OwnerKind(owner_kind)
        if source_uuid is not None:
            _validate_uuid(source_uuid)
        if (owner_kind is OwnerKind.CLAIM) != (claim_expires_at is not None):
            raise exception.LedgerError(reason="a claim needs an expiry, an instance none")
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                raise exception.MdevAlreadyAssigned(
                    uuid=uuid, owner=record.owner, owner_kind=record.owner_kind
                )
            if record.state is not DeviceState.PRESENT:
                raise exception.LedgerConflict(
                    action="assign", uuid=uuid, reason=f"it is {record.state}"
                )
            if record.intent_id is not None and record.intent_id != intent_id:
                raise exception.LedgerConflict(
                    action="assign", uuid=uuid,
                    reason=f"it is reserved by operation {record.intent_id}",
                )
            now = self._clock()
            # The checks above ran under the write lock, so the PRIMARY KEY
            # and the trigger cannot fire here; they guard everything else.
            self._execute(
                "INSERT INTO assignments (uuid, owner, owner_kind, claim_expires_at, "
                "assigned_at, source_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                (uuid, owner, owner_kind.value, claim_expires_at, now, source_uuid),
            )
            self._execute("UPDATE mdevs SET updated_at = ? WHERE uuid = ?", (now, uuid))
            return self._require(uuid)

    def release(self, uuid: str) -> DeviceRecord:
        """Drop the mdev's owner, keeping the mdev (free for reuse).  Idempotent."""
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                self._execute("DELETE FROM assignments WHERE uuid = ?", (uuid,))
                self._execute(
                    "UPDATE mdevs SET updated_at = ? WHERE uuid = ?", (self._clock(), uuid)
                )
            return self._require(uuid)

    def release_owner(self, owner: str, owner_kind: OwnerKind | None = None) -> list[DeviceRecord]:
        """Release everything ``owner`` holds; returns the released rows.  An
        instance's attach request goes with its devices."""
        with self.transaction():
            if owner_kind is not OwnerKind.CLAIM:
                self._execute("DELETE FROM attach_requests WHERE owner = ?", (owner,))
            return [self.release(r.uuid) for r in self.by_owner(owner, owner_kind)]

    # --- attach requests (DESIGN.md §11) ---------------------------------------------

    def record_attach_request(self, owner: str, document: Mapping[str, Any]) -> None:
        """What ``owner``'s attach call asked for (see the v4 migration)."""
        validate_instance_id(owner)
        with self.transaction():
            self._execute(
                "INSERT OR REPLACE INTO attach_requests (owner, document, created_at) "
                "VALUES (?, ?, ?)",
                (owner, json.dumps(dict(document), sort_keys=True), self._clock()),
            )

    def attach_request(self, owner: str) -> dict[str, Any] | None:
        with self._lock:
            rows = self._rows("SELECT document FROM attach_requests WHERE owner = ?", (owner,))
        return json.loads(rows[0][0]) if rows else None

    def commit_claim(self, owner: str) -> list[DeviceRecord]:
        """A migration claim becomes the instance's allocation (no expiry)."""
        validate_instance_id(owner)
        with self.transaction():
            self._execute(
                "UPDATE assignments SET owner_kind = 'instance', claim_expires_at = NULL "
                "WHERE owner = ? AND owner_kind = 'claim'",
                (owner,),
            )
            return self.by_owner(owner, OwnerKind.INSTANCE)

    def record_remove_intent(self, uuid: str, *, intent_id: int | None = None) -> DeviceRecord:
        """Before the sysfs remove write: ``removing``.  The mdev must be released first."""
        with self.transaction():
            record = self._require(uuid)
            if record.owner is not None:
                raise exception.LedgerConflict(
                    action="remove", uuid=uuid,
                    reason=f"it is assigned to {record.owner_kind} {record.owner}",
                )
            if record.state is DeviceState.REMOVING:
                return record  # a retried remove: the intent is already there
            self._require_intent(intent_id)
            self._set_state(uuid, DeviceState.REMOVING, intent_id=intent_id)
            return self._require(uuid)

    def cancel_remove(self, uuid: str) -> DeviceRecord:
        """The remove did not happen and will not be retried: back to ``present``."""
        with self.transaction():
            record = self._require(uuid)
            if record.state is not DeviceState.REMOVING:
                raise exception.LedgerConflict(
                    action="cancel the removal of", uuid=uuid, reason=f"it is {record.state}"
                )
            self._set_state(uuid, DeviceState.PRESENT, intent_id=None)
            return self._require(uuid)

    def forget(self, uuid: str) -> bool:
        """Delete the row (after a remove, or a create that did not happen).

        Refused for an assigned mdev.  Returns False when there was no row.
        """
        with self.transaction():
            record = self.get(uuid)
            if record is None:
                return False
            if record.owner is not None:
                raise exception.LedgerConflict(
                    action="forget", uuid=uuid,
                    reason=f"it is assigned to {record.owner_kind} {record.owner}",
                )
            self._execute("DELETE FROM mdevs WHERE uuid = ?", (uuid,))
            return True


def _uri(path: Path, mode: str) -> str:
    """SQLite's URI of ``path`` (percent-encoded) opened in ``mode``."""
    return f"{Path(os.path.abspath(path)).as_uri()}?mode={mode}"


def _create_private_file(path: Path) -> bool:
    """Create ``path`` 0600 when it does not exist; True when this call made it.

    Only a file that did not exist is opened and closed here: closing a
    descriptor of a file this process has open elsewhere would drop the
    POSIX locks its SQLite connection holds (the class docstring).  SQLite
    itself would create it 0644 & ~umask, and its -wal/-shm files copy the
    main file's mode."""
    if os.path.lexists(path):
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False  # another process made it meanwhile
    os.close(fd)
    return True


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _ensure_private_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing (an existing directory is left as is:
    it may be shared, e.g. a misconfigured /tmp, and chmod-ing it would hurt)."""
    if path.is_dir():
        if path.stat().st_mode & 0o022:
            LOG.warning("State directory %s is group- or world-writable", path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    # mkdir's mode is filtered by the umask; 0700 is narrower than any
    # umask leaves, but say it explicitly.
    path.chmod(0o700)
