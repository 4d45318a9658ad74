"""Source side of a live migration with mdevs (DESIGN.md §7, nova.md §8).

``prepare`` lists the domain's mdevs with their types (what the destination
must claim) after checking this host's versions.  ``migrate`` rewrites the
migratable XML with the destination's UUIDs and hands it to libvirt as
``VIR_MIGRATE_PARAM_DEST_XML``, and, for ``VIR_MIGRATE_PERSIST_DEST``, the
rewritten persistent XML as ``VIR_MIGRATE_PARAM_PERSIST_XML`` (without it
libvirt defines the domain on the destination with the *source's* mdev UUIDs:
seen with libvirt 11.3 in the real-kernel lab; Nova passes both too).  It
releases the source mdevs only once libvirt reports success and the source
domain is no longer active (libvirt has stopped its QEMU, which held the
mdevs' VFIO groups).  A failure raises MigrationFailed naming the side and
libvirt's message, and releases nothing: the guest still runs here, on these
mdevs.  Post-copy is refused up front: QEMU rejects it with VFIO devices, but
only after the migration has started.

The source agent is either the manager in this process or the daemon's API
(:class:`AgentApi`): an orchestrator beside a running daemon (a compute
service, the real-kernel lab) goes through the API, the daemon being the one
writer of the host's mdevs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from accel_agent import exception
from accel_agent.libvirt_xml import list_mdev_uuids, rewrite_mdev_uuids
from accel_agent.mdev.manager import MdevManager
from accel_agent.migration import versions as versions_mod

if TYPE_CHECKING:
    from accel_agent.api.client import ApiClient

LOG = logging.getLogger(__name__)

# How long a domain libvirt reports migrated may stay active on the source before
# its mdevs are only freed, not removed (libvirt stops the source QEMU before
# migrateToURI3 returns; this is the belt to that brace).
STOP_TIMEOUT = 60.0


def _libvirt() -> Any:
    import libvirt  # imported here: the CLI never pays for it

    return libvirt


class SourceAgent(Protocol):
    """What the source side needs of its host's agent."""

    def mdev_types(self) -> Mapping[str, str | None]:
        """``{uuid: mdev type}`` of every mdev on this host (sysfs)."""

    def release(self, instance: str, remove: bool = False) -> list[str]:
        """Release (free, or remove) the instance's mdevs; their UUIDs."""


class ManagerAgent:
    """The agent as the manager in this process."""

    def __init__(self, manager: MdevManager) -> None:
        self.manager = manager

    def mdev_types(self) -> dict[str, str | None]:
        return {uuid: mdev.mdev_type for uuid, mdev in self.manager.scan().mdevs.items()}

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return self.manager.release(instance, remove=remove)


