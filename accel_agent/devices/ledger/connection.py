"""The ledger's one SQLite connection: opening it (read-write, read-only or
upgrading; the file created 0600 only when missing, before any connection),
WAL with ``synchronous=FULL``, the check that the file at the path is still
the one open, SQLite's errors as the agent's, ``verify``/``check_integrity``,
transactions (savepoints when nested, ``durable=False`` for intents), and
the backup copy taken before a schema migration.

The stores (``devices``, ``intents``, ``claims``, ``attach``) are mixins over
this class: everything they read or write goes through its ``_execute`` /
``_rows`` under its lock, so a :class:`~accel_agent.devices.ledger.Ledger`
is one connection, whatever it stores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from accel_agent import exception
from accel_agent.config import files as safe_files
from accel_agent.devices.ledger.schema import MIGRATIONS, Migration

# The package's name, as before the split: what operators filter the
# ledger's log lines on.
LOG = logging.getLogger("accel_agent.devices.ledger")

LEDGER_FILENAME = "ledger.sqlite3"
# SQLite's primary result codes for a damaged file, and for a write the
# filesystem refused (disk full, I/O error, read-only).
_CORRUPT = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_WRITE_FAILED = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY})


class LedgerConnection:
    """The connection, its lock and its transactions; no table of its own but
    the schema's version."""

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
        (docs/design.md §5.2): closing ANY descriptor of a file drops every POSIX
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
        # Transactions committed that changed a row: what tells the device
        # manager whether an operation changed anything (DeviceManager.mutations).
        self.commits = 0
        # Where the copy taken before this open migrated the file, if it did.
        self.backup_path: Path | None = None
        # Before anything opens them: a FIFO at one of these paths blocks
        # SQLite's open (or its first read) for ever.
        _require_regular_files(self.path)
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
            _require_regular_files(self.path)  # made, or found, just now
            _make_private(self.path)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            raise exception.LedgerSchemaOld(path=str(self.path), found=found, supported=supported)

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
                # A new ledger goes through every step in one transaction:
                # one line says it was made; the steps are for debugging.
                LOG.debug("Migrating mdev ledger %s to schema %d", self.path, version + 1)
                self._migrations[version](self._conn)
                # Part of the same transaction: a failed migration leaves the
                # old version and the old schema.
                self._conn.execute(f"PRAGMA user_version = {version + 1:d}")
        if found == 0:
            LOG.info("created the mdev ledger %s (schema %d)", self.path, len(self._migrations))
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
        changes = self._conn.total_changes
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
            if self._conn.total_changes != changes:
                self.commits += 1

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


def _uri(path: Path, mode: str) -> str:
    """SQLite's URI of ``path`` (percent-encoded) opened in ``mode``."""
    return f"{Path(os.path.abspath(path)).as_uri()}?mode={mode}"


def _create_private_file(path: Path) -> bool:
    """Create ``path`` 0600 when it does not exist; True when this call made it.

    Only a file that did not exist is opened and closed here: closing a
    descriptor of a file this process has open elsewhere would drop the
    POSIX locks its SQLite connection holds (LedgerConnection.__init__).  SQLite
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


def _companions(path: Path) -> tuple[Path, ...]:
    """The ledger's file and SQLite's files beside it in WAL mode."""
    return path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _require_regular_files(path: Path) -> None:
    """LedgerError naming the first of the ledger's files that exists and
    is no regular file.  By stat alone: no descriptor of the ledger is ever
    opened (and closed) here (LedgerConnection.__init__)."""
    for companion in _companions(path):
        try:
            safe_files.require_regular(str(companion), "the mdev ledger's file")
        except safe_files.Refused as exc:
            raise exception.LedgerError(
                reason=f"{exc}: move it aside (the agent refuses to start until it is one)"
            ) from None


def _make_private(path: Path) -> None:
    """The ledger's files readable and writable by their owner only, whatever
    made them so (a copy restored with another mode): SQLite gives its -wal
    and -shm the main file's mode, and a file another user can read hands
    them every instance's devices."""
    for companion in _companions(path):
        try:
            mode = stat.S_IMODE(companion.stat().st_mode)
        except FileNotFoundError:
            continue
        if not mode & 0o077:
            continue
        try:
            companion.chmod(0o600)
        except OSError as exc:  # not this user's file: say so, the open decides
            LOG.warning("mdev ledger file %s is mode %04o, readable by others, and cannot "
                        "be made 0600: %s", companion, mode, exc.strerror)
            continue
        LOG.warning("mdev ledger file %s was mode %04o, readable by others: made 0600",
                    companion, mode)


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
