"""accelctl allocate/release/adopt/recover/domain-xml as processes, through the
real privsep daemon, on a FUSE-simulated host."""

import json
import os
import subprocess
import sys

import pytest

from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

CONF = (
    "[devices]\nenabled_mdev_types = nvidia-35, mtty-2\n"
    "[mdev_nvidia-35]\n[mdev_mtty-2]\ndevice_addresses = mtty\n[libvirt]\nuri =\n"
)
FOREIGN = "abcdef00-0000-4000-8000-000000000001"


@pytest.fixture
def host(tmp_path):
    skip_unless_root()
    with simulated_host(tmp_path, ["nvidia-pf", "mtty"], gpus=2) as host:
        yield host


def ctl(config, *args, rc=0):
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", config, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == rc, (args, proc.stdout, proc.stderr)
    return proc


def sysfs_mdevs(host):
    """uuid -> (parent, type), read from the kernel-shaped tree itself."""
    devices = os.path.join(host.root, "bus", "mdev", "devices")
    found = {}
    for uuid in os.listdir(devices):
        device = os.path.realpath(os.path.join(devices, uuid))
        found[uuid] = (
            os.path.basename(os.path.dirname(device)),
            os.path.basename(os.readlink(os.path.join(device, "mdev_type"))),
        )
    return found


def test_lifecycle_through_the_cli(host):
    config = host.config(CONF)
    allocated = json.loads(ctl(config, "allocate", "vm-1", "--count", "2", "--json").stdout)
    uuids = [m["uuid"] for m in allocated["mdevs"]]
    assert allocated["instance"] == "vm-1" and len(uuids) == 2
    assert set(uuids) <= host.sysfs_uuids()
    assert host.available("0000:84:00.0", "nvidia-35") == 14

    # inventory's used comes from sysfs + ledger
    inventory = json.loads(ctl(config, "inventory", "--json").stdout)
    used = {p["name"]: p["used"] for p in inventory["providers"]}
    assert used["testhost_pci_0000_84_00_0"] == 2
    mdevs = json.loads(ctl(config, "mdevs", "--json").stdout)["mdevs"]
    assert {m["uuid"]: m["instance"] for m in mdevs} == {u: "vm-1" for u in uuids}

    xml = ctl(config, "domain-xml", "vm-1").stdout
    assert xml.count("<hostdev") == 2 and all(u in xml for u in uuids)
    assert "qemu:commandline" not in xml
    # [libvirt] qemu_globals: one <qemu:commandline> after the hostdevs, for <domain>
    with_globals = host.config(
        CONF.replace("uri =\n", "uri =\nqemu_globals = vfio-pci.enable-migration=on\n"),
        "globals.conf",
    )
    lines = ctl(with_globals, "domain-xml", "vm-1").stdout.splitlines()
    assert lines[:2] == xml.splitlines()
    assert lines[2:] == [
        '<qemu:commandline xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0">'
        '<qemu:arg value="-global"/><qemu:arg value="vfio-pci.enable-migration=on"/>'
        "</qemu:commandline>"
    ]
    # --json (issue 25): the same elements, the <devices> part apart from the <domain> part.
    document = json.loads(ctl(with_globals, "domain-xml", "vm-1", "--json").stdout)
    assert document["instance"] == "vm-1"
    devices = document["devices"]
    assert [(d["type"], d["xml"]) for d in devices] == [("mdev", line) for line in lines[:2]]
    assert all(f'uuid="{d["uuid"]}"' in d["xml"] for d in devices)
    assert {d["uuid"] for d in devices} == set(uuids)
    assert document["qemu_commandline"] == lines[2]
    assert document["xml"] == "\n".join(lines)

    serial = json.loads(
        ctl(config, "allocate", "vm-2", "--count", "1", "--parent", "mtty", "--json").stdout
    )
    assert serial["mdevs"][0]["mdev_type"] == "mtty-2"

    proc = ctl(config, "allocate", "vm-3", "--count", "40", rc=1)
    assert "insufficient capacity" in proc.stderr and "nvidia-35" in proc.stderr

    # host reboot: the same UUIDs come back on the same parents, with the same types
    before = sysfs_mdevs(host)
    assert before == {
        **{m["uuid"]: (m["parent"], "nvidia-35") for m in allocated["mdevs"]},
        serial["mdevs"][0]["uuid"]: ("mtty", "mtty-2"),
    }
    host.sim.reboot()
    assert host.sysfs_uuids() == set()
    report = json.loads(ctl(config, "recover", "--json").stdout)
    assert sorted(report["recreated"]) == sorted(before)
    assert sysfs_mdevs(host) == before

    released = ctl(config, "release", "vm-1", "--remove").stdout
    assert released.startswith("released and removed 2 mdev(s) of vm-1: ")
    assert all(u in released for u in uuids)
    assert not set(uuids) & host.sysfs_uuids()
    assert host.available("0000:84:00.0", "nvidia-35") == 16
    assert "nothing to do" in ctl(config, "release", "vm-1").stdout


