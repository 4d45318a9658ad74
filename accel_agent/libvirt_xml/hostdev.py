"""Build the ``<hostdev type='mdev'>`` element that attaches an mdev to a guest.

The shape follows libvirt's ``hostdevsubsysmdev`` RNG definition (checked
against 9.0.0's ``domaincommon.rng``): ``model`` is required, ``display`` and
``ramfb`` are optional on/off switches, and ``<source><address uuid/>`` is
required.  ``managed='no'`` is written explicitly because that is what libvirt
itself reports for mdevs (it never creates them), so the agent's XML and
libvirt's round-tripped XML agree.

lxml is imported inside the functions: ``accelctl`` imports this module for
UUID validation and must start fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from accel_agent import exception

if TYPE_CHECKING:
    from lxml import etree

__all__ = [
    "MODELS",
    "QEMU_NAMESPACE",
    "build_hostdev",
    "canonical_uuid",
    "domain_hostdevs_xml",
    "hostdev_xml",
    "instance_domain_xml",
    "is_uuid",
    "qemu_commandline_xml",
]

# libvirt's namespace for QEMU pass-through (<qemu:commandline>, <qemu:arg>).
QEMU_NAMESPACE = "http://libvirt.org/schemas/domain/qemu/1.0"

MODELS = ("vfio-pci", "vfio-ccw", "vfio-ap")

_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def is_uuid(text: object) -> bool:
    """True for a UUID in 8-4-4-4-12 hex form, either case."""
    return isinstance(text, str) and _UUID_RE.fullmatch(text) is not None


def canonical_uuid(text: object, where: str = "") -> str:
    """Return ``text`` as the lowercase 8-4-4-4-12 form sysfs uses.

    Only that form is accepted (not braces, ``urn:uuid:`` or bare hex as
    ``uuid.UUID`` would): mdev names in sysfs are exactly this form, and being
    strict here means a typo is reported instead of silently reinterpreted.
    """
    if not isinstance(text, str) or _UUID_RE.fullmatch(text) is None:
        raise exception.InvalidMdevUUID(
            uuid=text, where=where, reason="expected 8-4-4-4-12 hexadecimal digits"
        )
    return text.lower()


def _switch(name: str, value: bool | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("on", "off"):
        return value
    raise ValueError(f"{name} must be True/False or 'on'/'off', not {value!r}")


def build_hostdev(
    uuid: str,
    model: str = "vfio-pci",
    display: bool | str | None = None,
    ramfb: bool | str | None = None,
) -> etree._Element:
    """Return a detached ``<hostdev>`` element for mdev ``uuid``.

    ``display``/``ramfb`` (True/False or 'on'/'off') are left out when None, as
    Nova does.  libvirt only supports them for vfio-pci, and QEMU's ramfb needs
    the display on; those combinations are refused here with ValueError rather
    than at domain start on some compute host.  (display='on' also needs a
    ``<graphics>`` device in the domain, which is the caller's business.)
    """
    from lxml import etree

    canonical = canonical_uuid(uuid)
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, not {model!r}")
    display_value = _switch("display", display)
    ramfb_value = _switch("ramfb", ramfb)
    if model != "vfio-pci" and (display_value is not None or ramfb_value is not None):
        raise ValueError(f"display and ramfb are only supported with model vfio-pci, not {model}")
    if ramfb_value == "on" and display_value != "on":
        raise ValueError("ramfb='on' requires display='on'")

    hostdev = etree.Element("hostdev")
    # Attribute order is the one of the template in docs/design.md §7.1; the schema ignores it.
    hostdev.set("mode", "subsystem")
    hostdev.set("type", "mdev")
    hostdev.set("model", model)
    hostdev.set("managed", "no")
    if display_value is not None:
        hostdev.set("display", display_value)
    if ramfb_value is not None:
        hostdev.set("ramfb", ramfb_value)
    source = etree.SubElement(hostdev, "source")
    etree.SubElement(source, "address", uuid=canonical)
    return hostdev


def hostdev_xml(
    uuid: str,
    model: str = "vfio-pci",
    display: bool | str | None = None,
    ramfb: bool | str | None = None,
    *,
    pretty: bool = False,
) -> str:
    """``build_hostdev`` serialised as a str (no XML declaration)."""
    from lxml import etree

    element = build_hostdev(uuid, model=model, display=display, ramfb=ramfb)
    return etree.tostring(element, encoding="unicode", pretty_print=pretty)


def domain_hostdevs_xml(
    uuids: Iterable[str],
    model: str = "vfio-pci",
    display: bool | str | None = None,
    ramfb: bool | str | None = None,
) -> str:
    """One ``<hostdev>`` per UUID, newline-separated, ready to go inside ``<devices>``.

    A UUID given twice is refused, and so is ramfb='on' for more than one device
    ("Only one vgpu device can have 'ramfb' enabled"): libvirt would reject both,
    but only when the domain is defined, far from the code that built it.
    """
    uuid_list = list(uuids)
    if _switch("ramfb", ramfb) == "on" and len(uuid_list) > 1:
        raise ValueError("libvirt allows ramfb='on' on only one mdev per domain")
    seen: set[str] = set()
    parts: list[str] = []
    for uuid in uuid_list:
        canonical = canonical_uuid(uuid)
        if canonical in seen:
            raise exception.InvalidMdevUUID(
                uuid=uuid, where="", reason="given twice; each mdev can be attached once"
            )
        seen.add(canonical)
        parts.append(hostdev_xml(canonical, model=model, display=display, ramfb=ramfb))
    return "\n".join(parts)


def qemu_commandline_xml(qemu_globals: Iterable[str]) -> str:
    """One ``<qemu:commandline>`` (namespace declared on itself) passing each
    ``driver.property=value`` to QEMU as ``-global``; it belongs in ``<domain>``.
    libvirt has no element for these vfio-pci properties, hence the pass-through."""
    from lxml import etree

    arg = f"{{{QEMU_NAMESPACE}}}arg"
    commandline = etree.Element(f"{{{QEMU_NAMESPACE}}}commandline", nsmap={"qemu": QEMU_NAMESPACE})
    for setting in qemu_globals:
        etree.SubElement(commandline, arg, value="-global")
        etree.SubElement(commandline, arg, value=setting)
    return etree.tostring(commandline, encoding="unicode")


def instance_domain_xml(uuids: Iterable[str], qemu_globals: Iterable[str] = ()) -> str:
    """What ``accelctl domain-xml`` prints: the ``<hostdev>`` elements (for
    ``<devices>``) and, when ``[libvirt] qemu_globals`` names any, one
    ``<qemu:commandline>`` after them (for ``<domain>`` itself).

    The mdev-only case of ``devices.instance_devices_xml``, which lays out
    PCI VFs and network VFs the same way; the output is unchanged by that."""
    from accel_agent.libvirt_xml.devices import MdevDevice, instance_devices_xml

    return instance_devices_xml([MdevDevice(uuid) for uuid in uuids], qemu_globals)
