"""``accelctl allocate``, ``release``, ``attach``, ``detach`` and
``domain-xml``: an instance's devices.

One writer (docs/design.md §6.2): while the daemon runs, each goes through its API
(accel_agent.cmd.daemon); without one (or with ``--offline``) it acts
directly through the manager, whose file lock still serialises them
(accel_agent.cmd.loading).  ``domain-xml`` only reads, and takes
``--sysfs-root``; the others refuse it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from accel_agent import exception, wiring
from accel_agent.cmd import daemon, loading, output


def register(subparsers: argparse._SubParsersAction) -> None:
    """``allocate``, ``release``, ``attach`` and ``detach``, in this order."""
    allocate = subparsers.add_parser(
        "allocate",
        help="give an instance N mdevs (reuse free ones, else create), all or nothing",
        description="Allocate COUNT mdevs of the configured type to INSTANCE. Free mdevs the "
        "agent owns are reused first; new ones are created on the least used GPU that can "
        "hold them all, else spread over GPUs. Nothing is left behind on failure. Asking "
        "again for the same allocation returns it.",
    )
    allocate.add_argument("instance", metavar="INSTANCE", help="instance id (e.g. its UUID)")
    allocate.add_argument("--count", type=int, required=True, metavar="N")
    allocate.add_argument("--parent", metavar="ADDR", help="only this parent or physical GPU")
    allocate.add_argument("--type", metavar="TYPE", help="only this mdev type")
    allocate.add_argument("--json", action="store_true")
    allocate.set_defaults(func=allocate_devices)

    release = subparsers.add_parser(
        "release",
        help="free an instance's mdevs (kept for reuse), or remove them",
        description="Release the mdevs of INSTANCE. They stay, free for reuse, unless "
        "--remove is given; an mdev a libvirt domain still references is never removed. "
        "Releasing an instance that holds nothing succeeds.",
    )
    release.add_argument("instance", metavar="INSTANCE")
    release.add_argument("--remove", action="store_true", help="also remove the mdevs")
    release.add_argument("--json", action="store_true")
    release.set_defaults(func=release_devices)

    attach = subparsers.add_parser(
        "attach",
        help="give an instance all its accelerators in one call (vGPUs and VFs), all or nothing",
        description="Prepare every device INSTANCE asks for: vGPUs (mdevs or vendor-VFIO "
        "VFs) by resource class or type, SR-IOV VFs of a configured pool with their network "
        "settings (set through rtnetlink before the VF is handed to vfio-pci). If any device "
        "fails, every device this call prepared is undone before the error is printed. "
        "Every field is checked before anything is prepared: a bad one is named "
        "(requests[1].vlan) and nothing changes. Asking again with the same requests prints "
        "the same handles. Each handle carries its guest XML (--json).",
        epilog="examples: accelctl attach vm1 --vgpu VGPU --vf "
        "nic_a,mac=52:54:00:12:34:56,vlan=100 --json; "
        "accelctl attach vm1 --request '{\"resource_class\": \"VGPU\", \"count\": 2}'",
    )
    attach.add_argument("instance", metavar="INSTANCE", help="instance id (e.g. its UUID)")
    attach.add_argument(
        "--vgpu", dest="request", action="append", type=_vgpu_request, metavar="CLASS[:N]",
        help="N (default 1) vGPUs of resource class CLASS (VGPU, CUSTOM_*) or of mdev type CLASS",
    )
    attach.add_argument(
        "--vf", dest="request", action="append", type=_vf_request, metavar="POOL[,K=V...]",
        help="one VF of pool POOL; K=V: pf, mac, vlan, qos, spoofchk, trust, link_state, "
        "max_tx_rate, min_tx_rate (e.g. nic_a,mac=52:54:00:12:34:56,vlan=100,trust=on)",
    )
    attach.add_argument(
        "--request", dest="request", action="append", type=_json_request, metavar="JSON",
        help="one device request as the API takes it (repeatable, in order with the others)",
    )
    attach.add_argument("--json", action="store_true", help="the handles with their XML")
    attach.set_defaults(func=attach_devices)

    detach = subparsers.add_parser(
        "detach",
        help="unprepare every device of an instance (VFs reset and returned to their driver)",
        description="Release every device of INSTANCE: SR-IOV VFs go back to their own "
        "driver with their network settings reset; mdevs stay free for reuse unless "
        "--remove. A VF whose VFIO group a VM still holds is kept with its settings (exit 1, "
        "accelctl recover returns it once free). Detaching an instance that holds nothing "
        "succeeds.",
    )
    detach.add_argument("instance", metavar="INSTANCE")
    detach.add_argument("--remove", action="store_true", help="also remove the mdevs")
    detach.add_argument("--json", action="store_true")
    detach.set_defaults(func=detach_devices)


def add_domain_xml(subparsers: argparse._SubParsersAction) -> None:
    domain_xml = subparsers.add_parser(
        "domain-xml",
        help="libvirt <hostdev> XML of an instance's mdevs",
        description="Print the <hostdev type='mdev'> elements for INSTANCE's mdevs (for "
        "<devices>), then, when [libvirt] qemu_globals is set, one <qemu:commandline> "
        "element with those -global settings (for <domain> itself).",
    )
    domain_xml.add_argument("instance", metavar="INSTANCE")
    domain_xml.add_argument(
        "--json",
        action="store_true",
        help="{instance, devices: [{type, uuid|address, xml}], qemu_commandline, xml}",
    )
    domain_xml.set_defaults(func=domain_xml_of)


# --- allocate, attach ------------------------------------------------------------------


def allocate_devices(args: argparse.Namespace) -> int:
    conf = loading.load_config_for_writes(args)
    allocation = daemon.via_api(
        args,
        conf.api.socket_path,
        lambda api: api.allocate(args.instance, args.count, args.parent, args.type),
    )
    if allocation is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            allocation = manager.allocate(
                args.instance, args.count, args.parent, args.type
            ).to_dict()
    output.allocation(allocation, args.json)
    return output.EXIT_OK


def _vf_request(text: str) -> dict[str, Any]:
    """``--vf POOL[,KEY=VALUE...]``: a VF request; integers and on/off/true/false
    as JSON would give them (the agent checks each field)."""
    pool, _, rest = text.partition(",")
    request: dict[str, Any] = {"pool": pool}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: expected KEY=VALUE")
        lowered = value.lower()
        if lowered in ("on", "true", "yes"):
            request[key] = True
        elif lowered in ("off", "false", "no"):
            request[key] = False
        elif value.isdigit():
            request[key] = int(value)
        else:
            request[key] = value
    return request


def _vgpu_request(text: str) -> dict[str, Any]:
    """``--vgpu CLASS[:COUNT]`` (CUSTOM_* and VGPU are resource classes, anything
    else an mdev type)."""
    name, _, count = text.partition(":")
    if count and not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: COUNT must be a number")
    key = "resource_class" if name == "VGPU" or name.startswith("CUSTOM_") else "mdev_type"
    return {key: name, "count": int(count) if count else 1}


def _json_request(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def attach_devices(args: argparse.Namespace) -> int:
    requests = list(args.request or [])
    if not requests:
        raise exception.InvalidAttachRequest(
            field="requests", reason="give at least one --vgpu, --vf or --request"
        )
    conf = loading.load_config_for_writes(args)
    answer = daemon.via_api(
        args, conf.api.socket_path, lambda api: api.attach(args.instance, requests)
    )
    if answer is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            parsed = wiring.attach_requests(manager, requests)
            answer = manager.attach(args.instance, parsed).to_dict()
    if args.json:
        output.emit_json(answer)
        return output.EXIT_OK
    output.table(
        ("request", "backend", "uuid", "parent", "type", "address"),
        [
            (h["request"], h["backend"], h["uuid"], h["parent"], h["type"], h["address"] or "-")
            for h in answer["attachments"]
        ],
    )
    return output.EXIT_OK


# --- release, detach -------------------------------------------------------------------


def _release_all(args: argparse.Namespace, call: Callable[[Any], Any]) -> list[str]:
    """What ``release``/``detach`` gave back: through the daemon's ``call``,
    or offline through the manager (both release the same way)."""
    conf = loading.load_config_for_writes(args)
    answer = daemon.via_api(args, conf.api.socket_path, call)
    if answer is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            return manager.release(args.instance, remove=args.remove)
    return answer["released"]


def _print_released(args: argparse.Namespace, released: list[str], verb: str, noun: str) -> int:
    if args.json:
        output.emit_json({"instance": args.instance, "released": released, "removed": args.remove})
    elif released:
        print(f"{verb} {len(released)} {noun}(s) of {args.instance}: {', '.join(released)}")
    else:
        print(f"instance {args.instance} holds no {noun}; nothing to do")
    return output.EXIT_OK


def detach_devices(args: argparse.Namespace) -> int:
    released = _release_all(args, lambda api: api.detach(args.instance, remove=args.remove))
    return _print_released(args, released, "detached", "device")


def release_devices(args: argparse.Namespace) -> int:
    released = _release_all(args, lambda api: api.release(args.instance, remove=args.remove))
    verb = "released and removed" if args.remove else "released"
    return _print_released(args, released, verb, "mdev")


# --- domain-xml ------------------------------------------------------------------------


def domain_xml_of(args: argparse.Namespace) -> int:
    from accel_agent.libvirt_xml import instance_devices_xml

    conf = loading.load_config(args)
    xml = (
        daemon.OFFLINE
        if args.sysfs_root
        else daemon.via_api(args, conf.api.socket_path, lambda api: api.domain_xml(args.instance))
    )
    if xml is daemon.OFFLINE:
        with loading.offline_manager(conf) as manager:
            allocation = manager.allocation(args.instance)
            if not allocation.mdevs:
                raise exception.MdevNotFound(uuid=f"(any, for instance {args.instance})")
            devices = manager.guest_devices(allocation.mdevs)
        xml = instance_devices_xml(devices, conf.libvirt.qemu_globals)
    text = str(xml).rstrip("\n")
    if args.json:
        output.emit_json(domain_xml_document(args.instance, text))
    else:
        print(text)
    return output.EXIT_OK


def domain_xml_document(instance: str, text: str) -> dict[str, Any]:
    """``domain-xml --json``: the elements of ``text`` (what ``domain-xml``
    prints, from the daemon or made here) one by one, so that a script need
    not parse XML to tell the ``<devices>`` part from the ``<domain>`` part:

    * ``devices``: one ``{"type": "mdev", "uuid", "xml"}`` or
      ``{"type": "pci", "address", "xml"}`` per device, in order, for
      ``<devices>``;
    * ``qemu_commandline``: the ``<qemu:commandline>`` element for
      ``<domain>`` (``[libvirt] qemu_globals``), or null;
    * ``xml``: the whole text, as printed without ``--json``.
    """
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    root = etree.fromstring(f"<elements>{text}</elements>", parser)
    devices: list[dict[str, Any]] = []
    commandline = None
    for element in root:
        xml = etree.tostring(element, encoding="unicode", with_tail=False)
        if etree.QName(element).localname == "commandline":
            commandline = xml
            continue
        address = element.find("source/address")
        kind = element.get("type")
        device: dict[str, Any] = {"type": kind}
        if kind == "mdev" and address is not None:
            device["uuid"] = address.get("uuid")
        elif address is not None:
            device["address"] = "{:04x}:{:02x}:{:02x}.{:x}".format(
                *(int(address.get(part, "0"), 16) for part in ("domain", "bus", "slot", "function"))
            )
        device["xml"] = xml
        devices.append(device)
    return {
        "instance": instance,
        "devices": devices,
        "qemu_commandline": commandline,
        "xml": text,
    }
