"""Scanner against simulator trees (real files and relative links, like /sys)."""

import os
import shutil

import pytest

from accel_agent import exception
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.simulator.profiles import NOVA_MDEV_06, NOVA_MDEV_07
from accel_agent.sysfs import scan

UUID_A = "11111111-2222-4333-8444-555555555555"


def tree(tmp_path, *profiles, mutate=None, **options):
    host = SimulatedHost(build_spec(profiles, **options))
    if mutate:
        mutate(host)
    root = tmp_path / "sys"
    materialise(host, str(root))
    return str(root), host


def test_scan_reads_parents_types_and_mdevs_like_the_kernel_lays_them_out(tmp_path):
    root, _ = tree(tmp_path, "nova")
    snap = scan(root)
    assert sorted(snap.parents) == ["0000:06:00.0", "0000:07:00.0"]
    p07 = snap.parents["0000:07:00.0"]
    assert p07.pci_address == "0000:07:00.0"
    assert p07.physical_gpu == "0000:07:00.0" and p07.physfn is None
    assert p07.driver == "nvidia" and p07.numa_node == 0
    assert p07.device_path.startswith("devices/pci0000:00/")
    assert {t: v.available_instances for t, v in p07.types.items()} == {
        "nvidia-11": 7,
        "nvidia-12": 10,
    }
    nvidia_11 = p07.types["nvidia-11"]
    assert nvidia_11.name == "GRID M60-0B" and nvidia_11.device_api == "vfio-pci"
    assert nvidia_11.description_fields["max_instance"] == "8"
    assert nvidia_11.max_instance == 8
    assert set(snap.mdevs) == {NOVA_MDEV_06, NOVA_MDEV_07}
    mdev = snap.mdevs[NOVA_MDEV_07]
    assert (mdev.parent, mdev.mdev_type) == ("0000:07:00.0", "nvidia-11")
    assert isinstance(mdev.iommu_group, int)
    assert snap.warnings == ()


def test_virtual_parent_and_multi_line_descriptions(tmp_path):
    root, _ = tree(tmp_path, "mtty", "i915-gvtg")
    snap = scan(root)
    mtty = snap.parents["mtty"]
    assert mtty.pci_address is None and mtty.physical_gpu == "mtty" and mtty.is_virtual
    assert mtty.device_path == "devices/virtual/mtty/mtty"
    assert mtty.types["mtty-1"].available_instances == 24
    assert mtty.types["mtty-2"].available_instances == 12
    assert mtty.types["mtty-1"].description is None
    gvt = snap.parents["0000:00:02.0"].types
    fields = next(iter(gvt.values())).description_fields
    assert {"low_gm_size", "high_gm_size", "fence", "resolution", "weight"} <= set(fields)


def test_sriov_vfs_name_their_physical_gpu(tmp_path):
    root, _ = tree(tmp_path, "nvidia-sriov", vfs=4)
    snap = scan(root)
    assert sorted(snap.parents) == [
        "0000:41:00.4",
        "0000:41:00.5",
        "0000:41:00.6",
        "0000:41:00.7",
    ]
    assert {p.physical_gpu for p in snap.parents.values()} == {"0000:41:00.0"}
    assert all(p.physfn == "0000:41:00.0" for p in snap.parents.values())
    assert len(snap.parents_of_gpu("0000:41:00.0")) == 4


def test_mdev_of_any_type_is_reported(tmp_path):
    root, _ = tree(
        tmp_path,
        "nvidia-pf",
        gpus=1,
        mutate=lambda h: h.create_mdev("0000:84:00.0", "nvidia-36", UUID_A),
    )
    snap = scan(root)
    assert snap.mdevs[UUID_A].mdev_type == "nvidia-36"
    # NVIDIA equal-size mode: the other types of this pGPU now read 0.
    assert snap.parents["0000:84:00.0"].types["nvidia-35"].available_instances == 0


