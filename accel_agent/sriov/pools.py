"""VF pools from configuration: ``[devices] enabled_vf_pools`` and one
``[vf_pool_<name>]`` section each (Nova's per-group style, issue 15; the
options are declared in :mod:`accel_agent.sriov.opts`).

Addresses are normalised (case, short ``BB:SS.F`` form) before matching and
before the duplicate check, as for mdev types; a PF named twice, in one pool
or in two, refuses the configuration, naming both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from oslo_config import cfg

from accel_agent import exception
from accel_agent.config import registry
from accel_agent.sriov import opts as pool_opts
from accel_agent.sysfs import address


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    device_addresses: tuple[str, ...]  # canonical PF addresses
    resource_class: str
    traits: tuple[str, ...]
    num_vfs: int | None


def build_pools(conf: cfg.ConfigOpts) -> Mapping[str, Pool]:
    """The enabled pools by name, validated; InvalidVfPoolConfig otherwise.
    Registers the backend's options on ``conf`` first (through the
    configuration room, config/registry.py), so any loaded configuration
    will do."""
    registry.register_room(conf, pool_opts, named=False)
    names = list(conf.devices.enabled_vf_pools or [])
    pools: dict[str, Pool] = {}
    owner: dict[str, str] = {}
    for name in names:
        if not re.fullmatch(pool_opts.VF_POOL_NAME_REGEX, name):
            raise exception.InvalidVfPoolConfig(
                pool=name, reason=f"a pool name must match {pool_opts.VF_POOL_NAME_REGEX}"
            )
        if name in pools:
            raise exception.InvalidVfPoolConfig(
                pool=name, reason="listed twice in [devices] enabled_vf_pools"
            )
        registry.register_groups(conf, pool_opts.named_opts(conf, [name]))
        group = conf[f"vf_pool_{name}"]
        addresses = []
        for raw in group.device_addresses:
            try:
                pf = address.parse_pci_address(raw)
            except exception.InvalidPciAddress:
                raise exception.InvalidVfPoolConfig(
                    pool=name, reason=f"device address {raw!r} is not a PCI address"
                ) from None
            if pf in owner:
                raise exception.InvalidVfPoolConfig(
                    pool=name, reason=f"PF {pf} is also in pool {owner[pf]}"
                )
            owner[pf] = name
            addresses.append(pf)
        if not addresses:
            raise exception.InvalidVfPoolConfig(pool=name, reason="no device_addresses")
        pools[name] = Pool(
            name=name,
            device_addresses=tuple(addresses),
            resource_class=group.resource_class,
            traits=tuple(group.traits),
            num_vfs=group.num_vfs,
        )
    return MappingProxyType(pools)
