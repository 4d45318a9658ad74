"""Source side of a live migration with mdevs and vGPU VFs (docs/design.md §7.2, §7.3, §10).

``prepare`` lists the domain's devices with their types (what the destination
must claim) after checking this host's versions: its mdevs, and those of its
PCI hostdevs that are the agent's vGPU VFs (other PCI devices, a NIC the
operator passes through, are not the agent's business and stay as they are).
``versions`` says this host's versions as the destination's claim takes them
(``source_versions``): libvirt, QEMU, kernel and, where this host has one, its
NVIDIA vGPU manager's, which the destination compares with its own for an
instance with vGPUs.
``migrate`` rewrites the migratable XML in one pass, each mdev UUID to the
destination's and each of the agent's VFs to the destination VF's PCI address
(the claim's ``pci_addresses``), and hands it to libvirt as
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from accel_agent import exception
from accel_agent.devices.manager import DeviceManager
from accel_agent.libvirt_xml import list_mdev_uuids, list_pci_sources, rewrite_domain_xml
from accel_agent.migration import versions as versions_mod

if TYPE_CHECKING:
    from accel_agent.api.client import ApiClient
    from accel_agent.libvirt_xml.rewrite import DomainRewriteResult

LOG = logging.getLogger(__name__)

# How long a domain libvirt reports migrated may stay active on the source before
# its mdevs are only freed, not removed (libvirt stops the source QEMU before
# migrateToURI3 returns; this is the belt to that brace).
STOP_TIMEOUT = 60.0


def _libvirt() -> Any:
    import libvirt  # imported here: the CLI never pays for it

    return libvirt


@dataclass(frozen=True, slots=True)
class AgentVf:
    """A device on this host that a guest is given by PCI address (a typed vGPU
    VF), as the source sees it."""

    uuid: str
    device_type: str | None  # its vGPU type; None when it cannot be read
    owned: bool  # in the agent's ledger (created or adopted), not foreign


class SourceAgent(Protocol):
    """What the source side needs of its host's agent."""

    def mdev_types(self) -> Mapping[str, str | None]:
        """``{uuid: mdev type}`` of every mdev on this host (sysfs)."""

    def vfs(self) -> Mapping[str, AgentVf]:
        """``{PCI address: device}`` of every device on this host that a guest
        is given by PCI address."""

    def release(self, instance: str, remove: bool = False) -> list[str]:
        """Release (free, or remove) the instance's mdevs; their UUIDs."""


class ManagerAgent:
    """The agent as the manager in this process."""

    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    def mdev_types(self) -> dict[str, str | None]:
        return {uuid: mdev.mdev_type for uuid, mdev in self.manager.scan().mdevs.items()}

    def vfs(self) -> dict[str, AgentVf]:
        owned = {record.uuid for record in self.manager.ledger.all()}
        return {
            mdev.address: AgentVf(mdev.uuid, mdev.mdev_type, mdev.uuid in owned)
            for mdev in self.manager.scan().mdevs.values()
            if mdev.address is not None
        }

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return self.manager.release(instance, remove=remove)