def test_garbage_dangling_and_missing_items_are_skipped_with_warnings(tmp_path):
    root, _ = tree(
        tmp_path, "nova", "mtty", mutate=lambda h: h.create_mdev("mtty", "mtty-1", UUID_A)
    )
    types06 = os.path.join(root, "class/mdev_bus/0000:06:00.0/mdev_supported_types")
    types07 = os.path.join(root, "class/mdev_bus/0000:07:00.0/mdev_supported_types")
    # non-numeric counter: that type is skipped, the parent stays
    with open(os.path.join(types07, "nvidia-12", "available_instances"), "w") as f:
        f.write("lots\n")
    # missing optional files: still scanned
    os.unlink(os.path.join(types06, "nvidia-11", "name"))
    os.unlink(os.path.join(types06, "nvidia-11", "description"))
    # a dangling parent link and a dangling mdev link
    os.symlink(
        "../../devices/pci0000:00/nowhere", os.path.join(root, "class/mdev_bus/0000:99:00.0")
    )
    os.symlink(
        "../../../devices/gone/aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
        os.path.join(root, "bus/mdev/devices/aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"),
    )
    # an mdev whose mdev_type link dangles
    os.unlink(os.path.join(root, "bus/mdev/devices", UUID_A, "mdev_type"))
    os.symlink(
        "../mdev_supported_types/gone", os.path.join(root, "bus/mdev/devices", UUID_A, "mdev_type")
    )
    # garbage names in the mdev bus
    os.mkdir(os.path.join(root, "bus/mdev/devices/not-a-uuid"))

    snap = scan(root)
    assert sorted(snap.parents) == ["0000:06:00.0", "0000:07:00.0", "mtty"]
    assert "nvidia-12" not in snap.parents["0000:07:00.0"].types
    assert "nvidia-11" in snap.parents["0000:07:00.0"].types
    t06 = snap.parents["0000:06:00.0"].types["nvidia-11"]
    assert (t06.name, t06.description, t06.available_instances) == (None, None, 15)
    assert snap.mdevs[UUID_A].mdev_type is None
    assert "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee" not in snap.mdevs
    text = "\n".join(snap.warnings)
    for needle in ("lots", "0000:99:00.0", "aaaaaaaa-bbbb", "not-a-uuid", UUID_A):
        assert needle in text


def test_links_leaving_the_root_are_not_followed(tmp_path):
    root, _ = tree(tmp_path, "mtty")
    outside = tmp_path / "outside" / "evil"
    (outside / "mdev_supported_types" / "x-1").mkdir(parents=True)
    (outside / "mdev_supported_types" / "x-1" / "device_api").write_text("vfio-pci\n")
    (outside / "mdev_supported_types" / "x-1" / "available_instances").write_text("5\n")
    os.symlink(str(outside), os.path.join(root, "class/mdev_bus/evil"))
    snap = scan(root)
    assert "evil" not in snap.parents
    assert any("evil" in w for w in snap.warnings)


def test_a_copied_tree_works_like_the_original(tmp_path):
    """Any directory shaped like /sys, not only ones the simulator made."""
    root, _ = tree(tmp_path, "nova")
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)
    assert scan(str(copy)).parents.keys() == scan(root).parents.keys()
    assert scan(str(copy)).mdevs.keys() == scan(root).mdevs.keys()


def test_tree_without_mdev_bus_is_an_empty_host_and_missing_root_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    snap = scan(str(tmp_path / "empty"))
    assert not snap.parents and not snap.mdevs
    with pytest.raises(exception.SysfsRootNotFound):
        scan(str(tmp_path / "missing"))


def test_mdevs_found_through_type_dirs_when_bus_is_absent(tmp_path):
    root, _ = tree(tmp_path, "nova")
    shutil.rmtree(os.path.join(root, "bus", "mdev"))
    assert set(scan(root).mdevs) == {NOVA_MDEV_06, NOVA_MDEV_07}


def _big_tree(tmp_path, parents=40):
    host = SimulatedHost(build_spec(["synthetic"], parents=parents, types=3))
    root = tmp_path / "big"
    materialise(host, str(root))
    return str(root)


def _spoil(root, parent_index, what):
    """Garbage in one parent (by sorted position) so that a worker warns."""
    bus = os.path.join(root, "class/mdev_bus")
    name = sorted(os.listdir(bus))[parent_index]
    types = os.path.join(bus, name, "mdev_supported_types")
    first = sorted(os.listdir(types))[0]
    with open(os.path.join(types, first, "available_instances"), "w") as f:
        f.write(what)
    return name, first


def _count_forks(monkeypatch) -> list[int]:
    forks: list[int] = []
    real_fork = os.fork

    def counting_fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counting_fork)
    return forks


# Some test modules import eventlet, which warns on every fork; accelctl,
# the only caller that forks, never imports it.
FORK_UNDER_EVENTLET = pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")


@FORK_UNDER_EVENTLET
@pytest.mark.parametrize("workers", [2, 3])
def test_a_parallel_scan_is_the_serial_scan(tmp_path, monkeypatch, workers):
    root = _big_tree(tmp_path)
    # Warnings from this process's share and from a worker's, in order.
    _spoil(root, 1, "garbage-early\n")
    _spoil(root, 38, "garbage-late\n")
    serial = scan(root)
    forks = _count_forks(monkeypatch)
    parallel = scan(root, workers=workers)
    assert len(forks) == workers - 1
    assert parallel == serial
    assert list(parallel.parents) == list(serial.parents)
    assert len(serial.warnings) == 2 and parallel.warnings == serial.warnings


