"""The one operation protocol every mutating use case goes through.

docs/design.md §5.7: a change to the host is **intent, then make, then
settle, or roll back**.  The intent is in the ledger before the first
sysfs write, so a crash at any instant leaves rows that recovery settles
by comparing them with sysfs.  This package is the only code that takes
the manager's lock, opens the ledger's transactions and calls its writing
methods, writes and settles intents, makes, unmakes and prepares devices
through their backends, writes libvirt's definitions, and names the crash
points (``step``) the crash tests kill at.  The use cases (allocations,
attach, claims, layout, takeover, recovery) decide *what* to change and
ask it to run the change; tests/unit/test_house.py keeps it so.

The runs, one module each, behind this facade (the rest of the agent
imports only this module):

* ``operation.py``: :func:`make_and_assign` runs an :class:`Operation`
  (allocate, claim, attach, a layout's new devices): reserve free devices
  or record create intents, make the new devices, assign them all in one
  transaction, or :meth:`~Operation.abort`.  Two commits whatever the
  count, one fsync.
* ``remove.py``: :func:`release_and_remove` runs a :class:`Release` (drop
  an owner's assignments and record the remove intents in one commit,
  remove, settle); :func:`remove_owned` removes one owned, unassigned
  device (rollback, recovery, a layout's removals).
* ``ownership.py``: changes that write no sysfs, each one durable
  transaction: a claim committed or freed, a :class:`Takeover` (an
  adoption, a takeover from Nova: libvirt's definitions undefined first,
  defined again when it fails).
* ``standing.py``: a standing layout's devices joining it, taken back,
  removed.
* ``settle.py``: recovery's half: the host's preparation under an intent,
  what a crash left half-done, a device made again, one forgotten.
* ``libvirt_defs.py``: libvirt's definitions go with the devices: a remove
  undefines the mdev after its sysfs remove and before the settlement;
  with ``[libvirt] define_mdevs`` a make defines what it created.
* ``runs.py``: the lock, the crash points, the one transaction of a change
  that writes no sysfs.

A privileged helper that fails in the middle (PrivilegedHelperUnavailable:
the write may or may not have happened) stops a run where it is: the intent
stays, exactly as after a crash, and recovery settles it.  So does a libvirt
that does not answer within ``[libvirt] call_timeout`` (LibvirtStalled): a
remove's sysfs writes are done, the undefine is left to recovery.
"""

from accel_agent.devices.protocol.libvirt_defs import define_made
from accel_agent.devices.protocol.operation import (
    AttachRecord,
    Chosen,
    Operation,
    Owner,
    PlanItem,
    Slot,
    ToMake,
    make_and_assign,
)
from accel_agent.devices.protocol.ownership import (
    Adoption,
    Assignment,
    Takeover,
    adopt,
    commit_claim,
    free_claim,
)
from accel_agent.devices.protocol.remove import (
    Release,
    release_and_remove,
    release_quietly,
    remove_owned,
)
from accel_agent.devices.protocol.runs import (
    LEGACY_LOCK_NAME,
    LOCK_NAME,
    LOCK_NAMES,
    device_ref,
    operation,
)
from accel_agent.devices.protocol.settle import (
    Existing,
    create_gpu_instance,
    destroy_gpu_instance,
    forget_gone,
    forget_gpu_instance,
    place_again,
    prepare_hosts,
    record_gpu_instance,
    record_placement,
    remake,
    set_mig_mode,
    set_mixed_size_mode,
    settle_interrupted,
)
from accel_agent.devices.protocol.standing import (
    LAYOUT,
    LAYOUT_OWNER,
    join_layout,
    remove_from_layout,
    take_back,
)

__all__ = [
    "LAYOUT",
    "LAYOUT_OWNER",
    "LEGACY_LOCK_NAME",
    "LOCK_NAME",
    "LOCK_NAMES",
    "Adoption",
    "Assignment",
    "AttachRecord",
    "Chosen",
    "Existing",
    "Operation",
    "Owner",
    "PlanItem",
    "Release",
    "Slot",
    "Takeover",
    "ToMake",
    "adopt",
    "commit_claim",
    "create_gpu_instance",
    "define_made",
    "destroy_gpu_instance",
    "device_ref",
    "forget_gone",
    "forget_gpu_instance",
    "free_claim",
    "join_layout",
    "make_and_assign",
    "operation",
    "place_again",
    "prepare_hosts",
    "record_gpu_instance",
    "record_placement",
    "release_and_remove",
    "release_quietly",
    "remake",
    "remove_from_layout",
    "remove_owned",
    "set_mig_mode",
    "set_mixed_size_mode",
    "settle_interrupted",
    "take_back",
]
