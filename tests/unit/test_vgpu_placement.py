"""A vGPU's placement on the vendor-VFIO route (issue 36): the privileged
write of ``vgpu-placement-id=<id>`` with its read-back, and the scan's
``placement_id`` of a typed VF, on the simulator's model (in process) and
static trees of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from accel_agent.backends import builtin
from accel_agent.backends.host import scan_host
from accel_agent.privileged import validate
from accel_agent.simulator import build_spec
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.static import materialise

PF = "0000:c1:00.0"
VF0, VF1 = "0000:c1:00.4", "0000:c1:00.5"
Q24, Q4 = 1155, 1150  # L40S-24Q (size 24, ids 0 24), L40S-4Q (size 4)


def mixed_host() -> SimulatedHost:
    host = SimulatedHost(build_spec(["nvidia-vfio"], gpus=1, vfs=4))
    assert SimulatedNvml(host).set_heterogeneous_mode(PF, True)
    return host


def vf_file(root: str, vf: str, name: str) -> Path:
    return Path(os.path.realpath(f"{root}/bus/pci/devices/{vf}")) / "nvidia" / name


def test_the_scan_reads_each_typed_vf_s_placement(tmp_path: Path) -> None:
    host = mixed_host()
    host.write(f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type", str(Q4))
    host.write(f"bus/pci/devices/{VF0}/nvidia/vgpu_params", "vgpu-placement-id=28")
    host.write(f"bus/pci/devices/{VF1}/nvidia/current_vgpu_type", str(Q24))
    snapshot = scan_host(materialise(host, tmp_path / "sys"), builtin())
    placed = {m.parent: (m.mdev_type, m.placement_id) for m in snapshot.mdevs.values()}
    # VF0's 4Q was moved to 28; VF1's 24Q went where the driver put it (the
    # lowest free id, 0); the untyped VFs have no device and no placement.
    assert placed == {VF0: ("nvidia-1150", 28), VF1: ("nvidia-1155", 0)}


def test_placing_writes_the_line_and_trusts_only_the_read_back(tmp_path: Path) -> None:
    host = mixed_host()
    host.write(f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type", str(Q24))
    root = materialise(host, tmp_path / "sys")
    params, placed = vf_file(root, VF0, "vgpu_params"), vf_file(root, VF0, "placement_id")
    # A static tree's placement_id never follows the write: the read-back differs.
    with pytest.raises(exception.VgpuPlacementMismatch, match=f"{VF0}.*24.*it reads 0"):
        privileged.write_vgpu_placement(root, VF0, 24)
    assert params.read_bytes() == b"vgpu-placement-id=24"  # no newline, the guide's line
    placed.write_text("24\n")  # as the driver would show it
    privileged.write_vgpu_placement(root, VF0, 24)


def test_placing_an_untyped_vf_or_a_bad_id_writes_nothing(tmp_path: Path) -> None:
    root = materialise(mixed_host(), tmp_path / "sys")
    params = vf_file(root, VF1, "vgpu_params")
    before = params.read_bytes()
    with pytest.raises(exception.VgpuPlacementWriteFailed, match="holds no vGPU"):
        privileged.write_vgpu_placement(root, VF1, 0)
    for bad in (-1, True, "6", 1 << 20, None):
        with pytest.raises(exception.PrivilegedInputRejected, match="placement id"):
            privileged.write_vgpu_placement(root, VF1, bad)  # type: ignore[arg-type]
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_vgpu_placement(root, "../../etc", 0)
    assert params.read_bytes() == before


def test_a_vgpu_params_outside_the_root_is_refused(tmp_path: Path) -> None:
    host = mixed_host()
    host.write(f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type", str(Q24))
    root = materialise(host, tmp_path / "sys")
    real = vf_file(root, VF0, "vgpu_params")
    outside = tmp_path / "elsewhere"
    outside.write_text("")
    real.unlink()
    real.symlink_to(outside)
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_vgpu_placement(root, VF0, 24)
    assert outside.read_text() == ""
    assert validate.validate_placement_id(0) == 0
