"""The static materialiser: a real tree with real, kernel-like relative links."""

from __future__ import annotations

import os
import stat

import pytest

from accel_agent import exception
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.static import materialise
from accel_agent.simulator.testing import materialised

U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"


@pytest.fixture
def host() -> SimulatedHost:
    h = SimulatedHost(build_spec(["nvidia-pf", "nvidia-sriov", "i915-gvtg", "mtty", "nova"],
                                 gpus=1, vfs=4))
    h.create_mdev("mtty", "mtty-2", U1)
    return h


def _walk(root: str) -> dict[str, os.stat_result]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path)
    return out


def test_every_symlink_is_relative_and_lands_inside_the_root(host, tmp_path):
    root = materialise(host, tmp_path / "sys")
    links = [p for p, st in _walk(root).items() if stat.S_ISLNK(st.st_mode)]
    assert len(links) > 50
    for rel in links:
        path = os.path.join(root, rel)
        target = os.readlink(path)
        assert not target.startswith("/"), rel
        real = os.path.realpath(path)
        assert real.startswith(root + os.sep), (rel, real)
        assert os.path.exists(real), rel


def test_links_read_like_the_kernels(host, tmp_path):
    root = materialise(host, tmp_path / "sys")
    dev = os.path.join(root, "bus/mdev/devices", U1)
    assert os.readlink(dev) == f"../../../devices/virtual/mtty/mtty/{U1}"
    assert os.readlink(os.path.join(dev, "mdev_type")) == "../mdev_supported_types/mtty-2"
    group = next(m.iommu_group for m in host.mdevs() if m.uuid == U1)
    assert os.readlink(os.path.join(dev, "iommu_group")) == \
        f"../../../../../kernel/iommu_groups/{group}"
    assert os.readlink(os.path.join(root, "class/mdev_bus/mtty")) == \
        "../../devices/virtual/mtty/mtty"
    assert os.readlink(os.path.join(root, "class/mdev_bus/0000:84:00.0")) == \
        "../../devices/pci0000:80/0000:80:01.0/0000:84:00.0"
    pf = os.path.join(root, "devices/pci0000:80/0000:80:01.0/0000:84:00.0")
    assert os.readlink(os.path.join(pf, "driver")) == "../../../../bus/pci/drivers/nvidia"
    types = os.path.join(root, "class/mdev_bus/mtty/mdev_supported_types/mtty-2")
    assert os.readlink(os.path.join(types, "devices", U1)) == f"../../../{U1}"
    # what every consumer does: parent = basename(dirname(realpath(bus link)))
    assert os.path.basename(os.path.dirname(os.path.realpath(dev))) == "mtty"
    assert os.path.basename(os.path.realpath(os.path.join(dev, "mdev_type"))) == "mtty-2"


def test_contents_and_modes_match_the_model(host, tmp_path):
    root = materialise(host, tmp_path / "sys")
    tree = _walk(root)
    entries = {e.path: e for e in host.export_tree() if e.path}
    assert set(tree) == set(entries)
    for rel, entry in entries.items():
        st = tree[rel]
        if entry.kind == "file":
            assert stat.S_IMODE(st.st_mode) == entry.mode, rel
            if entry.data is not None:
                with open(os.path.join(root, rel), "rb") as f:
                    assert f.read() == entry.data, rel
            else:
                assert st.st_size == 0
        elif entry.kind == "dir":
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755, rel
    mtty1 = os.path.join(root, "class/mdev_bus/mtty/mdev_supported_types/mtty-1")
    assert stat.S_IMODE(os.stat(os.path.join(mtty1, "create")).st_mode) == 0o200
    with open(os.path.join(mtty1, "available_instances")) as f:
        assert f.read() == "22\n"  # the state at materialise time
    assert stat.S_IMODE(os.stat(os.path.join(root, "bus/mdev/devices", U1, "remove")).st_mode) \
        == 0o200


def test_spec_is_accepted_directly_and_refuses_a_non_empty_directory(tmp_path):
    root = materialise(profiles.nova(), tmp_path / "a")
    with open(os.path.join(root, "class/mdev_bus/0000:07:00.0/mdev_supported_types/"
                                 "nvidia-12/available_instances")) as f:
        assert f.read() == "10\n"
    with pytest.raises(exception.SimulatorError, match="not empty"):
        materialise(profiles.nova(), root)


def test_materialised_helper_cleans_up(tmp_path):
    with materialised(profiles.mtty(), tmp_path / "m") as root:
        assert os.listdir(os.path.join(root, "class/mdev_bus")) == ["mtty"]
    assert not os.path.exists(root)


def test_pci_side_is_exported_with_writable_files_as_plain_files(tmp_path):
    host = SimulatedHost(build_spec(["nvidia-vfio", "igb-sriov"], gpus=1, vfs=2))
    host.write("bus/pci/devices/0000:10:00.0/sriov_numvfs", "2")
    host.write("bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type", "1150")
    root = materialise(host, tmp_path / "sys")

    def read(rel: str) -> bytes:
        with open(os.path.join(root, rel), "rb") as f:
            return f.read()

    vf0 = os.path.join(root, "bus/pci/devices/0000:c1:00.4")
    assert os.path.realpath(vf0) == os.path.join(
        root, "devices/pci0000:c0/0000:c0:01.0/0000:c1:00.4")
    assert read("bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type") == b"1150\n"
    assert read("bus/pci/devices/0000:c1:00.5/nvidia/creatable_vgpu_types") == (
        b"ID    : vGPU Name\n1150  : NVIDIA L40S-4Q\n1160  : NVIDIA L40S-4A\n")
    # unreadable at export time (ENXIO on a free VF): an empty file, mode kept
    gi = "bus/pci/devices/0000:c1:00.5/nvidia/gpu_instance_id"
    assert read(gi) == b""
    assert stat.S_IMODE(os.stat(os.path.join(root, gi)).st_mode) == 0o644
    assert read("bus/pci/devices/0000:10:00.0/sriov_numvfs") == b"2\n"
    assert read("bus/pci/devices/0000:10:10.2/driver_override") == b"(null)\n"
    assert os.readlink(os.path.join(root, "bus/pci/devices/0000:10:00.0/virtfn1")) == \
        "../0000:10:10.2"
    assert os.path.basename(os.path.realpath(
        os.path.join(root, "bus/pci/devices/0000:10:10.2/driver"))) == "igbvf"
    assert os.listdir(os.path.join(root, "class/net/enp16s0f0/device/net")) == ["enp16s0f0"]
    bind = os.path.join(root, "bus/pci/drivers/vfio-pci/bind")
    assert stat.S_IMODE(os.stat(bind).st_mode) == 0o200
    assert os.listdir(os.path.join(root, "class/mdev_bus")) == []
