"""Lab "systemd", first boot: the package installed with apt, the shipped unit driven by
systemctl (start through Type=notify, socket, sysfs writes and the VFIO probe inside the
sandbox, reload, a VF of the igb pool attached with MAC and VLAN, stop), then enabled with
mdevs in its ledger for the reboot that test_boot2.py checks.  The tests run in order; each
one states what it builds on.  The config has both backends from the start: mtty's mdev
type and the VF pool on QEMU's igb.
"""

from __future__ import annotations

import grp
import json
import os
import stat

import pytest

from tests.realkernel.systemd import unitlab as lab

pytestmark = lab.skip_unless_lab()

MAC = "52:54:00:ab:cd:10"


def _allocate(instance: str, count: int = 1) -> list[dict[str, str]]:
    answer = lab.ok("PUT", f"/v1/instances/{instance}/allocation", {"count": count})
    return answer["mdevs"]


def test_package_installs_with_apt_and_ships_the_unit_unchanged():
    deb = os.environ.get("LAB_DEB_FILE", "")
    assert deb.endswith(".deb") and os.path.isfile(deb), f"no package to install: {deb!r}"
    # offline: the rootfs holds the package's dependencies (lab.sh, LAB_DEB)
    # (--force-unsafe-io: no fsync per file; a TCG guest unpacks the venv 2x faster)
    lab.run("apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-unsafe-io", deb, timeout=600)
    status = lab.run("dpkg-query", "-W", "-f=${db:Status-Status}", "accel-agent").stdout
    assert status == "installed"
    shipped = (lab.REPO / "systemd" / "accel-agent.service").read_bytes()
    with open("/lib/systemd/system/accel-agent.service", "rb") as installed:
        assert installed.read() == shipped
    # installed, neither enabled nor started by the package
    assert lab.run("systemctl", "is-enabled", lab.UNIT, check=False).stdout.strip() == "disabled"
    assert lab.show("ActiveState")["ActiveState"] == "inactive"


def test_ordering_drop_ins_put_nova_compute_and_libvirt_guests_after_the_agent():
    """The package's drop-ins (docs/operations.md): both units start after the agent and
    stop before it.  test_boot2.py checks the order at boot and at stop."""
    for name in lab.ORDERED:
        shipped = lab.REPO / "systemd" / "dropins" / f"{name}.service.d" / "accel-agent.conf"
        installed = f"/lib/systemd/system/{name}.service.d/accel-agent.conf"
        with open(installed, "rb") as handle:
            assert handle.read() == shipped.read_bytes(), installed
        lab.write_stand_in(name)
    lab.run("systemctl", "daemon-reload")
    for name in lab.ORDERED:
        props = lab.show("After", "DropInPaths", unit=name)
        assert "accel-agent.service" in props["After"].split(), props
        # ordering only: starting them never starts an agent the operator did not enable
        wants = lab.show("Wants", "Requires", "Requisite", "BindsTo", unit=name)
        assert not any("accel-agent" in v for v in wants.values()), wants


def test_start_reaches_active_through_type_notify():
    lab.run("groupadd", "--system", "-f", lab.SOCKET_GROUP)
    lab.write_config("mtty-1")
    # Type=notify: `systemctl start` returns once the agent sent READY=1 (or failed).
    lab.run("systemctl", "start", lab.UNIT, timeout=300)
    props = lab.show("Type", "ActiveState", "SubState", "StatusText", "MainPID", "NRestarts")
    assert props["Type"] == "notify"
    assert (props["ActiveState"], props["SubState"]) == ("active", "running"), props
    # STATUS= comes only through the notify socket: the agent's own READY message
    assert props["StatusText"].startswith("serving the API on /run/accel-agent/api.sock"), props
    assert props["NRestarts"] == "0"
    assert lab.health()["status"] == "ok"


def test_socket_has_the_configured_mode_and_group():
    st = os.stat(lab.SOCKET)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
    assert grp.getgrgid(st.st_gid).gr_name == lab.SOCKET_GROUP
    assert st.st_uid == 0


