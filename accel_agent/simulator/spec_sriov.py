"""The spec of an SR-IOV PF whose VFs come and go, and of its vGPU types.

:class:`SriovPfSpec` describes a PF whose VFs the kernel creates and destroys
on a ``sriov_numvfs`` write (a NIC such as igb, or an NVIDIA GPU whose VFs are
typed through ``nvidia/current_vgpu_type``); the model of it lives in
:mod:`.pci` and :mod:`.nvidia_vfio`, the host spec that holds it in
:mod:`.spec`.  VF ``i`` sits where drivers/pci/iov.c puts it
(``pci_iov_virtfn_bus()``/``pci_iov_virtfn_devfn()``: the PF's routing id plus
the SR-IOV capability's First VF Offset and ``i`` VF Strides, see
:func:`~.kabi.virtfn_address`); every address a VF may take is reserved by
the host spec's validation, so a VF created at run time never lands on
another device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel_agent.simulator.kabi import virtfn_address
from accel_agent.simulator.spec_fields import (
    canonical_pci,
    hex_id,
    integer,
    invalid,
    json_fields,
    sysfs_name,
)
from accel_agent.simulator.spec_nvidia import MigSpec

# A network interface name: IFNAMSIZ is 16 with the NUL, no '/', ':' or blanks
# (net/core/dev.c dev_valid_name()).
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
# The PCI core caps sriov_totalvfs at what a u16 holds; a bus carries at most 256.
MAX_VFS = 256


@dataclass(frozen=True)
class VgpuTypeSpec:
    """One vGPU type of a vendor-specific-VFIO NVIDIA GPU (vGPU 17+): a line
    ``<type_id> : <name>`` of a VF's ``nvidia/creatable_vgpu_types``.

    ``type_id`` is the decimal id written to ``current_vgpu_type`` (unique per
    card model only).  ``framebuffer_mib`` is what the equal-size rule compares
    (docs/design.md §10.3); ``max_instances`` is the limit per
    physical GPU.  A time-sliced type may have a ``placement_size`` and the
    ``placements`` (ids) it supports in mixed-size mode (NVML
    ``nvmlDeviceGetVgpuTypeSupportedPlacements``; without them it cannot be
    placed in that mode, see :mod:`.nvidia_gpu`).  A MIG-backed type names its
    ``gpu_instance_profile`` (NVML ``nvmlVgpuTypeGetGpuInstanceProfileId``)
    and has no placements of its own.
    """

    type_id: int
    name: str
    framebuffer_mib: int
    max_instances: int
    placement_size: int | None = None
    placements: tuple[int, ...] = ()
    gpu_instance_profile: int | None = None

    def __post_init__(self) -> None:
        integer(self.type_id, "vgpu type_id", 1)
        where = f"vgpu type {self.type_id}"
        if self.type_id > 0xFFFFFFFF:
            raise invalid(f"vgpu type_id {self.type_id} does not fit 32 bits")
        if (not isinstance(self.name, str) or not self.name.strip() or "\n" in self.name
                or self.name != self.name.strip()):
            raise invalid(f"{where}: name {self.name!r} must be one trimmed line")
        integer(self.framebuffer_mib, f"{where}: framebuffer_mib", 1)
        integer(self.max_instances, f"{where}: max_instances", 1)
        places = tuple(self.placements)
        object.__setattr__(self, "placements", places)
        for pid in places:
            integer(pid, f"{where}: placement id", 0)
        if len(set(places)) != len(places):
            raise invalid(f"{where}: a placement id listed twice")
        if self.placement_size is None:
            if places:
                raise invalid(f"{where}: placements without a placement_size")
        else:
            integer(self.placement_size, f"{where}: placement_size", 1)
        if self.gpu_instance_profile is not None:
            integer(self.gpu_instance_profile, f"{where}: gpu_instance_profile", 0)
            if places or self.placement_size is not None:
                raise invalid(f"{where}: a MIG-backed type has no placements of its own")

    @property
    def mig_backed(self) -> bool:
        return self.gpu_instance_profile is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type_id": self.type_id, "name": self.name,
                               "framebuffer_mib": self.framebuffer_mib,
                               "max_instances": self.max_instances}
        if self.placement_size is not None:
            out["placement_size"] = self.placement_size
            out["placements"] = list(self.placements)
        if self.gpu_instance_profile is not None:
            out["gpu_instance_profile"] = self.gpu_instance_profile
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "vgpu type") -> VgpuTypeSpec:
        kwargs = json_fields(data, where, required=(
            "type_id", "name", "framebuffer_mib", "max_instances"),
            optional=("placement_size", "placements", "gpu_instance_profile"))
        if "placements" in kwargs:
            if not isinstance(kwargs["placements"], list):
                raise invalid(f"{where}.placements must be a list of ids")
            kwargs["placements"] = tuple(kwargs["placements"])
        return cls(**kwargs)


@dataclass(frozen=True)
class SriovPfSpec:
    """An SR-IOV physical function whose VFs the kernel creates and destroys on
    a ``sriov_numvfs`` write (the model lives in :mod:`.pci`).

    ``total_vfs`` is what ``sriov_totalvfs`` reads (the driver's limit),
    ``num_vfs`` how many VFs exist at boot (a boot script such as NVIDIA's
    ``sriov-manage -e`` enabled them).  VF ``i`` sits at the PF's routing id
    + ``vf_offset`` + ``vf_stride`` * i, as the SR-IOV capability says, has
    device id ``vf_device_id`` and binds to ``vf_driver``.  ``netdev`` names
    the network interface the PF driver registers (``net/<netdev>``).
    Non-empty ``vgpu_types`` make it an NVIDIA vGPU 17+ GPU: its VFs, bound to
    ``nvidia``, carry ``nvidia/creatable_vgpu_types`` and friends;
    ``heterogeneous`` is its capability for mixed-size mode (NVML
    ``NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_SIZES``), ``mig`` its MIG
    side (:class:`~.spec_nvidia.MigSpec`), both modelled in :mod:`.nvidia_gpu`.
    """

    address: str
    driver: str
    vf_driver: str
    total_vfs: int
    num_vfs: int = 0
    vendor_id: int = 0x8086
    device_id: int = 0
    vf_device_id: int = 0
    class_code: int = 0x020000
    numa_node: int = -1
    vf_offset: int = 1
    vf_stride: int = 1
    netdev: str | None = None
    vgpu_types: tuple[VgpuTypeSpec, ...] = ()
    heterogeneous: bool = False
    mig: MigSpec | None = None

    def __post_init__(self) -> None:
        where = f"SR-IOV PF {self.address}"
        canonical_pci(self.address, "SR-IOV PF address")
        sysfs_name(self.driver, f"{where}: driver")
        sysfs_name(self.vf_driver, f"{where}: vf_driver")
        for attr in ("vendor_id", "device_id", "vf_device_id", "class_code"):
            object.__setattr__(self, attr, hex_id(getattr(self, attr), f"{where}: {attr}"))
        integer(self.numa_node, f"{where}: numa_node", -1)
        integer(self.total_vfs, f"{where}: total_vfs", 1)
        if self.total_vfs > MAX_VFS:
            raise invalid(f"{where}: total_vfs {self.total_vfs} > {MAX_VFS}")
        integer(self.num_vfs, f"{where}: num_vfs", 0)
        if self.num_vfs > self.total_vfs:
            raise invalid(f"{where}: num_vfs {self.num_vfs} > total_vfs {self.total_vfs}")
        integer(self.vf_offset, f"{where}: vf_offset", 1)
        integer(self.vf_stride, f"{where}: vf_stride", 1)
        try:
            self.vf_addresses()
        except ValueError as exc:
            raise invalid(f"{where}: {exc}") from None
        if self.netdev is not None and (not isinstance(self.netdev, str)
                                        or not _IFNAME_RE.match(self.netdev)):
            raise invalid(f"{where}: netdev {self.netdev!r} is not an interface name")
        types = tuple(self.vgpu_types)
        object.__setattr__(self, "vgpu_types", types)
        ids: set[int] = set()
        for t in types:
            if not isinstance(t, VgpuTypeSpec):
                raise invalid(f"{where}: vgpu_types must be VgpuTypeSpec, got {t!r}")
            if t.type_id in ids:
                raise invalid(f"{where}: vgpu type {t.type_id} listed twice")
            ids.add(t.type_id)
            if t.mig_backed and (self.mig is None or self.mig.profile(
                    t.gpu_instance_profile or 0) is None):
                raise invalid(f"{where}: vgpu type {t.type_id} needs GPU instance profile "
                              f"{t.gpu_instance_profile}, which the GPU's MIG spec lacks")
        if not isinstance(self.heterogeneous, bool):
            raise invalid(f"{where}: heterogeneous must be true or false")
        if (self.heterogeneous or self.mig is not None) and not types:
            raise invalid(f"{where}: heterogeneous and mig need vgpu_types (an NVIDIA GPU)")
        if self.mig is not None and not isinstance(self.mig, MigSpec):
            raise invalid(f"{where}: mig must be a MigSpec")

    @property
    def is_vgpu(self) -> bool:
        """An NVIDIA vendor-specific-VFIO GPU (its VFs are typed, not passed as is)."""
        return bool(self.vgpu_types)

    def vf_address(self, index: int) -> str:
        return virtfn_address(self.address, self.vf_offset, self.vf_stride, index)

    def vf_addresses(self) -> list[str]:
        """Every address a VF of this PF can ever have (``total_vfs`` of them)."""
        return [self.vf_address(i) for i in range(self.total_vfs)]

    def vgpu_type(self, type_id: int) -> VgpuTypeSpec | None:
        for t in self.vgpu_types:
            if t.type_id == type_id:
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "address": self.address, "driver": self.driver, "vf_driver": self.vf_driver,
            "total_vfs": self.total_vfs, "num_vfs": self.num_vfs,
            "vendor_id": f"{self.vendor_id:#06x}", "device_id": f"{self.device_id:#06x}",
            "vf_device_id": f"{self.vf_device_id:#06x}", "class_code": f"{self.class_code:#08x}",
            "numa_node": self.numa_node, "vf_offset": self.vf_offset,
            "vf_stride": self.vf_stride,
        }
        if self.netdev is not None:
            out["netdev"] = self.netdev
        if self.vgpu_types:
            out["vgpu_types"] = [t.to_dict() for t in self.vgpu_types]
        if self.heterogeneous:
            out["heterogeneous"] = True
        if self.mig is not None:
            out["mig"] = self.mig.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "sriov_pf") -> SriovPfSpec:
        kwargs = json_fields(data, where,
                             required=("address", "driver", "vf_driver", "total_vfs"),
                             optional=("num_vfs", "vendor_id", "device_id", "vf_device_id",
                                       "class_code", "numa_node", "vf_offset", "vf_stride",
                                       "netdev", "vgpu_types", "heterogeneous", "mig"))
        if "vgpu_types" in kwargs:
            if not isinstance(kwargs["vgpu_types"], list):
                raise invalid(f"{where}.vgpu_types must be a list")
            kwargs["vgpu_types"] = tuple(
                VgpuTypeSpec.from_dict(t, f"{where}.vgpu_types[{i}]")
                for i, t in enumerate(kwargs["vgpu_types"]))
        if "mig" in kwargs:
            kwargs["mig"] = MigSpec.from_dict(kwargs["mig"], f"{where}.mig")
        return cls(**kwargs)
