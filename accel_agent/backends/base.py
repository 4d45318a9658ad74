"""The interface every device backend implements (os-vif's plugin pattern).

A backend knows one device model: how its parents and devices appear in
sysfs, how one device is made and unmade through the privileged helper, and
what a guest's libvirt XML says about it.  It decides nothing: the manager
(``accel_agent.devices.manager``) keeps the ledger, the intents, the allocation,
the recovery and the ownership for every backend alike, and calls a backend
only for the device half of an operation.  Which backend serves a parent is
what the scan found (``Parent.backend``), never configuration.

A backend is a class registered under the ``accel_agent.backends`` entry
points (:data:`NAMESPACE`), by this package or by another distribution,
loaded through stevedore (``accel_agent.backends.classes``) and built by
``wiring.build_backends`` for the daemon and the mutating commands.  What it
brings of its own:

* its **writer protocol**: a small ``Protocol`` of the privileged writes it
  calls on the ``writer`` it is handed (``MdevWriter``, ``VgpuWriter``,
  ``PciWriter``); the host's privileged writer (``devices/writers.py``)
  implements every one of them, and a backend from another package uses those
  same writes (a new write is a new privileged entrypoint, reviewed in
  ``accel_agent/privileged/``, never something a plugin brings);
* its **options**: :attr:`DeviceBackend.opts` names the module that declares
  them, which config/registry.py registers and lists with every room's
  (the sample config, ``check-config``);
* its **service**: :meth:`DeviceBackend.from_conf` builds the backend the
  daemon and the mutating commands use from the configuration (the
  ``sriov_vf`` backend its VF pools); a backend built with no arguments
  reads (discovers, describes) and cannot need its configuration for that.

A backend imports the sysfs reader and the privileged writer's protocols,
never the manager.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from accel_agent import exception
from accel_agent.sysfs.model import HostSnapshot, Parent

if TYPE_CHECKING:
    from oslo_config import cfg

    from accel_agent.devices.inventory import Provider
    from accel_agent.libvirt_xml.devices import DeviceDescription

#: The entry point group every backend is registered under (pyproject.toml).
NAMESPACE = "accel_agent.backends"


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A device as the manager knows it (a ledger row): enough for its backend
    to unmake it and describe it, whether or not it exists right now."""

    uuid: str
    parent: str
    device_type: str
    backend: str
    # What the device was made with for its instance (a VF's network
    # settings); None for a device that has none.
    settings: Mapping[str, Any] | None = None


def vfs_in_use(kind: str, devices: Sequence[DeviceRef], reason: str) -> exception.VfInUse:
    """:meth:`DeviceBackend.in_use` of a backend whose devices are VFs (the
    parent is the VF): the VFs, and the devices' UUIDs in the reason."""
    return exception.VfInUse(
        kind=kind,
        vf=", ".join(d.parent for d in devices),
        reason=f"{reason} (device {', '.join(d.uuid for d in devices)})",
    )


def check_fixed_uuid(kind: str, vf: str, uuid: str, expected: str) -> None:
    """VfUuidMismatch unless ``uuid`` is the one VF ``vf`` fixes: the ledger
    knows a VF's device by it, and recovery finds the device again by it."""
    if uuid != expected:
        raise exception.VfUuidMismatch(uuid=uuid, kind=kind, vf=vf, expected=expected)


class Discoverer(Protocol):
    """A backend's read side for one sysfs root (may keep what it learnt)."""

    def scan(self) -> Any:
        """A :class:`accel_agent.sysfs.nvidia_vfio.Discovery`-shaped result:
        ``parents``, ``devices``, ``warnings`` and ``notes``."""


class DeviceWriter(Protocol):
    """The host's privileged writer as the decider holds it
    (``devices/writers.py``: through the privsep helpers, or in process): it
    hands it to each backend and calls none of its writes itself.  What a
    backend calls on it is that backend's own writer protocol, declared
    beside it (``backends.mdev.MdevWriter``, ``backends.nvidia_vfio.VgpuWriter``,
    ``backends.sriov_vf.PciWriter``); the privileged writer implements them
    all."""


#: What a backend's make and destroy are handed: its writer protocol.
W = TypeVar("W")


