"""What every run of the protocol shares: the operation's lock, the crash
points, the one durable transaction of a change that writes no sysfs, and a
ledger record as its backend sees it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from accel_agent.backends.base import DeviceRef
from accel_agent.devices.ledger import DeviceRecord
from accel_agent.devices.lock_file import private_lock_dir

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager

# The protocol logs under one name, the package's, whichever of its modules
# speaks: what an operator filters on did not move when it became a package.
LOG = logging.getLogger(__name__.rpartition(".")[0])

LOCK_NAME = "accel-agent-mdevs"


def device_ref(record: DeviceRecord) -> DeviceRef:
    return DeviceRef(
        record.uuid, record.parent, record.mdev_type, record.backend, record.settings
    )


@contextlib.contextmanager
def operation(m: DeviceManager) -> Iterator[None]:
    """The manager's lock: a thread lock plus a file lock in ``state_dir``, so
    that an offline ``accelctl`` and the daemon never interleave.

    ``m.on_changed`` (the daemon: a rescan) is told after an operation that
    changed something, whatever its outcome: a ledger write it committed or
    a privileged write it attempted (``m.mutations`` moved, read under the
    lock).  One that changed nothing (a converge with the layout in place,
    a remove refused because the device is in use, a refused request) asks
    for nothing: a rescan that converges would otherwise ask for the next,
    for ever."""
    from oslo_concurrency import lockutils

    changed = False
    try:
        with (
            m.thread_lock,
            lockutils.lock(
                LOCK_NAME, external=True, do_log=False,
                lock_path=private_lock_dir(str(m.ledger.path.parent), LOCK_NAME),
            ),
        ):
            before = m.mutations
            try:
                yield
            finally:
                changed = m.mutations != before
    finally:
        m.operations += 1
        if changed:
            m.on_changed()


def step(m: DeviceManager, name: str) -> None:
    """A crash point: the crash tests kill the process here (``on_step``)."""
    m.on_step(name)


@contextlib.contextmanager
def apply(m: DeviceManager) -> Iterator[None]:
    """A change that writes no sysfs, in one durable transaction."""
    with m.ledger.transaction():
        yield
