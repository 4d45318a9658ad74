"""VF pools at work: inventory, enabling VFs, and the device half of an
attach (os-acc's ``prepare`` / ``unprepare``) for one SR-IOV VF.

:class:`VfPools` decides nothing about owners: the caller (the manager, under
its lock and with its ledger) says which VFs are taken (``exclude``) and
records what :meth:`VfPools.prepare` returns before the next call.  A VF is
*free* when it is bound to its own driver (or none) with no
``driver_override``, and nobody excludes it; a VF on ``vfio-pci`` counts as
used whether or not the caller knows it (someone handed it over).

prepare: validate the settings (InvalidVfSetting, field named: nothing done),
pick a free VF, set its network settings on the PF's netdev on top of the
reset state (so nothing a previous tenant left survives), then hand it to
``vfio-pci``; a failed hand-over resets the settings again.  unprepare: take
the VF off vfio-pci (VfInUse while its VFIO group is held: nothing done, its
settings kept: a running guest's MAC must not change), reset its settings,
then give it back to its driver.  Both are idempotent.

Order with libvirt (``<interface type='hostdev' managed='no'>``,
docs/design.md §10.4): libvirt programs MAC and VLAN itself when the
domain starts, after saving the VF's current ones, and restores those on
destroy.  prepare runs before the domain starts, so what libvirt saves and
restores is the agent's; unprepare runs after the domain is gone, so the
agent's reset comes last and nothing fights it.  The XML should carry the
same MAC and VLAN as the request (:meth:`PreparedVf.interface_xml` does).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from accel_agent import exception
from accel_agent.backends.sriov_vf import PciWriter, device_uuid
from accel_agent.backends.sriov_vf import guest_device as sriov_guest_device
from accel_agent.sriov import vfconfig
from accel_agent.sriov.pools import Pool
from accel_agent.sysfs import address
from accel_agent.sysfs import sriov as sriov_sysfs
from accel_agent.sysfs.sriov import PfInfo, VfInfo

LOG = logging.getLogger(__name__)


class NetWriter(Protocol):
    """The rtnetlink half (:class:`PrivsepNet`, or in process for tests)."""

    def apply(
        self, pf_netdev: str, vf: int, settings: Mapping[str, Any], pf: str
    ) -> dict[str, dict[str, Any]]: ...

    def reset(self, pf_netdev: str, vf: int, pf: str) -> dict[str, dict[str, Any]]: ...


class PrivsepNet:
    """:class:`NetWriter` through the CAP_NET_ADMIN daemon, started on first use."""

    def apply(
        self, pf_netdev: str, vf: int, settings: Mapping[str, Any], pf: str
    ) -> dict[str, dict[str, Any]]:
        from accel_agent import privileged

        privileged.ensure_net_privsep()
        return privileged.apply_vf_settings(pf_netdev, vf, settings, pf=pf, clean=True)

    def reset(self, pf_netdev: str, vf: int, pf: str) -> dict[str, dict[str, Any]]:
        from accel_agent import privileged

        privileged.ensure_net_privsep()
        return privileged.reset_vf_settings(pf_netdev, vf, pf=pf)


class LocalNet:
    """:class:`NetWriter` in this process (it needs CAP_NET_ADMIN itself)."""

    def apply(
        self, pf_netdev: str, vf: int, settings: Mapping[str, Any], pf: str
    ) -> dict[str, dict[str, Any]]:
        from accel_agent import privileged

        return privileged.apply_local(pf_netdev, vf, settings, pf, clean=True)

    def reset(self, pf_netdev: str, vf: int, pf: str) -> dict[str, dict[str, Any]]:
        from accel_agent import privileged

        return privileged.reset_local(pf_netdev, vf, pf)


@dataclass(frozen=True, slots=True)
class PreparedVf:
    """One VF handed to an instance: the attach handle's device half."""

    pool: str
    pf: str
    pf_netdev: str | None
    vf: str
    vf_index: int
    uuid: str  # the sriov_vf backend's device UUID for the ledger
    settings: Mapping[str, Any] = field(default_factory=dict)  # as asked, validated
    state: Mapping[str, Any] = field(default_factory=dict)  # as read back

    def interface_xml(self) -> str:
        """The guest's element for this VF (``sriov_vf.guest_device``)."""
        from accel_agent.libvirt_xml.devices import device_xml

        return device_xml(sriov_guest_device(self.vf, self.settings))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "pf": self.pf,
            "pf_netdev": self.pf_netdev,
            "vf": self.vf,
            "vf_index": self.vf_index,
            "uuid": self.uuid,
            "backend": "sriov_vf",
            "settings": dict(self.settings),
            "state": dict(self.state),
            "xml": self.interface_xml(),
        }


