"""The libvirt node-device adaptor (accel_agent.devices.nodedevs) against the
minimal fake of the libvirt-python calls it uses (tests/fake_nodedevs.py: the
test:/// driver cannot define, undefine, autostart or list inactive node
devices), and the mdev listing's ``libvirt`` key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accel_agent import exception
from accel_agent.devices import nodedevs
from accel_agent.reporting import views
from accel_agent.sysfs.model import HostSnapshot, Mdev
from tests.fake_nodedevs import Definition, FakeLibvirt

GPU = "0000:84:00.0"
U1 = "a0000000-0000-4000-8000-000000000001"
U2 = "a0000000-0000-4000-8000-000000000002"


def adaptor(fake: FakeLibvirt) -> nodedevs.LibvirtNodeDevices:
    return nodedevs.LibvirtNodeDevices("qemu:///system", opener=lambda: fake)


def test_parse_reads_parent_addr_or_the_parents_node_device_name():
    new = (f"<device><parent>pci_0000_84_00_0</parent><capability type='mdev'>"
           f"<type id='nvidia-35'/><uuid>{U1.upper()}</uuid><parent_addr>mtty</parent_addr>"
           "</capability></device>")
    assert nodedevs.parse_mdev_xml(new) == (U1, "mtty", "nvidia-35")
    old = new.replace("<parent_addr>mtty</parent_addr>", "")
    assert nodedevs.parse_mdev_xml(old) == (U1, GPU, "nvidia-35")
    # a definition whose parent is gone: libvirt says "computer"
    gone = old.replace("pci_0000_84_00_0", "computer")
    assert nodedevs.parse_mdev_xml(gone) == (U1, None, "nvidia-35")


def test_lists_defined_and_active_with_their_flags():
    fake = FakeLibvirt(
        sysfs=lambda: {U1: (GPU, "nvidia-35"), U2: (GPU, "nvidia-35")},
        defined={U1: Definition(GPU, "nvidia-35", autostart=True)},
    )
    found = adaptor(fake).require()
    assert (found[U1].defined, found[U1].autostart, found[U1].active) == (True, True, True)
    assert (found[U2].defined, found[U2].autostart) == (False, False)
    assert nodedevs.listing_view(adaptor(fake)) == {U1: (True, True)}


def test_a_device_gone_between_the_listing_and_its_read_is_skipped():
    """Seen in the trixie lab: a release with remove of two mdevs; the second's
    listing met the first, removed and undefined a moment before, still listed
    by libvirt: the whole read failed and the second's definitions stayed."""
    fake = FakeLibvirt(
        sysfs=lambda: {U2: (GPU, "nvidia-35")},
        defined={U1: Definition(GPU, "nvidia-35"), U2: Definition(GPU, "nvidia-35")},
        fail={"gone": {U1}},
    )
    found = adaptor(fake).require()
    assert list(found) == [U2] and found[U2].defined
    adaptor(fake).undefine(U2)
    assert fake.calls == [("undefine", U2)]


def test_define_sets_autostart_off_and_names_the_parents_node_device():
    fake = FakeLibvirt()
    adaptor(fake).define(U1, GPU, "nvidia-35")
    assert fake.nodedev(U1) == {"defined": True, "autostart": False}
    assert fake.calls == [("define", U1), ("autostart-", U1)]
    assert nodedevs.parent_nodedev_name(GPU) == "pci_0000_84_00_0"


def test_undefine_and_autostart_are_idempotent_and_touch_only_that_uuid():
    fake = FakeLibvirt(defined={U1: Definition(GPU, "nvidia-35", True),
                                U2: Definition(GPU, "nvidia-35", True)})
    lv = adaptor(fake)
    lv.set_autostart(U1, False)
    lv.undefine(U1)
    lv.undefine(U1)  # nothing left: nothing done
    assert set(fake.defined) == {U2} and fake.defined[U2].autostart


def test_failures_raise_one_class_per_meaning():
    fake = FakeLibvirt(fail={"open": True})
    with pytest.raises(exception.NodeDevicesUnavailable):
        adaptor(fake).require()
    assert adaptor(fake).mdevs() is None  # a listing's "not known"
    fake = FakeLibvirt(defined={U1: Definition(GPU, "nvidia-35")}, fail={"undefine": {U1}})
    with pytest.raises(exception.NodeDeviceWriteFailed) as info:
        adaptor(fake).undefine(U1)
    assert "undefine" in info.value.message and U1 in info.value.message


def test_no_uri_knows_nothing_and_writes_nothing():
    none = nodedevs.for_uri("")
    assert none.mdevs() is None and none.require() == {}
    none.undefine(U1)
    none.define(U1, GPU, "nvidia-35")


