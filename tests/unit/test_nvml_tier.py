"""The real-driver tier's code (tests/nvml/checks.py) run against the
simulator's NVML, so that CI exercises it although no GPU is here: every
read is made, nothing is written, the record is written and its checks
find what a driver could answer wrong."""

from __future__ import annotations

import json

import pytest

from accel_agent import exception
from accel_agent.nvml import Placement, VgpuPlacements
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from tests.nvml import checks

L4, H200 = "0000:21:00.0", "0000:61:00.0"


@pytest.fixture
def nvml() -> SimulatedNvml:
    """A host in the states the tier must read: mixed-size mode with vGPUs of
    three sizes, MIG with GPU instances and a MIG-backed vGPU."""
    host = SimulatedHost(profiles.build_spec(["nvidia-l4", "nvidia-h200"], vfs=4))
    nvml = SimulatedNvml(host)
    nvml.set_heterogeneous_mode(L4, True)
    for index, type_id in enumerate((1188, 1186, 1184)):  # L4-12Q, -6Q, -3Q
        host.write(f"bus/pci/devices/0000:21:00.{4 + index}/nvidia/current_vgpu_type",
                   str(type_id))
    nvml.set_mig_mode(H200, True)
    nvml.create_gpu_instance(H200, 19, Placement(0, 1))
    nvml.create_gpu_instance(H200, 9, Placement(4, 4))
    host.write("bus/pci/devices/0000:61:00.4/nvidia/current_vgpu_type", "1414")
    return nvml


def test_the_tier_reads_every_read_of_the_interface(nvml):
    reads, writes = checks.interface_methods()
    assert reads == set(checks.READS)
    assert writes == checks.WRITES
    reader = checks.ReadOnly(nvml)
    record = checks.read_host(reader)
    assert set(reader.calls) == reads
    assert sorted(record["gpus"]) == [L4, H200]
    assert checks.problems(record) == []
    l4, h200 = record["gpus"][L4], record["gpus"][H200]
    assert {v["placement_id"] for v in l4["vgpu_instances"]["value"]} == {0, 12, 18}
    assert l4["vgpu_placements"]["1186"]["value"]["supported"] == [0, 6, 12, 18]
    assert l4["mig_mode"] == {"error": "NvmlNotSupported", "message": (
        "NVML get MIG mode on 0000:21:00.0 failed: NVML_ERROR_NOT_SUPPORTED (the GPU has no "
        "MIG)")}
    assert [g["profile_id"] for g in h200["gpu_instances"]["value"]] == [19, 9]
    assert h200["vgpu_placements"]["1414"]["error"] == "NvmlNotSupported"


def test_the_tier_never_writes(nvml):
    reader = checks.ReadOnly(nvml)
    for write in sorted(checks.WRITES):
        with pytest.raises(AssertionError, match="read-only"):
            getattr(reader, write)
    assert reader.calls == []
    before = nvml.gpu_instances(H200)
    checks.read_host(reader)
    assert nvml.gpu_instances(H200) == before
    assert nvml.heterogeneous_mode(L4) is True


def test_the_record_is_one_json_file(nvml, tmp_path, monkeypatch):
    monkeypatch.setenv(checks.RECORD_ENV, str(tmp_path / "out" / "record.json"))
    path = checks.write_record(checks.read_host(checks.ReadOnly(nvml)),
                               checks.record_path(str(tmp_path)))
    assert path == str(tmp_path / "out" / "record.json")
    assert json.loads((tmp_path / "out" / "record.json").read_text())["status"][
        "source"] == "simulator"
    monkeypatch.delenv(checks.RECORD_ENV)
    monkeypatch.setenv("OUT", str(tmp_path / "o"))
    assert checks.record_path("/x") == str(tmp_path / "o" / "nvml-record.json")


class _Wrong(SimulatedNvml):
    """A driver that answers creatable placements it does not support."""

    def vgpu_placements(self, gpu: str, type_id: int) -> VgpuPlacements:
        right = super().vgpu_placements(gpu, type_id)
        return VgpuPlacements(right.type_id, right.placement_size, right.supported,
                              (*right.creatable, 99))


def test_the_checks_find_a_wrong_answer():
    nvml = _Wrong(SimulatedHost(profiles.build_spec(["nvidia-l4"], vfs=2)))
    found = checks.problems(checks.read_host(checks.ReadOnly(nvml)))
    assert found and all("not within supported" in p for p in found)
    assert any(p.startswith("0000:21:00.0 type 1186: creatable [0, 6, 12, 18, 99]")
               for p in found)


def test_without_nvml_the_record_says_why():
    from accel_agent.nvml import Unavailable

    record = checks.read_host(checks.ReadOnly(Unavailable("/srv/tree", "no NVIDIA here")))
    assert record == {"status": {"available": False, "source": None,
                                 "reason": "no NVIDIA here", "driver_version": None},
                      "gpus": {}}
    with pytest.raises(exception.NvmlNotAvailable, match="no NVIDIA here"):
        Unavailable("/srv/tree", "no NVIDIA here").gpus()
