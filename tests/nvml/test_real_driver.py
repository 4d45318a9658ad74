"""The real-driver tier: every read of the agent's NVML interface against
this host's NVIDIA driver, read-only, recorded in one JSON file.

Skipped, with the reason, where NVML cannot be loaded (no NVIDIA driver, no
libnvidia-ml.so.1, no nvidia-ml-py): never run in CI.  tests/nvml/README.md
says how to run it on a machine with an NVIDIA GPU.  It never sets a mode,
never makes or destroys a GPU instance and never resets a GPU: checks.ReadOnly
refuses every write before NVML is asked.
"""

from __future__ import annotations

import pytest

from accel_agent.nvml.real import RealNvml
from tests.nvml import checks


@pytest.fixture(scope="module")
def nvml():
    real = RealNvml()
    status = real.status()
    if not status.available:
        real.close()
        pytest.skip(f"no NVML on this host: {status.reason} "
                    f"(driver version from /proc: {status.driver_version or 'none'})")
    yield real
    real.close()


@pytest.fixture(scope="module")
def record(nvml, tmp_path_factory):
    reader = checks.ReadOnly(nvml)
    found = checks.read_host(reader)
    found["calls"] = sorted(set(reader.calls))
    path = checks.write_record(found, checks.record_path(str(tmp_path_factory.mktemp("nvml"))))
    print(f"\nNVML record written to {path}")
    return found


def test_every_read_of_the_interface_was_made(record):
    reads, _ = checks.interface_methods()
    assert reads == set(checks.READS)
    made = set(record["calls"])
    if not record["gpus"]:
        pytest.skip("NVML sees no GPU: only status and gpus were read")
    assert made == reads, f"not read: {sorted(reads - made)}"


def test_the_answers_are_consistent(record):
    assert record["status"]["source"] == "nvml"
    assert record["status"]["driver_version"]
    assert checks.problems(record) == []


def test_every_gpu_answered_its_virtualization_mode(record):
    """The one read every NVIDIA GPU answers, with or without vGPU or MIG."""
    for gpu, data in record["gpus"].items():
        assert "value" in data["virtualization_mode"], (gpu, data["virtualization_mode"])