class AgentApi:
    """The agent as its running daemon, through the API's unix socket."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def mdev_types(self) -> dict[str, str | None]:
        return {m["uuid"]: m["mdev_type"] for m in self.client.mdevs()["mdevs"]}

    def vfs(self) -> dict[str, AgentVf]:
        # The listing's "address" is set for exactly the devices given by address.
        return {
            m["address"]: AgentVf(m["uuid"], m["mdev_type"], bool(m["owned"]))
            for m in self.client.mdevs()["mdevs"]
            if m.get("address")
        }

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return list(self.client.release(instance, remove=remove)["released"])


def domain_vfs(xml: str | bytes, agent: SourceAgent) -> dict[str, AgentVf]:
    """``{address: device}`` of the domain's PCI sources that are devices the
    agent sees (its vGPU VFs).  Any other PCI device is left alone; a typed VF
    the ledger does not own is refused by name (ForeignVf) before anything
    changes."""
    addresses = list_pci_sources(xml)
    if not addresses:
        return {}  # no PCI device at all: no need to ask the agent
    known = agent.vfs()
    found: dict[str, AgentVf] = {}
    for address in addresses:
        vf = known.get(address)
        if vf is None:
            continue
        if not vf.owned:
            raise exception.ForeignVf(address=address, uuid=vf.uuid)
        found[address] = vf
    return found


def rewrite_for_destination(
    xml: str | bytes,
    mapping: Mapping[str, str],
    pci_addresses: Mapping[str, str],
    vfs: Mapping[str, AgentVf],
) -> DomainRewriteResult:
    """The domain XML the destination is given, in one rewrite pass.

    ``mapping`` (``{source uuid: destination uuid}``) and ``pci_addresses``
    (``{source uuid: destination PCI address}``) are the claim's answer as it
    came; ``vfs`` is :func:`domain_vfs` of ``xml``.  Each mdev UUID becomes its
    destination's; each of the agent's VFs moves to its destination VF's
    address.  Nova does the same for its live-migratable PCI devices (the
    destination claims, ``LiveMigrateData.pci_dev_map_src_dst`` maps source to
    destination address, ``get_updated_guest_xml`` applies it on an lxml tree);
    here the claim is keyed by the source's device UUID, because the destination
    never learns the source's addresses, and the change is spliced byte-exactly.
    Raises UnmappedVf naming an agent VF without a destination address, and
    whatever ``rewrite_domain_xml`` raises; nothing is returned half done.
    """
    by_uuid = {uuid.lower(): address for uuid, address in pci_addresses.items()}
    pci_mapping: dict[str, str] = {}
    for address, vf in vfs.items():
        target = by_uuid.get(vf.uuid)
        if target is None:
            raise exception.UnmappedVf(address=address, uuid=vf.uuid)
        pci_mapping[address] = target
    # A VF's UUID is the agent's name for it and never in the XML: its claim entry
    # is used through pci_addresses, not reported as an unused mdev key.
    vf_uuids = {vf.uuid for vf in vfs.values()}
    mdev_mapping = {s: d for s, d in mapping.items() if s.lower() not in vf_uuids}
    return rewrite_domain_xml(xml, mdev_mapping, pci_mapping)


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
        manager: DeviceManager | SourceAgent,
        minimums: versions_mod.Minimums | None = None,
        host_versions: Callable[[Any], versions_mod.HostVersions] = versions_mod.probe,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        vgpu_manager_version: Callable[[], str | None] | None = None,
    ) -> None:
        self.agent: SourceAgent = (
            ManagerAgent(manager) if isinstance(manager, DeviceManager) else manager
        )
        self.minimums = minimums or versions_mod.Minimums()
        self.host_versions = host_versions
        self.clock = clock
        self.sleep = sleep
        # This host's NVIDIA vGPU manager version: NVML (or /proc) for the
        # manager's sysfs root, or for the host's own /sys when the agent is
        # the daemon's API (whose caller runs on the source host beside it).
        root = manager.sysfs_root if isinstance(manager, DeviceManager) else None
        self.vgpu_manager_version = vgpu_manager_version or (
            lambda: versions_mod.host_vgpu_manager_version(root)
        )

    def versions(self, domain: Any) -> dict[str, str]:
        """This host's versions as the destination's claim takes them
        (``source_versions``), the NVIDIA vGPU manager's included where this
        host has one."""
        found = self.host_versions(domain.connect())
        return found.with_vgpu_manager(self.vgpu_manager_version()).to_dict()

    def _migratable_xml(self, domain: Any, inactive: bool = False) -> str:
        libvirt = _libvirt()
        flags = libvirt.VIR_DOMAIN_XML_MIGRATABLE
        if inactive:
            flags |= libvirt.VIR_DOMAIN_XML_INACTIVE
        return domain.XMLDesc(flags)

    def prepare(self, domain: Any) -> dict[str, str]:
        """``{uuid: type}`` of the domain's mdevs and of the agent's VFs among its
        PCI hostdevs, for the destination's claim."""
        versions_mod.check(self.host_versions(domain.connect()), "source", self.minimums)
        xml = self._migratable_xml(domain)
        uuids = list_mdev_uuids(xml)
        types = self.agent.mdev_types()
        missing = [u for u in uuids if u not in types]
        if missing:
            # Nova silently drops these; a migration without them would lose a device.
            raise exception.MdevNotFound(uuid=", ".join(missing))
        devices = {u: types[u] or "" for u in uuids}
        for vf in domain_vfs(xml, self.agent).values():
            devices[vf.uuid] = vf.device_type or ""
        return devices

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
        pci_addresses: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Migrate with the destination's mdev UUIDs and VF addresses; returns the
        released source UUIDs (removed from the host with ``remove``, else kept
        free for reuse).

        ``mapping`` and ``pci_addresses`` are the destination claim's answer as
        it came: ``{source uuid: destination uuid}`` for every device and
        ``{source uuid: destination PCI address}`` for the VF-backed ones.

        ``before_release`` runs once libvirt reported success and the source
        domain stopped, before the source releases anything: the destination's
        commit, so that the mdevs the guest now uses are owned on the
        destination before the source lets go of its own.  If it raises, the
        source releases nothing (its mdevs stay assigned: nothing is lost)."""
        libvirt = _libvirt()
        xml = self._migratable_xml(domain)
        uuids = list_mdev_uuids(xml)
        vfs = domain_vfs(xml, self.agent)
        post_copy = libvirt.VIR_MIGRATE_POSTCOPY | getattr(
            libvirt, "VIR_MIGRATE_POSTCOPY_RESUME", 0
        )
        if (uuids or vfs) and flags & post_copy:
            raise exception.MigrationPostCopyRefused(uuids=", ".join([*uuids, *vfs]))
        result = rewrite_for_destination(xml, mapping, pci_addresses or {}, vfs)
        if result.unused_uuids:
            LOG.warning("mapping keys not in the domain: %s", ", ".join(result.unused_uuids))
        migrate_params = dict(params or {})
        migrate_params[libvirt.VIR_MIGRATE_PARAM_DEST_XML] = result.xml
        if flags & libvirt.VIR_MIGRATE_PERSIST_DEST:
            persistent = migrate_params.get(libvirt.VIR_MIGRATE_PARAM_PERSIST_XML)
            if persistent is None:
                persistent = self._migratable_xml(domain, inactive=True)
            migrate_params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = rewrite_for_destination(
                persistent, mapping, pci_addresses or {}, domain_vfs(persistent, self.agent)
            ).xml
        owner = instance or domain.UUIDString()
        LOG.info(
            "migrating %s to %s with devices %s",
            domain.name(),
            dest_uri,
            ", ".join(f"{s}->{d}" for s, d in (*result.replaced_uuids, *result.replaced_pci)),
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
                "%s is still active here %.0f s after libvirt reported it migrated; its devices "
                "are freed, not removed",
                owner,
                STOP_TIMEOUT,
            )
        if before_release is not None:
            before_release()
        released = self.agent.release(owner, remove=remove and stopped)
        LOG.info("migration of %s done; released source devices %s", owner, released)
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