def test_the_listing_says_null_when_unknown_and_each_mdevs_flags_when_known():
    snapshot = HostSnapshot(root="/", parents={}, mdevs={
        U1: Mdev(uuid=U1, parent=GPU, mdev_type="nvidia-35", iommu_group=1),
        U2: Mdev(uuid=U2, parent=GPU, mdev_type="nvidia-35", iommu_group=2),
    })
    from accel_agent.devices.policy import DevicePolicy

    policy = DevicePolicy()
    unknown = views.mdevs_document(snapshot, policy, "h")
    assert [m["libvirt"] for m in unknown["mdevs"]] == [None, None]
    known = views.mdevs_document(snapshot, policy, "h", libvirt={U1: (True, False)})
    assert [m["libvirt"] for m in known["mdevs"]] == [
        {"defined": True, "autostart": False}, {"defined": False, "autostart": False}
    ]


def test_an_empty_uri_listing_imports_nothing_of_libvirt(tmp_path):
    """accelctl's offline listing with [libvirt] uri empty: libvirt null, and
    libvirt-python never imported (it costs the CLI tens of ms)."""
    root = tmp_path / "sys"
    for sub in ("class/mdev_bus", "bus/mdev/devices", "bus/pci/devices"):
        (root / sub).mkdir(parents=True)
    conf = tmp_path / "a.conf"
    conf.write_text(f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\n"
                    f"[api]\nsocket_path = {tmp_path / 'none.sock'}\n[libvirt]\nuri =\n")
    code = (
        "import sys, atexit\n"
        "atexit.register(lambda: sys.stderr.write('LIBVIRT=%s' % ('libvirt' in sys.modules)))\n"
        "from accel_agent.cmd.accelctl import main\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--config-file", str(conf), "mdevs", "--json"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
             "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "LIBVIRT=False" in proc.stderr


def test_a_driver_that_cannot_list_inactive_devices_defines_nothing():
    """libvirt's test driver (and libvirt < 7.3): "unsupported flags" for the
    inactive list; its active mdevs are all there is, none defined."""
    fake = FakeLibvirt(sysfs=lambda: {U1: (GPU, "nvidia-35")}, fail={"inactive": True})
    found = adaptor(fake).require()
    assert (found[U1].active, found[U1].defined) == (True, False)


def test_the_real_test_driver_answers_no_definitions():
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    assert nodedevs.LibvirtNodeDevices("test:///default").require() == {}


def _empty_root(tmp_path):
    root = tmp_path / "sys"
    for sub in ("class/mdev_bus", "bus/mdev/devices", "bus/pci/devices"):
        (root / sub).mkdir(parents=True)
    return str(root)


@pytest.mark.parametrize("uri, warned", [("", True), ("qemu:///system", False)])
def test_check_config_warns_of_define_mdevs_without_a_uri(tmp_path, uri, warned):
    from accel_agent.config import check
    from tests.configutil import make_conf

    conf = make_conf(
        f"state_dir = {tmp_path / 'state'}\n[libvirt]\nuri = {uri}\ndefine_mdevs = true\n",
        sysfs_root=_empty_root(tmp_path), directory=str(tmp_path),
    )
    errors, warnings, _ = check.check(conf)
    said = [w for w in warnings if "define_mdevs" in w]
    assert bool(said) is warned, warnings
    assert errors == []


def test_the_takeover_text_names_the_libvirt_action(monkeypatch, capsys):
    """accelctl adopt --from-libvirt --dry-run prints each mdev's libvirt action."""
    import argparse

    from accel_agent.cmd import ctl_reconcile, daemon

    plan = {
        "applied": False, "dry_run": True, "all": False, "problems": [], "unused": [],
        "domains": [{"uuid": U2, "name": "instance-1", "mdevs": [
            {"uuid": U1, "parent": GPU, "mdev_type": "nvidia-35", "action": "adopt",
             "libvirt": "undefine"},
        ]}],
    }
    monkeypatch.setattr(daemon, "via_api", lambda *a, **k: plan)
    args = argparse.Namespace(all=False, dry_run=True, json=False)
    conf = argparse.Namespace(api=argparse.Namespace(socket_path="/nonexistent"))
    assert ctl_reconcile._takeover(args, conf) == 0
    assert f"adopt   {U1}  nvidia-35 on {GPU}  libvirt: undefine" in capsys.readouterr().out


def test_a_definition_is_rebuilt_from_the_live_xml_without_its_live_parts():
    live = (f"<device><name>mdev_x</name><path>/sys/devices/x</path>"
            f"<parent>pci_0000_84_00_0</parent><driver><name>vfio_mdev</name></driver>"
            f"<capability type='mdev'><type id='nvidia-35'/><uuid>{U1}</uuid>"
            f"<parent_addr>{GPU}</parent_addr><iommuGroup number='3'/>"
            f"<attr name='vgpu_params' value='x'/></capability></device>")
    assert nodedevs.definition_xml(live) == (
        "<device><parent>pci_0000_84_00_0</parent><capability type=\"mdev\">"
        f"<type id=\"nvidia-35\"/><uuid>{U1}</uuid>"
        "<attr name=\"vgpu_params\" value=\"x\"/></capability></device>"
    )
