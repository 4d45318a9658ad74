"""The agent's three oslo.privsep contexts, their config sections, and the one
entrypoint each guard needs of its helper (its pid).

* ``sysfs_admin``, ``[accel_agent_privileged]``: **no** capability, uid 0
  (the package's docstring says why that is enough); mdev.py, vgpu.py and
  pci.py write through it;
* ``net_admin``, ``[accel_agent_net_privileged]``: CAP_NET_ADMIN only
  (net.py says why it is a context of its own);
* ``nvml_admin``, ``[accel_agent_nvml_privileged]``: CAP_SYS_ADMIN only, for
  NVML's writes (a GPU's mixed-size mode, MIG mode, GPU instances; nvml.py
  says why that capability and no other).

A context's ``pypath`` is where the helper imports it from (oslo.privsep
passes it as ``--privsep_context`` and refuses to start a helper unless
``import_class(pypath) is context``): both name the package's facade, where
they are re-exported, so ``accel_agent.privileged.sysfs_admin`` stays what
it always was.
"""

from __future__ import annotations

import os

from oslo_config import cfg

# After the package's filter of eventlet's notice (__init__.py runs first).
from oslo_privsep import capabilities as caps
from oslo_privsep import priv_context

CFG_SECTION = "accel_agent_privileged"
NET_CFG_SECTION = "accel_agent_net_privileged"
NVML_CFG_SECTION = "accel_agent_nvml_privileged"

sysfs_admin = priv_context.PrivContext(
    "accel_agent",
    cfg_section=CFG_SECTION,
    pypath="accel_agent.privileged.sysfs_admin",
    # See the package's docstring: uid 0 writing root-owned 0200 files needs none.
    capabilities=[],
)

net_admin = priv_context.PrivContext(
    "accel_agent",
    cfg_section=NET_CFG_SECTION,
    pypath="accel_agent.privileged.net_admin",
    capabilities=[caps.CAP_NET_ADMIN],
)


nvml_admin = priv_context.PrivContext(
    "accel_agent",
    cfg_section=NVML_CFG_SECTION,
    pypath="accel_agent.privileged.nvml_admin",
    # The driver's administrator test is capable(CAP_SYS_ADMIN) (nvml.py).
    capabilities=[caps.CAP_SYS_ADMIN],
)


@sysfs_admin.entrypoint
def _priv_sysfs_pid() -> int:
    """The helper's own pid: the guard kills a helper that misses a deadline."""
    return os.getpid()


@net_admin.entrypoint
def _priv_net_pid() -> int:
    """The net helper's own pid (guard.py)."""
    return os.getpid()


@nvml_admin.entrypoint
def _priv_nvml_pid() -> int:
    """The NVML helper's own pid (guard.py)."""
    return os.getpid()


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """oslo.privsep's options under each context's section, for oslo-config-generator."""
    return [
        (CFG_SECTION, list(priv_context.OPTS)),
        (NET_CFG_SECTION, list(priv_context.OPTS)),
        (NVML_CFG_SECTION, list(priv_context.OPTS)),
    ]
