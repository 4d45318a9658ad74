"""A minimal fake of the libvirt-python node-device calls the agent uses
(accel_agent.devices.nodedevs), for what libvirt's test:/// driver cannot do
here: define, undefine, autostart and list inactive mdev node devices (it
answers "this function is not supported by the connection driver"), with no
mdev parent on this host.  Only those calls; the real proof is the trixie lab.

``FakeLibvirt`` stands for the ``libvirt`` module: ``LibvirtNodeDevices(uri,
opener=lambda: fake)``.  Its ``defined`` dict is what mdevctl would keep;
``active`` is what sysfs has (``sysfs`` callable, e.g. the simulated host's
UUIDs).  ``fail`` makes one call fail: {"undefine": {uuid}, "open": True, ...}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

CAP_MDEV = 1 << 14
CAP_MDEV_TYPES = 1 << 13
ACTIVE = 1 << 31
INACTIVE = 1 << 30


NO_SUPPORT = 3
INVALID_ARG = 8
NO_NODE_DEVICE = 51


class FakeError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code

    def get_error_code(self) -> int:
        return self.code


@dataclass
class Definition:
    parent: str  # sysfs name
    mdev_type: str
    autostart: bool = False


def device_xml(uuid: str, parent: str, mdev_type: str) -> str:
    nodedev = "pci_" + parent.replace(":", "_").replace(".", "_") if ":" in parent else parent
    return (
        f"<device><name>mdev_{uuid.replace('-', '_')}</name><parent>{nodedev}</parent>"
        f"<capability type='mdev'><type id='{mdev_type}'/><uuid>{uuid}</uuid>"
        f"<parent_addr>{parent}</parent_addr></capability></device>"
    )


@dataclass
class FakeLibvirt:
    sysfs: Callable[[], dict[str, tuple[str, str]]] = dict  # uuid -> (parent, type)
    defined: dict[str, Definition] = field(default_factory=dict)
    fail: dict[str, object] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    lists: int = 0  # listAllDevices calls

    libvirtError = FakeError
    VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV = CAP_MDEV
    VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES = CAP_MDEV_TYPES
    VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE = ACTIVE
    VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE = INACTIVE
    VIR_ERR_NO_SUPPORT = NO_SUPPORT
    VIR_ERR_INVALID_ARG = INVALID_ARG
    VIR_ERR_NO_NODE_DEVICE = NO_NODE_DEVICE

    def _check(self, call: str, uuid: str = "") -> None:
        failing = self.fail.get(call)
        if failing is True or (isinstance(failing, set) and uuid in failing):
            raise FakeError(f"{call} refused (fake)")

    def open(self, uri: str) -> _Conn:
        self._check("open")
        return _Conn(self)

    def openReadOnly(self, uri: str) -> _Conn:  # libvirt's names
        self._check("open")
        return _Conn(self)

    def nodedev(self, uuid: str) -> dict[str, bool] | None:
        """What the listing should say of ``uuid``."""
        d = self.defined.get(uuid)
        return {"defined": d is not None, "autostart": bool(d and d.autostart)}


@dataclass
class _Conn:
    lv: FakeLibvirt

    def close(self) -> None:
        pass

    def listAllDevices(self, flags: int) -> list[_Dev]:
        assert flags & CAP_MDEV, flags
        self.lv._check("list")
        if flags & INACTIVE and self.lv.fail.get("inactive"):
            # libvirt's test driver: "unsupported flags (0xc0000000)"
            raise FakeError("unsupported flags (fake)", INVALID_ARG)
        self.lv.lists += 1
        live = self.lv.sysfs()
        uuids = sorted(set(live) | set(self.lv.defined))
        return [_Dev(self.lv, u) for u in uuids]

    def nodeDeviceDefineXML(self, xml: str, flags: int) -> _Dev:
        from accel_agent.devices.nodedevs import parse_mdev_xml

        uuid, parent, mdev_type = parse_mdev_xml(xml)
        assert uuid and parent and mdev_type, xml
        self.lv._check("define", uuid)
        self.lv.calls.append(("define", uuid))
        # mdevctl's JSON default: a definition starts with autostart on
        # unless told otherwise, as libvirt's would.
        self.lv.defined[uuid] = Definition(parent, mdev_type, autostart=True)
        return _Dev(self.lv, uuid)


@dataclass
class _Dev:
    lv: FakeLibvirt
    uuid: str

    def XMLDesc(self, flags: int) -> str:
        if self.uuid in self.lv.fail.get("gone", set()):  # type: ignore[operator]
            # listed, then gone before this call (libvirt's view catching up)
            raise FakeError("no node device with matching name (fake)", NO_NODE_DEVICE)
        d = self.lv.defined.get(self.uuid)
        parent, mdev_type = (d.parent, d.mdev_type) if d else self.lv.sysfs()[self.uuid]
        return device_xml(self.uuid, parent, mdev_type)

    def isActive(self) -> int:
        return int(self.uuid in self.lv.sysfs())

    def isPersistent(self) -> int:
        return int(self.uuid in self.lv.defined)

    def autostart(self) -> int:
        d = self.lv.defined.get(self.uuid)
        return int(bool(d and d.autostart))

    def undefine(self, flags: int) -> None:
        self.lv._check("undefine", self.uuid)
        self.lv.calls.append(("undefine", self.uuid))
        del self.lv.defined[self.uuid]

    def setAutostart(self, value: int) -> None:
        self.lv._check("autostart", self.uuid)
        self.lv.calls.append(("autostart" + ("+" if value else "-"), self.uuid))
        self.lv.defined[self.uuid].autostart = bool(value)
