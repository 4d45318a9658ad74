"""Taking over what exists: adopt one foreign device, or take over the devices
of a host Nova ran (every libvirt domain's mdevs adopted and assigned to the
instance named by the domain's UUID, Nova's instance UUID).

A takeover is all or nothing: any problem (an mdev missing, of a type the
config does not give its parent, used by two domains or owned by another
instance) refuses it and changes nothing; ``dry_run`` returns the plan,
problems included.  Idempotent: a second run finds nothing to do.  Both
write no sysfs; this module plans, and the protocol runs what it planned
(protocol.Takeover: the undefines, then one durable transaction).

libvirt's definitions (docs/design.md §14): a taken-over mdev that libvirt defines
(Nova since 2024.2 defines its mdevs persistent with autostart) is undefined,
so that the agent alone re-creates it at boot and Nova's start-up finds no
inactive definition to start.  Undefined, not merely autostart off: Nova's
``init_host`` starts every *inactive* defined mdev, autostart or not.  The
undefines come before the ledger's commit; a failure at any point defines
again, with its XML and autostart flag, what this call undefined, and the
ledger is not changed (protocol.Takeover.abort).  libvirt unreachable, or not answering within
``[libvirt] call_timeout`` (LibvirtStalled, a dry run too): refused, nothing
changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.devices import protocol
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind, validate_instance_id
from accel_agent.devices.results import TakeoverPlan
from accel_agent.sysfs import scanner

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)


def adopt(m: DeviceManager, uuid: str) -> DeviceRecord:
    """Take ownership of a foreign mdev so the agent may reuse or remove it;
    libvirt's definition of it, if any, is undefined (all or nothing)."""
    text = uuid.strip().lower() if isinstance(uuid, str) else ""
    if not scanner.is_canonical_uuid(text):
        raise exception.InvalidMdevUUID(uuid=uuid, where="", reason="not a UUID")
    with protocol.operation(m):
        snapshot = m.scan()
        mdev = snapshot.mdevs.get(text)
        if mdev is None:
            raise exception.MdevNotFound(uuid=text)
        if mdev.mdev_type is None:
            raise exception.MdevInUse(uuid=text, reason="its mdev_type cannot be read")
        existing = m.ledger.get(text)
        if existing is not None:
            return existing
        defined = m.nodedevs.require()  # NodeDevicesUnavailable: nothing done
        record = protocol.adopt(
            m, protocol.Adoption(text, mdev.parent, mdev.mdev_type, mdev.backend), defined
        )
        LOG.info("adopted %s %s (%s on %s)", m.device_kind(mdev.backend), text, mdev.mdev_type,
                 mdev.parent)
        return record


def takeover(m: DeviceManager, adopt_unused: bool = False, dry_run: bool = False) -> TakeoverPlan:
    """Take over the mdevs of a host Nova ran: every libvirt domain's mdevs
    are adopted and assigned to the instance named by the domain's UUID
    (Nova's instance UUID); with ``adopt_unused`` the foreign mdevs no
    domain uses are adopted free.  All or nothing: any problem (an mdev
    missing, of a type the config does not give its parent, used by two
    domains or owned by another instance) raises TakeoverRefused and
    changes nothing.  ``dry_run`` returns the plan, problems included,
    and changes nothing.  Idempotent: a second run finds nothing to do."""
    try:
        domains = m.domains.mdev_domains()  # LibvirtUnavailable: nothing done
        defined = m.nodedevs.require()  # NodeDevicesUnavailable: nothing done
    except exception.LibvirtStalled as exc:
        raise _refused(exc, dry_run) from None
    with protocol.operation(m):
        snapshot = m.scan()
        plan = _plan_takeover(m, snapshot, domains, adopt_unused, dry_run, defined)
        if dry_run:
            return plan
        if plan.problems:
            raise exception.TakeoverRefused(reason="; ".join(plan.problems))
        _takeover_of(m, snapshot, plan, defined).run()
        plan.applied = True
    _log_takeover(plan)
    return plan


def _refused(stall: exception.LibvirtStalled, dry_run: bool) -> exception.LibvirtStalled:
    """A takeover needs every domain and definition: one libvirt does not
    give within its deadline refuses it (a dry run too), saying so."""
    run = " (dry run)" if dry_run else ""
    return exception.LibvirtStalled(
        f"takeover from libvirt{run} refused, nothing changed: {stall.message}; run it "
        "again once libvirt answers "
        "(GET /v1/health: libvirt.state)",
        **stall.kwargs,
    )


