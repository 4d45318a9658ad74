"""Immutable snapshot of a host's mdev state, as read from sysfs.

"mdev" in the names is historical: a parent is whatever device a backend
(``accel_agent.backends``) makes devices on, and an :class:`Mdev` whatever
device it made.  For the ``mdev`` backend they are the kernel's mdev parents
and mediated devices; for ``nvidia_vfio`` a parent is an SR-IOV VF of an
NVIDIA GPU and a device is that VF once typed.  ``backend`` says which.

Everything here is frozen: a snapshot is a value that policy, inventory and
the manager can share between threads without locks.  A rescan produces a
new snapshot; nothing mutates an old one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class MdevType:
    """One ``mdev_supported_types/<type_id>`` directory of a parent."""

    type_id: str
    device_api: str
    available_instances: int
    name: str | None = None
    description: str | None = None
    # The most devices of this type one physical GPU holds, when the backend
    # knows it from elsewhere than ``description`` (vendor-VFIO VFs).
    per_gpu_limit: int | None = None
    # False: the type directory has no ``create`` file (the kernel puts one
    # in every mdev type), so nothing can be made from it: the scan then sets
    # ``available_instances`` to 0, whatever the counter says, and a rescan
    # keeps it there without reading the counter.
    has_create: bool = True

    @property
    def description_fields(self) -> Mapping[str, str]:
        """``description`` as key/value pairs (NVIDIA: "a=1, b=2"; i915: "a: 1"
        lines).  Parsed on use: a scan reads thousands of types and needs few."""
        from accel_agent.sysfs.scanner import parse_description

        return MappingProxyType(parse_description(self.description))

    @property
    def max_instance(self) -> int | None:
        """NVIDIA's per-physical-GPU limit: ``per_gpu_limit``, else the
        ``max_instance=`` of ``description`` (SR-IOV VFs)."""
        if self.per_gpu_limit is not None:
            return self.per_gpu_limit
        from accel_agent.sysfs import attributes

        # Bounded like every number from sysfs: "٣".isdigit() is True too.
        return attributes.parse_int_or_none(
            self.description_fields.get("max_instance"), attributes.MAX_INSTANCES
        )


@dataclass(frozen=True, slots=True)
class Parent:
    """A device registered with the mdev core (``class/mdev_bus/<name>``)."""

    name: str
    # Resolved device directory, relative to the sysfs root
    # ("devices/pci0000:80/0000:80:01.0/0000:84:00.0").
    device_path: str
    pci_address: str | None
    # The card this parent lives on: the PF's address for an SR-IOV VF
    # (``physfn`` link), the parent itself otherwise.  Capacity limits are
    # per physical GPU, never per VF.
    physical_gpu: str
    physfn: str | None
    numa_node: int | None
    driver: str | None
    vendor_id: str | None
    device_id: str | None
    types: Mapping[str, MdevType]
    # The backend that found it and makes devices on it (accel_agent.backends).
    backend: str = "mdev"

    @property
    def is_virtual(self) -> bool:
        return self.pci_address is None


@dataclass(frozen=True, slots=True)
class Mdev:
    """An existing mediated device (``bus/mdev/devices/<uuid>``)."""

    uuid: str
    parent: str
    # None when the ``mdev_type`` link is missing or dangling.
    mdev_type: str | None
    iommu_group: int | None
    backend: str = "mdev"
    # The device's PCI address when it is a PCI function (a typed VF);
    # an mdev is known by its UUID alone.
    address: str | None = None
    # A vGPU's placement on its GPU (``nvidia/placement_id`` of a typed VF:
    # an offset in the GPU's placement units, docs/design.md §16); None where
    # the device has none or it cannot be read.
    placement_id: int | None = None
    # A MIG-backed vGPU's GPU instance (``nvidia/gpu_instance_id`` of a typed
    # VF, issue 37); None where it is 0 (a time-sliced vGPU), absent or unreadable.
    gpu_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    root: str
    parents: Mapping[str, Parent]
    mdevs: Mapping[str, Mdev]
    # One line per item the scan skipped (unreadable, garbage, dangling).
    warnings: tuple[str, ...] = ()
    # parent name -> its mdevs sorted by UUID; built once so that per-type
    # lookups over thousands of types stay linear.
    by_parent: Mapping[str, tuple[Mdev, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def build(
        cls,
        root: str,
        parents: Mapping[str, Parent],
        mdevs: Mapping[str, Mdev],
        warnings: tuple[str, ...] = (),
    ) -> HostSnapshot:
        """A snapshot with its ``by_parent`` index."""
        by_parent: dict[str, list[Mdev]] = {}
        for mdev in sorted(mdevs.values(), key=lambda m: m.uuid):
            by_parent.setdefault(mdev.parent, []).append(mdev)
        return cls(
            root=root,
            parents=MappingProxyType(dict(parents)),
            mdevs=MappingProxyType(dict(mdevs)),
            warnings=tuple(warnings),
            by_parent=MappingProxyType({k: tuple(v) for k, v in by_parent.items()}),
        )

    def merged(
        self,
        parents: Mapping[str, Parent],
        mdevs: Mapping[str, Mdev],
        warnings: tuple[str, ...] = (),
    ) -> HostSnapshot:
        """This snapshot with another backend's parents and devices added
        (``self`` itself when there are none).  A name both claim stays the
        first's, with a warning: a device cannot be two models at once."""
        if not parents and not mdevs and not warnings:
            return self
        clash = sorted(set(parents) & set(self.parents))
        notes = tuple(f"parent {name} found by two backends; kept as {self.parents[name].backend}"
                      for name in clash)
        return HostSnapshot.build(
            self.root,
            {**parents, **self.parents},
            {**mdevs, **self.mdevs},
            self.warnings + tuple(warnings) + notes,
        )

    def mdevs_on(self, parent: str, mdev_type: str | None = None) -> list[Mdev]:
        on_parent = self.by_parent.get(parent, ())
        if mdev_type is None:
            return list(on_parent)
        return [m for m in on_parent if m.mdev_type == mdev_type]

    def parents_of_gpu(self, physical_gpu: str) -> list[Parent]:
        return [p for p in self.parents.values() if p.physical_gpu == physical_gpu]
