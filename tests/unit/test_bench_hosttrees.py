"""benchmarks/hosttrees.py makes trees our scanner reads as the kernel's:
what the generator wrote (parents, types, counters, mdevs, VFs) is what a
cold scan sees, so the benchmark's host shapes measure real work."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_agent import backends
from accel_agent.backends.host import scan_host
from accel_agent.devices.ledger import Ledger
from benchmarks import hostlisting, hosttrees

TINY = hosttrees.Shape(
    "tiny", gpus=2, types=2, depth=2, long_descriptions=True, numa_nodes=2,
    mdevs_per_gpu=2, owned_per_gpu=1,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(hosttrees, "CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def scan(root: str, tmp_path):
    return scan_host(root, backends.builtin(), state_dir=str(tmp_path / "state"))


@pytest.mark.parametrize("bus", ["all", "no-mdev", "none"])
def test_scanner_sees_the_gpus_types_counters_and_mdevs(cache, tmp_path, bus):
    root = hosttrees.tree(dataclasses.replace(TINY, bus=bus))
    snapshot = scan(root, tmp_path)
    wanted = {str(m["uuid"]): m for m in hosttrees.manifest(root)["mdevs"]}
    assert sorted(snapshot.parents) == ["0000:02:00.0", "0000:04:00.0"]  # under 2 bridges
    assert {p.numa_node for p in snapshot.parents.values()} == {0, 1}
    for parent in snapshot.parents.values():
        # No bus/ at all: no driver link either (it would point into bus/).
        assert parent.driver == (None if bus == "none" else "nvidia")
        assert sorted(parent.types) == ["nvidia-256", "nvidia-257"]
        first, second = parent.types["nvidia-256"], parent.types["nvidia-257"]
        # 24 of the 1 GB type minus the 2 mdevs; homogeneous: nothing else fits.
        assert (first.available_instances, second.available_instances) == (22, 0)
        assert first.description == (
            "num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=7680x4320, "
            "max_instance=24"
        )
    assert sorted(snapshot.mdevs) == sorted(wanted)
    for uuid, mdev in snapshot.mdevs.items():
        assert (mdev.parent, mdev.mdev_type) == (wanted[uuid]["parent"], "nvidia-256")
        assert mdev.iommu_group is not None
    assert not snapshot.warnings


def test_bus_mdev_lists_every_mdev_as_the_kernel_does(cache):
    root = hosttrees.tree(TINY)
    listed = sorted(os.listdir(os.path.join(root, "bus", "mdev", "devices")))
    assert listed == sorted(str(m["uuid"]) for m in hosttrees.manifest(root)["mdevs"])
    for uuid in listed:
        target = os.path.realpath(os.path.join(root, "bus", "mdev", "devices", uuid))
        assert os.path.basename(os.readlink(os.path.join(target, "mdev_type"))) == "nvidia-256"
    link = os.readlink(os.path.join(root, "class", "mdev_bus", "0000:02:00.0"))
    assert link.startswith("../../devices/pci0000:00/")


def test_vendor_vfio_pfs_beside_mdev_parents(cache, tmp_path):
    shape = hosttrees.Shape("vf", gpus=2, types=3, depth=1, vfio_pfs=1, vfs_per_pf=2)
    snapshot = scan(hosttrees.tree(shape), tmp_path)
    vfs = {n: p for n, p in snapshot.parents.items() if p.backend == "nvidia_vfio"}
    mdev = {n for n, p in snapshot.parents.items() if p.backend == "mdev"}
    assert sorted(vfs) == ["0000:01:00.4", "0000:01:00.5"]
    assert mdev == {"0000:02:00.0"}
    for vf in vfs.values():
        assert vf.physfn == "0000:01:00.0"
        assert sorted(vf.types) == ["nvidia-1150", "nvidia-1151", "nvidia-1152"]
        assert vf.types["nvidia-1152"].name == "NVIDIA L40S-3Q"


def test_a_tree_is_reused_and_rebuilt_when_its_shape_changes(cache):
    first = hosttrees.tree(TINY)
    marker = os.path.join(first, "kept")
    open(marker, "w").close()
    assert hosttrees.tree(TINY) == first and os.path.exists(marker)
    changed = hosttrees.tree(dataclasses.replace(TINY, numa_nodes=1))
    assert changed != first
    assert not os.path.exists(first) and not os.path.exists(first + ".json")  # stale: dropped


def test_owned_mdevs_are_recorded_in_the_ledger(cache, tmp_path):
    root = hosttrees.tree(TINY)
    state = str(tmp_path / "state")
    assert hostlisting.seed_state(state, hosttrees.manifest(root)["mdevs"]) == 2
    owned = {str(m["uuid"]) for m in hosttrees.manifest(root)["mdevs"] if m["owned"]}
    with Ledger(state, read_only=True) as ledger:
        assert {r.uuid for r in ledger.all()} == owned
        assert all(r.adopted for r in ledger.all())


@pytest.mark.parametrize(
    "bad",
    [{"bus": "some"}, {"depth": 4}, {"owned_per_gpu": 3}, {"enabled": 0},
     {"vfio_pfs": 1, "depth": 0}, {"vfio_pfs": 1, "vfs_per_pf": 253}],
)
def test_bad_shapes_are_refused(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(TINY, **bad)


def test_unknown_tree_names_are_refused():
    with pytest.raises(ValueError, match="unknown tree"):
        list(hosttrees.variants("flat,nope"))
    assert [s.name for s in hosttrees.variants("flat, vfio")] == ["flat", "vfio"]


def test_the_config_shares_the_gpus_out_among_the_enabled_types(cache, tmp_path):
    """What accelctl makes of the config the benchmark writes: each GPU
    configured for the type the generator gave it (its mdevs' type), the VFs
    for the vendor-VFIO type."""
    shape = hosttrees.Shape("cfg", gpus=4, types=3, depth=1, enabled=2, mdevs_per_gpu=1,
                            vfio_pfs=1, vfs_per_pf=2)
    root = hosttrees.tree(shape)
    written = hosttrees.manifest(root)
    conf = hostlisting.offline_config(str(tmp_path / "agent.conf"), root,
                                      str(tmp_path / "state"), shape.devices_config(written))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--offline", "--config-file", conf,
         "types", "--json"],
        capture_output=True, text=True, check=True, env=env,
    )
    parents = json.loads(out.stdout)["parents"]
    configured = {p["name"]: p["configured_type"] for p in parents}
    # Homogeneous counters follow the GPU's own type: 12 of 2 GB less its mdev.
    counters = {t["type_id"]: t["available_instances"]
                for p in parents if p["name"] == "0000:03:00.0" for t in p["types"]}
    assert counters == {"nvidia-256": 0, "nvidia-257": 11, "nvidia-258": 0}
    mdev_of = {str(m["parent"]): m["mdev_type"] for m in written["mdevs"]}
    assert configured == {
        "0000:02:00.0": "nvidia-256", "0000:03:00.0": "nvidia-257", "0000:04:00.0": "nvidia-256",
        "0000:01:00.4": "nvidia-1150", "0000:01:00.5": "nvidia-1150",
    }
    assert all(configured[gpu] == mdev_type for gpu, mdev_type in mdev_of.items())
    assert "will not be used" not in out.stderr


def test_a_build_cut_short_is_built_again(cache):
    first = hosttrees.tree(TINY)
    os.unlink(first + ".json")  # killed between the tree and its manifest
    assert hosttrees.tree(TINY) == first
    assert os.path.isfile(first + ".json")
