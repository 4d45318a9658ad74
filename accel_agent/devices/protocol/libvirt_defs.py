"""libvirt's mdev definitions go with the devices (docs/design.md §14): a
remove undefines the mdev in libvirt after its sysfs remove and before the
settlement (a failure there leaves the remove intent, which recovery
settles, undefining what is left); with ``[libvirt] define_mdevs`` a make
defines what it created (best effort: recovery defines what is missing); a
takeover undefines what it takes and, aborted, defines it again
(:class:`Undefines`).  The agent never undefines a definition of a device
that is not its own or that it does not take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.devices import nodedevs
from accel_agent.devices.protocol.runs import LOG, step

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.devices.nodedevs import MdevNodeDevice


def definitions(m: DeviceManager) -> Mapping[str, MdevNodeDevice] | None:
    """libvirt's mdev definitions; None when libvirt cannot be reached
    (nothing known: nothing is undefined, as always).  Raises LibvirtStalled
    when libvirt is there but did not answer within its deadline: a removed
    device's definition is then left to recovery, its remove intent kept."""
    try:
        return m.nodedevs.require()
    except exception.LibvirtStalled:
        raise
    except exception.NodeDevicesUnavailable as exc:
        failure = exc
    LOG.warning("%s; libvirt's mdev definitions are not known", failure.message)
    return None


def is_mdev(m: DeviceManager, uuid: str) -> bool:
    """Only mediated devices have libvirt definitions (mdevctl's)."""
    record = m.ledger.get(uuid)
    return record is None or record.backend == "mdev"


def undefine_removed(
    m: DeviceManager, uuids: Sequence[str], defined: Mapping[str, MdevNodeDevice] | None
) -> None:
    """Undefine in libvirt each removed device it defines (``defined``: what
    libvirt defines; None: unknown, libvirt unreachable, nothing done).
    Called with owned devices only: the agent never undefines another's.
    Raises NodeDeviceWriteFailed / NodeDevicesUnavailable with the remove
    intents still recorded, for recovery."""
    if defined is None:
        return
    for uuid in uuids:
        found = defined.get(uuid)
        if found is not None and found.defined:
            m.nodedevs.undefine(uuid)
            LOG.info("undefined removed mdev %s in libvirt (it would come back at boot)", uuid)
            step(m, "release.undefined")


def undefine_or_keep(m: DeviceManager, uuid: str) -> bool:
    """After its sysfs remove: undefine ``uuid`` in libvirt if it defines
    it.  False when libvirt refused: the row stays ``removing`` (its remove
    intent), and the next recovery undefines it and forgets the row."""
    if not is_mdev(m, uuid):
        return True  # a VF: libvirt keeps no definition of it
    failure: exception.AccelAgentException | None = None
    try:
        undefine_removed(m, [uuid], definitions(m))
    except exception.AccelAgentException as exc:  # LibvirtStalled included
        failure = exc
    if failure is None:
        return True
    LOG.warning("mdev %s is removed but libvirt may still define it (%s); the next "
                "recovery undefines it", uuid, failure)
    return False


def define_made(m: DeviceManager, uuids: Sequence[str]) -> None:
    """``[libvirt] define_mdevs``: define each device the agent made in
    libvirt, autostart off (the agent re-creates its devices at boot, not
    libvirt).  Best effort: a failure is logged and recovery defines it."""
    if not m.define_mdevs or not uuids:
        return
    failure: exception.AccelAgentException | None = None
    try:
        defined = m.nodedevs.require()
        for uuid in uuids:
            record = m.ledger.get(uuid)
            if record is None or record.backend != "mdev":
                continue
            found = defined.get(uuid)
            if found is not None and found.defined:
                if found.autostart:
                    m.nodedevs.set_autostart(uuid, False)
                continue
            m.nodedevs.define(uuid, record.parent, record.device_type, autostart=False)
            LOG.info("defined mdev %s in libvirt, autostart off", uuid)
    except exception.AccelAgentException as exc:
        failure = exc
    if failure is not None:  # outside the except clause: said once
        LOG.warning("defining mdevs in libvirt failed (%s); the next recovery defines them",
                    failure)


class Undefines:
    """The definitions a takeover undefines (devices it takes: libvirt must
    not start them again), and how to put them back when it fails.

    Each undefined definition is kept with its XML and autostart flag, so
    :meth:`abort` defines it again as it was.  The crash point
    ``takeover.undefined`` follows each undefine."""

    def __init__(self, m: DeviceManager, defined: Mapping[str, MdevNodeDevice]) -> None:
        self.m = m
        self.defined = defined
        # What this run undefined, in order (what abort defines again).
        self.undone: list[MdevNodeDevice] = []

    def undefine(self, uuids: Sequence[str]) -> None:
        """Undefine each of ``uuids`` that libvirt defines; on a failure,
        define again what was undefined and raise."""
        try:
            for uuid in uuids:
                found = self.defined.get(uuid)
                if found is None or not found.defined:
                    continue
                self.m.nodedevs.undefine(uuid)
                self.undone.append(found)
                step(self.m, "takeover.undefined")
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Put back libvirt's definitions this run undefined (newest first)."""
        while self.undone:
            found = self.undone.pop()
            failure: exception.AccelAgentException | None = None
            try:
                self.m.nodedevs.define_xml(nodedevs.definition_xml(found.xml), found.autostart)
            except exception.AccelAgentException as exc:
                failure = exc
            if failure is not None:
                LOG.error("could not define mdev %s in libvirt again after a failed takeover: "
                          "%s", found.uuid, failure)
            else:
                LOG.info("defined mdev %s in libvirt again (autostart %s): the takeover failed",
                         found.uuid, "on" if found.autostart else "off")
