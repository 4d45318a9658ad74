"""A standing layout's ledger writes (devices/layout.py decides them): free
devices join the layout, released ones go back to it, and one it no longer
wants is removed, or stays its own when something holds it.  A layout's
new devices are made by the :class:`~.operation.Operation` of its owner
:data:`LAYOUT`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices.ledger import OwnerKind
from accel_agent.devices.protocol.operation import Owner
from accel_agent.devices.protocol.remove import remove_owned
from accel_agent.devices.protocol.runs import LOG, apply, step

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager

# The ledger owner of a standing layout's devices that no instance holds.
LAYOUT_OWNER = "layout"
LAYOUT = Owner(LAYOUT_OWNER, OwnerKind.STANDING)


def join_layout(m: DeviceManager, uuids: Sequence[str]) -> None:
    """Free devices join the layout (held by it, marked its), in one commit."""
    if not uuids:
        return
    with apply(m):
        for uuid in uuids:
            m.ledger.assign(uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
            m.ledger.set_layout(uuid)


def take_back(m: DeviceManager, uuids: Sequence[str]) -> None:
    """Released devices the layout keeps (or that a VM kept from removal):
    those still free are the layout's again, in one commit."""
    if not uuids:
        return
    with apply(m):
        for uuid in uuids:
            record = m.ledger.get(uuid)
            if record is not None and record.free:
                m.ledger.assign(uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
                m.ledger.set_layout(uuid)


def remove_from_layout(m: DeviceManager, uuid: str) -> bool:
    """Remove a device the layout holds (crash point ``layout.released``
    between its release and its remove).  True when it is gone; one in use
    (a VM holds it) or that cannot be removed now stays the layout's, and
    nothing changed (no rescan asked for: it is tried again at the next
    converge)."""
    mark = m.mutations
    with apply(m):
        m.ledger.release(uuid)
    step(m, "layout.released")
    try:
        gone = remove_owned(m, uuid)
    except exception.AccelAgentException:
        gone = False
        LOG.warning("standing layout: cannot remove %s now; retried at the next converge",
                    uuid, exc_info=True)
    if gone:
        return True
    with apply(m):
        current = m.ledger.get(uuid)
        back = current is not None and current.free
        if back:
            m.ledger.assign(uuid, LAYOUT_OWNER, owner_kind=OwnerKind.STANDING)
    if back:
        m.forget_changes_since(mark)  # the layout's again, as it was
    return False
