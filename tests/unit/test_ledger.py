"""The mdev ledger: durability settings, schema, lifecycle, constraints, concurrency."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices.ledger import (
    MIGRATIONS,
    SCHEMA_VERSION,
    DeviceState,
    IntentKind,
    Ledger,
    OwnerKind,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PCI = "0000:84:00.0"
NV = "nvidia-35"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def ledger(state_dir: Path, clock: Clock) -> Ledger:
    with Ledger(state_dir, clock=clock) as led:
        yield led


def present(led: Ledger, n: int, parent: str = PCI, mdev_type: str = NV) -> str:
    led.record_create_intent(uid(n), parent, mdev_type)
    led.settle_created(uid(n))
    return uid(n)


def raw(led: Ledger) -> sqlite3.Connection:
    """A second, independent connection (as another process would have)."""
    conn = sqlite3.connect(led.path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


# --- files, modes, durability ------------------------------------------------------------


def test_state_dir_and_file_are_private(ledger: Ledger, state_dir: Path) -> None:
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert ledger.path == state_dir / "ledger.sqlite3"
    assert stat.S_IMODE(ledger.path.stat().st_mode) == 0o600


def test_wal_mode_and_full_sync(ledger: Ledger) -> None:
    # journal_mode=WAL is stored in the file: a fresh connection sees it.
    conn = raw(ledger)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    # synchronous is per connection: read the ledger's own (FULL == 2).
    assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert ledger._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    present(ledger, 1)
    assert Path(str(ledger.path) + "-wal").exists()
    assert stat.S_IMODE(Path(str(ledger.path) + "-wal").stat().st_mode) == 0o600


def test_existing_state_dir_is_not_chmodded(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    Ledger(shared).close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755


# --- schema and migrations ------------------------------------------------------------


def test_new_ledger_has_current_schema(ledger: Ledger) -> None:
    assert ledger.schema_version == SCHEMA_VERSION == 7
    tables = {
        r[0] for r in raw(ledger).execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert {"mdevs", "assignments", "intents"} <= tables
    assert ledger.check_integrity() == "ok"


def test_v0_database_is_migrated(state_dir: Path) -> None:
    """An existing, empty (user_version 0) database file is brought to the current schema."""
    state_dir.mkdir(mode=0o700)
    sqlite3.connect(state_dir / "ledger.sqlite3").close()
    with Ledger(state_dir) as led:
        assert led.schema_version == SCHEMA_VERSION
        present(led, 1)
        assert led.get(uid(1)) is not None


def _next_version(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE mdevs ADD COLUMN note TEXT NOT NULL DEFAULT ''")
    conn.execute("UPDATE mdevs SET note = 'migrated'")


def test_migration_to_a_later_version_keeps_data(state_dir: Path) -> None:
    with Ledger(state_dir) as led:
        present(led, 1)
        led.assign(uid(1), "inst-a")
    with Ledger(state_dir, migrations=(*MIGRATIONS, _next_version), upgrade=True) as led:
        assert led.schema_version == SCHEMA_VERSION + 1
        record = led.get(uid(1))
        assert record is not None and record.owner == "inst-a"
        note = led._conn.execute("SELECT note FROM mdevs WHERE uuid = ?", (uid(1),)).fetchone()
        assert note == ("migrated",)


def test_v4_ledger_upgraded_keeps_assignments_and_takes_standing_owners(
    state_dir: Path, clock: Clock
) -> None:
    """Schema 5 rebuilds assignments (a wider owner_kind CHECK): every row,
    its index and both triggers survive it."""
    with Ledger(state_dir, migrations=MIGRATIONS[:4], clock=clock):
        pass  # a new file: given schema 4, written below as an agent of then did
    conn = sqlite3.connect(state_dir / "ledger.sqlite3")
    with conn:
        for n in (1, 2, 3):
            conn.execute(
                "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at) "
                "VALUES (?, ?, ?, 'present', 1, 1)", (uid(n), PCI, NV),
            )
        conn.execute("INSERT INTO assignments (uuid, owner, owner_kind, assigned_at) "
                     "VALUES (?, 'inst-a', 'instance', 1)", (uid(1),))
        conn.execute("INSERT INTO assignments (uuid, owner, owner_kind, claim_expires_at, "
                     "assigned_at, source_uuid) VALUES (?, 'dst-1', 'claim', 99, 1, ?)",
                     (uid(2), uid(9)))
    conn.close()
    with Ledger(state_dir, upgrade=True, clock=clock) as led:
        assert led.schema_version == SCHEMA_VERSION == 7
        one, two = led.get(uid(1)), led.get(uid(2))
        assert one is not None and (one.owner, one.owner_kind) == ("inst-a", OwnerKind.INSTANCE)
        assert two is not None and (two.owner_kind, two.source_uuid) == (OwnerKind.CLAIM, uid(9))
        assert led.assign(uid(3), "layout", owner_kind=OwnerKind.STANDING).owner_kind is \
            OwnerKind.STANDING
        assert not led.get(uid(3)).layout and led.set_layout(uid(3)).layout
        conn = raw(led)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"assignments_by_owner", "assign_only_present", "assigned_stays_present"} <= names
        assert "assignments_v5" not in names
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE mdevs SET state = 'removing' WHERE uuid = ?", (uid(3),))
        assert led.check_integrity() == "ok"


def test_v5_ledger_upgraded_keeps_its_rows_and_records_placements(
    state_dir: Path, clock: Clock
) -> None:
    """Schema 6 (issue 36): each vGPU's planned placement; a row of schema 5
    reads back without one, a new one keeps it, a bad one is refused."""
    with Ledger(state_dir, migrations=MIGRATIONS[:5], clock=clock):
        pass
    conn = sqlite3.connect(state_dir / "ledger.sqlite3")
    with conn:
        conn.execute(
            "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at, "
            "backend) VALUES (?, ?, ?, 'present', 1, 1, 'nvidia_vfio')", (uid(1), PCI, NV))
    conn.close()
    with Ledger(state_dir, upgrade=True, clock=clock) as led:
        assert led.schema_version == SCHEMA_VERSION == 7
        old = led.get(uid(1))
        assert old is not None and old.placement_id is None and old.backend == "nvidia_vfio"
        assert led.set_placement(uid(1), 12).placement_id == 12
        new = led.record_create_intent(uid(2), PCI, NV, backend="nvidia_vfio", placement_id=6)
        assert new.placement_id == 6
        with pytest.raises(exception.LedgerError):
            led.set_placement(uid(1), -1)
        with pytest.raises(sqlite3.IntegrityError):
            raw(led).execute("UPDATE mdevs SET placement_id = 70000 WHERE uuid = ?", (uid(1),))
        assert led.get(uid(1)).placement_id == 12
        assert led.check_integrity() == "ok"


def test_failed_migration_changes_nothing(state_dir: Path) -> None:
    with Ledger(state_dir) as led:
        present(led, 1)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Ledger(state_dir, migrations=(*MIGRATIONS, broken), upgrade=True)
    with Ledger(state_dir) as led:
        assert led.schema_version == SCHEMA_VERSION
        tables = {r[0] for r in led._conn.execute("SELECT name FROM sqlite_master")}
        assert "half_done" not in tables
        assert led.get(uid(1)) is not None


def test_newer_schema_is_refused_and_untouched(state_dir: Path) -> None:
    with Ledger(state_dir, migrations=(*MIGRATIONS, _next_version)) as led:
        present(led, 1)
        led._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path = state_dir / "ledger.sqlite3"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(exception.LedgerSchemaTooNew) as info:
        Ledger(state_dir)
    assert info.value.kwargs["found"] == SCHEMA_VERSION + 1
    assert info.value.kwargs["supported"] == SCHEMA_VERSION
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_newer_schema_refused_even_in_rollback_journal_mode(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    conn = sqlite3.connect(state_dir / "ledger.sqlite3")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(exception.LedgerSchemaTooNew):
        Ledger(state_dir)
    conn = sqlite3.connect(state_dir / "ledger.sqlite3")
    # Refused before switching the journal mode: the file was not rewritten.
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_garbage_file_is_a_ledger_error(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    (state_dir / "ledger.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(exception.LedgerError):
        Ledger(state_dir)


# --- lifecycle -------------------------------------------------------------------------


def test_create_settle_assign_release_remove_forget(ledger: Ledger, clock: Clock) -> None:
    u = uid(1)
    rec = ledger.record_create_intent(u, PCI, NV)
    assert rec.state is DeviceState.CREATING and not rec.free
    assert [r.uuid for r in ledger.unsettled()] == [u]
    assert ledger.free_of_type(PCI, NV) == []

    clock.now += 1
    rec = ledger.settle_created(u)
    assert rec.state is DeviceState.PRESENT and rec.free
    assert rec.updated_at == rec.created_at + 1
    assert ledger.unsettled() == []
    assert [r.uuid for r in ledger.free_of_type(PCI, NV)] == [u]
    assert ledger.free_of_type(PCI, "nvidia-36") == []
    assert ledger.free_of_type("0000:85:00.0", NV) == []

    rec = ledger.assign(u, "inst-a")
    assert rec.owner == "inst-a" and rec.owner_kind is OwnerKind.INSTANCE
    assert ledger.free_of_type(PCI, NV) == []
    assert [r.uuid for r in ledger.by_owner("inst-a")] == [u]
    assert [r.uuid for r in ledger.assigned()] == [u]

    rec = ledger.release(u)
    assert rec.owner is None and rec.free
    assert ledger.release(u) == rec  # idempotent
    assert ledger.by_owner("inst-a") == []

    rec = ledger.record_remove_intent(u)
    assert rec.state is DeviceState.REMOVING
    assert [r.uuid for r in ledger.unsettled()] == [u]
    assert ledger.forget(u) is True
    assert ledger.get(u) is None
    assert ledger.forget(u) is False
    assert ledger.all() == []


def test_create_intent_forgotten_when_create_did_not_happen(ledger: Ledger) -> None:
    ledger.record_create_intent(uid(1), PCI, NV)
    assert ledger.forget(uid(1)) is True
    assert ledger.unsettled() == []


def test_cancel_remove(ledger: Ledger) -> None:
    present(ledger, 1)
    ledger.record_remove_intent(uid(1))
    assert ledger.cancel_remove(uid(1)).free
    with pytest.raises(exception.LedgerConflict):
        ledger.cancel_remove(uid(1))


def test_adopt(ledger: Ledger) -> None:
    rec = ledger.adopt(uid(1), PCI, NV)
    assert rec.adopted and rec.free
    assert present(ledger, 2) and not ledger.get(uid(2)).adopted
    with pytest.raises(exception.LedgerConflict):
        ledger.adopt(uid(2), PCI, NV)


@pytest.mark.parametrize(
    "action",
    [
        lambda led: led.settle_created(uid(1)),  # already present
        lambda led: led.record_create_intent(uid(1), PCI, NV),  # duplicate UUID
        lambda led: led.record_remove_intent(uid(1)),  # assigned
        lambda led: led.forget(uid(1)),  # assigned
        lambda led: led.reserve(uid(1), led.begin_intent(IntentKind.ALLOCATE)),  # assigned
    ],
)
def test_refused_transitions_change_nothing(ledger: Ledger, action) -> None:
    present(ledger, 1)
    ledger.assign(uid(1), "inst-a")
    before = ledger.get(uid(1))
    with pytest.raises(exception.LedgerConflict):
        action(ledger)
    assert ledger.get(uid(1)) == before


def test_unknown_mdev(ledger: Ledger) -> None:
    for action in (ledger.settle_created, ledger.release, ledger.record_remove_intent):
        with pytest.raises(exception.MdevNotFound):
            action(uid(9))
    with pytest.raises(exception.MdevNotFound):
        ledger.assign(uid(9), "inst-a")


def test_creating_or_removing_mdev_cannot_be_assigned(ledger: Ledger) -> None:
    ledger.record_create_intent(uid(1), PCI, NV)
    with pytest.raises(exception.LedgerConflict):
        ledger.assign(uid(1), "inst-a")
    present(ledger, 2)
    ledger.record_remove_intent(uid(2))
    with pytest.raises(exception.LedgerConflict):
        ledger.assign(uid(2), "inst-a")
    assert ledger.assigned() == []


# --- one owner per mdev, enforced by the database -----------------------------------------


def test_mdev_cannot_be_assigned_twice(ledger: Ledger) -> None:
    present(ledger, 1)
    ledger.assign(uid(1), "inst-a")
    with pytest.raises(exception.MdevAlreadyAssigned) as info:
        ledger.assign(uid(1), "inst-b")
    assert info.value.kwargs["owner"] == "inst-a"
    with pytest.raises(exception.MdevAlreadyAssigned):
        ledger.assign(uid(1), "inst-a")
    assert [r.owner for r in ledger.all()] == ["inst-a"]


def test_database_constraints_hold_against_raw_sql(ledger: Ledger, clock: Clock) -> None:
    """Even code that bypasses the API cannot double-assign or corrupt states."""
    present(ledger, 1)
    ledger.assign(uid(1), "inst-a")
    ledger.record_create_intent(uid(2), PCI, NV)
    conn = raw(ledger)
    ins = (
        "INSERT INTO assignments (uuid, owner, owner_kind, claim_expires_at, assigned_at) "
        "VALUES (?, ?, ?, ?, 0)"
    )
    with pytest.raises(sqlite3.IntegrityError):  # second owner: PRIMARY KEY
        conn.execute(ins, (uid(1), "inst-b", "instance", None))
    with pytest.raises(sqlite3.IntegrityError):  # not present: trigger
        conn.execute(ins, (uid(2), "inst-b", "instance", None))
    with pytest.raises(sqlite3.IntegrityError):  # unknown mdev: foreign key
        conn.execute(ins, (uid(3), "inst-b", "instance", None))
    conn.execute("BEGIN")
    conn.execute("DELETE FROM assignments")
    with pytest.raises(sqlite3.IntegrityError):  # claim without expiry: CHECK
        conn.execute(ins, (uid(1), "inst-b", "claim", None))
    conn.execute("ROLLBACK")
    with pytest.raises(sqlite3.IntegrityError):  # assigned stays present: trigger
        conn.execute("UPDATE mdevs SET state = 'removing' WHERE uuid = ?", (uid(1),))
    with pytest.raises(sqlite3.IntegrityError):  # assigned cannot be deleted: FK
        conn.execute("DELETE FROM mdevs WHERE uuid = ?", (uid(1),))
    with pytest.raises(sqlite3.IntegrityError):  # UUIDs are lowercase: CHECK
        conn.execute(
            "INSERT INTO mdevs VALUES (?, ?, ?, 'present', NULL, 0, 0, 0, 'mdev', NULL, 0, NULL)",
            (uid(0xABC).upper(), PCI, NV),
        )
    conn.close()
    assert ledger.get(uid(1)).owner == "inst-a"
    assert ledger.get(uid(1)).state is DeviceState.PRESENT


@pytest.mark.parametrize(
    "bad", ["", "   ", "x" * 256, "inst\x00a", "inst\na", "inst\ta", None, 42, b"inst"]
)
def test_invalid_instance_ids(ledger: Ledger, bad) -> None:
    present(ledger, 1)
    with pytest.raises(exception.InvalidInstanceId):
        ledger.assign(uid(1), bad)
    assert ledger.get(uid(1)).free


@pytest.mark.parametrize("good", ["x" * 255, "inst a", "ümlaut-ok", "9f0e-…"])
def test_valid_instance_ids(good: str) -> None:
    assert ledger_mod.validate_instance_id(good) == good


@pytest.mark.parametrize("bad", [uid(0xABC).upper(), "{" + uid(1) + "}", uid(1)[:-1], ""])
def test_invalid_uuids(ledger: Ledger, bad: str) -> None:
    with pytest.raises(exception.InvalidMdevUUID):
        ledger.record_create_intent(bad, PCI, NV)
    assert ledger.all() == []


# --- intents and all-or-nothing allocation --------------------------------------------


def test_allocate_intent_protocol(ledger: Ledger) -> None:
    reused = present(ledger, 1)
    intent = ledger.begin_intent(IntentKind.ALLOCATE, owner="inst-a")
    ledger.reserve(reused, intent)
    ledger.record_create_intent(uid(2), PCI, NV, intent_id=intent)
    ledger.record_create_intent(uid(3), PCI, NV, intent_id=intent)
    # Reserved rows are not free for anyone else.
    assert ledger.free_of_type(PCI, NV) == []
    with pytest.raises(exception.LedgerConflict):
        ledger.assign(reused, "inst-b")
    (pending,) = ledger.pending_intents()
    assert pending.id == intent and pending.kind is IntentKind.ALLOCATE
    assert pending.owner == "inst-a"
    assert pending.uuids == (uid(1), uid(2), uid(3))

    ledger.settle_created(uid(2))
    ledger.settle_created(uid(3))
    with ledger.transaction():
        for u in pending.uuids:
            ledger.assign(u, "inst-a", intent_id=intent)
        ledger.finish_intent(intent)
    assert ledger.pending_intents() == []
    assert [r.uuid for r in ledger.by_owner("inst-a")] == [uid(1), uid(2), uid(3)]
    assert all(r.intent_id is None for r in ledger.all())


def test_allocate_is_all_or_nothing(ledger: Ledger) -> None:
    """A failure in the final transaction assigns none of the N mdevs."""
    intent = ledger.begin_intent(IntentKind.ALLOCATE, owner="inst-a")
    for n in (1, 2):
        ledger.record_create_intent(uid(n), PCI, NV, intent_id=intent)
        ledger.settle_created(uid(n))
    ledger.record_create_intent(uid(3), PCI, NV, intent_id=intent)  # never settled
    with pytest.raises(exception.LedgerConflict), ledger.transaction():
        for n in (1, 2, 3):
            ledger.assign(uid(n), "inst-a", intent_id=intent)
        ledger.finish_intent(intent)
    assert ledger.assigned() == []
    assert [i.id for i in ledger.pending_intents()] == [intent]


def test_finish_intent_unreserves_rows(ledger: Ledger) -> None:
    intent = ledger.begin_intent(IntentKind.ALLOCATE)
    ledger.record_create_intent(uid(1), PCI, NV, intent_id=intent)
    ledger.settle_created(uid(1))
    assert ledger.free_of_type(PCI, NV) == []
    ledger.finish_intent(intent)
    assert [r.uuid for r in ledger.free_of_type(PCI, NV)] == [uid(1)]


def test_unknown_intent_is_refused(ledger: Ledger) -> None:
    with pytest.raises(exception.LedgerError):
        ledger.record_create_intent(uid(1), PCI, NV, intent_id=12345)
    assert ledger.all() == []


def test_nested_transaction_rolls_back_alone(ledger: Ledger) -> None:
    with ledger.transaction():
        present(ledger, 1)
        with pytest.raises(RuntimeError), ledger.transaction():
            present(ledger, 2)
            raise RuntimeError("inner")
        present(ledger, 3)
    assert [r.uuid for r in ledger.all()] == [uid(1), uid(3)]


def test_outer_failure_rolls_back_everything(ledger: Ledger) -> None:
    with pytest.raises(RuntimeError), ledger.transaction():
        present(ledger, 1)
        with ledger.transaction():
            present(ledger, 2)
        raise RuntimeError("outer")
    assert ledger.all() == []


# --- claims ------------------------------------------------------------------------


def test_claims_and_expiry(ledger: Ledger, clock: Clock) -> None:
    for n in (1, 2, 3):
        present(ledger, n)
    ledger.assign(uid(1), "inst-m", owner_kind=OwnerKind.CLAIM, claim_expires_at=1100.0)
    ledger.assign(uid(2), "inst-n", owner_kind=OwnerKind.CLAIM, claim_expires_at=1300.0)
    ledger.assign(uid(3), "inst-o")
    assert [r.uuid for r in ledger.claims()] == [uid(1), uid(2)]
    assert ledger.expired_claims(now=1050.0) == []
    assert [r.uuid for r in ledger.expired_claims(now=1100.0)] == [uid(1)]
    clock.now = 2000.0
    assert [r.uuid for r in ledger.expired_claims()] == [uid(1), uid(2)]

    committed = ledger.commit_claim("inst-n")
    assert [(r.uuid, r.owner_kind, r.claim_expires_at) for r in committed] == [
        (uid(2), OwnerKind.INSTANCE, None)
    ]
    assert [r.uuid for r in ledger.claims()] == [uid(1)]
    released = ledger.release_owner("inst-m", OwnerKind.CLAIM)
    assert [r.uuid for r in released] == [uid(1)]
    assert ledger.claims() == []


def test_claim_needs_expiry_and_instance_none(ledger: Ledger) -> None:
    present(ledger, 1)
    with pytest.raises(exception.LedgerError):
        ledger.assign(uid(1), "inst-m", owner_kind=OwnerKind.CLAIM)
    with pytest.raises(exception.LedgerError):
        ledger.assign(uid(1), "inst-m", claim_expires_at=5.0)
    assert ledger.get(uid(1)).free


# --- concurrency ------------------------------------------------------------------------


def _next_uuid_worker(state_dir: str, rounds: int) -> None:
    """Read-then-write in one transaction: the next UUID is derived from the
    row count, so two interleaved transactions would pick the same UUID."""
    with Ledger(state_dir, busy_timeout=60.0) as led:
        for _ in range(rounds):
            with led.transaction():
                n = len(led.all())
                led.record_create_intent(uid(n), PCI, NV)


def test_processes_serialise(state_dir: Path) -> None:
    Ledger(state_dir).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_next_uuid_worker, args=(str(state_dir), 15)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with Ledger(state_dir) as led:
        assert sorted(r.uuid for r in led.all()) == [uid(n) for n in range(45)]


def test_threads_serialise(ledger: Ledger) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                with ledger.transaction():
                    ledger.record_create_intent(uid(len(ledger.all())), PCI, NV)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(r.uuid for r in ledger.all()) == [uid(n) for n in range(80)]


def _hold_transaction(state_dir: str, entered, release) -> None:
    with Ledger(state_dir) as led, led.transaction():
        led.record_create_intent(uid(7), PCI, NV)
        entered.set()
        release.wait(120)


def test_open_transaction_excludes_other_writers(state_dir: Path) -> None:
    Ledger(state_dir).close()
    ctx = multiprocessing.get_context("spawn")
    entered, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_transaction, args=(str(state_dir), entered, release))
    holder.start()
    try:
        assert entered.wait(120)
        with Ledger(state_dir, busy_timeout=0.05) as led:
            with pytest.raises(exception.LedgerError, match="locked"):
                led.record_create_intent(uid(8), PCI, NV)
            # Readers are not blocked by the writer (WAL) and see the last commit.
            assert led.all() == []
            release.set()
            holder.join(120)
            assert holder.exitcode == 0
            led.record_create_intent(uid(8), PCI, NV)
            assert [r.uuid for r in led.all()] == [uid(7), uid(8)]
    finally:
        release.set()
        holder.join(5)


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from accel_agent.devices.ledger import Ledger
    led = Ledger(sys.argv[1])
    led.record_create_intent("00000000-0000-4000-8000-000000000001", "p", "t")
    with led.transaction():
        for n in range(2, 50):
            led.record_create_intent(f"00000000-0000-4000-8000-{n:012x}", "p", "t")
        led.settle_created("00000000-0000-4000-8000-000000000001")
        print("IN-TRANSACTION", flush=True)
        time.sleep(600)
    """
)


