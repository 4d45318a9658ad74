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

# The operation's lock files in the state directory (each made 0600 first,
# lock_file.py).  The lock was once named "accel-agent-mdevs", and during an
# upgrade a process of the older package (an offline accelctl, the old daemon
# still stopping) takes that name alone; so every operation takes both, the
# new name first.  Two processes of this package meet on the first; one of
# each package on the second; and no two take them in opposite orders (the
# older takes one), so none waits on the other for ever.  The older name can
# go once no supported upgrade starts from a release that takes it alone.
LOCK_NAME = "accel-agent-devices"
LEGACY_LOCK_NAME = "accel-agent-mdevs"
LOCK_NAMES = (LOCK_NAME, LEGACY_LOCK_NAME)


def device_ref(record: DeviceRecord) -> DeviceRef:
    return DeviceRef(
        record.uuid, record.parent, record.device_type, record.backend, record.settings
    )


@contextlib.contextmanager
def operation(m: DeviceManager) -> Iterator[None]:
    """The manager's lock: a thread lock plus the file locks in ``state_dir``
    (:data:`LOCK_NAMES`), so that an offline ``accelctl`` and the daemon
    never interleave, whichever release of the agent each one is.

    ``m.on_changed`` (the daemon: a rescan) is told after an operation that
    changed something, whatever its outcome: a ledger write it committed or
    a privileged write it attempted (``m.mutations`` moved, read under the
    lock).  One that changed nothing (a converge with the layout in place,
    a remove refused because the device is in use, a refused request) asks
    for nothing: a rescan that converges would otherwise ask for the next,
    for ever."""
    from oslo_concurrency import lockutils

    changed = False
    state_dir = str(m.ledger.path.parent)
    try:
        with m.thread_lock, contextlib.ExitStack() as locks:
            for name in LOCK_NAMES:  # in this order, always (LOCK_NAME's comment)
                locks.enter_context(lockutils.lock(
                    name, external=True, do_log=False,
                    lock_path=private_lock_dir(state_dir, name),
                ))
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