def test_reload_applies_a_new_config():
    assert lab.mdevs() == {}
    before = lab.health()["config"]
    assert lab.mdev_types_offered() == {"mtty-1"}
    lab.write_config("mtty-2")  # nothing assigned yet: nothing orphaned
    pid = lab.show("MainPID")["MainPID"]
    lab.run("systemctl", "reload", lab.UNIT)
    config = lab.wait_for(
        lambda: (c := lab.health()["config"])["last_reload"] != before["last_reload"] and c,
        "the reload to be recorded",
    )
    assert config["last_reload_result"] == "applied", config
    lab.wait_for(lambda: lab.mdev_types_offered() == {"mtty-2"}, "the inventory to offer mtty-2")
    assert lab.show("MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}


def test_allocation_creates_a_real_mtty_mdev_through_the_sandbox():
    mdevs = _allocate("inst-a")
    assert len(mdevs) == 1 and mdevs[0]["mdev_type"] == "mtty-2" and mdevs[0]["parent"] == "mtty"
    uuid = mdevs[0]["uuid"]
    # the privsep helper's write to .../mtty-2/create went through ProtectKernelTunables
    assert lab.mdevs() == {uuid: "mtty-2"}
    assert os.path.exists(lab.vfio_group_node(uuid))


def test_release_remove_removes_an_idle_mdev_and_keeps_a_held_one():
    """The in-use probe inside the sandbox: an idle mdev's VFIO group opens (removed), a
    held one's gives EBUSY (kept).  With PrivateDevices=yes the service saw no /dev/vfio
    and kept both, "cannot check whether it is in use"."""
    idle = _allocate("inst-idle")[0]["uuid"]
    held = _allocate("inst-held")[0]["uuid"]
    fd = os.open(lab.vfio_group_node(held), os.O_RDWR)  # what QEMU does with an mdev
    try:
        status, answer = lab.api("DELETE", "/v1/instances/inst-idle/allocation?remove=true")
        assert status == 200, answer
        assert answer["removed"] is True and answer["released"] == [idle]
        assert idle not in lab.mdevs()

        status, answer = lab.api("DELETE", "/v1/instances/inst-held/allocation?remove=true")
        assert status == 409, answer
        assert answer["error"]["code"] == "MdevInUse"
        assert held in lab.mdevs()
        # kept because the probe saw EBUSY, not because it could not look
        kept = [m for m in lab.messages(lab.journal()) if f"mdev {held} kept" in m]
        assert kept and "is open (a VM or another process holds it)" in kept[-1], kept
    finally:
        os.close(fd)
    # kept means released and free: the next allocation reuses it; once nobody holds
    # its group, release --remove removes it
    assert [m["uuid"] for m in _allocate("inst-again")] == [held]
    answer = lab.ok("DELETE", "/v1/instances/inst-again/allocation?remove=true")
    assert answer["removed"] is True and answer["released"] == [held]
    assert held not in lab.mdevs()


def test_reload_refuses_a_config_that_would_orphan_an_assigned_mdev():
    (uuid,) = [m["uuid"] for m in lab.ok("GET", "/v1/instances/inst-a/allocation")["mdevs"]]
    before = lab.health()["config"]
    pid = lab.show("MainPID")["MainPID"]
    lab.write_config("mtty-1")  # inst-a's mtty-2 mdev would lose its type
    try:
        lab.run("systemctl", "reload", lab.UNIT)
        config = lab.wait_for(
            lambda: (c := lab.health()["config"])["last_reload"] != before["last_reload"] and c,
            "the reload to be recorded",
        )
        assert config["last_reload_result"] == "refused", config
        assert uuid in config["last_reload_error"], config
        # the running configuration is kept, the service too
        assert lab.mdev_types_offered() == {"mtty-2"}
        assert lab.show("MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}
        assert lab.mdevs() == {uuid: "mtty-2"}
    finally:
        lab.write_config("mtty-2")


def test_the_pool_s_vfs_were_enabled_at_start():
    """The agent enabled the pool's VFs when it started (``sriov_numvfs``, written by its
    sysfs helper through the sandbox) and offers them."""
    pf = lab.igb_pf()
    vfs = lab.vfs_of(pf)
    assert len(vfs) == lab.POOL_NUM_VFS, vfs
    assert [lab.driver_of(vf) for vf in vfs] == ["igbvf"] * lab.POOL_NUM_VFS
    pools = [p for p in lab.ok("GET", "/v1/inventory")["providers"] if p["mdev_type"] == lab.POOL]
    assert [(p["pci_address"], p["inventory"]["total"]) for p in pools] == [
        (pf, lab.POOL_NUM_VFS)
    ], pools


def test_a_vf_is_attached_with_mac_and_vlan_through_the_api_and_detached():
    """The sriov_vf backend under the shipped unit: the MAC and VLAN go through the
    CAP_NET_ADMIN helper (the unit's CapabilityBoundingSet= must hold CAP_NET_ADMIN), the
    hand-over to vfio-pci and back writes /sys/bus/pci/drivers/*/bind|unbind and
    drivers_probe (ReadWritePaths= under ProtectKernelTunables=).  Read back from the
    kernel: the VF's driver link, its VFIO group node, iproute2."""
    pf = lab.igb_pf()
    netdev = lab.pf_netdev(pf)
    # the PF's link up, as a host's network config leaves it (igb wants it for some settings)
    lab.run("ip", "link", "set", "dev", netdev, "up")
    (vf,) = lab.vfs_of(pf)
    status, answer = lab.api(
        "POST", "/v1/instances/inst-vf/attachments", [{"pool": lab.POOL, "mac": MAC, "vlan": 100}]
    )
    assert status == 200, answer
    (handle,) = answer["attachments"]
    assert (handle["backend"], handle["address"], handle["type"]) == ("sriov_vf", vf, lab.POOL)
    assert lab.driver_of(vf) == "vfio-pci"
    group = os.path.basename(os.readlink(f"{lab.PCI_DEVICES}/{vf}/iommu_group"))
    assert os.path.exists(f"/dev/vfio/{group}")
    line = lab.ip_vf(netdev, 0)
    assert MAC in line and "vlan 100" in line, line
    assert MAC in handle["xml"], handle["xml"]
    # detach: back on igbvf, the tenant's MAC and VLAN gone
    status, answer = lab.api("DELETE", "/v1/instances/inst-vf/attachments")
    assert status == 200, answer
    assert lab.driver_of(vf) == "igbvf"
    line = lab.ip_vf(netdev, 0)
    assert MAC not in line and "vlan 100" not in line, line
    assert lab.ok("GET", "/v1/instances/inst-vf/attachments")["attachments"] == []


def test_stop_exits_cleanly():
    mdevs_before = lab.mdevs()
    lab.run("systemctl", "stop", lab.UNIT, timeout=120)
    assert lab.show("ActiveState")["ActiveState"] == "inactive"
    # (a stopped unit that is not enabled is unloaded at once: its Result= and
    # ExecMain*= are reset, so the journal is the record)
    messages = lab.messages(lab.journal())
    assert any(m.endswith("accel-agent stopped") for m in messages), messages[-20:]
    # systemd's own word: exit status 0, nothing left for it to kill (KillMode=mixed
    # would SIGKILL leftovers), no timeout
    assert "accel-agent.service: Deactivated successfully." in messages, messages[-20:]
    bad = [
        m
        for m in messages
        if "SIGKILL" in m
        or "Failed with result" in m
        or ("Main process exited" in m and "status=0/SUCCESS" not in m)
    ]
    assert not bad, bad
    # the privsep helper went with it; the mdevs stay (they are the instances')
    leftovers = lab.run("pgrep", "-f", "privsep-helper", check=False).stdout.split()
    assert leftovers == []
    assert lab.mdevs() == mdevs_before


def test_enable_with_mdevs_in_the_ledger_for_the_reboot():
    """Sets up test_boot2.py: enabled, running, two instances holding three mdevs."""
    lab.run("systemctl", "enable", "--now", lab.UNIT, timeout=300)
    assert lab.show("ActiveState")["ActiveState"] == "active"
    lab.run("systemctl", "enable", *(f"{name}.service" for name in lab.ORDERED))
    inst_a = lab.ok("GET", "/v1/instances/inst-a/allocation")["mdevs"]
    held = {"inst-a": sorted(m["uuid"] for m in inst_a)}
    held["inst-b"] = sorted(m["uuid"] for m in _allocate("inst-b", 2))
    assert len(lab.mdevs()) == 3
    # A standing layout of 5 mtty-2 mdevs (issue 23): the 3 the instances hold
    # count, the layout makes 2 more of its own, after the reload.
    lab.write_config("mtty-2", standing=lab.STANDING)
    lab.run("systemctl", "reload", lab.UNIT)
    lab.wait_for(lambda: len(lab.mdevs()) == lab.STANDING, "the standing layout's 2 mdevs")
    layout = sorted(set(lab.mdevs()) - {u for uuids in held.values() for u in uuids})
    listed = {m["uuid"]: m for m in lab.ok("GET", "/v1/mdevs")["mdevs"]}
    assert all(listed[u]["standing"] and listed[u]["instance"] is None for u in layout)
    held["layout"] = layout
    lab.STATE.mkdir(parents=True, exist_ok=True)
    lab.EXPECTED.write_text(json.dumps(held, indent=1))
    assert lab.run("systemctl", "is-enabled", lab.UNIT).stdout.strip() == "enabled"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__]))