class AgentApi:
    """The agent as its running daemon, through the API's unix socket."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def mdev_types(self) -> dict[str, str | None]:
        return {m["uuid"]: m["mdev_type"] for m in self.client.mdevs()["mdevs"]}

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return list(self.client.release(instance, remove=remove)["released"])


# libvirt (peer to peer) reports both hosts' job errors in one message.
_BOTH_SIDES_RE = re.compile(
    r"Message from the source host: (?P<source>.*?)\.?\s+"
    r"Message from the destination host: (?P<destination>.*?)\.?$",
    re.S,
)
# What the source's QEMU says when its peer gave up first (the destination's
# error arrives over the return path, or the connection breaks).
_PEER_FAILED_RE = re.compile(
    r"Sibling indicated error|Broken pipe|Connection reset|Unable to write to socket", re.I
)


def failed_side(message: str) -> tuple[str, str]:
    """(``"source"`` or ``"destination"``, that host's own message) from
    libvirt's error.  When libvirt reports both hosts, the side whose error is
    not a reaction to the other's is the one that failed; a message naming
    neither comes from the source's libvirtd, which drives the migration."""
    both = _BOTH_SIDES_RE.search(message)
    if both:
        source, destination = both.group("source").strip(), both.group("destination").strip()
        if _PEER_FAILED_RE.search(source):
            return "destination", destination
        return "source", source
    if re.search(r"job 'migration in'|destination host", message):
        return "destination", message
    return "source", message


class MigrationSource:
    def __init__(
        self,
        manager: MdevManager | SourceAgent,
        minimums: versions_mod.Minimums | None = None,
        host_versions: Callable[[Any], versions_mod.HostVersions] = versions_mod.probe,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.agent: SourceAgent = (
            ManagerAgent(manager) if isinstance(manager, MdevManager) else manager
        )
        self.minimums = minimums or versions_mod.Minimums()
        self.host_versions = host_versions
        self.clock = clock
        self.sleep = sleep

    def _migratable_xml(self, domain: Any, inactive: bool = False) -> str:
        libvirt = _libvirt()
        flags = libvirt.VIR_DOMAIN_XML_MIGRATABLE
        if inactive:
            flags |= libvirt.VIR_DOMAIN_XML_INACTIVE
        return domain.XMLDesc(flags)

    def prepare(self, domain: Any) -> dict[str, str]:
        """``{uuid: mdev type}`` of the domain's mdevs, for the destination's claim."""
        versions_mod.check(self.host_versions(domain.connect()), "source", self.minimums)
        uuids = list_mdev_uuids(self._migratable_xml(domain))
        types = self.agent.mdev_types()
        missing = [u for u in uuids if u not in types]
        if missing:
            # Nova silently drops these; a migration without them would lose a device.
            raise exception.MdevNotFound(uuid=", ".join(missing))
        return {u: types[u] or "" for u in uuids}

    def migrate(
        self,
        domain: Any,
        dest_uri: str,
        mapping: Mapping[str, str],
        flags: int = 0,
        params: Mapping[str, Any] | None = None,
        instance: str | None = None,
        remove: bool = False,
        before_release: Callable[[], object] | None = None,
    ) -> list[str]:
        """Migrate with the destination's mdev UUIDs; returns the released source
        UUIDs (removed from the host with ``remove``, else kept free for reuse).

        ``before_release`` runs once libvirt reported success and the source
        domain stopped, before the source releases anything: the destination's
        commit, so that the mdevs the guest now uses are owned on the
        destination before the source lets go of its own.  If it raises, the
        source releases nothing (its mdevs stay assigned: nothing is lost)."""
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
        if flags & libvirt.VIR_MIGRATE_PERSIST_DEST:
            persistent = migrate_params.get(libvirt.VIR_MIGRATE_PARAM_PERSIST_XML)
            if persistent is None:
                persistent = self._migratable_xml(domain, inactive=True)
            migrate_params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = rewrite_mdev_uuids(
                persistent, dict(mapping)
            ).xml
        owner = instance or domain.UUIDString()
        LOG.info(
            "migrating %s to %s with mdevs %s",
            domain.name(),
            dest_uri,
            ", ".join(f"{s}->{d}" for s, d in result.replaced),
        )
        try:
            domain.migrateToURI3(dest_uri, migrate_params, flags)
        except libvirt.libvirtError as exc:
            message = exc.get_error_message() or str(exc)
            side, reason = failed_side(message)
            raise exception.MigrationFailed(
                instance=owner,
                destination=dest_uri,
                side=side,
                reason=reason,
                libvirt_message=message,
            ) from exc
        # Only now: a failed migration leaves the guest running here, on these mdevs.
        stopped = self._wait_stopped(domain)
        if remove and not stopped:
            LOG.error(
                "%s is still active here %.0f s after libvirt reported it migrated; its mdevs "
                "are freed, not removed",
                owner,
                STOP_TIMEOUT,
            )
        if before_release is not None:
            before_release()
        released = self.agent.release(owner, remove=remove and stopped)
        LOG.info("migration of %s done; released source mdevs %s", owner, released)
        return released

    def _wait_stopped(self, domain: Any) -> bool:
        """Until libvirt reports the source domain inactive (or gone: undefined)."""
        libvirt = _libvirt()
        deadline = self.clock() + STOP_TIMEOUT
        delay = 0.05
        while True:
            try:
                if not domain.isActive():
                    return True
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return True
                raise
            if self.clock() >= deadline:
                return False
            self.sleep(delay)
            delay = min(delay * 2, 1.0)
