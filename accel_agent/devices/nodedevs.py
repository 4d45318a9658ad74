"""libvirt's node devices of capability mdev: which mdevs libvirt defines
(persistent, through mdevctl) and autostarts, and the three writes the agent
needs on them (undefine, autostart off, define with autostart off).

Nova's libvirt driver (since 2024.2) creates every mdev, then defines it
persistent with autostart (docs/design.md §14).  The agent reads those
definitions for its listings, undefines them when it takes a device over or
removes it (libvirt must not bring back at boot what the agent re-creates or
removed), and, with ``[libvirt] define_mdevs``, defines its own devices with
autostart off.

A thin adaptor: one connection per call, each call with a deadline
(``[libvirt] call_timeout``, through the URI's channel: devices/libvirt_calls.py),
libvirt imported on the first call (accelctl's listings must not pay for
it), every libvirt failure raised as one exception class per meaning (a
stalled libvirt: LibvirtStalled, a NodeDevicesUnavailable).  ``[libvirt] uri``
empty: :class:`NoNodeDevices`, for which everything is unknown and nothing is
written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accel_agent import exception
from accel_agent.devices import libvirt_calls

LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MdevNodeDevice:
    """One libvirt node device of capability mdev."""

    uuid: str
    parent: str | None  # the parent's sysfs name (0000:84:00.0, mtty), None if unknown
    mdev_type: str | None
    active: bool  # the mdev exists in sysfs
    defined: bool  # persistent: libvirt (mdevctl) keeps a definition
    autostart: bool
    xml: str  # XMLDesc: a rolled-back takeover defines it again from this (definition_xml)


class NodeDevices(Protocol):
    uri: str

    def mdevs(self, quiet: bool = False) -> Mapping[str, MdevNodeDevice] | None:
        """Every mdev node device (defined or active) by UUID; None when it
        cannot be known (no libvirt)."""

    def require(self) -> Mapping[str, MdevNodeDevice]:
        """As :meth:`mdevs`, but libvirt must answer: NodeDevicesUnavailable."""

    def undefine(self, uuid: str) -> None: ...

    def set_autostart(self, uuid: str, autostart: bool) -> None: ...

    def define(self, uuid: str, parent: str, mdev_type: str, autostart: bool = False) -> None: ...

    def define_xml(self, xml: str, autostart: bool) -> None: ...


class NoNodeDevices:
    """``[libvirt] uri`` empty: nothing is known, nothing is written."""

    uri = ""

    def mdevs(self, quiet: bool = False) -> Mapping[str, MdevNodeDevice] | None:
        return None

    def require(self) -> Mapping[str, MdevNodeDevice]:
        return {}

    def undefine(self, uuid: str) -> None:
        return None

    def set_autostart(self, uuid: str, autostart: bool) -> None:
        return None

    def define(self, uuid: str, parent: str, mdev_type: str, autostart: bool = False) -> None:
        return None

    def define_xml(self, xml: str, autostart: bool) -> None:
        return None


def _unsupported(libvirt: Any) -> tuple[int, ...]:
    # "this function is not supported", "unsupported flags" (an invalid arg).
    return (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_INVALID_ARG)


def parse_mdev_xml(xml: str) -> tuple[str | None, str | None, str | None]:
    """(uuid, parent sysfs name, type id) of an mdev node device's XML."""
    from lxml import etree

    root = etree.fromstring(xml.encode("utf-8"))
    cap = root.find("capability[@type='mdev']")
    if cap is None:
        return None, None, None
    uuid = (cap.findtext("uuid") or "").strip().lower() or None
    type_el = cap.find("type")
    mdev_type = type_el.get("id") if type_el is not None else None
    # parent_addr is the parent's sysfs name (libvirt >= 7.8); older ones
    # only name the parent's node device (pci_0000_84_00_0).
    parent = (cap.findtext("parent_addr") or "").strip() or _parent_from_nodedev(
        (root.findtext("parent") or "").strip()
    )
    return uuid, parent, mdev_type


def definition_xml(xml: str) -> str:
    """What to define again from a device's XMLDesc: its parent, type, UUID
    and vendor attributes, as a define takes them (Nova's shape), without
    the live parts (name, path, driver, IOMMU group)."""
    from lxml import etree

    root = etree.fromstring(xml.encode("utf-8"))
    device = etree.Element("device")
    parent = root.findtext("parent")
    if parent:
        etree.SubElement(device, "parent").text = parent.strip()
    cap = root.find("capability[@type='mdev']")
    kept = etree.SubElement(device, "capability", type="mdev")
    if cap is not None:
        for child in cap:
            if child.tag in ("type", "uuid", "attr"):
                kept.append(child)
    return etree.tostring(device, encoding="unicode")


def _parent_from_nodedev(name: str) -> str | None:
    if name.startswith("pci_"):
        parts = name[4:].split("_")
        if len(parts) == 4:
            return f"{parts[0]}:{parts[1]}:{parts[2]}.{parts[3]}"
    return None  # "computer" (a definition whose parent is missing), or unknown