def _to_undefine(plan: TakeoverPlan) -> list[str]:
    entries = [e for d in plan.domains for e in d["mdevs"]] + plan.unused
    return [e["uuid"] for e in entries if e.get("libvirt") == "undefine"]


def _takeover_of(
    m: DeviceManager, snapshot: HostSnapshot, plan: TakeoverPlan, defined: Mapping[str, Any]
) -> protocol.Takeover:
    """What the plan changes, for the protocol to run: libvirt's definitions
    of what it takes undefined, each domain's mdevs adopted (or owned
    already, free) and assigned to its instance, and with ``adopt_unused``
    the unused foreign mdevs adopted free."""
    adopt: list[protocol.Adoption] = []
    assign: list[protocol.Assignment] = []
    for domain in plan.domains:
        for mdev in domain["mdevs"]:
            if mdev["action"] == "adopt":
                adopt.append(_adoption(snapshot, mdev, domain["uuid"]))
            elif mdev["action"] == "assign":
                assign.append(protocol.Assignment(mdev["uuid"], domain["uuid"]))
    adopt += [_adoption(snapshot, mdev) for mdev in plan.unused if mdev["action"] == "adopt"]
    return protocol.Takeover(m, defined, _to_undefine(plan), adopt, assign)


def _adoption(
    snapshot: HostSnapshot, mdev: Mapping[str, Any], instance: str | None = None
) -> protocol.Adoption:
    return protocol.Adoption(
        mdev["uuid"], mdev["parent"], mdev["mdev_type"],
        backend=snapshot.mdevs[mdev["uuid"]].backend, instance=instance,
    )


def _log_takeover(plan: TakeoverPlan) -> None:
    for domain in plan.domains:
        taken = [m["uuid"] for m in domain["mdevs"] if m["action"] != "none"]
        if taken:
            LOG.info(
                "took over mdev(s) %s of libvirt domain %s as instance %s",
                ", ".join(taken), domain["name"], domain["uuid"],
            )
    adopted = [m["uuid"] for m in plan.unused if m["action"] == "adopt"]
    if adopted:
        LOG.info("adopted %d unused mdev(s) as free: %s", len(adopted), ", ".join(adopted))
    undefined = _to_undefine(plan)
    if undefined:
        LOG.info("undefined %d mdev(s) in libvirt: the agent re-creates them: %s",
                 len(undefined), ", ".join(undefined))


def _plan_takeover(
    m: DeviceManager,
    snapshot: HostSnapshot,
    domains: list[Any],
    adopt_unused: bool,
    dry_run: bool,
    defined: Mapping[str, Any],
) -> TakeoverPlan:
    plan = TakeoverPlan(dry_run=dry_run, adopt_unused=adopt_unused)
    users: dict[str, list[str]] = {}
    for domain in domains:
        for uuid in domain.mdevs:
            users.setdefault(uuid, []).append(f"{domain.name} ({domain.uuid})")
    for uuid, names in sorted(users.items()):
        if len(names) > 1:
            plan.problems.append(f"mdev {uuid} is used by {len(names)} domains: "
                                 + ", ".join(names))
    for domain in domains:
        who = f"domain {domain.name} ({domain.uuid})"
        try:
            validate_instance_id(domain.uuid)
        except exception.AccelAgentException as exc:
            plan.problems.append(f"{who}: its UUID is no instance id: {exc.message}")
        entries = []
        for uuid in domain.mdevs:
            entry = _takeover_entry(m, snapshot, uuid, domain.uuid, who, plan.problems)
            if entry is not None:
                # The mdev is (or stays) the instance's: libvirt must not keep it.
                takes = entry["action"] in ("adopt", "assign") or _owned_by(m, uuid, domain.uuid)
                entry["libvirt"] = _libvirt_action(defined, uuid, takes)
                entries.append(entry)
        plan.domains.append({"uuid": domain.uuid, "name": domain.name, "mdevs": entries})
    for uuid, mdev in sorted(snapshot.mdevs.items()):
        if uuid in users or m.ledger.get(uuid) is not None:
            continue
        entry = {"uuid": uuid, "parent": mdev.parent, "mdev_type": mdev.mdev_type,
                 "action": "foreign"}
        if adopt_unused:
            configured, layout = _configured(m, snapshot, mdev.parent)
            if mdev.mdev_type is not None and mdev.mdev_type in configured:
                entry["action"] = "adopt"
            elif layout is not None:
                entry["reason"] = (
                    f"its type {mdev.mdev_type} is none of the types [{layout}] gives "
                    f"{mdev.parent}'s GPU ({', '.join(configured)})"
                )
            else:
                entry["reason"] = (
                    f"its type {mdev.mdev_type} is not the one configured for "
                    f"{mdev.parent} ({', '.join(configured) or 'none'})"
                )
        entry["libvirt"] = _libvirt_action(defined, uuid, entry["action"] == "adopt")
        plan.unused.append(entry)
    return plan

