"""The NVML interface's real implementation over a stand-in of NVIDIA's
binding (no GPU is here: a module named ``pynvml`` with the calls it makes),
which implementation serves which sysfs root, and the NVML writer's
checks of its inputs (accel_agent/nvml/, accel_agent/privileged/nvml.py)."""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from types import SimpleNamespace

import pytest

from accel_agent import exception, nvml
from accel_agent.nvml import real
from accel_agent.nvml.simulated import SimulatedNvmlClient
from accel_agent.privileged import nvml as writer

GPU = "0000:c1:00.0"


class _Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def fake_pynvml(**calls) -> types.ModuleType:
    """What accel_agent uses of pynvml, answering like a vGPU host with one GPU."""
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    mod.NVMLError = NVMLError
    for name, code in (("NotSupported", 3), ("InvalidArgument", 2),
                       ("ArgumentVersionMismatch", 25)):
        setattr(mod, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {
            "__init__": lambda self, c=code: NVMLError.__init__(self, c)}))
    mod.shutdowns = 0

    def shutdown() -> None:
        mod.shutdowns += 1

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = shutdown
    mod.nvmlSystemGetDriverVersion = lambda: "550.54.16"
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda index: "handle"
    mod.nvmlDeviceGetPciInfo = lambda handle: SimpleNamespace(busId=b"00000000:C1:00.0")
    mod.nvmlDeviceGetHandleByPciBusId = lambda bus: "handle" if bus == GPU.encode() else \
        (_ for _ in ()).throw(NVMLError(6))
    mod.nvmlDeviceGetVirtualizationMode = lambda handle: 3
    mod.nvmlDeviceGetMigMode = lambda handle: [0, 1]
    mod.nvmlDeviceSetMigMode = lambda handle, mode: 19
    mod.nvmlDeviceGetVgpuHeterogeneousMode = lambda handle: 1
    mod.nvmlDeviceSetVgpuHeterogeneousMode = lambda handle, mode: 0
    mod.c_nvmlGpuInstancePlacement_t = _Placement
    for name, call in calls.items():
        setattr(mod, name, call)
    return mod


@pytest.fixture
def pynvml(monkeypatch):
    mod = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


# ------------------------------------------------------------------ reads, in the agent


def test_reads_answer_as_the_agent_names_things(pynvml):
    gpus = real.RealNvml()
    try:
        assert gpus.status() == nvml.NvmlStatus(True, "nvml", None, "550.54.16")
        assert gpus.gpus() == (GPU,)  # NVML's 00000000:C1:00.0, as the kernel spells it
        assert gpus.virtualization_mode(GPU) == "host_vgpu"
        assert gpus.mig_mode(GPU) == nvml.MigMode(current=False, pending=True)
        assert gpus.heterogeneous_mode(GPU) is True
    finally:
        gpus.close()


def test_nvmls_errors_keep_their_meaning(pynvml):
    def refused(handle):
        raise pynvml.NVMLError(19)

    pynvml.nvmlDeviceGetVgpuHeterogeneousMode = refused
    gpus = real.RealNvml()
    with pytest.raises(exception.NvmlInUse, match="NVML_ERROR_IN_USE"):
        gpus.heterogeneous_mode(GPU)
    with pytest.raises(exception.NvmlNotFound):
        gpus.mig_mode("0000:c2:00.0")
    with pytest.raises(exception.NvmlInvalidArgument, match="canonical PCI address"):
        gpus.mig_mode("0000:C1:00.0")
    gpus.close()


def test_a_read_that_hangs_misses_its_deadline_and_blocks_no_one(pynvml):
    release = threading.Event()
    entered = threading.Event()

    def wedged(handle):
        entered.set()
        release.wait(60)
        return [1, 1]

    pynvml.nvmlDeviceGetMigMode = wedged
    gpus = real.RealNvml(call_timeout=0.2)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            gpus.mig_mode(GPU)
        except exception.NvmlError as exc:
            outcome.append(exc)

    first = threading.Thread(target=ask)
    first.start()
    try:
        first.join(30)  # only to fail instead of hanging
        assert not first.is_alive(), "an NVML read did not return at its deadline"
        assert entered.is_set() and isinstance(outcome[0], exception.NvmlCallTimeout)
        # While the driver still holds the first call, the next fails at once.
        with pytest.raises(exception.NvmlCallTimeout, match=r"within 0\.2 s"):
            gpus.virtualization_mode(GPU)
    finally:
        release.set()
    pynvml.nvmlDeviceGetMigMode = lambda handle: [1, 1]
    for _ in range(100):  # the stuck call returns in the worker
        try:
            assert gpus.mig_mode(GPU) == nvml.MigMode(True, True)
            break
        except exception.NvmlCallTimeout:
            threading.Event().wait(0.05)
    else:
        pytest.fail("NVML never answered again after the stuck call returned")
    gpus.close()


