"""Which mdevs do libvirt domains reference?  Asked before any remove.

``remove`` on an mdev that a VM holds blocks the writer until QEMU lets go
(docs/design.md §4.4), and removing one that a stopped
domain references breaks that domain's next start.  So the manager asks
libvirt (every domain, running or not) before it removes anything.

A takeover from Nova (``accelctl adopt --from-libvirt``) asks the same
question the other way round: which domain uses which mdev
(:meth:`LibvirtDomains.mdev_domains`).

Each question has a deadline (``[libvirt] call_timeout``): a libvirt that
does not answer is "unknown" to the remove's check (the VFIO in-use probe
still guards) and refuses a takeover (devices/libvirt_calls.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from accel_agent import exception
from accel_agent.devices import libvirt_calls

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
    """The domains at ``uri``, each question asked through the URI's channel
    (devices/libvirt_calls.py): one deadline, ``timeout`` (``[libvirt]
    call_timeout``), for the whole question."""

    def __init__(self, uri: str, timeout: float | None = None) -> None:
        self.uri = uri
        self.channel = libvirt_calls.channel_for(uri, timeout)

    def referenced_uuids(self) -> set[str] | None:
        from accel_agent.libvirt_xml import list_mdev_uuids

        def run(libvirt: Any, conn: Any) -> set[str]:
            uuids: set[str] = set()
            for domain in conn.listAllDomains(0):
                # Inactive XML too: a stopped domain still owns its mdevs.
                uuids.update(list_mdev_uuids(domain.XMLDesc(0)))
                if domain.isActive():
                    uuids.update(list_mdev_uuids(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)))
            return uuids

        try:
            return self.channel.call("listing the domains' mdevs", run)
        except libvirt_calls.Unreachable as exc:
            failure: str = f"libvirt at {self.uri} is not reachable ({exc})"
        except exception.LibvirtStalled as exc:
            failure = exc.message
        except Exception as exc:  # libvirt's own error (libvirtError), whatever its module
            failure = f"listing libvirt domains at {self.uri} failed: {exc}"
        # Outside the except clause: oslo.log would append the exception again.
        LOG.warning("%s; domain check skipped", failure)
        return None

    def mdev_domains(self) -> list[DomainMdevs]:
        """Every domain (running or not) whose XML names mdevs, by domain UUID.

        Unlike :meth:`referenced_uuids`, which degrades to "unknown", a takeover
        must see every domain or do nothing: any failure raises
        LibvirtUnavailable (LibvirtStalled when libvirt does not answer)."""
        from accel_agent.libvirt_xml import list_mdev_uuids

        def run(libvirt: Any, conn: Any) -> list[DomainMdevs]:
            found = []
            try:
                for domain in conn.listAllDomains(0):
                    uuids = list(list_mdev_uuids(domain.XMLDesc(0)))
                    if domain.isActive():
                        uuids += list_mdev_uuids(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
                    unique = tuple(dict.fromkeys(u.lower() for u in uuids))
                    if unique:
                        found.append(DomainMdevs(domain.UUIDString(), domain.name(), unique))
            except libvirt.libvirtError as exc:
                raise exception.LibvirtUnavailable(uri=self.uri, reason=str(exc)) from None
            return sorted(found, key=lambda d: d.uuid)

        try:
            return self.channel.call("listing the domains' mdevs", run)
        except libvirt_calls.Unreachable as exc:
            failure = exc
        raise exception.LibvirtUnavailable(uri=self.uri, reason=str(failure))


def for_conf(conf: Any) -> DomainReferences:
    """The domains ``[libvirt]`` names: its ``uri`` (empty: :class:`NoDomains`),
    each call within its ``call_timeout``."""
    uri = conf.libvirt.uri
    return LibvirtDomains(uri, conf.libvirt.call_timeout) if uri else NoDomains()