def _configured(
    m: DeviceManager, snapshot: HostSnapshot, parent: str
) -> tuple[tuple[str, ...], str | None]:
    """The types the config gives ``parent`` and the section of its GPU's
    mixed-size layout (None without one).  A layout's GPU has no single type
    (``policy.type_for`` is None there): any of its layout's types is its
    own, so a vGPU of one of them is adoptable and any other is not."""
    found = snapshot.parents.get(parent, parent)
    layout = m.policy.gpu_layout_for(found)
    return m.policy.types_on(found), (layout.section if layout is not None else None)


def _libvirt_action(defined: Mapping[str, Any], uuid: str, takes: bool) -> str | None:
    """"undefine" when the agent takes ``uuid`` and libvirt defines it."""
    found = defined.get(uuid)
    return "undefine" if takes and found is not None and found.defined else None


def _owned_by(m: DeviceManager, uuid: str, instance: str) -> bool:
    record = m.ledger.get(uuid)
    return (
        record is not None
        and record.owner == instance
        and record.owner_kind is OwnerKind.INSTANCE
    )


def _takeover_entry(
    m: DeviceManager,
    snapshot: HostSnapshot,
    uuid: str,
    instance: str,
    who: str,
    problems: list[str],
) -> dict[str, Any] | None:
    mdev = snapshot.mdevs.get(uuid)
    if mdev is None:
        problems.append(
            f"{who} uses mdev {uuid}, which does not exist on this host "
            "(start the domain, or re-create the mdev, and run the takeover again)"
        )
        return None
    entry = {"uuid": uuid, "parent": mdev.parent, "mdev_type": mdev.mdev_type}
    configured, layout = _configured(m, snapshot, mdev.parent)
    if mdev.mdev_type is None:
        problems.append(f"{who} uses mdev {uuid}, whose type cannot be read")
    elif layout is not None and mdev.mdev_type not in configured:
        problems.append(
            f"{who} uses mdev {uuid} of type {mdev.mdev_type} on parent {mdev.parent}, "
            f"but {mdev.parent}'s GPU has the mixed-size layout [{layout}], whose types "
            f"are {', '.join(configured)} (add {mdev.mdev_type} to its vgpus, or move the "
            "GPU out of it)"
        )
    elif mdev.mdev_type not in configured:
        configured_type = configured[0] if configured else None
        problems.append(
            f"{who} uses mdev {uuid} of type {mdev.mdev_type} on parent {mdev.parent}, "
            f"but the config gives {mdev.parent} "
            + (f"type {configured_type}" if configured_type else "no type")
            + f" (add it to [mdev_{mdev.mdev_type}] device_addresses, with "
            f"{mdev.mdev_type} in [devices] enabled_mdev_types)"
        )
    record = m.ledger.get(uuid)
    if record is None:
        entry["action"] = "adopt"
    elif record.owner == instance and record.owner_kind is OwnerKind.INSTANCE:
        entry["action"] = "none"
    elif record.owner is not None:
        problems.append(
            f"{who} uses mdev {uuid}, which the agent has assigned to "
            f"{record.owner_kind} {record.owner}"
        )
        entry["action"] = "none"
    elif record.state is not DeviceState.PRESENT:
        problems.append(f"{who} uses mdev {uuid}, which the agent is {record.state}")
        entry["action"] = "none"
    else:
        entry["action"] = "assign"
    return entry
