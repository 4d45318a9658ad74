"""Source side of a live migration with mdevs (DESIGN.md §7, nova.md §8).

``prepare`` lists the domain's mdevs with their types (what the destination
must claim) after checking this host's versions.  ``migrate`` rewrites the
migratable XML with the destination's UUIDs, hands it to libvirt as
``VIR_MIGRATE_PARAM_DEST_XML`` and releases the source mdevs only once
libvirt reports success.  Post-copy is refused up front: QEMU rejects it
with VFIO devices, but only after the migration has started.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from accel_agent import exception
from accel_agent.libvirt_xml import list_mdev_uuids, rewrite_mdev_uuids
from accel_agent.mdev.manager import MdevManager
from accel_agent.migration import versions as versions_mod

LOG = logging.getLogger(__name__)


def _libvirt() -> Any:
    import libvirt  # imported here: the CLI never pays for it

    return libvirt


class MigrationSource:
    def __init__(
        self,
        manager: MdevManager,
        minimums: versions_mod.Minimums | None = None,
        host_versions: Callable[[Any], versions_mod.HostVersions] = versions_mod.probe,
    ) -> None:
        self.manager = manager
        self.minimums = minimums or versions_mod.Minimums()
        self.host_versions = host_versions

    def _migratable_xml(self, domain: Any) -> str:
        return domain.XMLDesc(_libvirt().VIR_DOMAIN_XML_MIGRATABLE)

    def prepare(self, domain: Any) -> dict[str, str]:
        """``{uuid: mdev type}`` of the domain's mdevs, for the destination's claim."""
        versions_mod.check(self.host_versions(domain.connect()), "source", self.minimums)
        uuids = list_mdev_uuids(self._migratable_xml(domain))
        snapshot = self.manager.scan()
        missing = [u for u in uuids if u not in snapshot.mdevs]
        if missing:
            # Nova silently drops these; a migration without them would lose a device.
            raise exception.MdevNotFound(uuid=", ".join(missing))
        return {u: snapshot.mdevs[u].mdev_type or "" for u in uuids}

    def migrate(
        self,
        domain: Any,
        dest_uri: str,
        mapping: Mapping[str, str],
        flags: int = 0,
        params: Mapping[str, Any] | None = None,
        instance: str | None = None,
    ) -> list[str]:
        """Migrate with the destination's mdev UUIDs; returns the released source UUIDs."""
        libvirt = _libvirt()
        xml = self._migratable_xml(domain)
        uuids = list_mdev_uuids(xml)
        post_copy = libvirt.VIR_MIGRATE_POSTCOPY | getattr(
            libvirt, "VIR_MIGRATE_POSTCOPY_RESUME", 0
        )
        if uuids and flags & post_copy:
            raise exception.MigrationPostCopyRefused(uuids=", ".join(uuids))
        result = rewrite_mdev_uuids(xml, dict(mapping))
        if result.unused_keys:
            LOG.warning("mapping keys not in the domain: %s", ", ".join(result.unused_keys))
        migrate_params = dict(params or {})
        migrate_params[libvirt.VIR_MIGRATE_PARAM_DEST_XML] = result.xml
        LOG.info(
            "migrating %s to %s with mdevs %s",
            domain.name(),
            dest_uri,
            ", ".join(f"{s}->{d}" for s, d in result.replaced),
        )
        domain.migrateToURI3(dest_uri, migrate_params, flags)
        # Only now: a failed migration leaves the guest running here, on these mdevs.
        owner = instance or domain.UUIDString()
        released = self.manager.release(owner)
        LOG.info("migration of %s done; released source mdevs %s", owner, released)
        return released