class DeviceBackend(abc.ABC, Generic[W]):
    """One device model, writing through ``W``, its writer protocol.
    Stateless apart from its discoverer and what :meth:`from_conf` gave it."""

    #: The entry point name (``accel_agent.backends``) and ``Parent.backend``.
    name: ClassVar[str]

    #: What its devices are called in log lines and messages ("mdev",
    #: "vGPU VF", "pool VF"): the core names no device model, its backend does.
    kind: ClassVar[str] = "device"

    #: The module that declares this backend's options (dotted name), or
    #: None: ``list_opts()``, the groups as the sample config lists them
    #: (a per-name group as its stand-in, ``[vf_pool_$(pool)]``), and, for
    #: per-name groups, ``named_opts(conf)``, the groups of the names ``conf``
    #: enables.  config/registry.py registers them (the one hook: found from
    #: the entry points, never imported by name); the backend reads them in
    #: :meth:`from_conf`.  A module, not the options themselves: naming it
    #: costs nothing, and the read-only listings load the backends without
    #: oslo.config.
    opts: ClassVar[str | None] = None

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts, writer: Any, net: Any = None) -> DeviceBackend[Any]:
        """The backend the daemon and the mutating commands use: its options
        read from ``conf`` (registered first, config/registry.py), the
        services it needs built, writing through ``writer`` (the host's
        privileged writer) and, for a VF's network settings, ``net`` (the
        CAP_NET_ADMIN helper when None).  Refuses a bad configuration of its
        own with the error that names it.  By default: the plain backend."""
        return cls()

    def discoverer(
        self, sysfs_root: str, state_dir: str | None = None, persist: bool = False
    ) -> Discoverer | None:
        """The read side for ``sysfs_root``; None for the mdev backend, whose
        scan is the host scanner's base (``accel_agent.sysfs.rescan``).
        ``state_dir``: where what it learnt of the host is kept, written only
        when ``persist`` (the agent; a listing only reads)."""
        return None

    @abc.abstractmethod
    def new_device_uuid(self, parent: Parent) -> str:
        """The UUID the next device made on ``parent`` will have.  A backend
        whose devices have no name of their own derives it from the parent,
        so it is the same after a reboot (``device_uuid_is_fixed``)."""

    #: True when a parent holds at most one device, whose UUID it fixes.
    device_uuid_is_fixed: ClassVar[bool] = False

    #: True for a backend whose parents come from configured pools, not from
    #: the host scan (SR-IOV VF pools): it says itself which devices exist
    #: (:meth:`outside_devices`) and which parent a request gets (:meth:`pick`).
    outside_snapshot: ClassVar[bool] = False

    #: True when a released device is always unmade, never kept free for
    #: reuse (a VF carries its tenant's network settings).
    unmade_on_release: ClassVar[bool] = False

    def device_uuid_of(self, parent: str) -> str:
        """The UUID of the one device parent ``parent`` holds (a fixed-UUID
        backend whose parents are not in the snapshot)."""
        raise NotImplementedError(f"backend {self.name} has no parent-fixed device UUIDs")

    def make(
        self,
        writer: W,
        parent: str,
        device_type: str,
        uuid: str,
        settings: Mapping[str, Any] | None,
    ) -> None:
        """Make (or re-make) a device with its per-instance ``settings``; a
        backend whose devices have none just creates it."""
        self.create(writer, parent, device_type, uuid)

    def place(self, writer: W, parent: str, placement_id: int) -> None:
        """Put the device just made on ``parent`` at ``placement_id`` (a
        vGPU of a mixed-size layout, devices/placements.py).  A backend
        whose devices have no placement refuses."""
        raise exception.MdevTypeNotSupported(
            parent=parent, mdev_type=f"a placement ({self.name} devices have none)")

    def placement_type_id(self, device_type: str) -> int | None:
        """The id NVML knows ``device_type`` by, for a backend whose devices
        have placements on their GPU (NVIDIA's vGPU VFs); None otherwise."""
        return None

    def served_pools(self) -> Mapping[str, Any]:
        """The named pools an ``outside_snapshot`` backend hands parents out
        of, by name (what an attach request's ``pool`` names; each with its
        ``name`` and ``device_addresses``); none by default."""
        return {}

    def pick(self, pool: str, where: str | None, exclude: Collection[str]) -> str:
        """A free parent of ``pool`` (of physical device ``where`` when given),
        none of ``exclude`` (an ``outside_snapshot`` backend)."""
        raise exception.UnknownVfPool(pool=pool, enabled="none")

    def outside_devices(self) -> Mapping[str, tuple[str, bool]]:
        """Every parent of an ``outside_snapshot`` backend now:
        {parent: (its pool, whether it holds a device)}."""
        return {}

    def providers(self, host: str) -> list[Provider]:
        """The resource providers of an ``outside_snapshot`` backend (one per
        physical device of its pools), beside the GPUs' from the scan."""
        return []

    def prepare_host(self) -> None:
        """What the host needs before devices are made or re-made (recovery
        runs it first): enabling a pool's VFs.  Nothing by default."""
        return None

    def handle(self, device: DeviceRef) -> dict[str, Any]:
        """What an attach handle says of ``device`` beyond its UUID, parent,
        type, address and XML."""
        return {}

    @abc.abstractmethod
    def create(self, writer: W, parent: str, device_type: str, uuid: str) -> None:
        """Make device ``uuid`` of ``device_type`` on ``parent`` (or re-make it,
        same UUID, same parent, after a reboot)."""

    @abc.abstractmethod
    def destroy(self, writer: W, device: DeviceRef, timeout: float) -> None:
        """Unmake ``device``; a DeviceInUse of its kind when something holds
        it (nothing done), MdevNotFound when it is gone already."""

    def in_use(self, devices: Sequence[DeviceRef], reason: str) -> exception.DeviceInUse:
        """The error that says ``devices`` (this backend's) are held and were
        kept for ``reason``: the class of their kind (an mdev's, a VF's), so
        a client reads from the code what it holds."""
        return exception.DeviceInUse(
            uuid=", ".join(d.uuid for d in devices), reason=f"{reason} ({self.kind})"
        )

    def pci_address(self, device: DeviceRef) -> str | None:
        """The PCI address a guest is given for ``device``, or None when the
        guest is given a mediated device by its UUID."""
        return None

    @abc.abstractmethod
    def guest_device(self, device: DeviceRef) -> DeviceDescription:
        """What a guest is given for ``device``, as a validated description
        (``accel_agent.libvirt_xml.devices``) that ``instance_devices_xml``
        lays out beside the instance's other devices, whatever their backend."""

    def guest_xml(self, device: DeviceRef) -> str:
        """The guest XML of ``device`` alone: one element for ``<devices>``."""
        from accel_agent.libvirt_xml.devices import device_xml

        return device_xml(self.guest_device(device))

    def host_notes(self, snapshot: HostSnapshot) -> list[str]:
        """Host preparation this backend needs and does not own (check-config)."""
        return []
