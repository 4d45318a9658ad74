"""Per-instance attach requests (os-acc, docs/design.md §11) as the API and
accelctl take them, checked whole before anything is prepared and turned into
the manager's plain requests (``accel_agent.devices.requests``).

One request is a list of device requests, each one of:

* ``{"resource_class": "VGPU", "count": 1}`` (optionally ``mdev_type``,
  ``parent``): vGPUs, mdevs or vendor-VFIO VFs alike, by the resource class
  of a configured type (``[mdev_<type>] mdev_class``) or by the type itself;
* ``{"pool": "nic_a", "mac": "52:54:00:..", "vlan": 100, ...}`` (optionally
  ``pf``): one SR-IOV VF of a configured pool with its network settings
  (``accel_agent.sriov.vfconfig``).

Every field is checked before the manager takes its lock: a bad one is
:class:`~accel_agent.exception.InvalidAttachRequest` naming it
(``requests[1].vlan``), and nothing is prepared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from accel_agent import exception
from accel_agent.backends.sriov_vf import BACKEND as SRIOV_VF
from accel_agent.devices.requests import (
    MAX_COUNT,
    TYPE_NAME_RULE,
    AttachRequest,
    DeviceRequest,
    PoolRequest,
    is_type_name,
)
from accel_agent.sriov import vfconfig
from accel_agent.sriov.pools import Pool
from accel_agent.sysfs import address

MAX_REQUESTS = 16
# Placement's resource class names: standard ones and CUSTOM_*.
_RESOURCE_CLASS = re.compile(r"[A-Z0-9_]{1,255}")
_DEVICE_FIELDS = frozenset({"resource_class", "mdev_type", "parent", "count"})
_VF_FIELDS = frozenset({"pool", "pf"})


def _bad(field: str, reason: str) -> exception.InvalidAttachRequest:
    return exception.InvalidAttachRequest(field=field, reason=reason)


def parse(raw: Any, pools: Mapping[str, Pool]) -> list[AttachRequest]:
    """The checked requests of one attach call (see the module docstring)."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or not raw:
        raise _bad("requests", "must be a non-empty list of device requests")
    if len(raw) > MAX_REQUESTS:
        raise _bad("requests", f"at most {MAX_REQUESTS} device requests per call")
    return [_parse_one(f"requests[{i}]", item, pools) for i, item in enumerate(raw)]


def _parse_one(where: str, item: Any, pools: Mapping[str, Pool]) -> AttachRequest:
    if not isinstance(item, Mapping):
        raise _bad(where, "must be an object")
    if "pool" in item:
        return _parse_vf(where, item, pools)
    unknown = sorted(str(k) for k in item if k not in _DEVICE_FIELDS)
    if unknown:
        raise _bad(
            f"{where}.{unknown[0]}",
            "unknown field of a vGPU request (a VF request names its pool: \"pool\")",
        )
    if item.get("resource_class") is None and item.get("mdev_type") is None:
        raise _bad(where, "names neither a pool nor a resource_class or mdev_type")
    count = item.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise _bad(f"{where}.count", f"must be an integer from 1 to {MAX_COUNT}, not {count!r}")
    resource_class = item.get("resource_class")
    if resource_class is not None and not (
        isinstance(resource_class, str) and _RESOURCE_CLASS.fullmatch(resource_class)
    ):
        raise _bad(f"{where}.resource_class", f"{resource_class!r} is no resource class name")
    mdev_type = item.get("mdev_type")
    if mdev_type is not None and not is_type_name(mdev_type):
        raise _bad(f"{where}.mdev_type", f"{mdev_type!r} must match {TYPE_NAME_RULE}")
    parent = item.get("parent")
    if parent is not None:
        if not (
            isinstance(parent, str)
            and parent.isprintable()
            and (address.is_pci_address(parent) or address.is_virtual_parent_name(parent))
        ):
            raise _bad(f"{where}.parent", f"{parent!r} is neither a PCI address nor a parent name")
        parent = address.normalise_parent(parent)
    return DeviceRequest(count, resource_class, mdev_type, parent)


def _parse_vf(where: str, item: Mapping[str, Any], pools: Mapping[str, Pool]) -> PoolRequest:
    name = item["pool"]
    pool = pools.get(name) if isinstance(name, str) else None
    if pool is None:
        raise _bad(
            f"{where}.pool",
            f"no VF pool {name!r} (enabled pools: {', '.join(pools) or 'none'}; "
            "see [devices] enabled_vf_pools)",
        )
    pf = item.get("pf")
    if pf is not None:
        try:
            pf = address.parse_pci_address(pf)
        except (exception.InvalidPciAddress, TypeError, AttributeError):
            raise _bad(f"{where}.pf", f"{pf!r} is not a PCI address") from None
        if pf not in pool.device_addresses:
            raise _bad(
                f"{where}.pf",
                f"PF {pf} is not in pool {pool.name} (its PFs: "
                f"{', '.join(pool.device_addresses)}: [vf_pool_{pool.name}] device_addresses)",
            )
    settings = {k: v for k, v in item.items() if k not in _VF_FIELDS}
    try:
        checked = vfconfig.validate_settings(settings)
    except exception.InvalidVfSetting as err:
        raise _bad(f"{where}.{err.kwargs['field']}", str(err.kwargs["reason"])) from None
    return PoolRequest(SRIOV_VF, pool.name, checked.to_dict(), pf)