@FORK_UNDER_EVENTLET
@pytest.mark.parametrize("workers", [2, 3])
def test_aliases_across_workers_are_settled_like_a_serial_scan(tmp_path, monkeypatch, workers):
    """Entries of one device in different workers' shares: one parent, one
    reading's warnings, one alias warning, as in a serial scan."""
    root = _big_tree(tmp_path)
    bus = os.path.join(root, "class/mdev_bus")
    names = sorted(os.listdir(bus))
    late, _ = _spoil(root, 30, "garbage-late\n")  # read in the last worker's share
    early = names[1]
    # Sorted first (this process's share) and last (the last worker's).
    os.symlink(late, os.path.join(bus, "0000:00:00.0"))
    os.symlink(os.readlink(os.path.join(bus, early)), os.path.join(bus, "0001:ff:00.0"))
    os.symlink("0001:ff:00.0", os.path.join(bus, "0001:fe:00.0"))  # a chain, too
    serial = scan(root)
    forks = _count_forks(monkeypatch)
    parallel = scan(root, workers=workers)
    assert len(forks) == workers - 1
    assert list(serial.parents) == names  # 40 GPUs, 40 parents
    assert parallel == serial and parallel.warnings == serial.warnings
    assert serial.warnings == (
        f"parent {late}: type nvidia-1000 available_instances 'garbage-late' is not a "
        "number; skipped",
        f"parent {early}: class/mdev_bus 0001:fe:00.0, 0001:ff:00.0 lead to its device too; "
        "aliases skipped",
        f"parent {late}: class/mdev_bus 0000:00:00.0 lead to its device too; aliases skipped",
    )


@FORK_UNDER_EVENTLET
def test_a_failed_scan_worker_is_redone_in_process(tmp_path, monkeypatch):
    from accel_agent.sysfs import scanner

    root = _big_tree(tmp_path)
    serial = scan(root)
    me = os.getpid()
    real_parents = scanner._Scan.parents

    def dying_in_workers(self, names):
        if os.getpid() != me:
            os._exit(3)  # a worker that dies before it sends anything
        return real_parents(self, names)

    monkeypatch.setattr(scanner._Scan, "parents", dying_in_workers)
    forks = _count_forks(monkeypatch)
    assert scan(root, workers=2) == serial
    assert len(forks) == 1


def test_a_worker_that_cannot_be_forked_is_scanned_in_process(tmp_path, monkeypatch):
    import errno

    root = _big_tree(tmp_path)
    serial = scan(root)
    fds_before = len(os.listdir("/proc/self/fd"))

    def no_fork():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    assert scan(root, workers=3) == serial
    assert len(os.listdir("/proc/self/fd")) == fds_before  # no pipe left open


def test_small_hosts_are_scanned_in_process(tmp_path, monkeypatch):
    from accel_agent.sysfs import scanner

    root, _ = tree(tmp_path, "nova")
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked for a small host"))
    assert scanner.scan(root, workers=4) == scan(root)


def test_without_proc_parents_are_resolved_by_path(tmp_path, monkeypatch):
    from accel_agent.sysfs import scanner

    root, _ = tree(tmp_path, "nova", "mtty")
    expected = scan(root)
    monkeypatch.setattr(scanner._Scan, "fd_path", staticmethod(lambda fd: None))
    assert scan(root) == expected


def test_a_type_directory_that_is_a_link_is_skipped(tmp_path):
    root, _ = tree(tmp_path, "mtty")
    types = os.path.join(root, "class/mdev_bus/mtty/mdev_supported_types")
    os.symlink("mtty-1", os.path.join(types, "mtty-9"))
    snap = scan(root)
    assert sorted(snap.parents["mtty"].types) == ["mtty-1", "mtty-2"]
    assert any("mtty-9 is not a directory" in w for w in snap.warnings)


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_rescan_rereads_a_parent_whose_types_changed_under_the_same_link(tmp_path, change):
    """A driver re-registering a parent with other types keeps its link: the
    steady-state rescan sees the type listing differ and reads it again."""
    from accel_agent.sysfs.rescan import Rescanner

    root, _ = tree(tmp_path, "mtty")
    types = os.path.join(root, "class/mdev_bus/mtty/mdev_supported_types")
    rescanner = Rescanner(root)
    rescanner.full()
    if change == "added":
        shutil.copytree(os.path.join(types, "mtty-2"), os.path.join(types, "mtty-3"))
    else:
        shutil.rmtree(os.path.join(types, "mtty-2"))
    snap = rescanner.rescan(lambda parent: {"mtty-1"})  # the daemon's: its configured type
    assert sorted(snap.parents["mtty"].types) == sorted(os.listdir(types))
    assert snap.parents == scan(root).parents