def test_without_the_binding_or_the_driver_nvml_is_not_available(monkeypatch, tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
                       "Release Build  (nixbld@)\nGCC version:  gcc version 15.3.0 (GCC)\n")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    gpus = real.RealNvml(proc_version=str(version))
    status = gpus.status()
    assert (status.available, status.source, status.driver_version) == (False, None,
                                                                         "580.159.04")
    assert "nvidia-ml-py" in status.reason
    with pytest.raises(exception.NvmlNotAvailable, match="not installed"):
        gpus.gpus()
    gpus.close()
    broken = fake_pynvml()

    def no_library() -> None:
        raise broken.NVMLError(12)

    broken.nvmlInit = no_library
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    status = real.RealNvml(proc_version=str(tmp_path / "absent")).status()
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in status.reason and status.driver_version is None


def test_writes_go_to_the_privileged_helper_checked_first(pynvml, monkeypatch):
    from accel_agent import privileged

    asked = []
    monkeypatch.setattr(privileged, "nvml_set_heterogeneous_mode",
                        lambda gpu, enabled: asked.append((gpu, enabled)) or enabled)
    monkeypatch.setattr(privileged, "nvml_create_gpu_instance", lambda *a: asked.append(a) or {
        "gpu_instance_id": 2, "profile_id": a[1], "placement": {"start": a[2], "size": a[3]}})
    gpus = real.RealNvml()
    assert gpus.set_heterogeneous_mode(GPU, True) is True
    assert gpus.create_gpu_instance(GPU, 9, nvml.Placement(4, 4)) == nvml.GpuInstance(
        2, 9, nvml.Placement(4, 4))
    for bad in (lambda: gpus.set_heterogeneous_mode(GPU, "yes"),
                lambda: gpus.set_heterogeneous_mode("c1:00.0", True),
                lambda: gpus.create_gpu_instance(GPU, 256, nvml.Placement(0, 1))):
        with pytest.raises(exception.NvmlInvalidArgument, match="refused before asking NVML"):
            bad()
    assert asked == [(GPU, True), (GPU, 9, 4, 4)]
    gpus.close()


# ------------------------------------------------------------------ which NVML for which tree


def test_the_tree_says_which_nvml_serves_it(tmp_path):
    assert isinstance(nvml.for_sysfs_root("/sys"), real.RealNvml)
    plain = nvml.for_sysfs_root(str(tmp_path))
    assert isinstance(plain, nvml.Unavailable)
    assert "neither the host's /sys nor a simulated host" in plain.status().reason
    marker = tmp_path.joinpath(*nvml.SIMULATOR_MARKER)
    marker.parent.mkdir()
    marker.write_text("relative/socket\n")
    assert isinstance(nvml.for_sysfs_root(str(tmp_path)), nvml.Unavailable)
    marker.write_text("/run/accel-agent-simulator/x.sock\n")
    client = nvml.for_sysfs_root(str(tmp_path))
    assert isinstance(client, SimulatedNvmlClient)
    assert client.socket_path == "/run/accel-agent-simulator/x.sock"
    # No simulator answers there: NVML is not available, and says where it looked.
    status = client.status()
    assert not status.available and "x.sock does not answer" in status.reason


# ------------------------------------------------------------------ the NVML writer


@pytest.fixture
def no_nvml(monkeypatch):
    """Any use of NVML fails the test: a refusal must come first."""
    def loaded(*args):
        raise AssertionError("NVML was loaded for a refused request")

    monkeypatch.setattr(writer, "_pynvml", loaded)


@pytest.mark.parametrize(("call", "args", "message"), [
    (writer.set_heterogeneous_mode_local, ("0000:C1:00.0", True), "canonical PCI address"),
    (writer.set_heterogeneous_mode_local, ("../../0000:c1:00.0", True), "canonical PCI"),
    (writer.set_heterogeneous_mode_local, (GPU, 1), "must be true or false"),
    (writer.set_mig_mode_local, (GPU, "true"), "must be true or false"),
    (writer.set_mig_mode_local, (None, True), "canonical PCI address"),
    (writer.create_gpu_instance_local, (GPU, -1, 0, 1), "profile id -1"),
    (writer.create_gpu_instance_local, (GPU, 256, 0, 1), "profile id 256"),
    (writer.create_gpu_instance_local, (GPU, 19, True, 1), "start True"),
    (writer.create_gpu_instance_local, (GPU, 19, 0, 0), "size 0"),
    (writer.create_gpu_instance_local, (GPU, 19, 300, 1), "start 300"),
    (writer.destroy_gpu_instance_local, (GPU, "3"), "GPU instance id '3'"),
    (writer.destroy_gpu_instance_local, (GPU, 5000), "GPU instance id 5000"),
])
def test_the_nvml_writer_refuses_bad_input_before_nvml(no_nvml, call, args, message):
    with pytest.raises(exception.PrivilegedInputRejected, match=message):
        call(*args)


def test_the_nvml_writer_reads_back_and_keeps_nvmls_meaning(pynvml):
    assert writer.set_mig_mode_local(GPU, True) == {
        "mode": {"current": False, "pending": True}, "activation": "IN_USE"}
    assert writer.set_heterogeneous_mode_local(GPU, True) is True

    def taken(handle, profile, placement):
        raise pynvml.NVMLError(23)

    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement = taken
    shutdowns = pynvml.shutdowns
    with pytest.raises(exception.NvmlInsufficientResources,
                       match=r"create GPU instance on 0000:c1:00\.0"):
        writer.create_gpu_instance_local(GPU, 19, 0, 1)
    assert pynvml.shutdowns == shutdowns + 1  # NVML closed after a failed call too
