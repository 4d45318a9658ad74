"""What the host shows about its PCI functions, read-only and unprivileged.

Per function (``bus/pci/devices/<address>``): class, vendor, device and
subsystem ids, the bound driver (``driver`` link), NUMA node, IOMMU group
(``iommu_group`` link), SR-IOV (``sriov_totalvfs``, ``sriov_numvfs``,
``virtfn<N>`` links; ``physfn`` on a VF) and, on an NVIDIA VF, the vGPU 17+
files (``nvidia/creatable_vgpu_types``, ``nvidia/current_vgpu_type``:
docs/design.md §10.3).  Per host: the IOMMU groups
(``kernel/iommu_groups``), the loaded modules, NVIDIA's driver version.

Where ``/proc`` is: ``/proc`` when the sysfs root is ``/sys``; for any other
root (a copy of a real host, a simulated tree) the directory ``proc`` beside
it (``<dir>/sys`` -> ``<dir>/proc``), so a capture of both reads as the host
did, and a tree without one shows no ``/proc`` (the facts read from it are
"not visible", never the running machine's).

Every read goes through :func:`accel_agent.sysfs.attributes.read_at` (no FIFO
blocks it, no link is followed out of the tree); a function whose directory
resolves outside the root is not read.  Anything unreadable is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from accel_agent.sysfs import address, attributes
from accel_agent.sysfs.nvidia_vfio import parse_creatable

PCI_DEVICES = os.path.join("bus", "pci", "devices")
IOMMU_GROUPS = os.path.join("kernel", "iommu_groups")
# The vGPU manager's VFIO module, in every NVIDIA vGPU for Linux KVM host
# package and in none of NVIDIA's other drivers: accel_agent.explain.verdicts
# says how a vGPU manager is told.
VGPU_VFIO_MODULE = "nvidia_vgpu_vfio"
# Vendors whose devices only a hypervisor shows a guest: virtio (Red Hat),
# QEMU's emulated devices, VMware, Hyper-V.
HYPERVISOR_VENDORS = {"1af4": "virtio", "1b36": "QEMU", "1234": "QEMU", "15ad": "VMware",
                      "1414": "Hyper-V"}
MAX_VFS = 4096


def proc_root_for(sysfs_root: str) -> str:
    """``/proc`` for the real ``/sys``, else ``proc`` beside the root."""
    absolute = os.path.abspath(sysfs_root)
    if absolute == "/sys" or os.path.realpath(absolute) == "/sys":
        return "/proc"
    return os.path.join(os.path.dirname(absolute), "proc")


@dataclass(frozen=True, slots=True)
class VfFacts:
    address: str
    driver: str | None
    iommu_group: int | None
    # The VF has an ``nvidia/`` directory (a vGPU manager gave it vGPU files).
    vgpu_files: bool = False
    current_vgpu_type: int | None = None  # 0: untyped
    creatable: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class FunctionFacts:
    address: str
    class_code: int | None
    vendor_id: str | None  # "10de"
    device_id: str | None
    subsystem_vendor: str | None
    subsystem_device: str | None
    driver: str | None
    numa_node: int | None  # None: -1 (no affinity) or unreadable
    iommu_group: int | None
    physfn: str | None
    sriov_total: int | None  # None: no SR-IOV capability visible
    sriov_num: int | None
    vfs: tuple[VfFacts, ...] = ()
    # Filled for a VF: its own vGPU files.
    vf: VfFacts | None = None

    @property
    def base_class(self) -> int | None:
        return None if self.class_code is None else self.class_code >> 16


@dataclass(frozen=True, slots=True)
class HostFacts:
    sysfs_root: str
    proc_root: str
    # Entries of kernel/iommu_groups; None when the directory is not there.
    iommu_groups: int | None
    # Loaded modules (<proc>/modules, else <sysfs>/module); None: not visible.
    modules: frozenset[str] | None
    # <proc>/driver/nvidia/version's first line; None: not visible.
    nvidia_version: str | None
    # Why this host looks like a guest ("virtio devices (1af4)"), or None.
    guest_hint: str | None
    functions: tuple[str, ...]  # every PCI function under the root

    @property
    def vgpu_vfio_loaded(self) -> bool | None:
        if self.modules is None:
            return None
        return VGPU_VFIO_MODULE in self.modules


def _hex_id(text: str | None, digits: int) -> str | None:
    if not text:
        return None
    body = text.strip().lower().removeprefix("0x")
    if len(body) != digits or any(c not in "0123456789abcdef" for c in body):
        return None
    return body


def _read(dir_fd: int, name: str) -> str | None:
    try:
        return attributes.read_at(dir_fd, name)
    except attributes.NotAnAttribute:
        return None


def _link(dir_fd: int, name: str) -> str | None:
    try:
        return os.path.basename(os.readlink(name, dir_fd=dir_fd).rstrip("/")) or None
    except OSError:
        return None


def _group(dir_fd: int) -> int | None:
    return attributes.parse_int_or_none(_link(dir_fd, "iommu_group"), attributes.MAX_IOMMU_GROUP)


def _open_function(root: str, name: str) -> int | None:
    """The function's directory, opened through its bus link when it stays
    inside the root."""
    path = os.path.join(root, PCI_DEVICES, name)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        return None
    try:
        return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def list_functions(root: str) -> tuple[str, ...]:
    try:
        names = os.listdir(os.path.join(root, PCI_DEVICES))
    except OSError:
        return ()
    return tuple(sorted(n for n in names if address.is_canonical_parent_name(n)
                        and address.is_pci_address(n)))


def _vgpu_files(dir_fd: int) -> tuple[bool, int | None, tuple[tuple[int, str], ...]]:
    try:
        nvidia = os.open("nvidia", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW,
                         dir_fd=dir_fd)
    except OSError:
        return False, None, ()
    try:
        current = attributes.parse_int_or_none(_read(nvidia, "current_vgpu_type"), 999_999)
        creatable = tuple(sorted(parse_creatable(_read(nvidia, "creatable_vgpu_types") or "")
                                 .items()))
        return True, current, creatable
    finally:
        os.close(nvidia)


def read_vf(root: str, vf: str) -> VfFacts:
    fd = _open_function(root, vf)
    if fd is None:
        return VfFacts(vf, None, None)
    try:
        files, current, creatable = _vgpu_files(fd)
        return VfFacts(vf, _link(fd, "driver"), _group(fd), files, current, creatable)
    finally:
        os.close(fd)


def read_function(root: str, name: str, with_vfs: bool = True) -> FunctionFacts | None:
    """One PCI function; None when it is not there (or not inside the root)."""
    fd = _open_function(root, name)
    if fd is None:
        return None
    try:
        class_text = _hex_id(_read(fd, "class"), 6)
        total = attributes.parse_int_or_none(_read(fd, "sriov_totalvfs"), MAX_VFS)
        vfs: list[tuple[int, str]] = []
        if with_vfs and total:
            for entry in os.listdir(fd):
                if entry.startswith("virtfn") and entry[6:].isdigit():
                    vf = _link(fd, entry)
                    if vf and address.is_pci_address(vf):
                        vfs.append((int(entry[6:]), vf))
        physfn = _link(fd, "physfn")
        physfn = physfn if physfn and address.is_pci_address(physfn) else None
        vf_facts = None
        if physfn is not None:
            files, current, creatable = _vgpu_files(fd)
            vf_facts = VfFacts(name, _link(fd, "driver"), _group(fd), files, current, creatable)
        return FunctionFacts(
            address=name,
            class_code=int(class_text, 16) if class_text else None,
            vendor_id=_hex_id(_read(fd, "vendor"), 4),
            device_id=_hex_id(_read(fd, "device"), 4),
            subsystem_vendor=_hex_id(_read(fd, "subsystem_vendor"), 4),
            subsystem_device=_hex_id(_read(fd, "subsystem_device"), 4),
            driver=_link(fd, "driver"),
            numa_node=attributes.parse_int_or_none(_read(fd, "numa_node"),
                                                   attributes.MAX_NUMA_NODE),
            iommu_group=_group(fd),
            physfn=physfn,
            sriov_total=total,
            sriov_num=attributes.parse_int_or_none(_read(fd, "sriov_numvfs"), MAX_VFS)
            if total is not None else None,
            vfs=tuple(read_vf(root, vf) for _, vf in sorted(vfs)),
            vf=vf_facts,
        )
    finally:
        os.close(fd)


def _modules(sysfs_root: str, proc_root: str) -> frozenset[str] | None:
    try:
        with open(os.path.join(proc_root, "modules"), encoding="ascii",
                  errors="replace") as handle:
            return frozenset(line.split()[0] for line in handle if line.split())
    except OSError:
        pass
    try:
        return frozenset(os.listdir(os.path.join(sysfs_root, "module")))
    except OSError:
        return None


def _first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return " ".join(handle.readline(4096).split()) or None
    except OSError:
        return None


def _guest_hint(root: str, functions: tuple[str, ...]) -> str | None:
    seen: dict[str, str] = {}
    for name in functions:
        fd = _open_function(root, name)
        if fd is None:
            continue
        try:
            vendor = _hex_id(_read(fd, "vendor"), 4)
        finally:
            os.close(fd)
        if vendor in HYPERVISOR_VENDORS:
            seen.setdefault(vendor, HYPERVISOR_VENDORS[vendor])
    if not seen:
        return None
    return ", ".join(f"{what} devices ({vendor})" for vendor, what in sorted(seen.items()))


def read_host(sysfs_root: str) -> HostFacts:
    root = os.path.realpath(sysfs_root)
    proc = proc_root_for(sysfs_root)
    try:
        groups: int | None = len(os.listdir(os.path.join(root, IOMMU_GROUPS)))
    except OSError:
        groups = None
    functions = list_functions(root)
    return HostFacts(
        sysfs_root=root,
        proc_root=proc,
        iommu_groups=groups,
        modules=_modules(root, proc),
        nvidia_version=_first_line(os.path.join(proc, "driver", "nvidia", "version")),
        guest_hint=_guest_hint(root, functions),
        functions=functions,
    )
