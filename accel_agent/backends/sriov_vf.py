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
about them.  The backend owns its options (``[devices] enabled_vf_pools``,
``[vf_pool_<name>]``: ``accel_agent.sriov.opts``, named by :attr:`opts`) and
builds its pool service from them (:meth:`SriovVfBackend.from_conf`): it
picks free VFs, says which VFs exist and which are handed over (for
recovery), and makes and unmakes a device through the pool service, which
sets a VF's network settings before the hand-over and resets them on the way
back.  Without pools (a listing, a host with none configured) it can still
give a recorded VF back to its driver.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from accel_agent import exception
from accel_agent.backends.base import (
    DeviceBackend,
    DeviceRef,
    check_fixed_uuid,
    vfs_in_use,
)
from accel_agent.sysfs.model import Parent

if TYPE_CHECKING:
    from oslo_config import cfg

    from accel_agent.devices.inventory import Provider
    from accel_agent.libvirt_xml.devices import DeviceDescription
    from accel_agent.sriov.pools import Pool
    from accel_agent.sriov.vfpool import VfPools

BACKEND = "sriov_vf"
# A fixed namespace: device UUIDs must be the same in every process and release.
_NAMESPACE = "b6f3c1e2-2d7a-5c8e-9f41-0a3d5e7c9b21"


def device_uuid(vf: str) -> str:
    """The UUID of the device that VF ``vf`` (canonical address) is when handed over."""
    # Imported here: uuid brings platform (~4 ms) into every listing.
    import uuid

    return str(uuid.uuid5(uuid.UUID(_NAMESPACE), f"{BACKEND}:{vf}"))


class PciWriter(Protocol):
    """The writes of the sriov_vf backend and its pool service
    (``privileged/pci.py``); a VF's network settings are the pool service's
    other writer (``vfpool.NetWriter``, ``privileged/net.py``)."""

    def set_num_vfs(self, pf: str, count: int) -> int: ...

    def bind_vfio(self, vf: str) -> None: ...

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None: ...


class SriovVfBackend(DeviceBackend[PciWriter]):
    name = BACKEND
    kind = "pool VF"
    device_uuid_is_fixed = True
    outside_snapshot = True
    unmade_on_release = True
    opts = "accel_agent.sriov.opts"

    def __init__(self, pools: VfPools | None = None) -> None:
        self.pools = pools

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts, writer: Any, net: Any = None) -> SriovVfBackend:
        """With the host's pool service when ``[devices] enabled_vf_pools``
        names any (InvalidVfPoolConfig for a bad one): PCI writes through
        ``writer``, network settings through ``net`` (the CAP_NET_ADMIN
        privsep helper, started on first use, when None)."""
        from accel_agent.sriov.pools import build_pools

        pools = build_pools(conf)  # InvalidVfPoolConfig
        if not pools:
            return cls()
        from accel_agent.sriov.vfpool import PrivsepNet, VfPools

        return cls(VfPools(
            conf.sysfs_root, pools, pci=writer, net=net or PrivsepNet(), host=conf.host
        ))

    def served_pools(self) -> Mapping[str, Pool]:
        return self.pools.pools if self.pools is not None else {}

    def new_device_uuid(self, parent: Parent) -> str:
        return device_uuid(parent.name)

    def device_uuid_of(self, parent: str) -> str:
        return device_uuid(parent)

    def pick(self, pool: str, where: str | None, exclude: Collection[str]) -> str:
        if self.pools is None:
            raise exception.UnknownVfPool(pool=pool, enabled="none")
        free = [
            vf.address
            for pf, vf in self.pools.free_vfs(pool, exclude=exclude)
            if where is None or pf.address == where
        ]
        if not free:
            raise exception.NoFreeVf(pool=pool, reason=self.pools.usage(pool))
        return free[0]

    def outside_devices(self) -> Mapping[str, tuple[str, bool]]:
        if self.pools is None:
            return {}
        return self.pools.members()

    def providers(self, host: str) -> list[Provider]:
        """One provider per PF with VFs, Nova's naming, the pool's resource
        class and traits (plus the agent's owner trait)."""
        if self.pools is None:
            return []
        from accel_agent.devices.inventory import OWNER_TRAIT, Provider

        return [
            Provider(
                name=p["name"],
                parent_provider=host,
                parent_device=p["pci_address"],
                parent_devices=(p["pci_address"],),
                pci_address=p["pci_address"],
                physical_gpu=p["pci_address"],
                numa_node=None,
                device_type=p["pool"],
                resource_class=p["resource_class"],
                total=p["inventory"]["total"],
                used=p["used"],
                traits=tuple(sorted({*p["traits"], OWNER_TRAIT})),
            )
            for p in self.pools.inventory()
        ]

    def prepare_host(self) -> None:
        if self.pools is not None:
            self.pools.ensure_num_vfs()

    def make(
        self,
        writer: PciWriter,
        parent: str,
        device_type: str,
        uuid: str,
        settings: Mapping[str, Any] | None,
    ) -> None:
        if self.pools is None:
            self.create(writer, parent, device_type, uuid)
            return
        check_fixed_uuid(self.kind, parent, uuid, device_uuid(parent))
        # Settings first, then the hand-over (vfpool's docstring says why).
        self.pools.prepare(device_type, settings or {}, vf=parent)

    def create(self, writer: PciWriter, parent: str, device_type: str, uuid: str) -> None:
        """Hand VF ``parent`` to vfio-pci; ``device_type`` is its pool's name."""
        check_fixed_uuid(self.kind, parent, uuid, device_uuid(parent))
        writer.bind_vfio(parent)

    def destroy(self, writer: PciWriter, device: DeviceRef, timeout: float) -> None:
        # VfInUse (a DeviceInUse) when its group is held: nothing done.  Through
        # the pool service when there is one: the settings are reset too, and
        # whatever step a prepare reached is undone (idempotent).
        if self.pools is not None:
            try:
                self.pools.unprepare(device.parent)
                return
            except exception.VfNotInPool:
                pass  # its pool left the config: still given back below
        try:
            writer.unbind_vfio(device.parent)
        except exception.PciDeviceNotFound:
            raise exception.MdevNotFound(uuid=device.uuid) from None  # the VF is gone

    def in_use(self, devices: Sequence[DeviceRef], reason: str) -> exception.VfInUse:
        return vfs_in_use(self.kind, devices, reason)

    def handle(self, device: DeviceRef) -> dict[str, Any]:
        return {"pool": device.device_type, "settings": dict(device.settings or {})}

    def pci_address(self, device: DeviceRef) -> str | None:
        return device.parent

    def guest_device(self, device: DeviceRef) -> DeviceDescription:
        return guest_device(device.parent, device.settings or {})


def guest_device(vf: str, settings: Mapping[str, Any]) -> DeviceDescription:
    """What a guest is given for VF ``vf`` prepared with ``settings``, always
    managed='no' (the agent put it on vfio-pci; libvirt must not rebind it): a
    network VF with a MAC as ``<interface type='hostdev'>``, whose MAC and VLAN
    libvirt programs again when the domain starts (the same ones: the
    ledger keeps them), any other VF as a plain PCI ``<hostdev>``."""
    from accel_agent.libvirt_xml.devices import NetworkVf, PciHostdev

    if settings.get("mac"):
        return NetworkVf(vf, settings["mac"], vlan=settings.get("vlan"))
    return PciHostdev(vf, managed=False)
