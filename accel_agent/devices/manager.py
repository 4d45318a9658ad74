"""The one place that decides which devices exist and who holds them: a small
facade over the use cases, each in a module of its own, all going through one
operation protocol.

docs/design.md §5, §15.  The manager holds what every use case needs (the ledger, the
privileged writer, the backends, the policy, libvirt's domains, the host
scan) and answers the reads; each mutation is a use case:

* ``allocations``: allocate and release (the mdev-only shortcut);
* ``attach``: every accelerator of an instance in one call;
* ``claims``: live-migration claims, commit, abort, expiry;
* ``takeover``: adopt a foreign device, take over a host Nova ran;
* ``recovery``: make sysfs and the ledger agree again.

``planning`` says where devices go; ``protocol`` runs every change: the lock
(a thread lock plus a file lock in ``state_dir``, so an offline ``accelctl``
and the daemon never interleave), the intent before every sysfs write, the
settlement after, the rollback, and the crash points the tests kill at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from accel_agent import backends as backends_mod
from accel_agent import exception
from accel_agent.backends.base import DeviceBackend, DeviceWriter
from accel_agent.backends.host import HostRescanner
from accel_agent.devices import allocations, attach, claims, layout, protocol, recovery, takeover
from accel_agent.devices import inventory as inventory_mod
from accel_agent.devices import nodedevs as nodedevs_mod
from accel_agent.devices.domains import DomainReferences, NoDomains
from accel_agent.devices.ledger import DeviceRecord, Ledger, OwnerKind
from accel_agent.devices.policy import DevicePolicy

if TYPE_CHECKING:
    from accel_agent.devices import requests as requests_mod
    from accel_agent.devices.results import Allocation, Attachment, RecoveryReport, TakeoverPlan
    from accel_agent.libvirt_xml.devices import DeviceDescription
    from accel_agent.nvml.base import Nvml
    from accel_agent.sysfs.model import HostSnapshot, Parent


class DeviceManager:
    def __init__(
        self,
        *,
        sysfs_root: str,
        policy: DevicePolicy,
        host: str,
        ledger: Ledger,
        writer: DeviceWriter,
        domains: DomainReferences | None = None,
        remove_timeout: float = 30.0,
        on_step: Callable[[str], None] | None = None,
        on_kept_in_use: Callable[[str], None] | None = None,
        backends: Mapping[str, DeviceBackend] | None = None,
        nodedevs: nodedevs_mod.NodeDevices | None = None,
        define_mdevs: bool = False,
        nvml: Nvml | None = None,
        nvml_conf: Any = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        # Every device model this host may have; the scan says which serves
        # which parent (Parent.backend), the ledger which made which device.
        self.backends = backends if backends is not None else backends_mod.builtin()
        self.policy = policy
        self.host = host
        self.ledger = ledger
        # Every privileged write goes through the counting writer (mutations).
        self._writes = 0
        self._forgotten = 0
        self.writer = writer
        self.domains = domains or NoDomains()
        # libvirt's mdev definitions: given (tests), or those at the domains'
        # URI (a reload that swaps the domains swaps them too).
        self._nodedevs = nodedevs
        self._derived_nodedevs: nodedevs_mod.NodeDevices | None = None
        # [libvirt] define_mdevs: define each mdev the agent makes, autostart off.
        self.define_mdevs = define_mdevs
        # Operations run so far (protocol.operation): what the listings'
        # copy of libvirt's definitions is checked against.
        self.operations = 0
        # uuid -> why its last remove was refused (in use), as logged: a
        # refusal is logged once per device and reason (protocol/remove.py).
        self.refused_removes: dict[str, str] = {}
        self.remove_timeout = remove_timeout
        # Crash tests hook here to kill the process between two steps.
        self.on_step = on_step or (lambda step: None)
        # Told the UUID of every device a remove kept because it is in use (metrics).
        self.on_kept_in_use = on_kept_in_use or (lambda uuid: None)
        # Told after an operation that changed something (mutations moved),
        # whatever its outcome: the daemon rescans.
        self.on_changed: Callable[[], None] = lambda: None
        # The thread half of the operation's lock (protocol.operation).
        self.thread_lock = threading.RLock()
        # NVIDIA's management library for this sysfs root (accel_agent.nvml):
        # given (tests), else found from the tree on first use (a host with no
        # mixed-size layout never asks it).
        self._nvml = nvml
        self._nvml_conf = nvml_conf
        # GPU -> why its mixed-size layout is not in place, as the last
        # converge found it (devices/mixed_layout.py; health's layout.short).
        self.mixed_reasons: dict[str, str] = {}
        # The agent keeps what the backends learn of the host beside its ledger.
        self._rescanner = HostRescanner(
            sysfs_root, self.backends, str(ledger.path.parent), persist=True
        )

    @property
    def writer(self) -> DeviceWriter:
        return self._writer

    @writer.setter
    def writer(self, value: DeviceWriter) -> None:
        self._writer = _CountingWriter(self, value)

    @property
    def nvml(self) -> Nvml:
        if self._nvml is None:
            from accel_agent import nvml as nvml_mod

            self._nvml = nvml_mod.for_sysfs_root(self.sysfs_root, self._nvml_conf)
        return self._nvml

    @nvml.setter
    def nvml(self, value: Nvml | None) -> None:
        self._nvml = value

    def note_write(self) -> None:
        """A privileged write that is not the device writer's (NVML's): a change."""
        self._writes += 1

    @property
    def mutations(self) -> int:
        """Changes this process made so far: the ledger's committed writes and
        every privileged write attempted (done or not: the host may have
        changed), less what :meth:`forget_changes_since` took back.  An
        operation that left it where it was changed nothing
        (protocol.operation asks for no rescan then)."""
        return self.ledger.commits + self._writes - self._forgotten

    def forget_changes_since(self, mark: int) -> None:
        """What happened since ``mark`` (a :attr:`mutations` value) left
        everything as it was: a remove refused because the device is in use
        (its intent recorded, the write refused, the intent cancelled)."""
        self._forgotten += max(0, self.mutations - mark)

    @property
    def nodedevs(self) -> nodedevs_mod.NodeDevices:
        if self._nodedevs is not None:
            return self._nodedevs
        uri = getattr(self.domains, "uri", "")
        if self._derived_nodedevs is None or self._derived_nodedevs.uri != uri:
            self._derived_nodedevs = nodedevs_mod.for_uri(uri)
        return self._derived_nodedevs

    @nodedevs.setter
    def nodedevs(self, value: nodedevs_mod.NodeDevices | None) -> None:
        self._nodedevs = value

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The operation's lock, for a caller that must check and change the
        policy atomically with respect to allocations (a config reload)."""
        return protocol.operation(self)

    def backend(self, name: str) -> DeviceBackend:
        found = self.backends.get(name)
        if found is None:
            raise exception.BackendNotInstalled(
                name=name, installed=", ".join(sorted(self.backends)) or "none"
            )
        return found

    def device_kind(self, backend: str) -> str:
        """What a device of ``backend`` is called in log lines and messages
        (``DeviceBackend.kind``: an mdev, a vGPU VF, a pool VF); "device" for
        a backend that is not installed."""
        found = self.backends.get(backend)
        return found.kind if found is not None else "device"

    def device_kinds(self, backends: Iterable[str]) -> str:
        """Devices of ``backends`` in a log line's count: "mdev(s)" when they
        are all of one kind, "device(s)" when of several (or none)."""
        kinds = {self.device_kind(name) for name in backends}
        return f"{kinds.pop()}(s)" if len(kinds) == 1 else "device(s)"

    # --- the host ---------------------------------------------------------------------

    def scan(self) -> HostSnapshot:
        """Fresh parents, devices and counters of the configured types: all any
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
        return set(self.policy.types_on(parent))

    def set_policy(self, policy: DevicePolicy) -> None:
        with self.thread_lock:
            self.policy = policy

    def scanned_records(self, records: Iterable[DeviceRecord]) -> list[DeviceRecord]:
        """The records of devices the host scan sees: not a pool's VFs, which
        their backend reports (they are never "missing" from the snapshot)."""
        return [
            r
            for r in records
            if not getattr(self.backends.get(r.backend), "outside_snapshot", False)
        ]

    def free_uuids(self) -> frozenset[str]:
        """Devices no instance or claim holds: free ones, and a standing
        layout's (an allocation takes those first: they are room, not use)."""
        return frozenset(
            r.uuid for r in self.ledger.all()
            if r.free or (r.owner_kind is OwnerKind.STANDING and r.intent_id is None)
        )

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
        base = inventory_mod.reported(base, self.policy)
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

    # --- what guests are given ------------------------------------------------------------

    def guest_devices(self, records: Iterable[DeviceRecord]) -> list[DeviceDescription]:
        """What a guest is given for each recorded device (``<hostdev type='mdev'>``
        by UUID, a VF by PCI address, ...), each said by the backend that made it,
        in the records' order."""
        return [self.backend(r.backend).guest_device(protocol.device_ref(r)) for r in records]

    def pci_address(self, record: DeviceRecord) -> str | None:
        """The PCI address a guest is given for a recorded device, None when the
        guest is given it by UUID (an mdev)."""
        return self.backend(record.backend).pci_address(protocol.device_ref(record))

    # --- the use cases --------------------------------------------------------------------

    def allocation(self, instance: str) -> Allocation:
        return allocations.allocation(self, instance)

    def allocate(
        self, instance: str, count: int, parent: str | None = None, device_type: str | None = None
    ) -> Allocation:
        return allocations.allocate(self, instance, count, parent, device_type)

    def release(self, instance: str, remove: bool = False) -> list[str]:
        return allocations.release(self, instance, remove)

    def attach(
        self, instance: str, requests: Sequence[requests_mod.AttachRequest]
    ) -> Attachment:
        return attach.attach(self, instance, requests)

    def attachment(self, instance: str) -> Attachment:
        return attach.attachment(self, instance)

    def claim(self, owner: str, sources: dict[str, str], expires_at: float) -> dict[str, str]:
        return claims.claim(self, owner, sources, expires_at)

    def commit_claim(self, owner: str) -> Allocation:
        return claims.commit(self, owner)

    def abort_claim(self, owner: str, remove: bool = False) -> list[str]:
        return claims.abort(self, owner, remove)

    def release_expired_claims(self) -> list[str]:
        with protocol.operation(self):
            return claims.release_expired(self)

    def adopt(self, uuid: str) -> DeviceRecord:
        return takeover.adopt(self, uuid)

    def takeover(self, adopt_unused: bool = False, dry_run: bool = False) -> TakeoverPlan:
        return takeover.takeover(self, adopt_unused, dry_run)

    def recover(self, full_check: bool = False) -> RecoveryReport:
        """Recovery, then the standing layouts where there are any (what a
        reboot reset: recovery re-creates the recorded devices, the layout
        fills the rest)."""
        report = recovery.recover(self, full_check)
        if layout.has_layouts(self):
            placed = layout.converge(self)
            report.layout_made = placed.created + placed.adopted
            report.layout_removed = placed.removed
            report.layout_draining = placed.draining
        return report

    def converge_layout(self) -> layout.LayoutReport:
        return layout.converge(self)

    def unrecorded(self, snapshot: HostSnapshot, foreign: list[str]) -> list[str]:
        return recovery.unrecorded(self, snapshot, foreign)


class _CountingWriter:
    """The manager's writer, counting every privileged write it is asked for
    (:attr:`DeviceManager.mutations`); anything else is the writer's own."""

    # Every write of the backends' writer protocols (backends.mdev.MdevWriter,
    # nvidia_vfio.VgpuWriter, sriov_vf.PciWriter: tests/unit/test_backends_loading.py).
    WRITES = frozenset({
        "create", "remove", "set_vgpu_type", "set_vgpu_placement", "clear_vgpu_type",
        "set_num_vfs", "bind_vfio", "unbind_vfio",
    })

    def __init__(self, manager: DeviceManager, writer: DeviceWriter) -> None:
        self._manager = manager
        self.inner = writer.inner if isinstance(writer, _CountingWriter) else writer

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name not in self.WRITES:
            return found
        manager = self._manager

        def counted(*args: Any, **kwargs: Any) -> Any:
            manager._writes += 1  # attempted: done or not, the host may have changed
            return found(*args, **kwargs)

        return counted
