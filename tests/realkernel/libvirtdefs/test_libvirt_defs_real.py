"""libvirt's persistent mdevs (issue 24) against the real stack of lab 2: libvirt 11's
node-device driver, Debian's mdevctl and udevd, Debian's 6.12 kernel with mtty.

The steps of one story, in order (each test leaves what the next one starts from):
Nova defines an mdev with autostart; the agent lists it foreign and defined; the
takeover undefines it; a remove leaves nothing libvirt could bring back; agent-owned
mdevs (one libvirt does not define, two the agent defined with ``[libvirt]
define_mdevs``, one of them autostarted by hand) across a "boot" of the mdev stack;
the node-device name Nova computes for an attach handle; the remove through the
daemon undefines.  defslab.py has the parts and the boot stand-in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from accel_agent.devices.attach import nova_handle
from tests.functional.daemon_fixture import wait_for
from tests.realkernel import mdevlab
from tests.realkernel.libvirtdefs import defslab
from tests.realkernel.migration import migrationlab

NOVA_UUID = "4b1d7c0e-2f5a-4e8b-9c3d-6a7b8c9d0e1f"


@dataclass
class Host:
    udevd: defslab.Udevd
    libvirtd: migrationlab.Libvirtd
    agent: migrationlab.Agent
    conn: Any = None
    story: dict[str, str] = field(default_factory=dict)  # what one step left the next

    def state(self, uuid: str) -> dict[str, bool] | None:
        return defslab.nodedev_state(self.conn, uuid)

    def wait_state(self, uuid: str, expected: dict[str, bool] | None) -> None:
        """libvirt learns what mdevctl did from its watch on /etc/mdevctl.d, a
        moment after the call that did it returned: wait for it (a hang fails)."""
        wait_for(
            lambda: self.state(uuid) == expected,
            defslab.TIMEOUT,
            0.2,
            f"libvirt to show {uuid} as {expected} (it shows {self.state(uuid)})",
        )

    def owned_by(self, instance: str) -> list[str]:
        return sorted(r.uuid for r in self.agent.ledger() if r.owner == instance)

    def listing(self, uuid: str) -> dict[str, Any]:
        """This mdev's entry in the daemon's listing."""
        doc = self.agent.client().mdevs()
        entries = [m for m in doc["mdevs"] if m["uuid"] == uuid]
        assert len(entries) == 1, doc
        return entries[0]


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    udevd = defslab.Udevd()
    udevd.start()
    _, linked = defslab.mdevctl_rule_path()
    libvirtd = migrationlab.Libvirtd("defs", "dddddddd-4444-4444-8444-444444444444", own_run=False)
    # One agent with [libvirt] define_mdevs = true from start to end.
    agent = migrationlab.Agent("defs", libvirtd, "define_mdevs = true")
    try:
        # both at once: each mostly waits for its own start-up work
        libvirtd.start()
        agent.start()
        libvirtd.wait_ready()
        agent.wait_ready()
        yield Host(udevd, libvirtd, agent, conn=libvirtd.open())
    finally:
        # Whatever a failed step left: no process, mdev or definition for the
        # migration tests that run next in this guest.
        agent.stop()
        for uuid in defslab.mdevctl_defined():
            defslab.run("mdevctl", "undefine", "--uuid", uuid, check=False)
        mdevlab.remove_all()
        libvirtd.stop()
        udevd.stop()
        if linked:
            Path("/usr/sbin/mdevctl").unlink()
        defslab.run("rm", "-rf", str(agent.dir))


def test_an_mdev_nova_defines_is_listed_foreign_defined_and_autostarted(host: Host) -> None:
    import libvirt

    conn, name = host.conn, defslab.nodedev_name(NOVA_UUID)
    assert [
        d.name() for d in conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES)
    ] == [defslab.PARENT_NODEDEV]
    # virsh nodedev-define, nodedev-start, nodedev-autostart: the calls virsh
    # makes, and Nova 34's _create_mdev (define, then autostart on)
    dev = conn.nodeDeviceDefineXML(defslab.mdev_xml(NOVA_UUID), 0)
    assert dev.name() == name
    inactive = conn.listAllDevices(
        libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
        | libvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE
    )
    assert [d.name() for d in inactive] == [name]  # virsh nodedev-list --cap mdev --inactive
    dev.create()
    dev.setAutostart(1)

    assert mdevlab.mdevs() == {NOVA_UUID: migrationlab.MDEV_TYPE}
    spec = defslab.mdevctl_defined()[NOVA_UUID]
    assert (spec["parent"], spec["mdev_type"], spec["start"]) == ("mtty", "mtty-1", "auto")
    host.wait_state(NOVA_UUID, {"active": True, "persistent": True, "autostart": True})
    entry = host.listing(NOVA_UUID)
    assert entry["owned"] is False
    assert entry["libvirt"] == {"defined": True, "autostart": True}


def test_the_takeover_undefines_and_a_remove_leaves_nothing_to_autostart(host: Host) -> None:
    dry_run = host.agent.ctl("adopt", "--from-libvirt", "--all", "--dry-run", "--json")
    plan = mdevlab.ok_json(dry_run)
    [entry] = [m for m in plan["unused"] if m["uuid"] == NOVA_UUID]
    assert (entry["action"], entry["libvirt"]) == ("adopt", "undefine")
    assert NOVA_UUID in defslab.mdevctl_defined(), "the dry run changed libvirt"

    mdevlab.ok(host.agent.ctl("adopt", "--from-libvirt", "--all"))
    assert defslab.mdevctl_defined() == {}
    # libvirt keeps the running mdev, as a transient node device
    host.wait_state(NOVA_UUID, {"active": True, "persistent": False, "autostart": False})
    assert mdevlab.mdevs() == {NOVA_UUID: migrationlab.MDEV_TYPE}

    # release needs an owner: an instance takes the adopted (free) mdev first
    client = host.agent.client()
    client.allocate("nova-vm", 1)
    assert host.owned_by("nova-vm") == [NOVA_UUID]
    client.release("nova-vm", remove=True)
    assert mdevlab.mdevs() == {}
    host.wait_state(NOVA_UUID, None)
    assert host.agent.ledger() == []


def test_after_a_boot_the_agent_s_mdevs_come_back_once_and_the_removed_one_not(
    host: Host,
) -> None:
    agent, client = host.agent, host.agent.client()
    client.allocate("vm-plain", 1)
    client.allocate("vm-def", 2)
    [p], (d, r) = host.owned_by("vm-plain"), host.owned_by("vm-def")
    host.story.update(plain=p, defined=d, raced=r)
    defined = defslab.mdevctl_defined()
    assert {u: s["start"] for u, s in defined.items()} == {p: "manual", d: "manual", r: "manual"}
    # p as a crash between its create and its define leaves it (or an agent that
    # made it before define_mdevs was on); r as Nova leaves its own: autostart on,
    # so mdevctl starts it at the boot, before the agent
    host.conn.nodeDeviceLookupByName(defslab.nodedev_name(p)).undefine(0)
    host.conn.nodeDeviceLookupByName(defslab.nodedev_name(r)).setAutostart(1)
    assert {u: s["start"] for u, s in defslab.mdevctl_defined().items()} == {d: "manual", r: "auto"}

    # The boot: the agent and libvirtd down, every mdev gone, mtty loaded again
    # (udev runs mdevctl's rule), libvirtd up, then the agent (recovery at start).
    agent.stop()
    host.libvirtd.stop()
    defslab.reload_mtty(host.udevd)
    assert mdevlab.mdevs() == {r: migrationlab.MDEV_TYPE}, (
        "mdevctl's udev rule should have started the autostart definition, and only it"
    )
    host.libvirtd.start()
    host.libvirtd.wait_ready()
    host.conn = host.libvirtd.open()
    agent.start()
    agent.wait_ready()

    assert mdevlab.mdevs() == {u: migrationlab.MDEV_TYPE for u in (p, d, r)}
    assert {rec.uuid: rec.owner for rec in agent.ledger()} == {
        p: "vm-plain",
        d: "vm-def",
        r: "vm-def",
    }
    assert agent.daemon is not None
    log = agent.daemon.log().split("===== run ")[-1]  # this start's
    recreated = re.findall(r"re-created mdev (\S+) ", log)
    assert sorted(recreated) == sorted([p, d]), log[-4000:]
    assert "MdevAlreadyExists" not in log and "EEXIST" not in log
    assert not re.search(r"\bERROR\b", log), log[-4000:]
    # The removed Nova mdev stays gone; recovery defined p again and turned r's
    # autostart off: the agent, not libvirt, re-creates its mdevs at the next boot.
    assert NOVA_UUID not in mdevlab.mdevs() and NOVA_UUID not in defslab.mdevctl_defined()
    host.wait_state(NOVA_UUID, None)
    assert {u: s["start"] for u, s in defslab.mdevctl_defined().items()} == {
        p: "manual",
        d: "manual",
        r: "manual",
    }
    for uuid in (p, d, r):
        host.wait_state(uuid, {"active": True, "persistent": True, "autostart": False})
        assert host.listing(uuid)["libvirt"] == {"defined": True, "autostart": False}


def test_the_node_device_name_nova_computes_for_an_agent_mdev(host: Host) -> None:
    import libvirt

    p = host.story["plain"]
    name = defslab.nodedev_name(p)
    dev = host.conn.nodeDeviceLookupByName(name)
    uuid, parent, mdev_type = _mdev_fields(dev.XMLDesc(0))
    assert (uuid, parent, mdev_type) == (p, "mtty", migrationlab.MDEV_TYPE)
    assert dev.parent() == defslab.PARENT_NODEDEV

    def resolves(candidate: str) -> bool:
        try:
            host.conn.nodeDeviceLookupByName(candidate)
        except libvirt.libvirtError as exc:
            assert exc.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE, exc
            return False
        return True

    # libvirt < 7.7's name, and the one Nova computes for a PCI parent: neither is
    # an mtty mdev's (its parent is no PCI device: parent_addr "mtty")
    assert not resolves(f"mdev_{p.replace('-', '_')}")
    assert not resolves(f"mdev_{p.replace('-', '_')}_0000_00_00_0")
    # The agent's attach handle for it (issue 24 part 2): the name Nova 34's
    # _allocate_cyborg_mdevs computes from it cannot resolve an mtty mdev either
    # (no PCI fields), so Nova fails on it rather than create a second mdev.
    handle = nova_handle(p, mdevlab.PARENT, migrationlab.MDEV_TYPE, None)
    info = handle["attach_handle_info"]
    assert handle["attach_handle_type"] == "MDEV"
    assert info["asked_type"] == migrationlab.MDEV_TYPE
    assert [info[k] for k in ("domain", "bus", "device", "function")] == [None] * 4
    nova_name = "mdev_{}_{}_{}_{}_{}".format(
        handle["attach_handle_uuid"].replace("-", "_"),
        info["domain"], info["bus"], info["device"], info["function"],
    )
    assert not resolves(nova_name), "an mtty handle names no PCI parent"


def test_a_remove_through_the_daemon_undefines(host: Host) -> None:
    client = host.agent.client()
    client.release("vm-plain", remove=True)
    client.release("vm-def", remove=True)
    assert mdevlab.mdevs() == {}
    assert defslab.mdevctl_defined() == {}
    for uuid in host.story.values():
        host.wait_state(uuid, None)
    assert host.agent.ledger() == []
    host.agent.stop()


def _mdev_fields(xml: str) -> tuple[str | None, str | None, str | None]:
    from accel_agent.devices import nodedevs

    return nodedevs.parse_mdev_xml(xml)
