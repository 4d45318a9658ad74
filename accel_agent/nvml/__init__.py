"""NVIDIA's management library (NVML) behind one small interface.

:class:`~.base.Nvml` is what the agent asks of NVML per GPU for mixed-size
vGPU layouts and MIG-backed vGPUs (docs/design.md §16); the records it
answers with are :mod:`.types`'.  Which implementation serves a sysfs root
is decided here, by :func:`for_sysfs_root`, from the tree itself:

* ``/sys``: the host's own NVML (:mod:`.real`, over ``pynvml``), or
  :class:`~.base.Unavailable` with the reason when this host has no NVIDIA
  driver or binding;
* a simulated host: the simulator serves a file in its tree,
  ``accel-agent-simulator/control_socket`` (:data:`SIMULATOR_MARKER`), naming
  its control socket, and NVML is asked there (:mod:`.simulated`);
* anything else (a static tree, a copy of a real host's files): no NVML.

Why a file in the tree and not an option: the daemon, ``accelctl`` and the
tests all find the simulator from the one thing they are given, the sysfs
root, so they cannot disagree about which NVML belongs to which tree; the
socket's path depends on the simulator's run directory (its user, its
environment), which a process reading the tree cannot derive; and an
operator cannot point a real ``/sys`` at a simulator, or forget to, because
no file can be created under a real sysfs (the check for ``/sys`` comes
first, whatever the tree holds).  Whoever can write such a tree could name
another socket, but could as well change every file the agent reads there:
the marker is trusted exactly as much as the tree.  A static tree written
from a simulated host (``accelctl simulate materialise``) has no live simulator and no such
file, so it has no NVML either.

Nothing here imports NVML or the simulator: accelctl's fast paths and hosts
without NVIDIA pay for neither.
"""

from __future__ import annotations

import os
from typing import Any

from accel_agent.nvml.base import Nvml, Unavailable
from accel_agent.nvml.types import (
    DEFAULT_CALL_TIMEOUT,
    GpuInstance,
    GpuInstanceProfile,
    MigMode,
    MigModeChange,
    NvmlStatus,
    Placement,
    VgpuInstance,
    VgpuPlacements,
    VgpuType,
)

# The character device groups (/proc/devices names) NVML opens, and how: the
# control and GPU nodes /dev/nvidiactl, /dev/nvidia<N> read-write (the group is
# "nvidia-frontend", "nvidia" in some driver builds), the MIG capability files
# /dev/nvidia-caps/nvidia-cap<N> read-only (root 0400; NVML passes them to the
# driver to prove the mig-config and mig-monitor capabilities).  The systemd
# unit's DeviceAllow= lets exactly these through (tests/unit/test_systemd_unit.py).
DEVICE_GROUPS = {"nvidia-frontend": "rw", "nvidia": "rw", "nvidia-caps": "r"}

# The file a simulated host serves in its tree (relative to its root), one
# line: the absolute path of its control socket.
SIMULATOR_MARKER = ("accel-agent-simulator", "control_socket")
HOST_SYSFS = "/sys"
_MARKER_MAX = 4096

__all__ = [
    "DEVICE_GROUPS", "HOST_SYSFS", "SIMULATOR_MARKER", "GpuInstance", "GpuInstanceProfile",
    "MigMode", "MigModeChange", "Nvml", "NvmlStatus", "Placement", "Unavailable",
    "VgpuInstance", "VgpuPlacements", "VgpuType", "for_sysfs_root", "simulator_socket",
]


def simulator_socket(sysfs_root: str) -> str | None:
    """The control socket a simulated host at ``sysfs_root`` names in its
    tree, or None when the tree names none (or names something that is not
    an absolute path)."""
    path = os.path.join(sysfs_root, *SIMULATOR_MARKER)
    try:
        with open(path, "rb") as handle:
            text = handle.read(_MARKER_MAX).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not text or not os.path.isabs(text) or not text.isprintable():
        return None
    return text


def for_sysfs_root(sysfs_root: str, conf: Any = None) -> Nvml:
    """The NVML that serves ``sysfs_root`` (module docstring).  ``conf``:
    the agent's configuration, for ``[nvml] call_timeout`` (the default
    without one)."""
    timeout = DEFAULT_CALL_TIMEOUT
    if conf is not None:
        timeout = float(conf.nvml.call_timeout)
    root = os.path.realpath(sysfs_root)
    if root == HOST_SYSFS:
        from accel_agent.nvml.real import RealNvml

        return RealNvml(call_timeout=timeout)
    socket_path = simulator_socket(root)
    if socket_path is not None:
        from accel_agent.nvml.simulated import SimulatedNvmlClient

        return SimulatedNvmlClient(socket_path, call_timeout=timeout)
    return Unavailable(sysfs_root, f"{sysfs_root} is neither the host's /sys nor a simulated "
                                   f"host (no {'/'.join(SIMULATOR_MARKER)} in it)")
