"""Which of the layouts' devices each GPU keeps, and which drain: one rule
for every kind of layout, standing (``[mdev_<type>] standing``) and
mixed-size or MIG-backed (``[gpu_layout_<name>]``), over
:meth:`DevicePolicy.wanted_on` (what a GPU carries at all times, ``(type,
count)`` each).  Pure functions of the ledger, the scan and the
configuration, so the converges, the listings, health and a release name the
same devices (docs/design.md §13).

Draining:

* a member of a layout (held by the layout, or taken from it by an
  instance) on a GPU that no longer wants its type (another type,
  ``standing = 0``, a layout that no longer names it) drains;
* a GPU with more devices of a type than it wants (a lowered count): the
  extras drain, those instances (or claims) hold first, then the layout's
  own, each in UUID order.  Instances first: their devices are the ones
  that go when released, and the device an instance gives back is never
  named in place of one already named (it joins the layout after every
  instance's), so a device named draining stays named until it is free.

A free device is never draining: the converge takes it into the layout or
removes it at once.  A device in use is never retyped, moved or removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.sysfs.model import HostSnapshot


@dataclass(slots=True)
class Kept:
    """The devices of one type on one GPU that a layout counts, and how
    many of that type the GPU wants."""

    wanted: int
    held: list[str] = field(default_factory=list)  # instances or claims hold them
    own: list[str] = field(default_factory=list)  # the layout holds them

    @property
    def present(self) -> int:
        return len(self.held) + len(self.own)


# (physical GPU, type) -> what of that type the GPU's layout counts.
Groups = dict[tuple[str, str], Kept]


def groups(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    holders: Mapping[str, str | None],
    members: Set[str],
    made: Mapping[str, tuple[str, str]] | None = None,
) -> tuple[Groups, set[str]]:
    """Per (GPU, a type it wants): the devices instances or claims hold and
    the layout's own, each sorted; and the members on a GPU that no longer
    wants their type.  ``holders``: the agent's settled devices, uuid -> the
    instance or claim holding it (None: the layout, or nobody); ``members``:
    the layouts' devices; ``made``: uuid -> (parent, type) of devices made
    since ``snapshot`` was read (a converge's own)."""
    found: Groups = {}
    unwanted: set[str] = set()
    for uuid, holder in holders.items():
        mdev = snapshot.mdevs.get(uuid)
        where = (mdev.parent, mdev.mdev_type) if mdev is not None else (made or {}).get(uuid)
        if where is None:
            continue  # not on the host: nothing to drain
        own = holder is None and uuid in members
        if holder is None and not own:
            continue  # free: the converge takes it into the layout or removes it now
        parent = snapshot.parents.get(where[0])
        wanted = dict(policy.wanted_on(parent)) if parent is not None else {}
        device_type = str(where[1])
        if parent is None or device_type not in wanted:
            if uuid in members:
                unwanted.add(uuid)
            continue
        kept = found.setdefault((parent.physical_gpu, device_type), Kept(wanted[device_type]))
        (kept.own if own else kept.held).append(uuid)
    for kept in found.values():
        kept.held.sort()
        kept.own.sort()
    return found, unwanted


def drained(found: Groups, unwanted: Set[str]) -> frozenset[str]:
    """The devices that drain, of :func:`groups`' answer (module docstring)."""
    names = set(unwanted)
    for kept in found.values():
        extra = kept.present - kept.wanted
        if extra > 0:
            names.update((kept.held + kept.own)[:extra])
    return frozenset(names)


def draining(
    snapshot: HostSnapshot,
    policy: DevicePolicy,
    holders: Mapping[str, str | None],
    members: Set[str],
    made: Mapping[str, tuple[str, str]] | None = None,
) -> frozenset[str]:
    """The devices the layouts no longer want, removed once free."""
    return drained(*groups(snapshot, policy, holders, members, made))
