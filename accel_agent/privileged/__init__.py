"""The only code of accel-agent that runs with privileges: a few sysfs writes,
a VF's network settings and NVML's writes, each in a small module of its own.

Three oslo.privsep contexts (context.py), each a helper process started by
the agent (lifecycle.py) and watched by a guard (guard.py):

* ``sysfs_admin``, **no** capability, uid 0, for the sysfs writers:
  mdev.py writes a UUID to ``.../mdev_supported_types/<type>/create`` and
  ``1`` to ``bus/mdev/devices/<uuid>/remove``; vgpu.py a vGPU type id (or
  ``0``) to a VF's ``nvidia/current_vgpu_type``; pci.py ``sriov_numvfs`` and
  a VF's hand-over to ``vfio-pci`` and back.  A write that unmakes a device
  (``remove``, the vGPU's ``0``, the unbind from ``vfio-pci``) comes only
  after a read-only open of its VFIO group node (``/dev/vfio/<group>``, root
  0600) shows that no VM holds it (inuse.py): the kernel's write would block
  until the holder lets go, and the probe belongs next to the write it guards;
* ``net_admin``, **CAP_NET_ADMIN only**, for net.py: a VF's MAC, VLAN,
  spoof check, trust, link state and rate over rtnetlink (net.py says why
  it is a context of its own);
* ``nvml_admin``, **CAP_SYS_ADMIN only**, for nvml.py: through NVIDIA's
  management library, a GPU's vGPU heterogeneous (mixed-size) mode, its MIG
  mode, its GPU instances (nvml.py says why that capability: the driver's
  administrator test is ``capable(CAP_SYS_ADMIN)``).

Everything else (scans, policy, ledger) runs unprivileged; reads are never
privileged (os-vif's style, docs/design.md §2.2).  What the rest of the agent
uses is this facade; the modules behind it are the package's own
(tests/unit/test_house.py checks that nothing outside imports them).

Capabilities of ``sysfs_admin``: **none** (``capabilities=[]``), the daemon keeps uid 0.
    sysfs ``create``/``remove`` are ``--w------- root root``.  kernfs checks
    them with ``generic_permission()`` at open(2) time, like any file: the
    owner-write bit is enough for a process whose fsuid is the owner, so uid 0
    needs no capability at all (CAP_DAC_OVERRIDE only matters for a file the
    caller does not own or whose owner bit is clear).  The mdev core's
    ``create_store()``/``remove_store()`` call no ``capable()``.  Checked on
    this host (kernel 6.18): under ``setpriv --bounding-set=-all`` a uid-0
    process with ``CapEff: 0000000000000000`` opens the root-owned 0200
    ``/sys/bus/pci/drivers_probe`` with O_WRONLY (nothing written), while
    uid 65534 gets EACCES.  End to end on a real mdev sysfs (Debian 6.1.0-56
    kernel with the mtty sample driver under QEMU, tests/realkernel/,
    docs/design.md §2.2 and Sources M1):
    this package's privsep daemon, ``CapEff``/``CapPrm`` 0, uid 0, created and
    removed mtty mdevs and got EEXIST/ENOSPC/ENOENT mapped as documented.
    tests/functional/test_privsep_daemon.py reads the running daemon's
    ``CapEff``/``CapPrm`` (all threads) and proves the other half: a
    root-owned ``create`` of mode 0000 gives EACCES in the daemon, i.e. it
    really holds no CAP_DAC_OVERRIDE.
    Why not "uid nobody + CAP_DAC_OVERRIDE" (a tempting alternative): that
    writes *any* file on the host; uid 0 without capabilities cannot load
    modules, mount, ptrace, chown, or bypass a permission bit.  What it can
    still do is write root-owned files that have the owner-write bit, which is
    why the entrypoints accept only validated names and confine the resolved
    path to ``sysfs_root``.  The daemon never exec()s: an exec as uid 0 would
    regain the full set under the kernel's root-exec rule.  A vendor driver
    whose create path calls ``capable()`` (none known) can be given a
    capability by the operator: ``[accel_agent_privileged] capabilities``.
    Leave ``[accel_agent_privileged] user`` unset: another uid cannot write
    the root-owned 0200 files without CAP_DAC_OVERRIDE.

Inputs are validated before any filesystem access (even ``realpath``), by
plain functions that unit tests call without the daemon (validate.py).
``sysfs_root`` comes with each call from the agent's running configuration
(an absolute, normalised path), never from the config files on disk: the
helper may be restarted (oslo.privsep respawns it when it died) after an
operator edited them, and the agent keeps acting on the tree it started
with until it is restarted itself (``sysfs_root`` needs a restart).  A
caller choosing the root gains nothing it could not do anyway: the agent
runs as root, and the checks below (names validated, the path confined to
that root, one link per written file) hold for any root.  The path is
resolved with ``realpath`` and must stay inside ``realpath(sysfs_root)``;
between that check and the ``open`` only whoever can change the tree itself
(root, for /sys) could swap a component, which is outside what a caller of
the entrypoints controls (``O_NOFOLLOW`` still refuses a last component
turned symlink).  Every write is one write(2) to an existing file with one
link (writes.py).

Errors cross the privsep channel by class name and ``args`` only, which would
lose an ``AccelAgentException``'s ``kwargs``.  So the daemon side wraps them
in a ``WireError`` (class name, message, kwargs) and the public functions
below rebuild the original class with its message and kwargs (wire.py).

Each public function comes in two forms: through the helper (``create_mdev``,
``set_num_vfs``, ``apply_vf_settings``, ...), what the agent uses, and the
same validation and write in the calling process (``write_create``,
``write_num_vfs``, ``apply_local``, ...), for trees its user owns (the
simulator) and for the helper's own side.
"""

