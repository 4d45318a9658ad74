"""The ``mdev`` backend: the kernel's mediated devices (``class/mdev_bus``).

Its read side is the host scanner's base (``accel_agent.sysfs.scanner`` and
``rescan``); a device is created by writing its UUID to the type's ``create``
and removed by writing ``1`` to its ``remove``; a guest is given
``<hostdev type='mdev'>`` with the UUID.
"""

from __future__ import annotations

import uuid as uuid_mod

from accel_agent.backends.base import DeviceBackend, DeviceRef, DeviceWriter
from accel_agent.sysfs.model import Parent


class MdevBackend(DeviceBackend):
    name = "mdev"

    def new_device_uuid(self, parent: Parent) -> str:
        return str(uuid_mod.uuid4())

    def create(self, writer: DeviceWriter, parent: str, device_type: str, uuid: str) -> None:
        writer.create(parent, device_type, uuid)

    def destroy(self, writer: DeviceWriter, device: DeviceRef, timeout: float) -> None:
        writer.remove(device.uuid, timeout)
