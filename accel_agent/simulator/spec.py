"""Declarative, JSON-serialisable description of a simulated mdev host.

A :class:`HostSpec` says *what hardware exists*: mdev parents (PCI GPUs, SR-IOV
VFs, virtual sample parents such as ``mtty``), the types each offers and how
their ``available_instances`` counters behave (the count *policy*), bare PCI
devices (SR-IOV PFs that are not mdev parents themselves), mdevs that already
exist at "boot", and SR-IOV PFs whose VFs come and go with ``sriov_numvfs``
(:class:`SriovPfSpec`: a NIC such as igb, or an NVIDIA GPU whose VFs are typed
through ``nvidia/current_vgpu_type``, see :mod:`.pci` and :mod:`.nvidia_vfio`).
:class:`~accel_agent.simulator.model.SimulatedHost` turns a spec into a live,
kernel-like sysfs model.

Specs are frozen and validated on construction, so a bad spec fails where it
is written (a profile builder, ``from_dict`` on a user's JSON file) with a
message naming the offending field, not later inside the model.  The field
checks live in :mod:`.spec_fields`, the SR-IOV PF and vGPU type specs live in
:mod:`.spec_sriov` and are importable from here like every spec.
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accel_agent.simulator.spec_fields import (
    canonical_pci,
    canonical_uuid,
    hex_id,
    integer,
    invalid,
    json_fields,
    sysfs_name,
)
from accel_agent.simulator.spec_sriov import MAX_VFS, SriovPfSpec, VgpuTypeSpec
from accel_agent.sysfs import address

# The spec's public names, wherever they are defined.
__all__ = [
    "DEFAULT_MDEV_DRIVERS", "DEVICE_APIS", "FALLBACK_MDEV_DRIVER", "KINDS", "MAX_VFS", "POLICIES",
    "POLICIES_NEEDING_CAPACITY", "POLICIES_NEEDING_MAX", "HostSpec", "MdevSpec", "ParentSpec",
    "PciDeviceSpec", "SriovPfSpec", "TypeSpec", "VgpuTypeSpec", "canonical_pci", "canonical_uuid",
    "new_uuid",
]


# How a parent's available_instances counters behave (docs/design.md §4.2, §8.1):
#   independent        every type has its own max_instances, types do not interact
#   shared             one pool per parent in weight units (i915 GVT-g)
#   global             one pool shared by every parent with the same ``pool`` name (mtty ports)
#   core               the mdev core's per-parent counter shared by all types (mdpy, ccw, ap);
#                      exhaustion gives EUSERS
#   nvidia-equal-size  classic NVIDIA PF: the first mdev locks the pGPU to its type
#   nvidia-vf          NVIDIA SR-IOV VF parents: 0/1 per VF, per-physfn budget of max_instance
POLICIES = ("independent", "shared", "global", "core", "nvidia-equal-size", "nvidia-vf")
# Policies whose types need a per-type limit (explicit or ``max_instance=`` in the description).
POLICIES_NEEDING_MAX = frozenset({"independent", "nvidia-equal-size", "nvidia-vf"})
# Policies whose parent needs a ``capacity`` (pool size in weight units / core counter).
POLICIES_NEEDING_CAPACITY = frozenset({"shared", "global", "core"})
# The kernel's VFIO_DEVICE_API_*_STRING values.
DEVICE_APIS = ("vfio-pci", "vfio-platform", "vfio-amba", "vfio-ccw", "vfio-ap")
KINDS = ("pci", "virtual")

# Which driver ends up bound to an mdev (the mdev's ``driver`` link) per parent driver.
DEFAULT_MDEV_DRIVERS = {"nvidia": "nvidia-vgpu-vfio", "mtty": "mtty", "mdpy": "mdpy"}
FALLBACK_MDEV_DRIVER = "vfio_mdev"

_MAX_INSTANCE_RE = re.compile(r"(?:^|[\s,])max_instance=(\d+)")


@dataclass(frozen=True)
class TypeSpec:
    """One ``mdev_supported_types/<type_id>`` directory.

    ``name``/``description`` of None mean the attribute file is absent (the ABI makes
    both optional; mtty has no description).  ``max_instances`` is the per-type limit
    for the independent / nvidia-* policies (for nvidia-vf it is the budget per
    physical GPU); when None it is parsed from ``max_instance=N`` in the description,
    like the real NVIDIA driver reports it.  ``weight`` is how many pool units one
    instance uses under the shared / global policies.
    """

    type_id: str
    device_api: str = "vfio-pci"
    name: str | None = None
    description: str | None = None
    max_instances: int | None = None
    weight: int = 1

    def __post_init__(self) -> None:
        sysfs_name(self.type_id, "type_id")
        if self.device_api not in DEVICE_APIS:
            raise invalid(
                f"type {self.type_id}: device_api {self.device_api!r} not in {DEVICE_APIS}")
        for attr in ("name", "description"):
            value = getattr(self, attr)
            if value is not None and not isinstance(value, str):
                raise invalid(f"type {self.type_id}: {attr} must be a string or null")
        if self.max_instances is not None:
            integer(self.max_instances, f"type {self.type_id}: max_instances", 0)
        integer(self.weight, f"type {self.type_id}: weight", 1)

    @property
    def limit(self) -> int | None:
        """The per-type limit: explicit, else NVIDIA's ``max_instance=`` field."""
        if self.max_instances is not None:
            return self.max_instances
        if self.description:
            match = _MAX_INSTANCE_RE.search(self.description)
            if match:
                return int(match.group(1))
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type_id": self.type_id, "device_api": self.device_api}
        for key in ("name", "description", "max_instances"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.weight != 1:
            out["weight"] = self.weight
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "type") -> TypeSpec:
        return cls(**json_fields(data, where, required=("type_id",), optional=(
            "device_api", "name", "description", "max_instances", "weight")))


