"""The mdev ledger: every mdev the agent owns, crash-safe, in SQLite.

``<state_dir>/ledger.sqlite3`` (directory 0700, file 0600), WAL mode with
``synchronous=FULL`` so a returned commit survives a power cut (intents,
which a durable commit always follows, skip the fsync), schema
versioned by ``PRAGMA user_version`` and migrated in one transaction.

The manager's protocol (docs/design.md §5.2, §5.7) is "intent before every sysfs write,
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

One connection per process (docs/design.md §5.2): the daemon and everything in its
process go through its one Ledger object; other processes that only read
open it ``read_only`` (SQLite's ``mode=ro``: never created, migrated, written
or checkpointed).  A schema migration runs only where asked for
(``upgrade=True``: the daemon's start, ``accelctl ledger upgrade``), after a
backup copy made with SQLite's backup API; every other opener refuses an
older schema with :class:`LedgerSchemaOld`, naming the command to run.

This package is split by what it stores, behind this facade (all the rest
of the agent imports): ``records.py`` (the records and their row),
``validation.py`` (ids and names before they reach SQL), ``connection.py``
(the one connection: opening, WAL, identity, transactions, errors, backup
and upgrade), ``intents.py``, ``devices.py`` (rows and owners),
``claims.py``, ``attach.py`` (attach requests), ``gpu_instances.py`` (the
MIG-backed layouts' GPU instances) and ``schema.py`` (the
schema's versions and migrations).  :class:`Ledger` is the stores composed
as mixins over one :class:`~.connection.LedgerConnection`: one object, one
connection, whatever it reads or writes.
"""

from __future__ import annotations

from accel_agent.devices.ledger.attach import AttachRequestStore
from accel_agent.devices.ledger.claims import ClaimStore
from accel_agent.devices.ledger.connection import LEDGER_FILENAME
from accel_agent.devices.ledger.devices import DeviceStore
from accel_agent.devices.ledger.gpu_instances import GpuInstanceRecord, GpuInstanceStore
from accel_agent.devices.ledger.intents import IntentStore
from accel_agent.devices.ledger.records import (
    DeviceRecord,
    DeviceState,
    Intent,
    IntentKind,
    OwnerKind,
)
from accel_agent.devices.ledger.schema import MIGRATIONS, SCHEMA_VERSION, Migration
from accel_agent.devices.ledger.validation import MAX_ID_LEN, validate_instance_id

# The ledger's own refusal, for its callers as before (accel_agent.exception).
from accel_agent.exception import LedgerSchemaOld

__all__ = [
    "LEDGER_FILENAME",
    "MAX_ID_LEN",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "DeviceRecord",
    "DeviceState",
    "GpuInstanceRecord",
    "Intent",
    "IntentKind",
    "Ledger",
    "LedgerSchemaOld",
    "Migration",
    "OwnerKind",
    "validate_instance_id",
]


class Ledger(ClaimStore, DeviceStore, IntentStore, AttachRequestStore, GpuInstanceStore):
    """One SQLite connection, safe to share between the threads of one process.

    Opened by :class:`~.connection.LedgerConnection` (its ``__init__`` says
    how, and why a process never opens its ledger twice); each base adds
    the queries and changes of what it stores.  Subclasses come before
    their bases: claims are assignments of device rows, which intents
    reserve.
    """
