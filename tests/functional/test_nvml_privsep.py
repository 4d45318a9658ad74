"""The NVML writer's REAL privsep daemon (``accel_agent.privileged.nvml``):
it holds CAP_SYS_ADMIN and nothing else, refuses bad input in the daemon
before NVML is loaded, and NVML's own answer crosses the channel as the
agent's exception (on this host, without an NVIDIA driver: NvmlNotAvailable
with the reason)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from accel_agent.privileged import lifecycle
from tests.functional.privsep_fixture import REPO_ROOT, skip_unless_root

pytestmark = pytest.mark.privsep

CAP_SYS_ADMIN = 21
GPU = "0000:c1:00.0"


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    skip_unless_root()
    config = tmp_path_factory.mktemp("nvmlpriv") / "accel-agent.conf"
    config.write_text("[DEFAULT]\n")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old) if p)
    try:
        lifecycle.start_context(privileged.nvml_admin, privileged.NVML_CFG_SECTION,
                                [str(config)], [])
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    guard = privileged.guard_of(privileged.nvml_admin)
    try:
        health = guard.health()
        assert health.state == "ok" and health.pid, health
        yield health.pid
    finally:
        guard.stop()


def test_the_nvml_helper_holds_cap_sys_admin_and_nothing_else(helper: int) -> None:
    status = _status(helper)
    assert int(status["CapEff"], 16) == 1 << CAP_SYS_ADMIN, status["CapEff"]
    assert int(status["CapPrm"], 16) == 1 << CAP_SYS_ADMIN, status["CapPrm"]
    assert status["Uid"].split()[0] == "0"


@pytest.mark.parametrize("call", [
    lambda: privileged.nvml_set_mig_mode("0000:C1:00.0", True),
    lambda: privileged.nvml_set_heterogeneous_mode(GPU, "on"),
    lambda: privileged.nvml_create_gpu_instance(GPU, 19, 0, 0),
    lambda: privileged.nvml_destroy_gpu_instance(GPU, -1),
])
def test_bad_input_is_refused_in_the_helper(helper: int, call) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        call()


def test_nvmls_answer_crosses_the_channel_as_its_class(helper: int) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this host has an NVIDIA driver: the tier tests/nvml reads it instead")
    with pytest.raises(exception.NvmlNotAvailable, match=r"nvmlInit|pynvml") as info:
        privileged.nvml_set_heterogeneous_mode(GPU, True)
    assert info.value.kwargs["gpu"] == GPU
