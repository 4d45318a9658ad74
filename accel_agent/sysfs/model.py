"""Immutable snapshot of a host's mdev state, as read from sysfs.

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

    @property
    def description_fields(self) -> Mapping[str, str]:
        """``description`` as key/value pairs (NVIDIA: "a=1, b=2"; i915: "a: 1"
        lines).  Parsed on use: a scan reads thousands of types and needs few."""
        from accel_agent.sysfs.scanner import parse_description

        return MappingProxyType(parse_description(self.description))

    @property
    def max_instance(self) -> int | None:
        """NVIDIA's per-physical-GPU limit from ``description`` (SR-IOV VFs)."""
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

    def mdevs_on(self, parent: str, mdev_type: str | None = None) -> list[Mdev]:
        on_parent = self.by_parent.get(parent, ())
        if mdev_type is None:
            return list(on_parent)
        return [m for m in on_parent if m.mdev_type == mdev_type]

    def parents_of_gpu(self, physical_gpu: str) -> list[Parent]:
        return [p for p in self.parents.values() if p.physical_gpu == physical_gpu]
