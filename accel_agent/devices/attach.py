"""Attach: every accelerator of an instance in one call (docs/design.md §11, the
os-acc way), all or nothing, as one operation of the protocol: one intent
with every reservation and create intent (a pool VF's with its settings),
the devices made, then one transaction that assigns them all and records
the request.  A failure undoes what the call made before it raises; a crash
leaves an intent that recovery undoes.

Idempotent: the same requests again get the same handles, after a restart
too (the request is in the ledger); different ones while the instance holds
devices are refused.  Each handle carries the device and what its guest is
given (its backend's XML and identity), and the same device as Nova 34's
libvirt driver reads a Cyborg accelerator request (``nova_handle``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.devices import planning, protocol
from accel_agent.devices import requests as requests_mod
from accel_agent.devices.ledger import DeviceRecord, OwnerKind, validate_instance_id
from accel_agent.devices.results import Attachment
from accel_agent.sysfs import address as pci

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager


def attach(
    m: DeviceManager, instance: str, requests: Sequence[requests_mod.AttachRequest]
) -> Attachment:
    """Prepare every device ``requests`` (checked by ``attach_requests``) ask
    for, all or nothing."""
    validate_instance_id(instance)
    wanted = requests_mod.document(requests)
    with protocol.operation(m):
        held = m.ledger.by_owner(instance, OwnerKind.INSTANCE)
        if held:
            recorded = m.ledger.attach_request(instance)
            if recorded is not None and recorded["requests"] == wanted:
                return _attachment(m, instance, recorded)
            raise exception.InstanceAlreadyAllocated(instance=instance, count=len(held))
        snapshot = m.scan()
        items, request_of = planning.plan_attach(m, snapshot, requests)
        protocol.make_and_assign(
            m, snapshot, protocol.Owner(instance), items,
            attach=protocol.AttachRecord(wanted, tuple(request_of)),
        )
        document = m.ledger.attach_request(instance)
        assert document is not None
        return _attachment(m, instance, document)


def attachment(m: DeviceManager, instance: str) -> Attachment:
    """The instance's attach handles; an instance that holds devices from
    ``allocate`` gets one handle per device, request index 0."""
    validate_instance_id(instance)
    document = m.ledger.attach_request(instance) or {
        "devices": [[r.uuid, 0] for r in m.ledger.by_owner(instance, OwnerKind.INSTANCE)]
    }
    return _attachment(m, instance, document)


def _attachment(m: DeviceManager, instance: str, document: Mapping[str, Any]) -> Attachment:
    handles = []
    for uuid, index in document["devices"]:
        record = m.ledger.get(uuid)
        if record is None or record.owner != instance:
            continue  # a device recovery could not bring back (reported there)
        handles.append(_handle(m, record, index))
    return Attachment(instance, tuple(handles))


def _handle(m: DeviceManager, record: DeviceRecord, index: int) -> dict[str, Any]:
    """One attach handle: the device, and what its guest is given."""
    backend = m.backend(record.backend)
    ref = protocol.device_ref(record)
    return {
        "request": index,
        "backend": record.backend,
        "uuid": record.uuid,
        "parent": record.parent,
        "type": record.device_type,
        "address": backend.pci_address(ref),
        **backend.handle(ref),
        "xml": backend.guest_xml(ref),
        **nova_handle(record.uuid, record.parent, record.device_type, backend.pci_address(ref)),
    }


def nova_handle(uuid: str, parent: str, device_type: str, address: str | None) -> dict[str, Any]:
    """The keys of a bound Cyborg ARQ that Nova 34's libvirt driver reads
    (``_allocate_cyborg_mdevs``, ``_guest_add_accel_pci_devices``).

    ``address`` is the PCI address the guest is given (a VF): a ``PCI``
    handle, whose ``attach_handle_info`` is that address.  Otherwise the guest
    is given the mdev ``uuid``: an ``MDEV`` handle, whose info is its
    parent's address and ``asked_type`` (Nova looks the mdev up by the
    node-device name ``mdev_<uuid>_<dddd>_<bb>_<ss>_<f>`` and creates it on
    ``pci_<dddd>_<bb>_<ss>_<f>`` only when that name is unknown).  A parent
    that is no PCI device (mtty) has no such name: its four fields are null,
    so Nova fails on the handle instead of looking up or creating an mdev
    on a PCI device that does not exist.

    ``attach_handle_uuid`` is the device's UUID for both kinds: Nova reads
    it of an MDEV only; Cyborg's PCI handles carry their own record's UUID,
    which names nothing on the host, so the agent gives its device's."""
    if address is not None:
        kind, info = "PCI", _pci_fields(address)
    else:
        kind, info = "MDEV", {**_pci_fields(parent), "asked_type": device_type}
    return {"attach_handle_type": kind, "attach_handle_uuid": uuid, "attach_handle_info": info}


def _pci_fields(name: str) -> dict[str, str | None]:
    """``dddd:bb:ss.f`` split as Nova's ``pci_utils.parse_address`` and
    libvirt's node-device names spell it: lower-case hex, zero-padded to 4, 2
    and 2 digits, the function one digit; all null for a non-PCI name."""
    if not pci.is_pci_address(name):
        return {"domain": None, "bus": None, "device": None, "function": None}
    canonical = pci.parse_pci_address(name)
    domain, bus, rest = canonical.split(":")
    device, function = rest.split(".")
    return {"domain": domain, "bus": bus, "device": device, "function": function}
