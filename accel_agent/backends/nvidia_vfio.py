"""The ``nvidia_vfio`` backend: NVIDIA vGPU 17+ on SR-IOV VFs (vendor-specific VFIO).

On Ada, Hopper and Blackwell GPUs a vGPU is a VF of the GPU kept bound to
``nvidia`` and typed through ``nvidia/current_vgpu_type``
(``accel_agent.sysfs.nvidia_vfio`` reads them).  A VF is a parent that holds
at most one device; the device's UUID is derived from the VF's address, so a
host reboot (every VF back to ``0``) is repaired by re-typing the same VFs.
Types are ``nvidia-<id>`` in configuration and listings, and
``[mdev_nvidia-<id>] device_addresses`` names the PFs.  A guest is given the
VF as ``<hostdev type='pci' managed='no'>``: ``managed='yes'`` would have
libvirt rebind the VF away from ``nvidia`` and break the vGPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from accel_agent import exception
from accel_agent.backends.base import (
    DeviceBackend,
    DeviceRef,
    Discoverer,
    check_fixed_uuid,
    vfs_in_use,
)
from accel_agent.sysfs import nvidia_vfio
from accel_agent.sysfs.model import HostSnapshot, Parent

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.devices import PciHostdev


class VgpuWriter(Protocol):
    """The writes of the nvidia_vfio backend (``privileged/vgpu.py``)."""

    def set_vgpu_type(self, vf: str, type_id: int) -> None: ...

    def set_vgpu_placement(self, vf: str, placement_id: int) -> None: ...

    def clear_vgpu_type(self, vf: str, timeout: float) -> None: ...


class NvidiaVfioBackend(DeviceBackend[VgpuWriter]):
    name = nvidia_vfio.BACKEND
    kind = "vGPU VF"
    device_uuid_is_fixed = True

    def discoverer(
        self, sysfs_root: str, state_dir: str | None = None, persist: bool = False
    ) -> Discoverer:
        return nvidia_vfio.VfioScanner(sysfs_root, state_dir, persist)

    def new_device_uuid(self, parent: Parent) -> str:
        return nvidia_vfio.device_uuid(parent.name)

    def create(self, writer: VgpuWriter, parent: str, device_type: str, uuid: str) -> None:
        type_id = nvidia_vfio.type_id_of(device_type)
        if type_id is None:
            raise exception.MdevTypeNotSupported(parent=parent, mdev_type=device_type)
        check_fixed_uuid(self.kind, parent, uuid, nvidia_vfio.device_uuid(parent))
        writer.set_vgpu_type(parent, type_id)

    def place(self, writer: VgpuWriter, parent: str, placement_id: int) -> None:
        """Move the vGPU just made on VF ``parent`` to ``placement_id`` (a
        mixed-size layout's plan), read back by the writer."""
        writer.set_vgpu_placement(parent, placement_id)

    def placement_type_id(self, device_type: str) -> int | None:
        return nvidia_vfio.type_id_of(device_type)

    def destroy(self, writer: VgpuWriter, device: DeviceRef, timeout: float) -> None:
        writer.clear_vgpu_type(device.parent, timeout)

    def in_use(self, devices: Sequence[DeviceRef], reason: str) -> exception.VfInUse:
        return vfs_in_use(self.kind, devices, reason)

    def pci_address(self, device: DeviceRef) -> str | None:
        return device.parent

    def guest_device(self, device: DeviceRef) -> PciHostdev:
        # managed='no': with 'yes' libvirt would unbind the VF from nvidia and bind
        # it to vfio-pci when the guest starts (and back when it stops), which
        # destroys the vGPU and breaks the VF's VFIO registration until SR-IOV is
        # cycled (docs/design.md §10.3).  nvidia's own VFIO driver already offers the
        # VF to QEMU as it is.
        from accel_agent.libvirt_xml.devices import PciHostdev

        return PciHostdev(device.parent, managed=False)

    def host_notes(self, snapshot: HostSnapshot) -> list[str]:
        return []
