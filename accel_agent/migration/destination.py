"""Destination side of a live migration with mdevs and vGPU VFs (docs/design.md §7.3, §10).

``claim`` checks this host's versions (and the source's, when the source
sends them), checks that every source type is offered here, then holds one
device per source device of the same type as an expiring, persisted claim and
answers ``{source uuid: destination uuid}``; whichever backend serves the type
makes the device (an mdev, or a VF typed with the same vGPU type id).
:meth:`MigrationDestination.pci_addresses` adds, for the devices a guest is
given by PCI address, the destination VF the source must rewrite its own to.
``commit`` turns the claim into the instance's allocation once the migration
landed; ``abort`` frees it (or removes its devices); claims nobody commits or
aborts expire (the periodic task frees them).
Unlike Nova, whose claims live in memory, a destination restart keeps them.

An instance with NVIDIA vGPUs (devices of the ``nvidia_vfio`` backend's
types here) is claimed only when the source's NVIDIA vGPU manager version,
as the source sent it, equals this host's (migration/versions.py says why
and where each version comes from); instances without them never ask.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from accel_agent import exception
from accel_agent.devices.ledger import OwnerKind
from accel_agent.devices.manager import DeviceManager
from accel_agent.devices.results import Allocation
from accel_agent.migration import versions as versions_mod
from accel_agent.sysfs import nvidia_vfio
from accel_agent.sysfs.model import HostSnapshot
from accel_agent.sysfs.scanner import is_canonical_uuid

_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_MDEVS = 64


def normalise_sources(sources: Any) -> dict[str, str]:
    """``{src uuid: type}`` from a caller: UUIDs lower-cased and checked."""
    if not isinstance(sources, Mapping) or not sources:
        raise exception.InvalidMigrationRequest(
            reason="mdevs must be a non-empty object {source uuid: mdev type}"
        )
    if len(sources) > MAX_MDEVS:
        raise exception.InvalidMigrationRequest(reason=f"more than {MAX_MDEVS} mdevs")
    normalised: dict[str, str] = {}
    for uuid, mdev_type in sources.items():
        key = uuid.lower() if isinstance(uuid, str) else uuid
        if not isinstance(key, str) or not is_canonical_uuid(key):
            raise exception.InvalidMdevUUID(uuid=uuid, where=" in mdevs", reason="not a UUID")
        if not isinstance(mdev_type, str) or not _TYPE_RE.match(mdev_type):
            raise exception.InvalidMigrationRequest(
                reason=f"mdev type {mdev_type!r} of {key} is not a type id"
            )
        if key in normalised:
            raise exception.InvalidMigrationRequest(reason=f"{key} is given twice")
        normalised[key] = mdev_type
    return normalised


def vgpu_types(snapshot: HostSnapshot) -> set[str]:
    """The types this host makes as NVIDIA vGPUs (typed vGPU 17+ VFs): those
    whose migration needs equal vGPU manager versions."""
    return {
        device_type
        for parent in snapshot.parents.values()
        if parent.backend == nvidia_vfio.BACKEND
        for device_type in parent.types
    }


class MigrationDestination:
    def __init__(
        self,
        manager: DeviceManager,
        host_versions: Callable[[], versions_mod.HostVersions],
        minimums: versions_mod.Minimums | None = None,
        claim_timeout: float = 600.0,
        clock: Callable[[], float] = time.time,
        vgpu_manager_version: Callable[[], str | None] | None = None,
    ) -> None:
        self.manager = manager
        self.host_versions = host_versions
        self.minimums = minimums or versions_mod.Minimums()
        self.claim_timeout = claim_timeout
        self.clock = clock
        # This host's NVIDIA vGPU manager version, asked only for an instance
        # with vGPUs: by default its NVML (or /proc) for the manager's sysfs root.
        self.vgpu_manager_version = vgpu_manager_version or (
            lambda: versions_mod.host_vgpu_manager_version(manager.sysfs_root)
        )

    @classmethod
    def from_conf(cls, conf: Any, manager: DeviceManager) -> MigrationDestination:
        """This host as a destination: versions asked of ``[libvirt] uri``,
        floors and claim lifetime from ``[migration]``."""
        uri = conf.libvirt.uri

        def host_versions() -> versions_mod.HostVersions:
            if not uri:
                raise exception.MigrationNotPossible(
                    reason="[libvirt] uri is empty: this host cannot check its libvirt and "
                    "QEMU versions, so it cannot accept a migration"
                )
            return versions_mod.probe_uri(uri)

        return cls(
            manager,
            host_versions,
            versions_mod.Minimums.from_conf(conf),
            claim_timeout=conf.migration.claim_timeout,
            vgpu_manager_version=lambda: versions_mod.host_vgpu_manager_version(
                manager.sysfs_root, conf
            ),
        )

    def claim(
        self,
        instance: str,
        sources: Mapping[str, str],
        source_versions: Mapping[str, Any] | None = None,
    ) -> dict[str, str]:
        wanted = normalise_sources(sources)
        source = None
        if source_versions is not None:
            source = versions_mod.HostVersions.from_dict(source_versions)
            versions_mod.check(source, "source", self.minimums)
        versions_mod.check(self.host_versions(), "destination", self.minimums)
        snapshot = self.manager.scan()
        offered = {p.device_type for p in self.manager.inventory(snapshot).providers}
        missing = sorted(set(wanted.values()) - offered)
        if missing:
            raise exception.MigrationTypesUnsupported(
                types=", ".join(missing), supported=", ".join(sorted(offered)) or "none"
            )
        vgpus = sorted(set(wanted.values()) & vgpu_types(snapshot))
        if vgpus:
            versions_mod.check_vgpu_manager(
                source.nvidia_vgpu_manager if source is not None else None,
                self.vgpu_manager_version(),
                ", ".join(vgpus),
            )
        return self.manager.claim(instance, wanted, self.clock() + self.claim_timeout)

    def commit(self, instance: str) -> Allocation:
        return self.manager.commit_claim(instance)

    def abort(self, instance: str, remove: bool = False) -> list[str]:
        return self.manager.abort_claim(instance, remove=remove)

    def pci_addresses(self, instance: str) -> dict[str, str]:
        """``{source uuid: destination PCI address}`` of the devices claimed for
        ``instance`` that a guest is given by address (vGPU VFs): the source
        rewrites its VF's ``<source><address>`` to it.  Empty for mdevs only."""
        records = self.manager.ledger.by_owner(instance, OwnerKind.CLAIM)
        addresses = {}
        for record in records:
            address = self.manager.pci_address(record)
            if address is not None and record.source_uuid is not None:
                addresses[record.source_uuid] = address
        return addresses

    def claims(self, instance: str) -> dict[str, Any]:
        records = self.manager.ledger.by_owner(instance, OwnerKind.CLAIM)
        if not records:
            raise exception.MigrationClaimNotFound(instance=instance)
        return {
            "instance": instance,
            "mapping": {r.source_uuid: r.uuid for r in records},
            "pci_addresses": self.pci_addresses(instance),
            "expires_at": min(r.claim_expires_at or 0 for r in records),
        }
