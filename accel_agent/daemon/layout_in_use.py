"""How many of the standing layouts' devices a consumer uses now (issue 23's
"in use" in health and metrics), counted at each converge.

A standing device is used by a consumer that picks it itself (Nova's PCI
passthrough, a device plugin): the agent only sees that its VFIO group is
held open.  The count reads that the same way the listings do, from /proc
(sysfs/vfio_holders.py), never by opening a group: a probe's open would
give a VM starting on the device EBUSY.  It is independent of what decides
"draining" (the privileged write's own EBUSY probe), so one cannot hide a
fault of the other.

Counted by the rescan that converges, from the ledger and the scan it reads
after the converge anyway (a scan of its own would cost a whole sysfs read
more): one /proc walk per converge, whatever the number of devices (it
costs about 15 ms with 300 processes), and none while the ledger holds no
layout device.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from accel_agent.devices.ledger import DeviceRecord
from accel_agent.sysfs import vfio_holders

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot

# (type, physical GPU, devices held open), one row per (type, GPU) that has
# layout devices, 0 included; sorted.
InUse = tuple[tuple[str, str, int], ...]


def count(
    members: Iterable[DeviceRecord], snapshot: HostSnapshot, held: frozenset[str]
) -> InUse:
    """Per (type, GPU): the members on the host whose VFIO group is in ``held``."""
    rows: Counter[tuple[str, str]] = Counter()
    for record in members:
        mdev = snapshot.mdevs.get(record.uuid)
        if mdev is None:
            continue  # not on the host: nothing can hold it
        parent = snapshot.parents.get(mdev.parent)
        key = (mdev.mdev_type or record.device_type, parent.physical_gpu if parent else mdev.parent)
        rows[key] += int(mdev.iommu_group is not None and str(mdev.iommu_group) in held)
    return tuple(sorted((t, gpu, n) for (t, gpu), n in rows.items()))


def group_dir(devices: DeviceManager) -> str:
    """Where the VFIO group nodes of the agent's sysfs are (as the listings
    and the privileged probe find them)."""
    return vfio_holders.vfio_dev_dir(
        devices.sysfs_root, getattr(devices.writer, "vfio_dev_dir", None) or ""
    )


def read(
    devices: DeviceManager,
    records: Iterable[DeviceRecord],
    snapshot: HostSnapshot,
    proc: str = "/proc",
) -> InUse | None:
    """The layout devices in use now, of ``records`` (the ledger, read before
    ``snapshot``): () when they hold none (no walk), None when not known
    (/proc not readable)."""
    members = [r for r in records if r.in_layout]
    if not members:
        return ()
    held = vfio_holders.held_groups(group_dir(devices), proc)
    if held is None:
        return None
    return count(members, snapshot, held)


def by_type(rows: InUse) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for device_type, _gpu, n in rows:
        totals[device_type] += n
    return dict(sorted(totals.items()))


def by_gpu(rows: InUse) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for _type, gpu, n in rows:
        totals[gpu] += n
    return dict(sorted(totals.items()))
