"""Trees without ``bus/mdev/devices`` (a copy of /sys made without ``bus/``):
the mdevs are found in their parents' device directories, one listing per
parent, and the daemon's listing re-reads no counter when nothing changed,
as it does with the bus (issue 26: such a tree made every listing re-read
every counter and list every type's ``devices/``).

Static trees (the simulator's, materialised, then ``bus/mdev`` removed);
changes are made by hand the way the kernel would show them.
"""

from __future__ import annotations

import os
import shutil

from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.simulator.profiles import NOVA_MDEV_06, NOVA_MDEV_07
from accel_agent.sysfs import attributes, scan, scanner
from accel_agent.sysfs.rescan import Rescanner

VF_MDEV = "7e7e7e7e-0000-4000-8000-000000000001"
VF0 = "0000:41:00.4"


def tree(tmp_path) -> tuple[str, dict]:
    """The nova profile (two GPUs, one foreign mdev each) and four SR-IOV
    VFs of one card with an mdev on the first; returns the root without
    bus/mdev and the mdevs a scan saw with it."""
    host = SimulatedHost(build_spec(["nova", "nvidia-sriov"], vfs=4))
    host.create_mdev(VF0, "nvidia-474", VF_MDEV)
    root = materialise(host, tmp_path / "sys")
    with_bus = dict(scan(root).mdevs)
    shutil.rmtree(os.path.join(root, "bus", "mdev"))
    return root, with_bus


def no_counter_reads(monkeypatch) -> list[str]:
    """Record every available_instances read and every directory listed."""
    seen: list[str] = []
    real_read, real_listdir = attributes.read_at, scanner._Scan.listdir

    def read_at(dir_fd, name):
        if name.endswith("available_instances"):
            seen.append(name)
        return real_read(dir_fd, name)

    def listdir(path):
        seen.append(f"listdir {path}")
        return real_listdir(path)

    monkeypatch.setattr(attributes, "read_at", read_at)
    monkeypatch.setattr(scanner._Scan, "listdir", staticmethod(listdir))
    return seen


def test_the_mdevs_are_found_in_their_parents_directories_as_the_bus_lists_them(tmp_path):
    root, with_bus = tree(tmp_path)
    snap = scan(root)
    assert dict(snap.mdevs) == with_bus
    assert set(snap.mdevs) == {NOVA_MDEV_06, NOVA_MDEV_07, VF_MDEV}
    assert snap.mdevs[VF_MDEV].parent == VF0
    assert snap.mdevs[VF_MDEV].mdev_type == "nvidia-474"
    assert Rescanner(root).rescan().mdevs == snap.mdevs


def test_a_uuid_named_directory_without_mdev_type_is_no_mdev(tmp_path):
    root, _ = tree(tmp_path)
    device = os.path.realpath(os.path.join(root, "class/mdev_bus/0000:07:00.0"))
    os.mkdir(os.path.join(device, "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"))
    assert set(scan(root).mdevs) == {NOVA_MDEV_06, NOVA_MDEV_07, VF_MDEV}


def test_a_listing_with_nothing_changed_reads_no_counter_and_no_type_directory(
    tmp_path, monkeypatch
):
    root, _ = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    first = rescanner.listing()  # the first scan listed its mdevs late: all read once more
    seen = no_counter_reads(monkeypatch)
    assert rescanner.listing() is first
    assert [s for s in seen if "available_instances" in s] == []
    assert [s for s in seen if s.endswith("devices")] == []


def test_an_mdev_removed_behind_the_agent_rereads_its_card_and_no_other(tmp_path, monkeypatch):
    root, _ = tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.rescan()
    first = rescanner.listing()
    # The kernel's view of a remove: the device directory and the type's
    # link go, and the card's counters go up (one type per card: all of them).
    vf0 = os.path.realpath(os.path.join(root, "class/mdev_bus", VF0))
    shutil.rmtree(os.path.join(vf0, VF_MDEV))
    os.unlink(os.path.join(vf0, "mdev_supported_types/nvidia-474/devices", VF_MDEV))
    for vf in ("0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"):
        types = os.path.join(root, "class/mdev_bus", vf, "mdev_supported_types")
        for type_id in os.listdir(types):
            with open(os.path.join(types, type_id, "available_instances"), "w") as handle:
                handle.write("1\n")
    seen = no_counter_reads(monkeypatch)
    after = rescanner.listing()
    assert VF_MDEV not in after.mdevs
    assert after.parents == scan(root).parents
    assert after.parents[VF0].types["nvidia-474"].available_instances == 1
    assert first.parents[VF0].types["nvidia-474"].available_instances == 0
    # The other cards' counters were not read again.
    assert after.parents["0000:06:00.0"] is first.parents["0000:06:00.0"]
    assert all("0000:06:00.0" not in s for s in seen)


def test_an_mdev_created_during_the_first_scan_is_not_missed_by_the_next_listing(
    tmp_path, monkeypatch
):
    root, _ = tree(tmp_path)
    real = scanner._Scan.parent
    gpu = "0000:07:00.0"
    created = "7e7e7e7e-0000-4000-8000-000000000002"

    def create_after(walker, name):
        # Another process creates an mdev once this parent's counters were
        # read, before its directory is listed: the snapshot has the mdev
        # and the old counter.
        found = real(walker, name)
        if name == gpu:
            monkeypatch.setattr(scanner._Scan, "parent", real)
            device = os.path.realpath(os.path.join(root, "class/mdev_bus", gpu))
            os.mkdir(os.path.join(device, created))
            type_dir = os.path.join(device, "mdev_supported_types/nvidia-12")
            os.symlink(os.path.relpath(type_dir, os.path.join(device, created)),
                       os.path.join(device, created, "mdev_type"))
            os.symlink(f"../../../{created}", os.path.join(type_dir, "devices", created))
            with open(os.path.join(type_dir, "available_instances")) as handle:
                left = int(handle.read())
            with open(os.path.join(type_dir, "available_instances"), "w") as handle:
                handle.write(f"{left - 1}\n")
        return found

    monkeypatch.setattr(scanner._Scan, "parent", create_after)
    rescanner = Rescanner(root)
    racy = rescanner.rescan()
    assert created in racy.mdevs
    stale = racy.parents[gpu].types["nvidia-12"].available_instances
    listed = rescanner.listing()
    assert listed.parents[gpu].types["nvidia-12"].available_instances == stale - 1
    assert listed.parents == scan(root).parents