def parent_nodedev_name(parent: str) -> str:
    """libvirt's node-device name of a PCI parent (what Nova writes in <parent>)."""
    return "pci_" + parent.replace(":", "_").replace(".", "_")


class LibvirtNodeDevices:
    """The node devices at ``uri``.  ``opener`` (tests) returns a
    libvirt-python-shaped module, called through a channel of its own; the
    default imports libvirt and shares the URI's channel (its deadline
    ``timeout`` and its state) with every other user of that URI."""

    def __init__(
        self, uri: str, opener: Callable[[], Any] | None = None, timeout: float | None = None
    ) -> None:
        self.uri = uri
        if opener is None:
            self.channel = libvirt_calls.channel_for(uri, timeout)
        else:
            self.channel = libvirt_calls.LibvirtChannel(
                uri, timeout or libvirt_calls.DEFAULT_TIMEOUT, opener=opener
            )

    def _call(self, what: str, run: Callable[[Any, Any], Any], write: bool = False) -> Any:
        """``run(libvirt, conn)`` through the channel; a connection that cannot
        be opened is NodeDevicesUnavailable, a stalled libvirt LibvirtStalled."""
        try:
            return self.channel.call(what, run, write=write)
        except libvirt_calls.Unreachable as exc:
            failure = exc
        raise exception.NodeDevicesUnavailable(uri=self.uri, reason=str(failure))

    def mdevs(self, quiet: bool = False) -> Mapping[str, MdevNodeDevice] | None:
        try:
            return self.require()
        except exception.NodeDevicesUnavailable as exc:
            failure = exc
        # A stall was said once, when it began (libvirt_calls).
        if not quiet and not isinstance(failure, exception.LibvirtStalled):
            LOG.warning("%s; libvirt's mdev definitions are not known", failure.message)
        return None

    def require(self) -> Mapping[str, MdevNodeDevice]:
        def run(libvirt: Any, conn: Any) -> dict[str, MdevNodeDevice]:
            try:
                return self._read(libvirt, conn)
            except libvirt.libvirtError as exc:
                failure = exc
            raise exception.NodeDevicesUnavailable(uri=self.uri, reason=str(failure))

        found: dict[str, MdevNodeDevice] = self._call("listing the mdev node devices", run)
        return found

    @staticmethod
    def _all_mdevs(libvirt: Any, conn: Any) -> list[Any]:
        """Every mdev node device, defined or active.  A driver that cannot
        list inactive ones (libvirt before 7.3, the test driver: "unsupported
        flags") cannot keep definitions either: its active ones are all."""
        cap = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
        try:
            return list(conn.listAllDevices(
                cap
                | libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE
                | libvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE
            ))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _unsupported(libvirt):
                raise
        return list(conn.listAllDevices(cap))

    @staticmethod
    def _flag(libvirt: Any, call: Callable[[], int]) -> bool:
        """isPersistent/autostart; False where the driver has no such thing."""
        try:
            return bool(call())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _unsupported(libvirt):
                raise
        return False

    @staticmethod
    def _unless_gone(libvirt: Any, read: Callable[[], Any]) -> Any:
        """``read()`` of one listed device; None when the device went between
        the listing and the call (VIR_ERR_NO_NODE_DEVICE: an mdev removed or
        undefined a moment before, libvirt learning of mdevctl's changes late,
        seen in the trixie lab): it is neither active nor defined any more,
        and the rest of the listing still holds."""
        try:
            return read()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_NODE_DEVICE:
                raise
        return None

    def _read(self, libvirt: Any, conn: Any) -> dict[str, MdevNodeDevice]:
        found: dict[str, MdevNodeDevice] = {}
        for dev in self._all_mdevs(libvirt, conn):

            def describe(dev: Any = dev) -> tuple[str, bool, bool, bool]:
                return (
                    dev.XMLDesc(0),
                    self._flag(libvirt, dev.isActive),
                    self._flag(libvirt, dev.isPersistent),
                    self._flag(libvirt, dev.autostart),
                )

            described = self._unless_gone(libvirt, describe)
            if described is None:
                continue
            xml, active, defined, autostart = described
            uuid, parent, mdev_type = parse_mdev_xml(xml)
            if uuid is None:
                continue
            entry = MdevNodeDevice(
                uuid=uuid,
                parent=parent,
                mdev_type=mdev_type,
                active=active,
                defined=defined,
                autostart=autostart,
                xml=xml,
            )
            # mdevctl allows one UUID under several parents: a definition
            # wins over a transient twin, for the "is it defined" question.
            if uuid not in found or (entry.defined and not found[uuid].defined):
                found[uuid] = entry
        return found

    def _device(self, libvirt: Any, conn: Any, uuid: str) -> Any:
        for dev in self._all_mdevs(libvirt, conn):
            xml = self._unless_gone(libvirt, lambda dev=dev: dev.XMLDesc(0))
            if xml is not None and parse_mdev_xml(xml)[0] == uuid and self._flag(
                libvirt, dev.isPersistent
            ):
                return dev
        return None

    def _write(self, what: str, uuid: str, action: Callable[[Any, Any], None]) -> None:
        def run(libvirt: Any, conn: Any) -> None:
            try:
                action(libvirt, conn)
                return
            except libvirt.libvirtError as exc:
                failure = exc
            raise exception.NodeDeviceWriteFailed(
                uri=self.uri, action=what, uuid=uuid, reason=str(failure)
            )

        self._call(f"{what} mdev {uuid}", run, write=True)

    def undefine(self, uuid: str) -> None:
        """Drop libvirt's definition of ``uuid`` (the mdev itself stays);
        nothing to do when there is none (idempotent)."""

        def run(libvirt: Any, conn: Any) -> None:
            dev = self._device(libvirt, conn, uuid)
            if dev is not None:
                dev.undefine(0)

        self._write("undefine", uuid, run)

    def set_autostart(self, uuid: str, autostart: bool) -> None:
        def run(libvirt: Any, conn: Any) -> None:
            dev = self._device(libvirt, conn, uuid)
            if dev is not None:
                dev.setAutostart(1 if autostart else 0)

        self._write("autostart " + ("on" if autostart else "off"), uuid, run)

    def define(self, uuid: str, parent: str, mdev_type: str, autostart: bool = False) -> None:
        from lxml import etree

        device = etree.Element("device")
        etree.SubElement(device, "parent").text = self._parent_name(parent)
        cap = etree.SubElement(device, "capability", type="mdev")
        etree.SubElement(cap, "type", id=mdev_type)
        etree.SubElement(cap, "uuid").text = uuid
        self.define_xml(etree.tostring(device, encoding="unicode"), autostart)

    def define_xml(self, xml: str, autostart: bool) -> None:
        """Define from ``xml`` and set its autostart: autostart is set on
        every define, because libvirt's (mdevctl's) default may be on."""
        uuid = parse_mdev_xml(xml)[0] or "?"

        def run(libvirt: Any, conn: Any) -> None:
            dev = conn.nodeDeviceDefineXML(xml, 0)
            dev.setAutostart(1 if autostart else 0)

        self._write("define", uuid, run)

    def _parent_name(self, parent: str) -> str:
        """The node-device name of ``parent``: a PCI parent's is computed;
        another (mtty) is found among the devices that offer mdev types,
        by the sysfs path's last part."""
        if ":" in parent:
            return parent_nodedev_name(parent)

        def run(libvirt: Any, conn: Any) -> str | None:
            try:
                for dev in conn.listAllDevices(
                    libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES
                ):
                    from lxml import etree

                    path = etree.fromstring(dev.XMLDesc(0).encode()).findtext("path") or ""
                    if path.rstrip("/").rsplit("/", 1)[-1] == parent:
                        return str(dev.name())
            except libvirt.libvirtError as exc:
                raise exception.NodeDevicesUnavailable(uri=self.uri, reason=str(exc)) from None
            return None

        name: str | None = self._call(f"finding the node device of {parent}", run)
        if name is not None:
            return name
        raise exception.NodeDeviceWriteFailed(
            uri=self.uri, action="define", uuid="?",
            reason=f"libvirt has no node device for parent {parent}",
        )


