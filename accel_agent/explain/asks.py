"""What the configuration asks of one device: its mdev type (listed in
``[mdev_<type>] device_addresses``, or the default type), that type's layout
(``standing``, ``reported_by``, ``max_instances``), the mixed-size layout of
its GPU (``[gpu_layout_<name>]``: several types, so no one ``mdev_type``) and
the VF pool naming it as a PF (``[vf_pool_<name>] device_addresses``).

Plain data: the daemon builds it from its running policy and pools, accelctl
from the config files; neither needs the other's objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accel_agent.sysfs import address

if TYPE_CHECKING:
    from accel_agent.devices.policy import DevicePolicy


@dataclass(frozen=True, slots=True)
class Asks:
    policy: DevicePolicy | None = None
    # PF address -> (pool name, num_vfs).
    pools: Mapping[str, tuple[str, int | None]] = field(default_factory=dict)
    # Why the configuration could not be read (then nothing is asked).
    problem: str | None = None

    @classmethod
    def of(cls, policy: DevicePolicy | None, pools: Mapping[str, Any] | None,
           problem: str | None = None) -> Asks:
        """From a policy and the VF pools by name (``accel_agent.sriov.pools.Pool``
        or anything with ``device_addresses`` and ``num_vfs``)."""
        by_pf = {
            pf: (name, getattr(pool, "num_vfs", None))
            for name, pool in (pools or {}).items()
            for pf in getattr(pool, "device_addresses", ())
        }
        return cls(policy, by_pf, problem)

    def listed_type(self, name: str) -> str | None:
        """The type whose ``device_addresses`` name this device."""
        if self.policy is None:
            return None
        return self.policy.parent_types.get(address.normalise_parent(name))

    def for_device(self, name: str, physfn: str | None = None) -> dict[str, Any]:
        """The ``config`` object of an explained device."""
        listed = self.listed_type(name) or (self.listed_type(physfn) if physfn else None)
        mdev_type, source = listed, "device_addresses" if listed else None
        layout = None
        if self.policy is not None and mdev_type is None:
            layout = self.policy.gpu_layout_for(physfn or name)
        if layout is not None:
            source = "gpu_layout"
        elif mdev_type is None and self.policy is not None and self.policy.default_type:
            mdev_type, source = self.policy.default_type, "default"
        config = self.policy.config_of(mdev_type) if self.policy and mdev_type else None
        pool = self.pools.get(name) or (self.pools.get(physfn) if physfn else None)
        return {
            "mdev_type": mdev_type,
            "source": source,
            "standing": config.standing if config else 0,
            "reported_by": config.reported_by if config else None,
            "max_instances": config.max_instances if config else None,
            "vf_pool": {"name": pool[0], "num_vfs": pool[1]} if pool else None,
            "gpu_layout": None if layout is None else {
                "name": layout.name,
                "vgpus": [{"mdev_type": t, "count": n} for t, n in layout.vgpus],
                "reported_by": layout.reported_by,
            },
        }
