"""The ``sriov_vf`` backend: plain SR-IOV VFs of configured accelerator PFs
(a NIC, an FPGA), handed to an instance on ``vfio-pci``.

A VF is a parent that holds at most one device, as for ``nvidia_vfio``: the
device is the VF handed over, its UUID derived from the VF's address (so the
ledger's record of it survives a reboot that renumbers nothing).  Making the
device binds the VF to ``vfio-pci`` (``driver_override`` + ``bind``), unmaking
it gives the VF back to its own driver unless its VFIO group is held.  The
VF's network settings are the pool service's (``accel_agent.sriov.vfpool``),
per instance: they are not part of the device's identity.

The pools are not in the mdev snapshot (no discoverer): their inventory is
one provider per PF of a configured pool, which ``vfpool.VfPools.inventory``
builds, and the mdev policy, which walks mdev types, has nothing to say
about them.
"""

from __future__ import annotations

import uuid as uuid_mod
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.backends.base import DeviceBackend, DeviceRef, DeviceWriter
from accel_agent.sysfs.model import Parent

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.devices import DeviceDescription

BACKEND = "sriov_vf"
# A fixed namespace: device UUIDs must be the same in every process and release.
_NAMESPACE = uuid_mod.UUID("b6f3c1e2-2d7a-5c8e-9f41-0a3d5e7c9b21")


def device_uuid(vf: str) -> str:
    """The UUID of the device that VF ``vf`` (canonical address) is when handed over."""
    return str(uuid_mod.uuid5(_NAMESPACE, f"{BACKEND}:{vf}"))


class SriovVfBackend(DeviceBackend):
    name = BACKEND
    device_uuid_is_fixed = True

    def new_device_uuid(self, parent: Parent) -> str:
        return device_uuid(parent.name)

    def create(self, writer: DeviceWriter, parent: str, device_type: str, uuid: str) -> None:
        """Hand VF ``parent`` to vfio-pci; ``device_type`` is its pool's name."""
        if uuid != device_uuid(parent):
            raise exception.LedgerError(reason=f"device {uuid} is not the UUID of VF {parent}")
        writer.bind_vfio(parent)

    def destroy(self, writer: DeviceWriter, device: DeviceRef, timeout: float) -> None:
        # VfInUse (an MdevInUse) when its group is held: nothing done.
        writer.unbind_vfio(device.parent)

    def pci_address(self, device: DeviceRef) -> str | None:
        return device.parent

    def guest_device(self, device: DeviceRef) -> DeviceDescription:
        # The VF as plain PCI passthrough, managed='no': the agent put it on
        # vfio-pci already, and libvirt must not rebind it.  A network VF with
        # its MAC and VLAN (<interface type='hostdev'>) needs the settings the
        # device was prepared with, which the ledger does not keep: VfPools'
        # PreparedVf.interface_xml() gives that form.
        from accel_agent.libvirt_xml.devices import PciHostdev

        return PciHostdev(device.parent, managed=False)
