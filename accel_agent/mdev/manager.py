"""The one place that decides which mdevs exist and who holds them.

DESIGN.md §5.  Every operation runs under one lock (a thread lock plus a
file lock in ``state_dir``, so an offline ``accelctl`` and the daemon never
interleave), starts from a fresh sysfs scan, and follows the ledger's
protocol: intent before every sysfs write, settled after.  A crash at any
instant leaves rows that :meth:`MdevManager.recover` can settle by comparing
them with sysfs; the tests kill a real process at every step to prove it.

* allocate: reuse free owned mdevs of the configured type, else create;
  providers (physical GPUs) in a deterministic order, least used first, then
  by name; one GPU if one can hold the whole request, else spread; all or
  nothing (what this call created is removed again on failure).
* release: idempotent; ``remove=True`` also removes the mdevs, except one
  that a libvirt domain still references (kept, free, with a warning).
* recover: finish or undo interrupted operations, re-create every recorded
  mdev missing from sysfs with the same UUID on the same parent and type,
  report foreign mdevs (never touched unless adopted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accel_agent import backends as backends_mod
from accel_agent import exception
from accel_agent.backends.base import DeviceBackend, DeviceRef, DeviceWriter
from accel_agent.backends.host import HostRescanner
from accel_agent.mdev import inventory as inventory_mod
from accel_agent.mdev import requests as requests_mod
from accel_agent.mdev.domains import DomainReferences, NoDomains
from accel_agent.mdev.ledger import (
    IntentKind,
    Ledger,
    MdevRecord,
    MdevState,
    OwnerKind,
    validate_instance_id,
)
from accel_agent.mdev.policy import MdevPolicy
from accel_agent.sysfs import address, scanner
from accel_agent.sysfs.model import HostSnapshot, Parent

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.devices import DeviceDescription

LOG = logging.getLogger(__name__)

MAX_COUNT = requests_mod.MAX_COUNT
LOCK_NAME = "accel-agent-mdevs"


# The privileged half (accel_agent.backends.base.DeviceWriter): the writes
# that need root, for every backend.
MdevWriter = DeviceWriter


class PrivsepWriter:
    """Writes through the oslo.privsep daemon, started on first use with the
    agent's own config files.  Every call names ``sysfs_root``: a helper that
    was restarted must not act on a root an operator has since written into
    those files."""

    def __init__(self, sysfs_root: str | None = None, vfio_dev_dir: str | None = None) -> None:
        # Normalised as the helper wants it ("/sys/" and "/sys" are one root).
        self.sysfs_root = os.path.normpath(sysfs_root) if sysfs_root else None
        self.vfio_dev_dir = (
            os.path.normpath(vfio_dev_dir) if vfio_dev_dir else vfio_dev_dir
        )

    @staticmethod
    def _started() -> Any:
        # Imported on the first write: oslo.privsep is heavy, and read-only
        # commands build a manager too.  The helper is started (and started
        # again after a failure) by its guard, on the first call.
        from accel_agent import privileged

        return privileged

    def create(self, parent: str, mdev_type: str, uuid: str) -> None:
        self._started().create_mdev(parent, mdev_type, uuid, sysfs_root=self.sysfs_root)

    def remove(self, uuid: str, timeout: float) -> None:
        self._started().remove_mdev(
            uuid, timeout, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir
        )

    def set_vgpu_type(self, vf: str, type_id: int) -> None:
        self._started().set_vgpu_type(vf, type_id, sysfs_root=self.sysfs_root)

    def clear_vgpu_type(self, vf: str, timeout: float) -> None:
        self._started().clear_vgpu_type(
            vf, timeout, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir
        )

    # SR-IOV VFs (backend sriov_vf): same daemon, accel_agent.privileged_pci.
    def set_num_vfs(self, pf: str, count: int) -> int:
        self._started()
        from accel_agent import privileged_pci

        return privileged_pci.set_num_vfs(pf, count, sysfs_root=self.sysfs_root)

    def bind_vfio(self, vf: str) -> None:
        self._started()
        from accel_agent import privileged_pci

        privileged_pci.bind_vfio(vf, sysfs_root=self.sysfs_root)

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None:
        self._started()
        from accel_agent import privileged_pci

        return privileged_pci.unbind_vfio(
            vf, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir, give_back=give_back
        )


class DirectWriter:
    """Same validation and writes, in this process: for unprivileged trees
    (the simulator as its owner) and benchmarks.  Production uses privsep."""

    def __init__(self, sysfs_root: str, vfio_dev_dir: str = "") -> None:
        from accel_agent import privileged

        self._privileged = privileged
        self.sysfs_root = sysfs_root
        self.vfio_dev_dir = vfio_dev_dir

    def create(self, parent: str, mdev_type: str, uuid: str) -> None:
        self._privileged.write_create(self.sysfs_root, parent, mdev_type, uuid)

    def remove(self, uuid: str, timeout: float) -> None:
        self._privileged.write_remove(self.sysfs_root, uuid, timeout, self.vfio_dev_dir)

    def set_vgpu_type(self, vf: str, type_id: int) -> None:
        self._privileged.write_vgpu_type(self.sysfs_root, vf, type_id)

    def clear_vgpu_type(self, vf: str, timeout: float) -> None:
        self._privileged.write_vgpu_clear(self.sysfs_root, vf, timeout, self.vfio_dev_dir)

    def set_num_vfs(self, pf: str, count: int) -> int:
        from accel_agent import privileged_pci

        return privileged_pci.write_num_vfs(self.sysfs_root, pf, count)

    def bind_vfio(self, vf: str) -> None:
        from accel_agent import privileged_pci

        privileged_pci.write_bind_vfio(self.sysfs_root, vf)

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None:
        from accel_agent import privileged_pci

        return privileged_pci.write_unbind_vfio(
            self.sysfs_root, vf, self.vfio_dev_dir, give_back
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    instance: str
    mdevs: tuple[MdevRecord, ...]

    @property
    def uuids(self) -> list[str]:
        return [m.uuid for m in self.mdevs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "mdevs": [
                {"uuid": m.uuid, "parent": m.parent, "mdev_type": m.mdev_type} for m in self.mdevs
            ],
        }


@dataclass
class RecoveryReport:
    recreated: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    waiting_for_parent: list[str] = field(default_factory=list)
    released_claims: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    # Interrupted removes that found the mdev in use: kept, free, owned.
    kept_in_use: list[str] = field(default_factory=list)
    # Foreign mdevs that look like the agent's while its ledger was lost:
    # see MdevManager.unrecorded.
    unrecorded: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {k: sorted(v) for k, v in self.__dict__.items()}


@dataclass
class TakeoverPlan:
    """What ``takeover`` does (or, dry run or refused, would do).

    ``domains``: per libvirt domain with mdevs, each mdev with its action:
    ``adopt`` (foreign: adopted and assigned to the domain's UUID), ``assign``
    (owned and free: assigned) or ``none`` (already the instance's).
    ``unused``: foreign mdevs no domain uses, ``adopt`` (``--all``, adopted
    free) or ``foreign`` (left alone; ``reason`` says why when ``--all`` was
    given).  ``problems``: why the takeover is refused; any one of them means
    nothing changes."""

    dry_run: bool
    adopt_unused: bool
    domains: list[dict[str, Any]] = field(default_factory=list)
    unused: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "dry_run": self.dry_run,
            "all": self.adopt_unused,
            "domains": self.domains,
            "unused": self.unused,
            "problems": self.problems,
        }


def _check_request_names(parent: str | None, mdev_type: str | None) -> None:
    """A parent and a type as a caller may name them: no control character
    (``"mtty\\n"`` must not quietly become ``mtty``), a PCI address or parent
    name, a type id as sysfs spells them (fullmatch: ``$`` would take a
    trailing newline)."""
    if parent is not None and not (
        isinstance(parent, str)
        and parent.isprintable()
        and (address.is_pci_address(parent) or address.is_virtual_parent_name(parent.strip()))
    ):
        raise exception.InvalidAllocationRequest(
            reason=f"parent {parent!r} is neither a PCI address nor an mdev parent name"
        )
    if mdev_type is not None and not requests_mod.is_type_name(mdev_type):
        raise exception.InvalidAllocationRequest(
            reason=f"mdev type {mdev_type!r} must match {requests_mod.TYPE_NAME_RULE}"
        )


def unrecorded_warning(ledger_path: str, uuids: list[str]) -> str:
    return (
        f"the mdev ledger {ledger_path} was missing, yet {len(uuids)} mdev(s) of the type "
        f"configured for their parent exist that no record names ({', '.join(uuids)}): if "
        "the agent made them, their assignments are lost. They are treated as foreign "
        "(counted, never touched); adopt each one that is the agent's (accelctl adopt UUID)"
    )


def _device_ref(record: MdevRecord) -> DeviceRef:
    return DeviceRef(
        record.uuid, record.parent, record.mdev_type, record.backend, record.settings
    )


@dataclass(frozen=True, slots=True)
class _Slot:
    parent: str
    reuse: str | None  # uuid of a free owned mdev, or None: create one
    # A pool VF (not in the snapshot): its backend and network settings.
    backend: str | None = None
    settings: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class _Devices:
    """What exists now, for recovery: the snapshot's mdevs and parents, and
    the parents of each backend outside the snapshot (pool VFs),
    {backend: {parent: (pool, holds a device)}}."""

    snapshot: HostSnapshot
    outside: Mapping[str, Mapping[str, tuple[str, bool]]]

    def exists(self, record: MdevRecord) -> bool:
        if record.backend in self.outside:
            found = self.outside[record.backend].get(record.parent)
            return bool(found and found[1])
        return record.uuid in self.snapshot.mdevs

    def has_parent(self, record: MdevRecord) -> bool:
        if record.backend in self.outside:
            return record.parent in self.outside[record.backend]
        return record.parent in self.snapshot.parents


@dataclass(frozen=True, slots=True)
class Attachment:
    """An instance's attach handles (DESIGN.md §11): one per device, in the
    order of the requests that asked for them, each with its guest XML."""

    instance: str
    handles: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "attachments": [dict(h) for h in self.handles]}


class MdevManager:
    def __init__(
        self,
        *,
        sysfs_root: str,
        policy: MdevPolicy,
        host: str,
        ledger: Ledger,
        writer: MdevWriter,
        domains: DomainReferences | None = None,
        remove_timeout: float = 30.0,
        on_step: Callable[[str], None] | None = None,
        on_kept_in_use: Callable[[str], None] | None = None,
        backends: Mapping[str, DeviceBackend] | None = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        # Every device model this host may have; the scan says which serves
        # which parent (Parent.backend), the ledger which made which device.
        self.backends = backends if backends is not None else backends_mod.builtin()
        self.policy = policy
        self.host = host
        self.ledger = ledger
        self.writer = writer
        self.domains = domains or NoDomains()
        self.remove_timeout = remove_timeout
        # Crash tests hook here to kill the process between two steps.
        self._on_step = on_step or (lambda step: None)
        # Told the UUID of every mdev a remove kept because it is in use (metrics).
        self.on_kept_in_use = on_kept_in_use or (lambda uuid: None)
        self._thread_lock = threading.RLock()
        # The agent keeps what the backends learn of the host beside its ledger.
        self._rescanner = HostRescanner(
            sysfs_root, self.backends, str(ledger.path.parent), persist=True
        )

    # --- plumbing ----------------------------------------------------------------

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The manager's lock, for a caller that must check and change the
        policy atomically with respect to allocations (a config reload)."""
        return self._locked()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        from oslo_concurrency import lockutils

        with (
            self._thread_lock,
            lockutils.lock(
                LOCK_NAME, external=True, lock_path=str(self.ledger.path.parent), do_log=False
            ),
        ):
            yield

    def _step(self, name: str) -> None:
        self._on_step(name)

    def scan(self) -> HostSnapshot:
        """Fresh parents, mdevs and counters of the configured types: all any
        decision here needs.  Steady-state rescans re-read only those."""
        return self._rescanner.rescan(self._configured_types)

    def scan_all(self) -> HostSnapshot:
        """Every type's counter true, for the listings: re-reads the mdev
        list and only the counters that list says can have changed
        (accel_agent.sysfs.rescan explains why that is enough)."""
        return self._rescanner.listing()

    def scan_full(self) -> HostSnapshot:
        """Every counter and every mdev read again: the periodic safety net
        for what no mdev change announces."""
        return self._rescanner.rescan(reread_mdevs=True)

    def interrupt_scans(self) -> None:
        """The agent is stopping: scans made inside
        ``accel_agent.sysfs.rescan.interruptible()`` stop at their next parent."""
        self._rescanner.interrupt()

    def _configured_types(self, parent: Parent) -> set[str]:
        mdev_type = self.policy.type_for(parent)
        return {mdev_type} if mdev_type else set()

    def set_policy(self, policy: MdevPolicy) -> None:
        with self._thread_lock:
            self.policy = policy

    def scanned_records(self, records: Iterable[MdevRecord]) -> list[MdevRecord]:
        """The records of devices the host scan sees: not a pool's VFs, which
        their backend reports (they are never "missing" from the snapshot)."""
        return [
            r
            for r in records
            if not getattr(self.backends.get(r.backend), "outside_snapshot", False)
        ]

    def free_uuids(self) -> frozenset[str]:
        return frozenset(r.uuid for r in self.ledger.all() if r.free)

    def inventory(self, snapshot: HostSnapshot | None = None) -> inventory_mod.Inventory:
        snapshot = snapshot or self.scan()
        return inventory_mod.compute_inventory(
            snapshot, self.policy, self.host, self._free_present(snapshot)
        )

    def reported_inventory(
        self, snapshot: HostSnapshot, free: Iterable[str] | None = None
    ) -> inventory_mod.Inventory:
        """What the agent reports (``/v1/inventory``, Placement): the GPUs'
        providers from the scan, and those of the backends outside it (one per
        PF of a VF pool).  Allocation plans with :meth:`inventory` alone."""
        base = inventory_mod.compute_inventory(
            snapshot,
            self.policy,
            self.host,
            self._free_present(snapshot) if free is None else free,
        )
        extra = [
            p
            for b in self.backends.values()
            if b.outside_snapshot
            for p in b.providers(self.host)
        ]
        if not extra:
            return base
        providers = tuple(sorted((*base.providers, *extra), key=lambda p: p.name))
        return dataclasses.replace(base, providers=providers)

    def outside_state(self) -> tuple[Any, ...]:
        """The parents of the backends outside the scan and whether each holds
        a device, as a value (a listing built from it is still right)."""
        return tuple(
            (name, tuple(sorted(b.outside_devices().items())))
            for name, b in sorted(self.backends.items())
            if b.outside_snapshot
        )

    def _free_present(self, snapshot: HostSnapshot) -> frozenset[str]:
        return frozenset(u for u in self.free_uuids() if u in snapshot.mdevs)

    # --- allocate ---------------------------------------------------------------------

    def allocation(self, instance: str) -> Allocation:
        validate_instance_id(instance)
        return Allocation(instance, tuple(self.ledger.by_owner(instance, OwnerKind.INSTANCE)))

    def guest_devices(self, records: Iterable[MdevRecord]) -> list[DeviceDescription]:
        """What a guest is given for each recorded device (``<hostdev type='mdev'>``
        by UUID, a VF by PCI address, ...), each said by the backend that made it,
        in the records' order."""
        return [self._backend(r.backend).guest_device(_device_ref(r)) for r in records]

    def pci_address(self, record: MdevRecord) -> str | None:
        """The PCI address a guest is given for a recorded device, None when the
        guest is given it by UUID (an mdev)."""
        return self._backend(record.backend).pci_address(_device_ref(record))

    def allocate(
        self,
        instance: str,
        count: int,
        parent: str | None = None,
        mdev_type: str | None = None,
    ) -> Allocation:
        """Give ``instance`` ``count`` mdevs, all or nothing.

        Idempotent: asking again for what the instance already holds returns
        it; asking for something different while it holds mdevs is refused.
        """
        validate_instance_id(instance)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise exception.InvalidAllocationRequest(
                reason=f"count must be an integer from 1 to {MAX_COUNT}, not {count!r}"
            )
        _check_request_names(parent, mdev_type)
        wanted_parent = address.normalise_parent(parent) if parent else None
        with self._locked():
            held = self.ledger.by_owner(instance, OwnerKind.INSTANCE)
            if held:
                if self._holds(held, count, wanted_parent, mdev_type):
                    return Allocation(instance, tuple(held))
                raise exception.InstanceAlreadyAllocated(instance=instance, count=len(held))
            snapshot = self.scan()
            chosen_type, slots = self._plan(snapshot, count, wanted_parent, mdev_type)
            self._execute(snapshot, instance, [(slot, chosen_type, None) for slot in slots])
            return self.allocation(instance)

    def _holds(
        self,
        held: list[MdevRecord],
        count: int,
        wanted_parent: str | None,
        mdev_type: str | None,
    ) -> bool:
        """Whether ``held`` is what this request asks for (a repeat: idempotent),
        as opposed to a different request (refused, never answered with the
        old allocation).  The parent may name the mdevs' parent or their GPU."""
        if len(held) != count:
            return False
        if mdev_type is not None and any(r.mdev_type != mdev_type for r in held):
            return False
        if wanted_parent is None or all(r.parent == wanted_parent for r in held):
            return True
        parents = self.scan().parents
        return all(
            r.parent in parents and parents[r.parent].physical_gpu == wanted_parent
            for r in held
        )

    def claim(self, owner: str, sources: dict[str, str], expires_at: float) -> dict[str, str]:
        """Live-migration destination: one mdev per source mdev, of the same
        type, held as an expiring claim.  Returns ``{source uuid: our uuid}``.

        Idempotent for the same set of source mdevs; persisted, so the
        answer survives a restart.
        """
        validate_instance_id(owner)
        with self._locked():
            held = self.ledger.by_owner(owner, OwnerKind.CLAIM)
            if held:
                mapping = {r.source_uuid: r.uuid for r in held}
                if set(mapping) == set(sources):
                    return mapping  # type: ignore[return-value]
                raise exception.InstanceAlreadyAllocated(instance=owner, count=len(held))
            snapshot = self.scan()
            items: list[tuple[_Slot, str, str | None]] = []
            by_type: dict[str, list[str]] = {}
            for source, mdev_type in sorted(sources.items()):
                by_type.setdefault(mdev_type, []).append(source)
            for mdev_type, type_sources in sorted(by_type.items()):
                _, slots = self._plan(snapshot, len(type_sources), None, mdev_type)
                items += [
                    (slot, mdev_type, src) for slot, src in zip(slots, type_sources, strict=True)
                ]
            self._execute(snapshot, owner, items, OwnerKind.CLAIM, expires_at)
            return {
                r.source_uuid: r.uuid  # type: ignore[misc]
                for r in self.ledger.by_owner(owner, OwnerKind.CLAIM)
            }

    # --- attach (DESIGN.md §11) -------------------------------------------------------

    def attach(
        self, instance: str, requests: Sequence[requests_mod.AttachRequest]
    ) -> Attachment:
        """Prepare every device ``requests`` (checked by ``attach_requests``) ask
        for, all or nothing, as one operation of the ledger: one intent with
        every reservation and create intent (a pool VF's with its settings),
        the devices made, then one transaction that assigns them all and
        records the request.  A failure undoes what this call made before it
        raises; a crash leaves an intent that ``recover`` undoes.

        Idempotent: the same requests again get the same handles; different
        ones while the instance holds devices are refused."""
        validate_instance_id(instance)
        wanted = requests_mod.document(requests)
        with self._locked():
            held = self.ledger.by_owner(instance, OwnerKind.INSTANCE)
            if held:
                recorded = self.ledger.attach_request(instance)
                if recorded is not None and recorded["requests"] == wanted:
                    return self._attachment(instance, recorded)
                raise exception.InstanceAlreadyAllocated(instance=instance, count=len(held))
            snapshot = self.scan()
            items, request_of = self._plan_attach(snapshot, requests)

            def record(uuids: list[str]) -> None:
                devices = [[uuid, index] for uuid, index in zip(uuids, request_of, strict=True)]
                self.ledger.record_attach_request(
                    instance, {"requests": wanted, "devices": devices}
                )

            self._execute(snapshot, instance, items, on_settle=record)
            document = self.ledger.attach_request(instance)
            assert document is not None
            return self._attachment(instance, document)

    def attachment(self, instance: str) -> Attachment:
        """The instance's attach handles; an instance that holds devices from
        ``allocate`` gets one handle per device, request index 0."""
        validate_instance_id(instance)
        document = self.ledger.attach_request(instance) or {
            "devices": [[r.uuid, 0] for r in self.ledger.by_owner(instance, OwnerKind.INSTANCE)]
        }
        return self._attachment(instance, document)

    def _plan_attach(
        self, snapshot: HostSnapshot, requests: Sequence[requests_mod.AttachRequest]
    ) -> tuple[list[tuple[_Slot, str, str | None]], list[int]]:
        """Every request's slots, each request planned around the ones before it."""
        items: list[tuple[_Slot, str, str | None]] = []
        request_of: list[int] = []
        planned: Counter[str] = Counter()
        # A pool's parents the ledger records, whatever their state, are taken.
        taken = {r.parent for r in self.ledger.all() if self._backend(r.backend).outside_snapshot}
        for index, request in enumerate(requests):
            if isinstance(request, requests_mod.DeviceRequest):
                mdev_type, slots = self._plan(
                    snapshot, request.count, request.parent, request.mdev_type,
                    request.resource_class, planned,
                )
                for slot in slots:
                    planned[slot.reuse or slot.parent] += 1
                items += [(slot, mdev_type, None) for slot in slots]
                request_of += [index] * len(slots)
                continue
            parent = self._backend(request.backend).pick(request.pool, request.where, taken)
            taken.add(parent)
            slot = _Slot(parent, None, backend=request.backend, settings=request.settings)
            items.append((slot, request.pool, None))
            request_of.append(index)
        return items, request_of

    def _attachment(self, instance: str, document: Mapping[str, Any]) -> Attachment:
        handles = []
        for uuid, index in document["devices"]:
            record = self.ledger.get(uuid)
            if record is None or record.owner != instance:
                continue  # a device recovery could not bring back (reported there)
            handles.append(self._handle(record, index))
        return Attachment(instance, tuple(handles))

    def _handle(self, record: MdevRecord, index: int) -> dict[str, Any]:
        """One attach handle: the device, and what its guest is given."""
        backend = self._backend(record.backend)
        ref = _device_ref(record)
        return {
            "request": index,
            "backend": record.backend,
            "uuid": record.uuid,
            "parent": record.parent,
            "type": record.mdev_type,
            "address": backend.pci_address(ref),
            **backend.handle(ref),
            "xml": backend.guest_xml(ref),
        }

    def _plan(
        self,
        snapshot: HostSnapshot,
        count: int,
        wanted_parent: str | None,
        wanted_type: str | None,
        wanted_class: str | None = None,
        planned: Counter[str] | None = None,
    ) -> tuple[str, list[_Slot]]:
        """Where ``count`` devices go.  ``planned``: what earlier requests of
        the same call took (reused UUIDs, creates per parent), left alone."""
        planned = planned if planned is not None else Counter()
        inventory = self.inventory(snapshot)
        free_by_parent: dict[str, list[str]] = {}
        recorded: set[str] = set()
        for record in self.ledger.all():
            recorded.add(record.uuid)
            if record.free and record.uuid in snapshot.mdevs and not planned[record.uuid]:
                free_by_parent.setdefault(record.parent, []).append(record.uuid)
        candidates = []
        for provider in inventory.providers:
            if wanted_type and provider.mdev_type != wanted_type:
                continue
            if wanted_class and provider.resource_class != wanted_class:
                continue
            members = list(provider.parent_devices)
            if wanted_parent:
                if wanted_parent in members:
                    members = [wanted_parent]
                elif wanted_parent != provider.physical_gpu:
                    continue
            candidates.append((provider, members))
        if not candidates:
            raise exception.InsufficientCapacity(
                mdev_type=wanted_type
                or (f"any type of class {wanted_class}" if wanted_class else "any configured type"),
                parents=wanted_parent or "any configured parent",
                reason="no configured parent offers it",
            )
        order = [t.mdev_type for t in self.policy.types]
        best_short: tuple[str, int, list[str]] | None = None
        for mdev_type in sorted({p.mdev_type for p, _ in candidates}, key=order.index):
            ranked = sorted(
                (c for c in candidates if c[0].mdev_type == mdev_type),
                key=lambda c: (c[0].used, c[0].name),
            )
            per_provider = [
                self._provider_slots(
                    snapshot, provider, members, mdev_type, free_by_parent, recorded, planned
                )
                for provider, members in ranked
            ]
            # One GPU when one can hold it all (guest locality), else spread.
            whole = next((s for s in per_provider if len(s) >= count), None)
            if whole is not None:
                return mdev_type, whole[:count]
            spread = [slot for slots in per_provider for slot in slots]
            if len(spread) >= count:
                return mdev_type, spread[:count]
            if best_short is None:
                best_short = (mdev_type, len(spread), [p.name for p, _ in ranked])
        assert best_short is not None
        mdev_type, available, providers = best_short
        raise exception.InsufficientCapacity(
            mdev_type=mdev_type,
            parents=", ".join(
                sorted({m for p, ms in candidates if p.name in providers for m in ms})
            ),
            reason=f"{count} requested, {available} available",
        )

    def _provider_slots(
        self,
        snapshot: HostSnapshot,
        provider: inventory_mod.Provider,
        members: list[str],
        mdev_type: str,
        free_by_parent: dict[str, list[str]],
        recorded: set[str],
        planned: Counter[str],
    ) -> list[_Slot]:
        slots = [_Slot(p, u) for p in members for u in sorted(free_by_parent.get(p, []))]
        existing = sum(
            len(snapshot.mdevs_on(p, mdev_type)) + planned[p] for p in provider.parent_devices
        )
        # ``total`` already holds the per-GPU caps (max_instances, VF budget).
        creatable = provider.total - existing
        for parent_name in members:
            parent = snapshot.parents[parent_name]
            offered = parent.types[mdev_type].available_instances - planned[parent_name]
            backend = self._backend(parent.backend)
            if backend.device_uuid_is_fixed and backend.new_device_uuid(parent) in recorded:
                # Its one device is recorded but missing (a VF untyped behind
                # our back): it waits for recovery, never for a new owner.
                offered = 0
            take = max(0, min(offered, creatable))
            slots += [_Slot(parent_name, None)] * take
            creatable -= take
        return slots

    def _execute(
        self,
        snapshot: HostSnapshot,
        owner: str,
        items: list[tuple[_Slot, str, str | None]],
        owner_kind: OwnerKind = OwnerKind.INSTANCE,
        expires_at: float | None = None,
        on_settle: Callable[[list[str]], None] | None = None,
    ) -> list[str]:
        """Reserve or create every slot, then assign them all, or undo what
        this call did.  Returns the devices' UUIDs in the items' order;
        ``on_settle`` is told them inside the transaction that assigns them.

        Two ledger commits whatever the count, one fsync: the intent with
        every reservation and create intent before the first sysfs write,
        then the settlement with every assignment after the last.  A
        reuse-only allocation writes nothing to sysfs, so it is a single
        transaction with no intent at all.
        """
        kind = IntentKind.CLAIM if owner_kind is OwnerKind.CLAIM else IntentKind.ALLOCATE
        chosen: list[tuple[str, str | None]] = []
        to_create: list[tuple[str, str, str, DeviceBackend, Mapping[str, Any] | None]] = []
        if all(slot.reuse for slot, _, _ in items):
            reused = [slot.reuse for slot, _, _ in items]
            with self.ledger.transaction():
                for slot, _type, source in items:
                    assert slot.reuse is not None
                    self._assign(slot.reuse, owner, owner_kind, expires_at, None, source)
                if on_settle is not None:
                    on_settle(reused)  # type: ignore[arg-type]
            self._step("allocate.assigned")
            self._log_assigned(owner, owner_kind, reused)  # type: ignore[arg-type]
            return reused  # type: ignore[return-value]
        # The intent needs no fsync: the settlement's below covers it (Ledger.transaction).
        with self.ledger.transaction(durable=False):
            intent = self.ledger.begin_intent(kind, owner)
            for slot, mdev_type, source in items:
                if slot.reuse:
                    self.ledger.reserve(slot.reuse, intent)
                    chosen.append((slot.reuse, source))
                    continue
                if slot.backend is not None:
                    # A pool's parent: its backend fixes the device's UUID.
                    backend = self._backend(slot.backend)
                    new = backend.device_uuid_of(slot.parent)
                else:
                    parent = snapshot.parents[slot.parent]
                    backend = self._backend(parent.backend)
                    new = backend.new_device_uuid(parent)
                self.ledger.record_create_intent(
                    new, slot.parent, mdev_type, intent_id=intent, backend=backend.name,
                    settings=slot.settings,
                )
                to_create.append((new, slot.parent, mdev_type, backend, slot.settings))
                chosen.append((new, source))
        self._step("allocate.intent")
        created: list[str] = []
        try:
            for new, parent_name, mdev_type, backend, settings in to_create:
                backend.make(self.writer, parent_name, mdev_type, new, settings)
                created.append(new)
                self._step("allocate.created")
            with self.ledger.transaction():
                for new in created:
                    self.ledger.settle_created(new)
                for uuid, source in chosen:
                    self._assign(uuid, owner, owner_kind, expires_at, intent, source)
                if on_settle is not None:
                    on_settle([uuid for uuid, _ in chosen])
                self.ledger.finish_intent(intent)
            self._step("allocate.assigned")
        except exception.PrivilegedHelperUnavailable:
            # The write in flight may or may not have happened: leave the
            # intent as a crash would, for recovery to settle from sysfs (the
            # daemon runs it once a new helper answers).  Nothing is assigned.
            LOG.error("operation %d for %s interrupted: the privileged helper failed; "
                      "recovery settles it", intent, owner)
            raise
        except BaseException:
            self._roll_back(intent, created)
            raise
        self._log_assigned(owner, owner_kind, [uuid for uuid, _ in chosen])
        return [uuid for uuid, _ in chosen]

    def _assign(
        self,
        uuid: str,
        owner: str,
        owner_kind: OwnerKind,
        expires_at: float | None,
        intent: int | None,
        source: str | None,
    ) -> None:
        self.ledger.assign(
            uuid,
            owner,
            owner_kind=owner_kind,
            claim_expires_at=expires_at,
            intent_id=intent,
            source_uuid=source,
        )

    @staticmethod
    def _log_assigned(owner: str, owner_kind: OwnerKind, uuids: list[str | None]) -> None:
        LOG.info(
            "%s %d mdev(s) for %s: %s",
            "claimed" if owner_kind is OwnerKind.CLAIM else "allocated",
            len(uuids),
            owner,
            ", ".join(str(u) for u in uuids),
        )

    def _roll_back(self, intent: int, created: list[str]) -> None:
        """Undo a failed allocate: remove what it created, free what it reserved.

        A privileged helper that fails meanwhile stops the rollback where it
        is: the intent stays with the rows left, for recovery."""
        try:
            self._undo(intent, created)
        except exception.PrivilegedHelperUnavailable as exc:
            LOG.error("rollback of operation %d interrupted (%s); recovery settles the rest",
                      intent, exc.message)

    def _undo(self, intent: int, created: list[str]) -> None:
        for record in self.ledger.all():
            if record.intent_id != intent:
                continue
            if record.state is MdevState.CREATING and record.uuid not in created:
                if self._backend(record.backend).outside_snapshot:
                    # Its make failed part-way (a VF's settings set, the
                    # hand-over refused): undo whatever step it reached.
                    self._unmake_quietly(record.uuid)
                self.ledger.forget(record.uuid)  # the create write never succeeded
        for uuid in created:
            try:
                self._remove_owned(uuid)
            except exception.PrivilegedHelperUnavailable:
                raise
            except exception.AccelAgentException as exc:
                # It stays recorded (free, owned): reusable, never leaked.
                LOG.error("rollback could not remove mdev %s: %s", uuid, exc)
                record = self.ledger.get(uuid)
                if record is not None and record.state is MdevState.REMOVING:
                    self.ledger.cancel_remove(uuid)
                elif record is not None and record.state is MdevState.CREATING:
                    self.ledger.settle_created(uuid)
        self.ledger.finish_intent(intent)

    def _backend(self, name: str) -> DeviceBackend:
        backend = self.backends.get(name)
        if backend is None:
            raise exception.LedgerError(
                reason=f"backend {name!r} is not installed (accel_agent.backends entry points: "
                f"{', '.join(sorted(self.backends))})"
            )
        return backend

    def _destroy(self, uuid: str) -> None:
        """Unmake one recorded device through the backend that made it."""
        record = self.ledger.get(uuid)
        if record is None:
            raise exception.MdevNotFound(uuid=uuid)
        self._backend(record.backend).destroy(self.writer, _device_ref(record), self.remove_timeout)

    def _unmake_quietly(self, uuid: str) -> None:
        try:
            with contextlib.suppress(exception.MdevNotFound):
                self._destroy(uuid)
        except exception.PrivilegedHelperUnavailable:
            raise  # not undone: its record must stay for recovery
        except exception.AccelAgentException as exc:
            LOG.error("device %s: undoing a failed make failed: %s", uuid, exc)

    def _remove_owned(self, uuid: str) -> bool:
        """Remove one owned, unassigned mdev (rollback and recovery paths).

        False when it is in use (its VFIO group is held, or the remove timed
        out): it stays recorded as a free, owned mdev, never leaked."""
        self.ledger.record_remove_intent(uuid)
        try:
            with contextlib.suppress(exception.MdevNotFound):
                self._destroy(uuid)
        except (exception.MdevInUse, exception.MdevRemoveTimeout) as exc:
            self.ledger.cancel_remove(uuid)
            self._kept_in_use(uuid, exc)
            return False
        self.ledger.forget(uuid)
        return True

    def _kept_in_use(self, uuid: str, exc: exception.AccelAgentException) -> None:
        LOG.warning("mdev %s kept as a free mdev instead of removed: %s", uuid, exc.message)
        self.on_kept_in_use(uuid)

    # --- release / adopt ------------------------------------------------------------

    def release(self, instance: str, remove: bool = False) -> list[str]:
        """Free (or remove) the instance's mdevs; returns their UUIDs.  Idempotent.

        With ``remove``: one commit drops the assignments and records every
        remove intent, the sysfs writes follow, one commit settles them.
        """
        validate_instance_id(instance)
        return self._release_owner(instance, OwnerKind.INSTANCE, remove)

    def _release_owner(self, instance: str, kind: OwnerKind, remove: bool) -> list[str]:
        """``release`` for an instance's allocation or a migration claim."""
        with self._locked():
            records = self.ledger.by_owner(instance, kind)
            if not records:
                return []
            kept: list[str] = []
            # A pool VF always goes back to its driver, its settings reset: it
            # is never kept as a free device (its MAC belonged to a tenant).
            unmade = {r.uuid for r in records if self._backend(r.backend).unmade_on_release}
            removable = [r.uuid for r in records if r.uuid in unmade]
            if remove:
                referenced = self.domains.referenced_uuids()
                if referenced is None:
                    LOG.warning("cannot ask libvirt which mdevs domains use; removing anyway")
                    referenced = set()
                for record in records:
                    if record.uuid in unmade:
                        continue
                    if record.uuid in referenced:
                        LOG.warning(
                            "not removing mdev %s: a libvirt domain still references it",
                            record.uuid,
                        )
                        kept.append(record.uuid)
                        self.on_kept_in_use(record.uuid)
                    else:
                        removable.append(record.uuid)
            # With removes to follow, the closing commit is the durable one.
            with self.ledger.transaction(durable=not removable):
                intent = self.ledger.begin_intent(IntentKind.RELEASE, instance)
                self.ledger.release_owner(instance, kind)
                for uuid in removable:
                    self.ledger.record_remove_intent(uuid, intent_id=intent)
                if not removable:
                    self.ledger.finish_intent(intent)
            self._step("release.released")
            if removable:
                gone, held = self._remove_all(removable)
                with self.ledger.transaction():
                    for uuid in gone:
                        self.ledger.forget(uuid)
                    for uuid in held:
                        self.ledger.cancel_remove(uuid)
                    self.ledger.finish_intent(intent)
                self._step("release.forgotten")
                kept += held
            LOG.info(
                "released %d mdev(s) of %s %s%s",
                len(records),
                "instance" if kind is OwnerKind.INSTANCE else "the migration claim of",
                instance,
                " (removed)" if remove else "",
            )
            if kept and (remove or unmade & set(kept)):
                raise exception.MdevInUse(
                    uuid=", ".join(kept),
                    reason="released but not removed: a domain or a VM still holds it",
                )
            return [r.uuid for r in records]

    def _remove_all(self, uuids: list[str]) -> tuple[list[str], list[str]]:
        """The sysfs removes of recorded remove intents: (gone, still held)."""
        gone: list[str] = []
        held: list[str] = []
        for uuid in uuids:
            try:
                # Already gone (ENOENT) reaches the goal too.
                with contextlib.suppress(exception.MdevNotFound):
                    self._destroy(uuid)
                gone.append(uuid)
            except (exception.MdevInUse, exception.MdevRemoveTimeout) as exc:
                self._kept_in_use(uuid, exc)
                held.append(uuid)
            self._step("release.removed")
        return gone, held

    def commit_claim(self, owner: str) -> Allocation:
        """The migration landed: the claim becomes the instance's allocation."""
        validate_instance_id(owner)
        with self._locked():
            if not self.ledger.by_owner(owner, OwnerKind.CLAIM):
                raise exception.MigrationClaimNotFound(instance=owner)
            held = self.ledger.by_owner(owner, OwnerKind.INSTANCE)
            if held:
                raise exception.InstanceAlreadyAllocated(instance=owner, count=len(held))
            self.ledger.commit_claim(owner)
            LOG.info("migration claim of %s committed", owner)
            return self.allocation(owner)

    def abort_claim(self, owner: str, remove: bool = False) -> list[str]:
        """The migration failed or was cancelled: free the claimed mdevs
        (kept for reuse), or with ``remove`` remove them like ``release``
        does.  Idempotent.

        Why remove: a failed incoming migration can leave the device in the
        state the failed load left it (seen on the real kernel: mtty keeps its
        RESUMING state across close, and the next incoming migration into that
        mdev fails); a new mdev starts clean."""
        validate_instance_id(owner)
        if remove:
            return self._release_owner(owner, OwnerKind.CLAIM, remove=True)
        with self._locked():
            released = self.ledger.release_owner(owner, OwnerKind.CLAIM)
            if released:
                LOG.info("migration claim of %s aborted, %d mdev(s) freed", owner, len(released))
            return [r.uuid for r in released]

    def release_expired_claims(self) -> list[str]:
        with self._locked():
            return self._release_expired_claims()

    def _release_expired_claims(self) -> list[str]:
        # Callers hold the lock (the file lock is not re-entrant).
        expired = self.ledger.expired_claims()
        for record in expired:
            self.ledger.release(record.uuid)
            LOG.warning(
                "migration claim of %s on mdev %s expired; freed", record.owner, record.uuid
            )
        return [r.uuid for r in expired]

    def adopt(self, uuid: str) -> MdevRecord:
        """Take ownership of a foreign mdev so the agent may reuse or remove it."""
        text = uuid.strip().lower() if isinstance(uuid, str) else ""
        if not scanner.is_canonical_uuid(text):
            raise exception.InvalidMdevUUID(uuid=uuid, where="", reason="not a UUID")
        with self._locked():
            snapshot = self.scan()
            mdev = snapshot.mdevs.get(text)
            if mdev is None:
                raise exception.MdevNotFound(uuid=text)
            if mdev.mdev_type is None:
                raise exception.MdevInUse(uuid=text, reason="its mdev_type cannot be read")
            existing = self.ledger.get(text)
            if existing is not None:
                return existing
            record = self.ledger.adopt(text, mdev.parent, mdev.mdev_type, backend=mdev.backend)
            LOG.info("adopted mdev %s (%s on %s)", text, mdev.mdev_type, mdev.parent)
            return record

    # --- takeover from libvirt (Nova) ----------------------------------------------

    def takeover(self, adopt_unused: bool = False, dry_run: bool = False) -> TakeoverPlan:
        """Take over the mdevs of a host Nova ran: every libvirt domain's mdevs
        are adopted and assigned to the instance named by the domain's UUID
        (Nova's instance UUID); with ``adopt_unused`` the foreign mdevs no
        domain uses are adopted free.  All or nothing: any problem (an mdev
        missing, of a type the config does not give its parent, used by two
        domains or owned by another instance) raises TakeoverRefused and
        changes nothing.  ``dry_run`` returns the plan, problems included,
        and changes nothing.  Idempotent: a second run finds nothing to do."""
        domains = self.domains.mdev_domains()  # LibvirtUnavailable: nothing done
        with self._locked():
            snapshot = self.scan()
            plan = self._plan_takeover(snapshot, domains, adopt_unused, dry_run)
            if dry_run:
                return plan
            if plan.problems:
                raise exception.TakeoverRefused(reason="; ".join(plan.problems))
            with self.ledger.transaction():
                for domain in plan.domains:
                    for mdev in domain["mdevs"]:
                        if mdev["action"] == "adopt":
                            self.ledger.adopt(
                                mdev["uuid"], mdev["parent"], mdev["mdev_type"],
                                backend=snapshot.mdevs[mdev["uuid"]].backend,
                            )
                        if mdev["action"] in ("adopt", "assign"):
                            self.ledger.assign(mdev["uuid"], domain["uuid"])
                for mdev in plan.unused:
                    if mdev["action"] == "adopt":
                        self.ledger.adopt(
                            mdev["uuid"], mdev["parent"], mdev["mdev_type"],
                            backend=snapshot.mdevs[mdev["uuid"]].backend,
                        )
            plan.applied = True
        for domain in plan.domains:
            taken = [m["uuid"] for m in domain["mdevs"] if m["action"] != "none"]
            if taken:
                LOG.info(
                    "took over mdev(s) %s of libvirt domain %s as instance %s",
                    ", ".join(taken), domain["name"], domain["uuid"],
                )
        adopted = [m["uuid"] for m in plan.unused if m["action"] == "adopt"]
        if adopted:
            LOG.info("adopted %d unused mdev(s) as free: %s", len(adopted), ", ".join(adopted))
        return plan

    def _plan_takeover(
        self,
        snapshot: HostSnapshot,
        domains: list[Any],
        adopt_unused: bool,
        dry_run: bool,
    ) -> TakeoverPlan:
        plan = TakeoverPlan(dry_run=dry_run, adopt_unused=adopt_unused)
        users: dict[str, list[str]] = {}
        for domain in domains:
            for uuid in domain.mdevs:
                users.setdefault(uuid, []).append(f"{domain.name} ({domain.uuid})")
        for uuid, names in sorted(users.items()):
            if len(names) > 1:
                plan.problems.append(f"mdev {uuid} is used by {len(names)} domains: "
                                     + ", ".join(names))
        for domain in domains:
            who = f"domain {domain.name} ({domain.uuid})"
            try:
                validate_instance_id(domain.uuid)
            except exception.AccelAgentException as exc:
                plan.problems.append(f"{who}: its UUID is no instance id: {exc.message}")
            entries = []
            for uuid in domain.mdevs:
                entry = self._takeover_entry(snapshot, uuid, domain.uuid, who, plan.problems)
                if entry is not None:
                    entries.append(entry)
            plan.domains.append({"uuid": domain.uuid, "name": domain.name, "mdevs": entries})
        for uuid, mdev in sorted(snapshot.mdevs.items()):
            if uuid in users or self.ledger.get(uuid) is not None:
                continue
            entry = {"uuid": uuid, "parent": mdev.parent, "mdev_type": mdev.mdev_type,
                     "action": "foreign"}
            if adopt_unused:
                configured = self.policy.type_for_name(mdev.parent, snapshot.parents)
                if mdev.mdev_type is not None and configured == mdev.mdev_type:
                    entry["action"] = "adopt"
                else:
                    entry["reason"] = (
                        f"its type {mdev.mdev_type} is not the one configured for "
                        f"{mdev.parent} ({configured or 'none'})"
                    )
            plan.unused.append(entry)
        return plan

    def _takeover_entry(
        self, snapshot: HostSnapshot, uuid: str, instance: str, who: str, problems: list[str]
    ) -> dict[str, Any] | None:
        mdev = snapshot.mdevs.get(uuid)
        if mdev is None:
            problems.append(
                f"{who} uses mdev {uuid}, which does not exist on this host "
                "(start the domain, or re-create the mdev, and run the takeover again)"
            )
            return None
        entry = {"uuid": uuid, "parent": mdev.parent, "mdev_type": mdev.mdev_type}
        configured = self.policy.type_for_name(mdev.parent, snapshot.parents)
        if mdev.mdev_type is None:
            problems.append(f"{who} uses mdev {uuid}, whose type cannot be read")
        elif configured != mdev.mdev_type:
            problems.append(
                f"{who} uses mdev {uuid} of type {mdev.mdev_type} on parent {mdev.parent}, "
                f"but the config gives {mdev.parent} "
                + (f"type {configured}" if configured else "no type")
                + f" (add it to [mdev_{mdev.mdev_type}] device_addresses, with "
                f"{mdev.mdev_type} in [devices] enabled_mdev_types)"
            )
        record = self.ledger.get(uuid)
        if record is None:
            entry["action"] = "adopt"
        elif record.owner == instance and record.owner_kind is OwnerKind.INSTANCE:
            entry["action"] = "none"
        elif record.owner is not None:
            problems.append(
                f"{who} uses mdev {uuid}, which the agent has assigned to "
                f"{record.owner_kind} {record.owner}"
            )
            entry["action"] = "none"
        elif record.state is not MdevState.PRESENT:
            problems.append(f"{who} uses mdev {uuid}, which the agent is {record.state}")
            entry["action"] = "none"
        else:
            entry["action"] = "assign"
        return entry

    # --- recover ----------------------------------------------------------------------

    def recover(self, full_check: bool = False) -> RecoveryReport:
        """Make sysfs and the ledger agree again (start-up, reboot, parent back).

        Refuses, changing nothing, when an assigned mdev would have to be
        re-created with a type the config no longer gives its parent, or
        (``full_check``: SQLite's integrity_check first) when the ledger is
        corrupt.
        """
        report = RecoveryReport()
        if full_check:
            self.ledger.verify(full=True)
        with self._locked():
            self._prepare_hosts()
            snapshot = self.scan()
            devices = _Devices(
                snapshot,
                {n: b.outside_devices() for n, b in self.backends.items() if b.outside_snapshot},
            )
            self._check_recreatable(devices)
            self._settle_interrupted(devices, report)
            report.released_claims += self._release_expired_claims()
            self._return_free_vfs(report)
            self._recreate_missing(devices, report)
            owned = {r.uuid for r in self.ledger.all()}
            # What this recovery removed is in the snapshot it started from,
            # and recorded nowhere now: gone, not foreign.
            gone = set(report.removed)
            report.foreign = sorted(
                u for u in snapshot.mdevs if u not in owned and u not in gone
            )
            report.unrecorded = self.unrecorded(snapshot, report.foreign)
        for uuid in report.foreign:
            LOG.info("foreign mdev %s: reported and counted, never touched", uuid)
        if report.unrecorded:
            LOG.warning("%s", unrecorded_warning(str(self.ledger.path), report.unrecorded))
        return report

    def unrecorded(self, snapshot: HostSnapshot, foreign: list[str]) -> list[str]:
        """The foreign mdevs that look like the agent's own, when its ledger
        was lost (the state directory shows the agent ran here, but this
        process had to create the ledger): of the type the config gives their
        parent, so the agent could have made them.

        The agent cannot know more: its UUIDs are random (uuid4) and sysfs
        records no creator, so its lost mdevs and hand-made ones of the
        configured type look the same; and a state directory wiped whole
        looks like a first start (no warning).  They stay foreign (never
        touched) until an operator adopts them; the warning says so."""
        if not self.ledger.lost:
            return []
        found = []
        for uuid in foreign:
            mdev = snapshot.mdevs[uuid]
            parent = snapshot.parents.get(mdev.parent)
            if parent is not None and mdev.mdev_type and self.policy.type_for(parent) == (
                mdev.mdev_type
            ):
                found.append(uuid)
        return found

    def _prepare_hosts(self) -> None:
        """What each backend needs first (a pool's VFs enabled after a reboot)."""
        for backend in self.backends.values():
            try:
                backend.prepare_host()
            except exception.AccelAgentException as exc:
                LOG.warning("backend %s cannot prepare the host: %s", backend.name, exc)

    def _configured_type(self, record: MdevRecord, devices: _Devices) -> str | None:
        if record.backend in devices.outside:
            found = devices.outside[record.backend].get(record.parent)
            return found[0] if found else None
        return self.policy.type_for_name(record.parent, devices.snapshot.parents)

    def _check_recreatable(self, devices: _Devices) -> None:
        errors: list[exception.AccelAgentException] = []
        for record in self.ledger.assigned():
            if devices.exists(record) or record.state is not MdevState.PRESENT:
                continue
            if record.backend != "mdev" and not devices.has_parent(record):
                # A VF's configured type is its GPU's (its pool's); with the VF
                # gone (SR-IOV disabled) it cannot be told: it waits for its
                # parent, and is checked when that comes back.
                continue
            if self._configured_type(record, devices) != record.mdev_type:
                errors.append(
                    exception.RecoveryTypeNotConfigured(
                        uuid=record.uuid,
                        instance=record.owner,
                        mdev_type=record.mdev_type,
                        parent=record.parent,
                    )
                )
        if errors:
            raise exception.ConfigErrors(errors)

    def _settle_interrupted(self, devices: _Devices, report: RecoveryReport) -> None:
        for record in self.ledger.unsettled():
            exists = devices.exists(record)
            if self._backend(record.backend).unmade_on_release:
                # A pool VF is never kept free: whatever step its prepare or
                # unprepare reached (settings set, on vfio-pci or not), it goes
                # back to its driver with its settings reset (idempotent).
                if self._remove_owned(record.uuid):
                    (report.removed if exists else report.forgotten).append(record.uuid)
                else:
                    report.kept_in_use.append(record.uuid)
                continue
            if record.state is MdevState.CREATING:
                if exists:
                    # The write happened, the process died before recording it:
                    # ours, free, reusable.
                    self.ledger.settle_created(record.uuid)
                    report.settled.append(record.uuid)
                else:
                    self.ledger.forget(record.uuid)
                    report.forgotten.append(record.uuid)
            elif record.state is MdevState.REMOVING:
                if exists:
                    if self._remove_owned(record.uuid):
                        report.removed.append(record.uuid)
                    else:
                        report.kept_in_use.append(record.uuid)
                else:
                    self.ledger.forget(record.uuid)
                    report.forgotten.append(record.uuid)
        for intent in self.ledger.pending_intents():
            # Assignments and the intent's end commit together, so an intent
            # still here never assigned anything: ending it frees its rows.
            self.ledger.finish_intent(intent.id)

    def _return_free_vfs(self, report: RecoveryReport) -> None:
        """Pool VFs recorded free (a release that found one in use): back to
        their driver now if nothing holds them any more."""
        for record in self.ledger.all():
            if record.free and self._backend(record.backend).unmade_on_release:
                if self._remove_owned(record.uuid):
                    report.removed.append(record.uuid)
                else:
                    report.kept_in_use.append(record.uuid)

    def _recreate_missing(self, devices: _Devices, report: RecoveryReport) -> None:
        for record in self.ledger.all():
            if devices.exists(record) or record.state is not MdevState.PRESENT:
                continue
            if not devices.has_parent(record):
                LOG.warning("mdev %s waits for parent %s to come back", record.uuid, record.parent)
                report.waiting_for_parent.append(record.uuid)
                continue
            if not record.assigned and self._configured_type(record, devices) != record.mdev_type:
                # A free mdev of a type the config dropped: nobody needs it back.
                self.ledger.forget(record.uuid)
                report.forgotten.append(record.uuid)
                continue
            # Same UUID, same parent, same type (a VF: same settings), by the
            # backend that made it.
            self._backend(record.backend).make(
                self.writer, record.parent, record.mdev_type, record.uuid, record.settings
            )
            report.recreated.append(record.uuid)
            LOG.info(
                "re-created mdev %s (%s on %s) for %s",
                record.uuid,
                record.mdev_type,
                record.parent,
                record.owner or "reuse",
            )