def test_adopt_and_refusals(host):
    config = host.config(CONF)
    host.create_foreign("0000:85:00.0", "nvidia-35", FOREIGN)
    mdevs = json.loads(ctl(config, "mdevs", "--json").stdout)["mdevs"]
    assert mdevs[0]["uuid"] == FOREIGN and mdevs[0]["owned"] is False
    assert ctl(config, "adopt", FOREIGN).stdout == (
        f"adopted {FOREIGN} (nvidia-35 on 0000:85:00.0)\n"
    )
    mdevs = json.loads(ctl(config, "mdevs", "--json").stdout)["mdevs"]
    assert mdevs[0]["owned"] is True
    assert "not a UUID" in ctl(config, "adopt", "../../etc/passwd", rc=1).stderr
    assert "not found" in ctl(config, "adopt", "abcdef00-0000-4000-8000-0000000000ff", rc=1).stderr
    proc = ctl(config, "--sysfs-root", "/tmp", "allocate", "vm", "--count", "1", rc=1)
    assert "--sysfs-root" in proc.stderr
    assert ctl(config, "allocate", "vm", rc=2).returncode == 2
    usage = ctl(config, "adopt", rc=2).stderr
    assert usage == "accelctl adopt: error: give either UUID or --from-libvirt\n"
    # An instance with no claim: the abort is idempotent, and says what it freed.
    assert ctl(config, "migration", "abort", "vm-9").stdout == (
        "claim of vm-9 aborted; freed: none\n"
    )
    assert not os.path.exists("/tmp/class")


def test_attach_and_detach_through_the_cli(host):
    """accelctl attach/detach (issue 15): two kinds of vGPU request in one call,
    the handles with their XML, the same answer again, a bad field named with
    nothing made, detach giving everything back."""
    config = host.config(CONF)
    answer = json.loads(
        ctl(config, "attach", "vm-1", "--vgpu", "VGPU:2", "--vgpu", "mtty-2", "--json").stdout
    )
    handles = answer["attachments"]
    assert [h["request"] for h in handles] == [0, 0, 1]
    assert [h["type"] for h in handles] == ["nvidia-35", "nvidia-35", "mtty-2"]
    assert {h["uuid"]: (h["parent"], h["type"]) for h in handles} == sysfs_mdevs(host)
    assert all(h["uuid"] in h["xml"] and h["address"] is None for h in handles)
    again = ctl(config, "attach", "vm-1", "--request", '{"resource_class": "VGPU", "count": 2}',
                "--request", '{"mdev_type": "mtty-2"}', "--json")
    assert json.loads(again.stdout) == answer
    table = ctl(config, "attach", "vm-1", "--vgpu", "VGPU:2", "--vgpu", "mtty-2").stdout
    assert all(h["uuid"] in table for h in handles)
    refused = ctl(config, "attach", "vm-2", "--vgpu", "mtty-2", "--vf", "nic_a,vlan=9000", rc=1)
    assert "requests[1].pool" in refused.stderr, refused.stderr
    assert len(sysfs_mdevs(host)) == 3
    usage = ctl(config, "attach", "vm-2", "--vf", "nic_a,vlan", rc=2)
    assert "KEY=VALUE" in usage.stderr
    detached = json.loads(ctl(config, "detach", "vm-1", "--remove", "--json").stdout)
    assert sorted(detached["released"]) == sorted(h["uuid"] for h in handles)
    assert sysfs_mdevs(host) == {}
    assert "holds no device" in ctl(config, "detach", "vm-1").stdout
