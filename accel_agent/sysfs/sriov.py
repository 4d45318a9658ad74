"""SR-IOV PFs and their VFs, read side (unprivileged, like every read).

For each configured PF: ``bus/pci/devices/<pf>/`` with ``sriov_totalvfs``,
``sriov_numvfs``, ``virtfn<i>`` links to its VFs, ``net/<ifname>`` while its
driver has registered a netdev; for each VF its ``driver`` link,
``driver_override`` and ``iommu_group``.  Every link is resolved and must stay
inside the sysfs root; anything unreadable is a warning on the PF, never a
crash of the scan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from accel_agent.sysfs import address

PCI_DEVICES = ("bus", "pci", "devices")
VFIO_PCI = "vfio-pci"


@dataclass(frozen=True, slots=True)
class VfInfo:
    address: str
    index: int  # virtfn<index> of its PF: the VF number rtnetlink knows
    driver: str | None
    driver_override: str | None
    iommu_group: int | None

    @property
    def handed_over(self) -> bool:
        """On vfio-pci: an instance's (or being given to one)."""
        return self.driver == VFIO_PCI


@dataclass(frozen=True, slots=True)
class PfInfo:
    address: str
    driver: str | None
    netdev: str | None
    total_vfs: int
    num_vfs: int
    vfs: tuple[VfInfo, ...]
    warnings: tuple[str, ...] = ()

    def vf(self, vf_address: str) -> VfInfo | None:
        return next((v for v in self.vfs if v.address == vf_address), None)


class NotAPf(Exception):
    """The address is no SR-IOV PF under this root (the reason is the text)."""


def _inside(root: str, path: str) -> str | None:
    real = os.path.realpath(path)
    return real if os.path.commonpath([root, real]) == root else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return None


def _link_name(root: str, path: str) -> str | None:
    if not os.path.islink(path):
        return None
    target = _inside(root, path)
    return os.path.basename(target) if target else None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


def read_vf(root: str, vf: str, index: int) -> VfInfo:
    device = os.path.join(root, *PCI_DEVICES, vf)
    override = _read(os.path.join(device, "driver_override"))
    return VfInfo(
        address=vf,
        index=index,
        driver=_link_name(root, os.path.join(device, "driver")),
        driver_override=None if override in (None, "", "(null)") else override,
        iommu_group=_int(_link_name(root, os.path.join(device, "iommu_group"))),
    )


def read_pf(sysfs_root: str, pf: str) -> PfInfo:
    """PF ``pf`` (canonical address) and its VFs; NotAPf when it is not one."""
    root = os.path.realpath(sysfs_root)
    device = os.path.join(root, *PCI_DEVICES, pf)
    real = _inside(root, device)
    if real is None or not os.path.isdir(real):
        raise NotAPf(f"no PCI device {pf} under {sysfs_root}")
    total = _int(_read(os.path.join(real, "sriov_totalvfs")))
    if total is None:
        raise NotAPf(f"{pf} has no sriov_totalvfs (not SR-IOV capable)")
    warnings: list[str] = []
    vfs = []
    for name in sorted(os.listdir(real)):
        if not (name.startswith("virtfn") and name[6:].isdigit()):
            continue
        vf = _link_name(root, os.path.join(real, name))
        if vf is None or not address.is_pci_address(vf):
            warnings.append(f"{pf}/{name} is not a link to a PCI device inside the root")
            continue
        vfs.append(read_vf(root, vf, int(name[6:])))
    netdevs = (
        sorted(os.listdir(os.path.join(real, "net")))
        if os.path.isdir(os.path.join(real, "net"))
        else []
    )
    if len(netdevs) > 1:
        warnings.append(f"{pf} has several netdevs ({', '.join(netdevs)}); using {netdevs[0]}")
    return PfInfo(
        address=pf,
        driver=_link_name(root, os.path.join(real, "driver")),
        netdev=netdevs[0] if netdevs else None,
        total_vfs=total,
        num_vfs=_int(_read(os.path.join(real, "sriov_numvfs"))) or 0,
        vfs=tuple(sorted(vfs, key=lambda v: v.index)),
        warnings=tuple(warnings),
    )
