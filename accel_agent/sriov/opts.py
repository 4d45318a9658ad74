"""The ``sriov_vf`` backend's options: ``[devices] enabled_vf_pools`` and one
``[vf_pool_<name>]`` group per enabled pool.

Declared here, beside the pools they describe (``pools.build_pools`` reads
them); registered by config/registry.py, which finds this module through
the backend's entry point (``SriovVfBackend.opts``) like any backend's, and
lists it in the sample config and docs/config.md with every room's.  A
pool's group exists only for an enabled pool, as ``[mdev_<type>]`` for an
enabled type: :func:`named_opts` lists them once the enabled names are
known, :func:`list_opts` shows the group once, as ``vf_pool_$(pool)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from oslo_config import cfg

from accel_agent.config.types import ResourceClassName, TraitName

Groups = list[tuple[str, list[cfg.Opt]]]
VF_POOL_NAME_REGEX = r"^[a-z0-9_]{1,32}$"

enabled_vf_pools = cfg.ListOpt(
    "enabled_vf_pools",
    default=[],
    help="""
Pools of SR-IOV accelerator VFs the agent hands to instances (backend
sriov_vf), one [vf_pool_<name>] section each. A pool name is lower-case
letters, digits and '_'. Empty: no VF pool.
""",
)


def pool_opts(pool: str) -> list[cfg.Opt]:
    """The options of ``[vf_pool_<pool>]`` (new objects each call: oslo.config
    keeps one per group it is registered in)."""
    return [
        cfg.ListOpt(
            "device_addresses",
            default=[],
            help=f"The SR-IOV PFs (PCI addresses such as 0000:3b:00.0) whose VFs make pool "
            f"{pool}. A PF belongs to one pool.",
        ),
        cfg.Opt(
            "resource_class",
            type=ResourceClassName(),
            default="SRIOV_NET_VF",
            help="Placement resource class of each PF's VFs (one provider per PF): "
            "CUSTOM_[A-Z0-9_]+ or a standard class (SRIOV_NET_VF, PCI_DEVICE, FPGA, ...).",
        ),
        cfg.ListOpt(
            "traits",
            default=[],
            item_type=TraitName(),
            help="Placement traits of each PF's provider: CUSTOM_[A-Z0-9_]+ (e.g. "
            "CUSTOM_NIC_A) or a standard trait of os-traits.",
        ),
        cfg.IntOpt(
            "num_vfs",
            min=0,
            max=65535,
            help="VFs to enable on each PF (sriov_numvfs) when the agent is asked to "
            "(accelctl / the backend's ensure_num_vfs); never changed while a VF is on "
            "vfio-pci. Unset: the PFs keep what they have.",
        ),
    ]


def list_opts() -> Groups:
    """The groups as the sample lists them: ``enabled_vf_pools`` in
    ``[devices]`` (after the core's, config/registry.py merges the group) and
    the per-pool group once, as ``vf_pool_$(pool)``."""
    return [
        ("devices", [enabled_vf_pools]),
        ("vf_pool_$(pool)", pool_opts("$(pool)")),
    ]


def named_opts(conf: cfg.ConfigOpts, pools: Iterable[str] | None = None) -> Groups:
    """``[vf_pool_<name>]`` of each pool of ``pools`` (the enabled ones of
    ``conf`` when None) whose name is one a pool may have; a bad name is
    refused by ``pools.build_pools``, naming it, and has no group."""
    names = pools if pools is not None else list(conf.devices.enabled_vf_pools or [])
    return [
        (f"vf_pool_{name}", pool_opts(name))
        for name in names
        if re.fullmatch(VF_POOL_NAME_REGEX, name)
    ]
