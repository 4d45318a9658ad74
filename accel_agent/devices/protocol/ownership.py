"""Changes of who holds a device that write no sysfs: a migration claim
committed or freed (devices/claims.py), and taking over what exists, an
adoption or a takeover from Nova (devices/takeover.py), which writes
libvirt's definitions too.  Each is one durable transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel_agent.devices.ledger import DeviceRecord, OwnerKind
from accel_agent.devices.protocol.libvirt_defs import Undefines
from accel_agent.devices.protocol.runs import apply

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.nodedevs import MdevNodeDevice


def commit_claim(m: DeviceManager, owner: str) -> None:
    """A migration claim becomes the instance's allocation."""
    with apply(m):
        m.ledger.commit_claim(owner)


def free_claim(m: DeviceManager, owner: str) -> list[DeviceRecord]:
    """Drop a migration claim, keeping its devices free for reuse; returns
    the devices it held."""
    with apply(m):
        return m.ledger.release_owner(owner, OwnerKind.CLAIM)


@dataclass(frozen=True, slots=True)
class Adoption:
    """A foreign device the agent takes as its own (recorded present,
    adopted): free, or assigned to ``instance`` (a takeover's domain)."""

    uuid: str
    parent: str
    device_type: str
    backend: str = "mdev"
    instance: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """A device the agent owns already, free, given to an instance."""

    uuid: str
    instance: str


class Takeover:
    """Taking over what exists: libvirt's definitions of what it takes are
    undefined first (crash point ``takeover.undefined`` after each), then
    one durable transaction adopts and assigns.  All or nothing: a failure
    at any point defines again what it undefined (:meth:`abort`) and the
    ledger is not changed."""

    def __init__(
        self,
        m: DeviceManager,
        defined: Mapping[str, MdevNodeDevice],
        to_undefine: Sequence[str] = (),
        adopt: Sequence[Adoption] = (),
        assign: Sequence[Assignment] = (),
    ) -> None:
        self.m = m
        self.to_undefine = tuple(to_undefine)
        self.adopt = tuple(adopt)
        self.assign = tuple(assign)
        self.undefines = Undefines(m, defined)
        # The records of what it adopted, once its transaction committed.
        self.adopted: list[DeviceRecord] = []

    def run(self) -> None:
        # A failure half-way through the undefines defines again what they
        # undid (Undefines.undefine); a failure of the ledger's commit, all
        # of them (abort).
        self.undefines.undefine(self.to_undefine)
        try:
            self._apply()
        except BaseException:
            self.abort()
            raise

    def _apply(self) -> None:
        m = self.m
        adopted = []
        with apply(m):
            for each in self.adopt:
                adopted.append(
                    m.ledger.adopt(each.uuid, each.parent, each.device_type, backend=each.backend)
                )
                if each.instance is not None:
                    m.ledger.assign(each.uuid, each.instance)
            for given in self.assign:
                m.ledger.assign(given.uuid, given.instance)
        self.adopted = adopted

    def abort(self) -> None:
        """Define again what :meth:`run` undefined; nothing else changed."""
        self.undefines.abort()


def adopt(
    m: DeviceManager, adoption: Adoption, defined: Mapping[str, MdevNodeDevice]
) -> DeviceRecord:
    """Take ownership of one foreign device; libvirt's definition of it, if
    any, is undefined (all or nothing)."""
    taken = Takeover(m, defined, to_undefine=[adoption.uuid], adopt=[adoption])
    taken.run()
    return taken.adopted[0]