class VfPools:
    """The configured pools of one host (see the module docstring)."""

    def __init__(
        self,
        sysfs_root: str,
        pools: Mapping[str, Pool],
        pci: PciWriter,
        net: NetWriter,
        host: str = "",
    ) -> None:
        self.sysfs_root = sysfs_root
        self.pools = pools
        self.pci = pci
        self.net = net
        self.host = host

    # --- reads ---------------------------------------------------------------------

    def pool(self, name: str) -> Pool:
        found = self.pools.get(name)
        if found is None:
            raise exception.UnknownVfPool(pool=name, enabled=", ".join(self.pools) or "none")
        return found

    def scan(self) -> dict[str, PfInfo | str]:
        """Every configured PF: its PfInfo, or why it is not usable."""
        found: dict[str, PfInfo | str] = {}
        for pool in self.pools.values():
            for pf in pool.device_addresses:
                try:
                    found[pf] = sriov_sysfs.read_pf(self.sysfs_root, pf)
                except sriov_sysfs.NotAPf as why:
                    found[pf] = str(why)
        return found

    def inventory(self) -> list[dict[str, Any]]:
        """One provider per usable PF, Nova's naming (``<host>_pci_0000_3b_00_0``):
        total = its VFs now, used = those on vfio-pci."""
        providers = []
        scanned = self.scan()
        for pool in self.pools.values():
            for pf in pool.device_addresses:
                info = scanned[pf]
                if isinstance(info, str) or not info.vfs:
                    continue
                total = len(info.vfs)
                providers.append(
                    {
                        "name": f"{self.host}_{address.provider_suffix(pf)}",
                        "parent_provider": self.host,
                        "pci_address": pf,
                        "pool": pool.name,
                        "backend": "sriov_vf",
                        "resource_class": pool.resource_class,
                        "traits": sorted(pool.traits),
                        "inventory": {
                            "total": total,
                            "reserved": 0,
                            "min_unit": 1,
                            "max_unit": total,
                            "step_size": 1,
                            "allocation_ratio": 1.0,
                        },
                        "used": sum(1 for v in info.vfs if v.handed_over),
                    }
                )
        return sorted(providers, key=lambda p: p["name"])

    def _usable_pfs(self) -> Iterator[tuple[Pool, PfInfo]]:
        """Each configured PF that is an SR-IOV PF now, with its pool."""
        for pool in self.pools.values():
            for pf in pool.device_addresses:
                try:
                    yield pool, sriov_sysfs.read_pf(self.sysfs_root, pf)
                except sriov_sysfs.NotAPf:
                    continue

    def members(self) -> dict[str, tuple[str, bool]]:
        """Every VF of a configured pool now: {address: (pool, on vfio-pci)}."""
        return {
            vf.address: (pool.name, vf.handed_over)
            for pool, info in self._usable_pfs()
            for vf in info.vfs
        }

    def locate(self, vf: str) -> tuple[Pool, PfInfo, VfInfo]:
        """The pool, PF and VF of VF address ``vf`` (VfNotInPool otherwise)."""
        try:
            vf = address.parse_pci_address(vf)
        except exception.InvalidPciAddress:
            raise exception.VfNotInPool(vf=vf, reason="not a PCI address") from None
        for pool, info in self._usable_pfs():
            found = info.vf(vf)
            if found is not None:
                return pool, info, found
        raise exception.VfNotInPool(vf=vf, reason=f"pools: {', '.join(self.pools) or 'none'}")

    def free_vfs(self, pool: str, exclude: Collection[str] = ()) -> list[tuple[PfInfo, VfInfo]]:
        """The pool's free VFs, PFs in configured order, VFs by index."""
        out = []
        for pf in self.pool(pool).device_addresses:
            try:
                info = sriov_sysfs.read_pf(self.sysfs_root, pf)
            except sriov_sysfs.NotAPf:
                continue
            for vf in info.vfs:
                if vf.address not in exclude and not vf.handed_over and vf.driver_override is None:
                    out.append((info, vf))
        return out

    # --- writes --------------------------------------------------------------------

    def ensure_num_vfs(self, pool: str | None = None) -> dict[str, tuple[int, int]]:
        """Write ``sriov_numvfs`` of every PF whose pool says ``num_vfs`` and
        differs; {pf: (before, after)} of those written.  VfsHandedOver when a
        PF's VFs are on vfio-pci (nothing written on that PF)."""
        changed = {}
        for each in [self.pool(pool)] if pool else list(self.pools.values()):
            if each.num_vfs is None:
                continue
            for pf in each.device_addresses:
                try:
                    info = sriov_sysfs.read_pf(self.sysfs_root, pf)
                except sriov_sysfs.NotAPf as why:
                    raise exception.NotSriovPf(address=pf, reason=str(why)) from None
                if info.num_vfs == each.num_vfs:
                    continue
                if each.num_vfs > info.total_vfs:
                    raise exception.SriovNumVfsRefused(
                        pf=pf,
                        count=each.num_vfs,
                        errno="ERANGE",
                        error=f"sriov_totalvfs is {info.total_vfs}",
                    )
                before = self.pci.set_num_vfs(pf, each.num_vfs)
                LOG.info("PF %s: %d VF(s) enabled (was %d)", pf, each.num_vfs, before)
                changed[pf] = (before, each.num_vfs)
        return changed

    def prepare(
        self,
        pool: str,
        settings: Mapping[str, Any] | None = None,
        *,
        exclude: Collection[str] = (),
        vf: str | None = None,
    ) -> PreparedVf:
        """Give one free VF of ``pool`` (or VF ``vf`` of it: a retry, or
        recovery of a recorded one) the network ``settings`` and hand it to
        vfio-pci.  Raises InvalidVfSetting / UnknownVfPool before anything is
        done, NoFreeVf, PfNetdevNotFound, VfSettingRefused (rolled back) and
        friends from the netlink half, PciRebindFailed (settings reset)."""
        wanted = vfconfig.validate_settings(settings or {})
        self.pool(pool)  # UnknownVfPool before anything is done
        if vf is not None:
            where, pf_info, vf_info = self.locate(vf)
            if where.name != pool:
                raise exception.VfNotInPool(vf=vf, reason=f"it is in pool {where.name}")
        else:
            free = self.free_vfs(pool, exclude)
            if not free:
                raise exception.NoFreeVf(pool=pool, reason=self.usage(pool))
            pf_info, vf_info = free[0]
        state: dict[str, Any] = {}
        netdev = pf_info.netdev
        if wanted.to_dict() or netdev is not None:
            # Always through the PF when it has a netdev: a clean apply resets
            # what a previous tenant left even when nothing is asked.
            if netdev is None:
                raise exception.PfNetdevNotFound(
                    pf=pf_info.address, reason=f"its driver ({pf_info.driver}) registered none"
                )
            state = self.net.apply(netdev, vf_info.index, wanted.to_dict(), pf_info.address)[
                "after"
            ]
        try:
            self.pci.bind_vfio(vf_info.address)
        except Exception:
            if netdev is not None:
                self._reset_quietly(netdev, vf_info.index, pf_info.address)
            raise
        LOG.info(
            "VF %s (PF %s VF %d) of pool %s prepared",
            vf_info.address,
            pf_info.address,
            vf_info.index,
            pool,
        )
        return PreparedVf(
            pool=pool,
            pf=pf_info.address,
            pf_netdev=netdev,
            vf=vf_info.address,
            vf_index=vf_info.index,
            uuid=device_uuid(vf_info.address),
            settings=wanted.to_dict(),
            state=state,
        )

    def unprepare(self, vf: str) -> None:
        """Take VF ``vf`` off vfio-pci, reset its settings, give it back to its
        driver (idempotent).  VfInUse while its VFIO group is held: nothing
        done.  The reset comes before the give-back: igbvf would otherwise
        start on the tenant's MAC, trust and spoofchk (it reads them at probe)."""
        _, pf_info, vf_info = self.locate(vf)
        self.pci.unbind_vfio(vf_info.address, give_back=False)
        if pf_info.netdev is not None:
            self.net.reset(pf_info.netdev, vf_info.index, pf_info.address)
        driver = self.pci.unbind_vfio(vf_info.address)
        LOG.info(
            "VF %s (PF %s VF %d) unprepared, on %s",
            vf_info.address,
            pf_info.address,
            vf_info.index,
            driver or "no driver",
        )

    def _reset_quietly(self, netdev: str, index: int, pf: str) -> None:
        failure: exception.AccelAgentException | None = None
        try:
            self.net.reset(netdev, index, pf)
        except exception.AccelAgentException as err:
            failure = err
        if failure is not None:  # outside the except clause: oslo.log would repeat it
            LOG.error("PF %s VF %d: reset after a failed hand-over failed: %s", pf, index, failure)

    def usage(self, pool: str) -> str:
        """Each PF of ``pool``: its VFs and how many are handed over (for the
        NoFreeVf message)."""
        counts = []
        for pf in self.pool(pool).device_addresses:
            try:
                info = sriov_sysfs.read_pf(self.sysfs_root, pf)
            except sriov_sysfs.NotAPf as why:
                counts.append(str(why))
                continue
            used = sum(1 for v in info.vfs if v.handed_over)
            counts.append(f"{pf}: {len(info.vfs)} VF(s), {used} on vfio-pci")
        return "; ".join(counts)
