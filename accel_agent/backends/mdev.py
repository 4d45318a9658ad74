"""The ``mdev`` backend: the kernel's mediated devices (``class/mdev_bus``).

Its read side is the host scanner's base (``accel_agent.sysfs.scanner`` and
``rescan``); a device is created by writing its UUID to the type's ``create``
and removed by writing ``1`` to its ``remove``; a guest is given
``<hostdev type='mdev'>`` with the UUID.

The boot race (docs/design.md §14): libvirt's or mdevctl's autostart may start a
definition of the agent's mdev before the agent's recovery re-creates it.  A
create that meets EEXIST for an mdev of the same UUID, parent and type is the
agent's device made by someone else first: success.  Any other mdev of that
UUID stays refused (MdevAlreadyExists).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from accel_agent import exception
from accel_agent.backends.base import DeviceBackend, DeviceRef
from accel_agent.sysfs.model import Parent

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.devices import MdevDevice

LOG = logging.getLogger(__name__)


class MdevWriter(Protocol):
    """The writes of the mdev backend (``privileged/mdev.py``)."""

    def create(self, parent: str, mdev_type: str, uuid: str) -> None: ...

    def remove(self, uuid: str, timeout: float) -> None: ...


class MdevBackend(DeviceBackend[MdevWriter]):
    name = "mdev"
    kind = "mdev"

    def new_device_uuid(self, parent: Parent) -> str:
        # Imported here: uuid brings platform (~4 ms), and the read-only
        # listings, which never make a device, load this backend too.
        import uuid

        return str(uuid.uuid4())

    def create(self, writer: MdevWriter, parent: str, device_type: str, uuid: str) -> None:
        try:
            writer.create(parent, device_type, uuid)
        except exception.MdevAlreadyExists:
            if not _same_mdev_exists(writer, parent, device_type, uuid):
                raise
            LOG.info(
                "mdev %s (%s on %s) already existed: libvirt's or mdevctl's autostart "
                "created it first; it is the agent's device", uuid, device_type, parent,
            )

    def destroy(self, writer: MdevWriter, device: DeviceRef, timeout: float) -> None:
        writer.remove(device.uuid, timeout)

    def in_use(self, devices: Sequence[DeviceRef], reason: str) -> exception.MdevInUse:
        return exception.MdevInUse(uuid=", ".join(d.uuid for d in devices), reason=reason)

    def guest_device(self, device: DeviceRef) -> MdevDevice:
        # Imported here: accelctl's listings load the backends and never build XML.
        from accel_agent.libvirt_xml.devices import MdevDevice

        return MdevDevice(device.uuid)


def _same_mdev_exists(writer: MdevWriter, parent: str, device_type: str, uuid: str) -> bool:
    from accel_agent.sysfs import scanner

    root = getattr(writer, "sysfs_root", None) or "/sys"
    found = scanner.read_mdev(root, uuid)
    return found is not None and (found.parent, found.mdev_type) == (parent, device_type)
