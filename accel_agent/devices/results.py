"""What the decider's use cases answer: an instance's allocation, its attach
handles, a recovery's report, a takeover's plan.  Plain data, JSON-able
through ``to_dict`` (the API's and accelctl's documents)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accel_agent.devices.ledger import DeviceRecord


@dataclass(frozen=True, slots=True)
class Allocation:
    instance: str
    mdevs: tuple[DeviceRecord, ...]

    @property
    def uuids(self) -> list[str]:
        return [m.uuid for m in self.mdevs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "mdevs": [
                {"uuid": m.uuid, "parent": m.parent, "mdev_type": m.device_type} for m in self.mdevs
            ],
        }


@dataclass
class RecoveryReport:
    recreated: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    waiting_for_parent: list[str] = field(default_factory=list)
    released_claims: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    # Interrupted removes that found the mdev in use: kept, free, owned.
    kept_in_use: list[str] = field(default_factory=list)
    # Foreign mdevs that look like the agent's while its ledger was lost:
    # see DeviceManager.unrecorded.
    unrecorded: list[str] = field(default_factory=list)
    # The standing layouts, converged after recovery (devices/layout.py):
    # devices made or taken back, removed, still draining.
    layout_made: list[str] = field(default_factory=list)
    layout_removed: list[str] = field(default_factory=list)
    layout_draining: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {k: sorted(v) for k, v in self.__dict__.items()}


@dataclass
class TakeoverPlan:
    """What ``takeover`` does (or, dry run or refused, would do).

    ``domains``: per libvirt domain with mdevs, each mdev with its action:
    ``adopt`` (foreign: adopted and assigned to the domain's UUID), ``assign``
    (owned and free: assigned) or ``none`` (already the instance's).
    ``unused``: foreign mdevs no domain uses, ``adopt`` (``--all``, adopted
    free) or ``foreign`` (left alone; ``reason`` says why when ``--all`` was
    given).  ``problems``: why the takeover is refused; any one of them means
    nothing changes."""

    dry_run: bool
    adopt_unused: bool
    domains: list[dict[str, Any]] = field(default_factory=list)
    unused: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "dry_run": self.dry_run,
            "all": self.adopt_unused,
            "domains": self.domains,
            "unused": self.unused,
            "problems": self.problems,
        }


@dataclass(frozen=True, slots=True)
class Attachment:
    """An instance's attach handles (docs/design.md §11): one per device, in the
    order of the requests that asked for them, each with its guest XML."""

    instance: str
    handles: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "attachments": [dict(h) for h in self.handles]}