NO_URI = "[libvirt] uri is empty: no libvirt on this host"


def listing_definitions(
    nodedevs: NodeDevices, quiet: bool = False
) -> tuple[dict[str, tuple[bool, bool]] | None, str | None]:
    """What the mdev listings show: (uuid -> (defined, autostart) of every
    mdev libvirt defines, None); (None, why) when that is not known: no
    [libvirt] uri, libvirt unreachable or stalled (within its deadline)."""
    if not nodedevs.uri:
        return None, NO_URI
    try:
        found = nodedevs.require()
    except exception.NodeDevicesUnavailable as exc:
        failure = exc
    else:
        return {u: (d.defined, d.autostart) for u, d in found.items() if d.defined}, None
    if not quiet and not isinstance(failure, exception.LibvirtStalled):
        LOG.warning("%s; libvirt's mdev definitions are not known", failure.message)
    return None, failure.message


def listing_view(
    nodedevs: NodeDevices, quiet: bool = False
) -> dict[str, tuple[bool, bool]] | None:
    """:func:`listing_definitions` without the why."""
    return listing_definitions(nodedevs, quiet)[0]


def for_uri(uri: str, timeout: float | None = None) -> NodeDevices:
    """``timeout``: ``[libvirt] call_timeout`` (None: the URI's channel keeps its own)."""
    return LibvirtNodeDevices(uri, timeout=timeout) if uri else NoNodeDevices()