@dataclass(frozen=True)
class PciDeviceSpec:
    """A PCI function that exists on the host but is *not* an mdev parent,
    e.g. the PF of an NVIDIA SR-IOV GPU whose VFs are the parents."""

    address: str
    driver: str = "nvidia"
    vendor_id: int = 0x10DE
    device_id: int = 0
    class_code: int = 0x030200
    numa_node: int = -1

    def __post_init__(self) -> None:
        canonical_pci(self.address, "device address")
        sysfs_name(self.driver, f"device {self.address}: driver")
        object.__setattr__(self, "vendor_id", hex_id(self.vendor_id, "vendor_id"))
        object.__setattr__(self, "device_id", hex_id(self.device_id, "device_id"))
        object.__setattr__(self, "class_code", hex_id(self.class_code, "class_code"))
        integer(self.numa_node, f"device {self.address}: numa_node", -1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "driver": self.driver,
            "vendor_id": f"{self.vendor_id:#06x}",
            "device_id": f"{self.device_id:#06x}",
            "class_code": f"{self.class_code:#08x}",
            "numa_node": self.numa_node,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "device") -> PciDeviceSpec:
        return cls(**json_fields(data, where, required=("address",), optional=(
            "driver", "vendor_id", "device_id", "class_code", "numa_node")))


