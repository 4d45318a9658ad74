"""The in-use probe: is a device's VFIO group held by a VM right now?

libvirt's own test (virNodeDeviceDestroy, virHostdevIsPCINodeDeviceUsed):
the kernel lets one process at a time open ``/dev/vfio/<group>`` (root
0600), so an open that fails with EBUSY means a VM (or anything else) holds
the device, and a write that unmakes it would block until it lets go.  Every
such write probes first, next to the write it guards: an mdev's ``remove``
(mdev.py), a vGPU VF's ``0`` (vgpu.py), a VF's unbind from ``vfio-pci``
(pci.py).  The probe holds the group for the instant of one open/close.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence

from accel_agent import exception
from accel_agent.privileged.validate import real_root, reject
from accel_agent.privileged.writes import errno_text


def vfio_dev_dir(sysfs_root: str, configured: str = "") -> str:
    """Where the VFIO group nodes of ``sysfs_root``'s devices live:
    ``configured`` when set, ``/dev/vfio`` for the real /sys, else
    ``<sysfs_root>/vfio`` (the simulator serves its group nodes there)."""
    if configured:
        return configured
    if os.path.realpath(sysfs_root) == "/sys":
        return "/dev/vfio"
    return os.path.join(sysfs_root, "vfio")


def _iommu_group(root: str, device: Sequence[str], what: str) -> str | None:
    """The IOMMU group number of the device at ``root/device``, or None when
    it has none (no VFIO driver bound: nothing can hold it through VFIO)."""
    link = os.path.join(root, *device, "iommu_group")
    try:
        target = os.path.realpath(link, strict=True)
    except OSError:
        return None
    group = os.path.basename(target)
    if os.path.commonpath([root, target]) != root or not group.isdigit():
        raise reject(f"the iommu_group of {what} resolves to {target}, not a group")
    return group


def probe_group(
    sysfs_root: str,
    device: Sequence[str],
    what: str,
    vfio_dir: str,
    in_use: Callable[[str], exception.AccelAgentException],
) -> None:
    """Raise ``in_use(reason)`` unless the VFIO group of the device at
    ``device`` (relative to the root) can be opened now (check_not_in_use)."""
    root = real_root(sysfs_root)
    group = _iommu_group(root, device, what)
    if group is None:
        return
    directory = vfio_dev_dir(sysfs_root, vfio_dir)
    node = os.path.join(directory, group)
    try:
        fd = os.open(node, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.EBUSY:
            raise in_use(
                f"its VFIO group {node} is open (a VM or another process holds it); "
                "kept, not removed"
            ) from None
        if err.errno == errno.ENOENT and os.path.isdir(directory):
            return  # no group node: VFIO does not offer the device to anyone
        _, text = errno_text(err)
        raise in_use(
            f"cannot check whether it is in use: opening {node} failed with {text}; "
            "kept, not removed"
        ) from None
    os.close(fd)


def probe_vf_group(sysfs_root: str, vf: str, vfio_dir: str) -> None:
    """Raise VfInUse unless the VFIO group of PCI function ``vf`` can be
    opened now: the one probe before a VF leaves vfio-pci or is untyped."""
    probe_group(
        sysfs_root,
        ("bus", "pci", "devices", vf),
        f"VF {vf}",
        vfio_dir,
        lambda reason: exception.VfInUse(vf=vf, reason=reason),
    )