from __future__ import annotations

import warnings

# oslo.privsep's daemon module imports eventlet, which prints its own
# deprecation notice on import.  The agent never uses eventlet (threading
# everywhere) and an operator can do nothing about it: keep it out of
# accelctl's and the daemon's output.  Here, before any module of the
# package imports oslo.privsep: Python runs this file first.
warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated", category=Warning)

# The helper imports the contexts by these paths (their pypath): keep them here.
from accel_agent.privileged.context import (  # noqa: E402
    CFG_SECTION,
    NET_CFG_SECTION,
    NVML_CFG_SECTION,
    list_opts,
    net_admin,
    nvml_admin,
    sysfs_admin,
)
from accel_agent.privileged.inuse import vfio_dev_dir  # noqa: E402
from accel_agent.privileged.lifecycle import (  # noqa: E402
    ensure_net_privsep,
    guard_of,
    guards,
    helper_command,
    set_call_timeout,
    start_net_privsep,
    start_privsep,
    stop_net_privsep,
    stop_privsep,
)
from accel_agent.privileged.mdev import (  # noqa: E402
    check_not_in_use,
    create_mdev,
    remove_mdev,
    write_create,
    write_remove,
)
from accel_agent.privileged.net import (  # noqa: E402
    apply_local,
    apply_vf_settings,
    read_vf,
    reset_local,
    reset_vf_settings,
)
from accel_agent.privileged.nvml import (  # noqa: E402
    nvml_create_gpu_instance,
    nvml_destroy_gpu_instance,
    nvml_set_heterogeneous_mode,
    nvml_set_mig_mode,
)
from accel_agent.privileged.pci import (  # noqa: E402
    bind_vfio,
    set_num_vfs,
    unbind_vfio,
    write_bind_vfio,
    write_num_vfs,
    write_unbind_vfio,
)
from accel_agent.privileged.vgpu import (  # noqa: E402
    clear_vgpu_type,
    set_vgpu_placement,
    set_vgpu_type,
    write_vgpu_clear,
    write_vgpu_placement,
    write_vgpu_type,
)

__all__ = [
    "CFG_SECTION",
    "NET_CFG_SECTION",
    "NVML_CFG_SECTION",
    "apply_local",
    "apply_vf_settings",
    "bind_vfio",
    "check_not_in_use",
    "clear_vgpu_type",
    "create_mdev",
    "ensure_net_privsep",
    "guard_of",
    "guards",
    "helper_command",
    "list_opts",
    "net_admin",
    "nvml_admin",
    "nvml_create_gpu_instance",
    "nvml_destroy_gpu_instance",
    "nvml_set_heterogeneous_mode",
    "nvml_set_mig_mode",
    "read_vf",
    "remove_mdev",
    "reset_local",
    "reset_vf_settings",
    "set_call_timeout",
    "set_num_vfs",
    "set_vgpu_placement",
    "set_vgpu_type",
    "start_net_privsep",
    "start_privsep",
    "stop_net_privsep",
    "stop_privsep",
    "sysfs_admin",
    "unbind_vfio",
    "vfio_dev_dir",
    "write_bind_vfio",
    "write_create",
    "write_num_vfs",
    "write_remove",
    "write_unbind_vfio",
    "write_vgpu_clear",
    "write_vgpu_placement",
    "write_vgpu_type",
]