@dataclass(frozen=True)
class ParentSpec:
    """One mdev parent: a PCI function (GPU PF or SR-IOV VF) or a virtual device.

    ``name`` is the kernel's ``dev_name()``: a canonical PCI address for ``kind='pci'``,
    a plain name such as ``mtty`` for ``kind='virtual'``.  ``physfn`` names the PF of an
    SR-IOV VF (a parent or a bare device in the same spec).  ``capacity`` sizes the pool
    for the shared / global / core policies; ``pool`` names the global pool (default:
    the driver name, i.e. one pool per module like mtty's ``MAX_MTTYS``).
    """

    name: str
    types: tuple[TypeSpec, ...]
    kind: str = "pci"
    driver: str = "nvidia"
    vendor_id: int = 0x10DE
    device_id: int = 0
    class_code: int = 0x030200
    numa_node: int = -1
    physfn: str | None = None
    policy: str = "independent"
    capacity: int | None = None
    pool: str | None = None
    mdev_driver: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise invalid(f"parent {self.name!r}: kind {self.kind!r} not in {KINDS}")
        if self.kind == "pci":
            canonical_pci(self.name, "parent name")
        else:
            sysfs_name(self.name, "parent name")
            if address.is_pci_address(self.name):
                raise invalid(
                    f"virtual parent {self.name!r} looks like a PCI address; use kind 'pci'")
            if self.physfn is not None:
                raise invalid(f"virtual parent {self.name!r} cannot have a physfn")
        sysfs_name(self.driver, f"parent {self.name}: driver")
        if self.mdev_driver is not None:
            sysfs_name(self.mdev_driver, f"parent {self.name}: mdev_driver")
        object.__setattr__(self, "vendor_id", hex_id(self.vendor_id, "vendor_id"))
        object.__setattr__(self, "device_id", hex_id(self.device_id, "device_id"))
        object.__setattr__(self, "class_code", hex_id(self.class_code, "class_code"))
        integer(self.numa_node, f"parent {self.name}: numa_node", -1)
        if self.physfn is not None:
            canonical_pci(self.physfn, f"parent {self.name}: physfn")
            if self.physfn == self.name:
                raise invalid(f"parent {self.name}: physfn cannot be the parent itself")
        self._check_policy()
        types = tuple(self.types)
        object.__setattr__(self, "types", types)
        if not types:
            raise invalid(f"parent {self.name}: offers no types")
        seen: set[str] = set()
        for t in types:
            if not isinstance(t, TypeSpec):
                raise invalid(f"parent {self.name}: types must be TypeSpec, got {t!r}")
            if t.type_id in seen:
                raise invalid(f"parent {self.name}: type {t.type_id} listed twice")
            seen.add(t.type_id)
            # mdev_type_add(): kobject name is "<dev_driver_string(parent)>-<sysfs_name>".
            if not t.type_id.startswith(self.driver + "-"):
                raise invalid(
                    f"parent {self.name}: type id {t.type_id!r} must start with the parent's "
                    f"driver name ({self.driver}-), as the kernel forms it"
                )
            if self.policy in POLICIES_NEEDING_MAX and t.limit is None:
                raise invalid(
                    f"parent {self.name}: type {t.type_id} needs max_instances (or "
                    f"'max_instance=N' in its description) under policy {self.policy}"
                )

    def _check_policy(self) -> None:
        if self.policy not in POLICIES:
            raise invalid(f"parent {self.name}: policy {self.policy!r} not in {POLICIES}")
        if self.policy in POLICIES_NEEDING_CAPACITY:
            if self.capacity is None:
                raise invalid(f"parent {self.name}: policy {self.policy} needs a capacity")
            integer(self.capacity, f"parent {self.name}: capacity", 0)
        elif self.capacity is not None:
            raise invalid(f"parent {self.name}: capacity is only used by "
                          f"{sorted(POLICIES_NEEDING_CAPACITY)}")
        if self.pool is not None:
            if self.policy != "global":
                raise invalid(f"parent {self.name}: pool is only used by policy global")
            sysfs_name(self.pool, f"parent {self.name}: pool")

    @property
    def pool_name(self) -> str:
        return self.pool or self.driver

    @property
    def effective_mdev_driver(self) -> str:
        if self.mdev_driver:
            return self.mdev_driver
        return DEFAULT_MDEV_DRIVERS.get(self.driver, FALLBACK_MDEV_DRIVER)

    def type(self, type_id: str) -> TypeSpec | None:
        for t in self.types:
            if t.type_id == type_id:
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "driver": self.driver}
        if self.kind == "pci":
            out.update(
                vendor_id=f"{self.vendor_id:#06x}",
                device_id=f"{self.device_id:#06x}",
                class_code=f"{self.class_code:#08x}",
            )
        out["numa_node"] = self.numa_node
        for key in ("physfn", "capacity", "pool", "mdev_driver"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["policy"] = self.policy
        out["types"] = [t.to_dict() for t in self.types]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "parent") -> ParentSpec:
        kwargs = json_fields(data, where, required=("name", "types"), optional=(
            "kind", "driver", "vendor_id", "device_id", "class_code", "numa_node", "physfn",
            "policy", "capacity", "pool", "mdev_driver"))
        if not isinstance(kwargs["types"], list):
            raise invalid(f"{where}.types must be a list")
        kwargs["types"] = tuple(
            TypeSpec.from_dict(t, f"{where}.types[{i}]") for i, t in enumerate(kwargs["types"])
        )
        return cls(**kwargs)


