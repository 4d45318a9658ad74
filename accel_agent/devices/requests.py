"""What one attach call asks the manager for (docs/design.md §11), as plain data
with no device model in it: the API's and accelctl's requests are checked and
turned into these by ``accel_agent.attach_requests``.

* :class:`DeviceRequest`: ``count`` devices of the host scan's parents (mdevs,
  vendor-VFIO vGPU VFs) by resource class or type, as ``allocate`` places them;
* :class:`PoolRequest`: one device of a configured pool, whose backend picks
  the parent (an SR-IOV VF) and makes it with the per-instance ``settings``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_COUNT = 64  # devices of one request (and of one allocate)
# What the kernel names a type directory (mdev_supported_types/<type>); the
# rule is quoted as is in the refusals.
TYPE_NAME_RULE = "[A-Za-z0-9_.-]{1,64}"
_TYPE_NAME = re.compile(TYPE_NAME_RULE)


def is_type_name(value: Any) -> bool:
    """A type id as sysfs spells them (fullmatch: ``$`` would take a trailing
    newline)."""
    return isinstance(value, str) and _TYPE_NAME.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    count: int
    resource_class: str | None = None
    device_type: str | None = None
    parent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count}
        # The attach request's own words (the API's fields, the ledger's
        # record of the request): ``mdev_type`` is the type's field there.
        for key, value in (
            ("resource_class", self.resource_class),
            ("mdev_type", self.device_type),
            ("parent", self.parent),
        ):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class PoolRequest:
    backend: str
    pool: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    where: str | None = None  # the pool's physical device (a PF), when asked

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pool": self.pool, **self.settings}
        if self.where is not None:
            out["pf"] = self.where
        return out


AttachRequest = DeviceRequest | PoolRequest


def document(requests: Sequence[AttachRequest]) -> list[dict[str, Any]]:
    """The requests as the ledger keeps them: a repeat of the same call is
    recognised by comparing these (idempotency)."""
    return [r.to_dict() for r in requests]
