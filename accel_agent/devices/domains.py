"""Which mdevs do libvirt domains reference?  Asked before any remove.

``remove`` on an mdev that a VM holds blocks the writer until QEMU lets go
(research/sysfs-mdevctl-kubevirt.md §1.5), and removing one that a stopped
domain references breaks that domain's next start.  So the manager asks
libvirt (every domain, running or not) before it removes anything.

A takeover from Nova (``accelctl adopt --from-libvirt``) asks the same
question the other way round: which domain uses which mdev
(:meth:`LibvirtDomains.mdev_domains`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from accel_agent import exception

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class DomainMdevs:
    """One libvirt domain and the mdevs its XML names (live and inactive)."""

    uuid: str  # the domain's UUID: Nova's instance UUID
    name: str
    mdevs: tuple[str, ...]


class DomainReferences(Protocol):
    def referenced_uuids(self) -> set[str] | None:
        """mdev UUIDs referenced by any domain; None when that cannot be known."""

    def mdev_domains(self) -> list[DomainMdevs]:
        """Every domain with mdevs; raises LibvirtUnavailable when it cannot be known."""


class NoDomains:
    """For hosts without libvirt (and the simulator demo)."""

    uri = ""

    def referenced_uuids(self) -> set[str] | None:
        return set()

    def mdev_domains(self) -> list[DomainMdevs]:
        # Not "unavailable" (503, retry later): nothing will change until the config does.
        raise exception.TakeoverRefused(
            reason="[libvirt] uri is empty, so there are no domains to take over"
        )


class LibvirtDomains:
    def __init__(self, uri: str) -> None:
        self.uri = uri

    def referenced_uuids(self) -> set[str] | None:
        try:
            import libvirt  # imported here: only removes need it
        except ImportError:
            LOG.warning("libvirt-python is not installed; cannot check domains")
            return None
        try:
            conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            failure = exc
        else:
            return self._referenced(libvirt, conn)
        # Outside the except clause: oslo.log would append the exception again.
        LOG.warning("libvirt at %s is not reachable (%s); domain check skipped", self.uri, failure)
        return None

    def _referenced(self, libvirt: Any, conn: Any) -> set[str] | None:
        from accel_agent.libvirt_xml import list_mdev_uuids

        try:
            uuids: set[str] = set()
            for domain in conn.listAllDomains(0):
                # Inactive XML too: a stopped domain still owns its mdevs.
                uuids.update(list_mdev_uuids(domain.XMLDesc(0)))
                if domain.isActive():
                    uuids.update(list_mdev_uuids(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)))
            return uuids
        except libvirt.libvirtError as exc:
            failure = exc
        finally:
            conn.close()
        LOG.warning("listing libvirt domains at %s failed: %s", self.uri, failure)
        return None

    def mdev_domains(self) -> list[DomainMdevs]:
        """Every domain (running or not) whose XML names mdevs, by domain UUID.

        Unlike :meth:`referenced_uuids`, which degrades to "unknown", a takeover
        must see every domain or do nothing: any failure raises
        LibvirtUnavailable."""
        try:
            import libvirt
        except ImportError:
            raise exception.LibvirtUnavailable(
                uri=self.uri, reason="libvirt-python is not installed"
            ) from None
        from accel_agent.libvirt_xml import list_mdev_uuids

        try:
            conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            raise exception.LibvirtUnavailable(uri=self.uri, reason=str(exc)) from None
        try:
            found = []
            for domain in conn.listAllDomains(0):
                uuids = list(list_mdev_uuids(domain.XMLDesc(0)))
                if domain.isActive():
                    uuids += list_mdev_uuids(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
                unique = tuple(dict.fromkeys(u.lower() for u in uuids))
                if unique:
                    found.append(DomainMdevs(domain.UUIDString(), domain.name(), unique))
            return sorted(found, key=lambda d: d.uuid)
        except libvirt.libvirtError as exc:
            raise exception.LibvirtUnavailable(uri=self.uri, reason=str(exc)) from None
        finally:
            conn.close()