@dataclass(frozen=True)
class MdevSpec:
    """An mdev that exists when the simulated host starts (created at "boot")."""

    uuid: str
    parent: str
    type_id: str
    held: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "uuid", canonical_uuid(self.uuid, "mdev uuid"))
        sysfs_name(self.parent, f"mdev {self.uuid}: parent")
        sysfs_name(self.type_id, f"mdev {self.uuid}: type_id")
        if not isinstance(self.held, bool):
            raise invalid(f"mdev {self.uuid}: held must be true or false")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uuid": self.uuid, "parent": self.parent, "type_id": self.type_id}
        if self.held:
            out["held"] = True
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "mdev") -> MdevSpec:
        if isinstance(data, list | tuple) and len(data) == 3:  # the short [uuid, parent, type] form
            return cls(*data)
        return cls(**json_fields(data, where, required=("uuid", "parent", "type_id"),
                                 optional=("held",)))


@dataclass(frozen=True)
class HostSpec:
    """A whole simulated host.  Validated as a unit on construction."""

    parents: tuple[ParentSpec, ...] = ()
    devices: tuple[PciDeviceSpec, ...] = ()
    mdevs: tuple[MdevSpec, ...] = ()
    profiles: tuple[str, ...] = field(default=(), compare=False)
    sriov_pfs: tuple[SriovPfSpec, ...] = ()

    def __post_init__(self) -> None:
        for attr in ("parents", "devices", "mdevs", "profiles", "sriov_pfs"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        self._validate()

    def _validate(self) -> None:
        pci: dict[str, object] = {}
        names: set[str] = set()
        for p in self.parents:
            if not isinstance(p, ParentSpec):
                raise invalid(f"parents must be ParentSpec, got {p!r}")
            if p.name in names:
                raise invalid(f"parent {p.name} defined twice")
            names.add(p.name)
            if p.kind == "pci":
                pci[p.name] = p
        for d in self.devices:
            if not isinstance(d, PciDeviceSpec):
                raise invalid(f"devices must be PciDeviceSpec, got {d!r}")
            if d.address in pci:
                raise invalid(f"PCI address {d.address} defined twice")
            pci[d.address] = d
        self._validate_sriov_pfs(pci)
        pools: dict[str, int] = {}
        for p in self.parents:
            if p.physfn is not None:
                pf = pci.get(p.physfn)
                if pf is None:
                    raise invalid(f"parent {p.name}: physfn {p.physfn} is not a PCI device "
                                  "of this spec")
                if isinstance(pf, ParentSpec) and pf.physfn is not None:
                    raise invalid(f"parent {p.name}: physfn {p.physfn} is itself a VF")
            if p.policy == "global":
                cap = pools.setdefault(p.pool_name, p.capacity or 0)
                if cap != p.capacity:
                    raise invalid(
                        f"parent {p.name}: global pool {p.pool_name} capacity {p.capacity} "
                        f"differs from another parent's {cap}"
                    )
        seen: set[str] = set()
        by_name = {p.name: p for p in self.parents}
        for m in self.mdevs:
            if not isinstance(m, MdevSpec):
                raise invalid(f"mdevs must be MdevSpec, got {m!r}")
            if m.uuid in seen:
                raise invalid(f"mdev {m.uuid} listed twice")
            seen.add(m.uuid)
            parent = by_name.get(m.parent)
            if parent is None:
                raise invalid(f"mdev {m.uuid}: parent {m.parent} is not in the spec")
            if parent.type(m.type_id) is None:
                raise invalid(f"mdev {m.uuid}: parent {m.parent} does not offer {m.type_id}")
        for name in self.profiles:
            if not isinstance(name, str):
                raise invalid(f"profile names must be strings, got {name!r}")

    def _validate_sriov_pfs(self, pci: dict[str, object]) -> None:
        """Every address a dynamic VF may take is reserved up front, so a VF
        created at run time can never land on another device."""
        taken = {a: f"PCI device {a}" for a in pci}
        for pf in self.sriov_pfs:
            if not isinstance(pf, SriovPfSpec):
                raise invalid(f"sriov_pfs must be SriovPfSpec, got {pf!r}")
            for addr, what in ((pf.address, f"SR-IOV PF {pf.address}"),
                               *((a, f"VF of {pf.address}") for a in pf.vf_addresses())):
                if addr in taken:
                    raise invalid(f"PCI address {addr} defined twice ({taken[addr]} and {what})")
                taken[addr] = what

    # -- helpers --------------------------------------------------------------------

    def parent(self, name: str) -> ParentSpec | None:
        for p in self.parents:
            if p.name == name:
                return p
        return None

    @classmethod
    def merge(cls, specs: Iterable[HostSpec]) -> HostSpec:
        """One host made of several specs (``--profile nvidia-pf --profile mtty``).
        Conflicting names are reported by the validation of the result."""
        parents: list[ParentSpec] = []
        devices: list[PciDeviceSpec] = []
        mdevs: list[MdevSpec] = []
        profiles: list[str] = []
        sriov_pfs: list[SriovPfSpec] = []
        for s in specs:
            parents += s.parents
            devices += s.devices
            mdevs += s.mdevs
            profiles += s.profiles
            sriov_pfs += s.sriov_pfs
        return cls(parents=tuple(parents), devices=tuple(devices), mdevs=tuple(mdevs),
                   profiles=tuple(profiles), sriov_pfs=tuple(sriov_pfs))

    # -- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parents": [p.to_dict() for p in self.parents]}
        if self.devices:
            out["devices"] = [d.to_dict() for d in self.devices]
        if self.mdevs:
            out["mdevs"] = [m.to_dict() for m in self.mdevs]
        if self.sriov_pfs:
            out["sriov_pfs"] = [p.to_dict() for p in self.sriov_pfs]
        if self.profiles:
            out["profiles"] = list(self.profiles)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> HostSpec:
        kwargs = json_fields(data, "spec", required=(), optional=(
            "parents", "devices", "mdevs", "profiles", "sriov_pfs"))
        for key in kwargs:
            if not isinstance(kwargs[key], list):
                raise invalid(f"spec.{key} must be a list")
        return cls(
            parents=tuple(ParentSpec.from_dict(p, f"parents[{i}]")
                          for i, p in enumerate(kwargs.get("parents", []))),
            devices=tuple(PciDeviceSpec.from_dict(d, f"devices[{i}]")
                          for i, d in enumerate(kwargs.get("devices", []))),
            mdevs=tuple(MdevSpec.from_dict(m, f"mdevs[{i}]")
                        for i, m in enumerate(kwargs.get("mdevs", []))),
            profiles=tuple(kwargs.get("profiles", [])),
            sriov_pfs=tuple(SriovPfSpec.from_dict(p, f"sriov_pfs[{i}]")
                            for i, p in enumerate(kwargs.get("sriov_pfs", []))),
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> HostSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise invalid(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str) -> HostSpec:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise invalid(f"cannot read {path}: {exc.strerror}") from None
        return cls.from_json(text)


def new_uuid() -> str:
    return str(uuidlib.uuid4())
