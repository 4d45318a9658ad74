"""Which VFIO groups a process holds open now, read from ``/proc`` without
touching the groups themselves.

The privileged writers' in-use probe (privileged/inuse.py) opens a device's
group node and takes EBUSY for "in use": right before a write that would
unmake the device, as libvirt's virNodeDeviceDestroy does.  A listing must
not do that: for the instant of its open, a VM starting on the device would
get EBUSY itself.  So the listings (``"in_use"`` of a standing layout's
devices, issue 23) look at what processes hold instead: a QEMU (or any other
process) using a device keeps an open file descriptor on its group node,
``/dev/vfio/<group>`` (``/proc/<pid>/fd/*`` links to it).  Reading other
processes' descriptors needs root, as the agent runs; without it the answer
is None (not known).
"""

from __future__ import annotations

import os


def vfio_dev_dir(sysfs_root: str, configured: str = "") -> str:
    """Where the VFIO group nodes of ``sysfs_root``'s devices live:
    ``configured`` when set, ``/dev/vfio`` for the real /sys, else
    ``<sysfs_root>/vfio`` (the simulator serves its group nodes there).

    The same rule as the privileged probe's (privileged/inuse.py), written
    twice on purpose: the privileged side imports almost nothing of the
    agent (tests/unit/test_house.py), and a listing must not load the
    privileged package.  tests/unit/test_vfio_holders.py holds them equal."""
    if configured:
        return configured
    if os.path.realpath(sysfs_root) == "/sys":
        return "/dev/vfio"
    return os.path.join(sysfs_root, "vfio")


def held_groups(directory: str, proc: str = "/proc") -> frozenset[str] | None:
    """The names of the group nodes in ``directory`` that some process holds
    open, or None when other processes' descriptors cannot be read."""
    prefix = os.path.realpath(directory) + os.sep
    held: set[str] = set()
    readable = False
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        fds = os.path.join(proc, pid, "fd")
        try:
            entries = os.listdir(fds)
        except OSError:
            continue  # gone, or not ours to read
        readable = True
        for fd in entries:
            try:
                target = os.readlink(os.path.join(fds, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                held.add(target[len(prefix):])
    return frozenset(held) if readable and os.geteuid() == 0 else None