def test_sigkilled_writer_leaves_nothing_half_written(state_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(state_dir)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "IN-TRANSACTION"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    with Ledger(state_dir, busy_timeout=5.0) as led:
        assert led.check_integrity() == "ok"
        # The committed intent survived, the killed transaction did not.
        records = led.all()
        assert [(r.uuid, r.state) for r in records] == [(uid(1), DeviceState.CREATING)]
        # The write lock died with the process.
        led.settle_created(uid(1))
        assert led.get(uid(1)).state is DeviceState.PRESENT


def test_constraint_failure_is_a_ledger_error(ledger: Ledger) -> None:
    """Skipping the API's checks still hits the database's constraint, typed."""
    present(ledger, 1)
    ledger.assign(uid(1), "inst-a")
    with pytest.raises(exception.LedgerError, match="constraint failed"):
        ledger._execute(
            "INSERT INTO assignments (uuid, owner, owner_kind, assigned_at) VALUES (?, ?, ?, 0)",
            (uid(1), "inst-b", "instance"),
        )
    assert ledger.get(uid(1)).owner == "inst-a"


def test_v1_ledger_is_migrated_to_the_current_schema_keeping_assignments(
    state_dir: Path,
) -> None:
    """The real v1 -> v2 (claim source UUIDs) and v2 -> v3 (backend) steps on a
    database written by v1."""
    with Ledger(state_dir, migrations=MIGRATIONS[:1]) as led:
        assert led.schema_version == 1
        # Raw SQL: this code's queries already expect v2 columns.
        led._conn.execute(
            "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at) "
            "VALUES (?, ?, ?, 'present', 0, 0)",
            (uid(1), PCI, NV),
        )
        led._conn.execute(
            "INSERT INTO assignments (uuid, owner, owner_kind, assigned_at) "
            "VALUES (?, 'inst-a', 'instance', 0)",
            (uid(1),),
        )
    with Ledger(state_dir, upgrade=True) as led:
        assert led.schema_version == SCHEMA_VERSION
        record = led.get(uid(1))
        assert record is not None and record.owner == "inst-a" and record.source_uuid is None
        assert record.backend == "mdev"  # v3: every row before it was an mdev
        assert record.settings is None  # v4: an mdev has no per-instance settings
        assert led.attach_request("inst-a") is None
        present(led, 2)
        led.assign(uid(2), "inst-b", owner_kind="claim", claim_expires_at=1e12, source_uuid=uid(9))
        assert led.get(uid(2)).source_uuid == uid(9)


def test_the_backend_of_a_row_is_kept(ledger: Ledger) -> None:
    ledger.record_create_intent(uid(1), "0000:c1:00.4", "nvidia-1147", backend="nvidia_vfio")
    ledger.adopt(uid(2), PCI, NV)
    assert [(r.uuid, r.backend) for r in ledger.all()] == [
        (uid(1), "nvidia_vfio"), (uid(2), "mdev")
    ]


def test_settings_and_the_attach_request_are_kept_and_go_with_the_release(
    ledger: Ledger,
) -> None:
    """Schema v4 (issue 15): a device's settings (a VF's MAC and VLAN) and the
    instance's attach request, dropped with the instance's devices."""
    ledger.record_create_intent(
        uid(1), "0000:10:10.0", "nic_a", backend="sriov_vf",
        settings={"vlan": 100, "mac": "52:54:00:00:00:01"},
    )
    ledger.settle_created(uid(1))
    with ledger.transaction():
        ledger.assign(uid(1), "inst-a")
        ledger.record_attach_request("inst-a", {"requests": [{"pool": "nic_a"}]})
    assert ledger.get(uid(1)).settings == {"mac": "52:54:00:00:00:01", "vlan": 100}
    assert ledger.attach_request("inst-a") == {"requests": [{"pool": "nic_a"}]}
    ledger.release_owner("inst-b")  # another instance: nothing of inst-a goes
    assert ledger.attach_request("inst-a") is not None
    ledger.release_owner("inst-a")
    assert ledger.attach_request("inst-a") is None and ledger.get(uid(1)).owner is None
    with pytest.raises(sqlite3.IntegrityError):  # settings are JSON: CHECK
        ledger._conn.execute("UPDATE mdevs SET settings = 'not json' WHERE uuid = ?", (uid(1),))


def test_a_new_ledger_is_one_info_line(tmp_path, caplog):
    """A fresh ledger passes every schema step in one transaction: the
    operator's log says it was made, once; the steps are debug detail."""
    import logging

    with caplog.at_level(logging.INFO, logger="accel_agent"):
        Ledger(str(tmp_path)).close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        f"created the mdev ledger {tmp_path / 'ledger.sqlite3'} (schema {SCHEMA_VERSION})"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="accel_agent"):
        Ledger(str(tmp_path)).close()  # an existing one: nothing to say
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_v6_ledger_upgraded_records_the_gpu_instances_of_mig_layouts(
    state_dir: Path, clock: Clock
) -> None:
    """Schema 7 (issue 37): the GPU instances a MIG-backed layout owns, by
    GPU and placement; a schema 6 ledger keeps its rows and starts with none."""
    from accel_agent.devices.ledger import GpuInstanceRecord

    with Ledger(state_dir, migrations=MIGRATIONS[:6], clock=clock) as led:
        present(led, 1)
    with Ledger(state_dir, upgrade=True, clock=clock) as led:
        assert led.schema_version == SCHEMA_VERSION == 7
        assert led.get(uid(1)) is not None and led.gpu_instances() == []
        small = GpuInstanceRecord("0000:61:00.0", 4, 1, 19, "gpu_layout_mig")
        large = GpuInstanceRecord("0000:61:00.0", 0, 4, 9, "gpu_layout_mig")
        led.record_gpu_instance(small)
        led.record_gpu_instance(large)
        assert led.gpu_instances("0000:61:00.0") == [large, small]
        assert led.gpu_instances("0000:62:00.0") == []
        led.forget_gpu_instance("0000:61:00.0", 0)
        led.forget_gpu_instance("0000:61:00.0", 0)  # idempotent
        assert led.gpu_instances() == [small]
        with pytest.raises(exception.LedgerError):
            led.record_gpu_instance(GpuInstanceRecord("61:00.0", 0, 4, 9, "gpu_layout_mig"))
        with pytest.raises(exception.LedgerError):
            led.record_gpu_instance(GpuInstanceRecord("0000:61:00.0", 0, 0, 9, "x"))
        assert led.gpu_instances() == [small]
        assert led.check_integrity() == "ok"
