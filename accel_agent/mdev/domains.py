"""Which mdevs do libvirt domains reference?  Asked before any remove.

``remove`` on an mdev that a VM holds blocks the writer until QEMU lets go
(research/sysfs-mdevctl-kubevirt.md §1.5), and removing one that a stopped
domain references breaks that domain's next start.  So the manager asks
libvirt (every domain, running or not) before it removes anything.
"""

from __future__ import annotations

import logging
from typing import Protocol

LOG = logging.getLogger(__name__)


class DomainReferences(Protocol):
    def referenced_uuids(self) -> set[str] | None:
        """mdev UUIDs referenced by any domain; None when that cannot be known."""


class NoDomains:
    """For hosts without libvirt (and the simulator demo)."""

    def referenced_uuids(self) -> set[str] | None:
        return set()


class LibvirtDomains:
    def __init__(self, uri: str) -> None:
        self.uri = uri

    def referenced_uuids(self) -> set[str] | None:
        try:
            import libvirt  # imported here: only removes need it
        except ImportError:
            LOG.warning("libvirt-python is not installed; cannot check domains")
            return None
        from accel_agent.libvirt_xml import list_mdev_uuids

        try:
            conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            LOG.warning("libvirt at %s is not reachable (%s); domain check skipped", self.uri, exc)
            return None
        try:
            uuids: set[str] = set()
            for domain in conn.listAllDomains(0):
                # Inactive XML too: a stopped domain still owns its mdevs.
                uuids.update(list_mdev_uuids(domain.XMLDesc(0)))
                if domain.isActive():
                    uuids.update(list_mdev_uuids(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)))
            return uuids
        except libvirt.libvirtError as exc:
            LOG.warning("listing libvirt domains at %s failed: %s", self.uri, exc)
            return None
        finally:
            conn.close()
