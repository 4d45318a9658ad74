"""``accelctl simulate`` commands that need no FUSE, and its argparse wiring."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from accel_agent.simulator import cli, control
from accel_agent.simulator.spec import HostSpec


def run(argv: list[str]) -> int:
    """Like accelctl: a top-level parser with subparsers(dest='command')."""
    parser = argparse.ArgumentParser(prog="accelctl")
    subparsers = parser.add_subparsers(dest="command")
    cli.register(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


def test_spec_prints_a_loadable_spec(capsys):
    assert run(["simulate", "spec", "--profile", "mtty", "--profile", "nvidia-sriov",
                "--vfs", "2"]) == 0
    spec = HostSpec.from_json(capsys.readouterr().out)
    assert spec.profiles == ("mtty", "nvidia-sriov")
    assert sorted(p.name for p in spec.parents) == ["0000:41:00.4", "0000:41:00.5", "mtty"]


def test_default_profile_and_spec_file(tmp_path, capsys):
    assert run(["simulate", "spec"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"] == ["nvidia-pf"]
    path = tmp_path / "host.json"
    assert run(["simulate", "spec", "--profile", "mtty"]) == 0
    path.write_text(capsys.readouterr().out)
    assert run(["simulate", "spec", "--spec", str(path), "--profile", "nova"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"] == ["mtty", "nova"]


def test_materialise(tmp_path, capsys):
    target = tmp_path / "tree"
    assert run(["simulate", "materialise", str(target), "--profile", "synthetic",
                "--parents", "3", "--types", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert len(os.listdir(target / "class" / "mdev_bus")) == 3


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "spec", "--profile", "nvidia-pf", "--vfs", "2"], "vfs not used"),
    (["simulate", "materialise", "/proc/self/nonexistent-dir", "--profile", "mtty"],
     "cannot use"),
    (["simulate", "spec", "--spec", "/nonexistent.json"], "cannot read /nonexistent.json"),
    (["simulate", "reboot", "/nonexistent-mountpoint"], "no simulator is serving"),
])
def test_errors_exit_1_with_a_message(argv, needle, capsys):
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["simulate", "mount"],                          # no directory
    ["simulate", "spec", "--profile", "nope"],      # unknown profile
    ["simulate", "spec", "--gpus", "0"],            # not >= 1
])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 2


def test_missing_action_is_usage(capsys):
    assert run(["simulate"]) == 2
    assert "action is required" in capsys.readouterr().err


def test_profiles_lists_every_profile(capsys):
    assert cli.main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("nvidia-pf", "nvidia-sriov", "nvidia-vfio", "igb-sriov", "i915-gvtg", "mtty",
                 "synthetic"):
        assert name in out


def test_mount_without_fuse_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(control, "fuse_unavailable_reason", lambda: "/dev/fuse does not exist")
    assert run(["simulate", "mount", str(tmp_path / "sys"), "--profile", "mtty"]) == 1
    assert "FUSE is not available: /dev/fuse does not exist" in capsys.readouterr().err
    assert not (tmp_path / "sys").exists()


def test_spec_with_the_pci_profiles(capsys):
    assert run(["simulate", "spec", "--profile", "nvidia-pf", "--profile", "nvidia-vfio",
                "--profile", "igb-sriov", "--gpus", "2", "--vfs", "16", "--nics", "2"]) == 0
    spec = HostSpec.from_json(capsys.readouterr().out)
    assert [(p.address, p.num_vfs) for p in spec.sriov_pfs] == [
        ("0000:c1:00.0", 16), ("0000:c2:00.0", 16), ("0000:10:00.0", 0), ("0000:10:00.1", 0)]
    assert run(["simulate", "spec", "--profile", "nvidia-vfio", "--vfs", "33"]) == 1
    assert "vfs must be an integer in 1..32" in capsys.readouterr().err
    assert run(["simulate", "spec", "--profile", "mtty", "--nics", "2"]) == 1
    assert "nics not used" in capsys.readouterr().err


def test_status_prints_the_pci_side(capsys, monkeypatch):
    from accel_agent.simulator.model import SimulatedHost
    from accel_agent.simulator.profiles import build_spec

    host = SimulatedHost(build_spec(["nvidia-vfio", "igb-sriov"], gpus=1, vfs=2))
    host.write("bus/pci/devices/0000:c1:00.5/nvidia/current_vgpu_type", "1150")
    host.write("bus/pci/devices/0000:10:00.0/sriov_numvfs", "2")
    host.write("bus/pci/devices/0000:10:10.2/driver_override", "vfio-pci")
    host.write("bus/pci/drivers/igbvf/unbind", "0000:10:10.2")
    host.write("bus/pci/drivers_probe", "0000:10:10.2")
    host.hold("0000:10:10.2")
    status = json.loads(json.dumps(host.status()))
    status.update(pid=1, mountpoint="/x", mounted=True, profiles=["nvidia-vfio", "igb-sriov"])

    class Fake:
        def status(self, counters: bool = True) -> dict:
            return status

    monkeypatch.setattr(cli, "_client", lambda args: Fake())
    assert run(["simulate", "status", "/x"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  pf 0000:10:00.0 igb  vfs 2/7  netdev enp16s0f0" in out
    assert "  pf 0000:c1:00.0 nvidia  vfs 2/32  vgpus 1" in out
    group = status["vgpus"][0]["iommu_group"]
    assert f"  vgpu 0000:c1:00.5 1150 NVIDIA L40S-4Q group {group}" in out
    vf_group = next(v["iommu_group"] for v in status["vfs"] if v["address"] == "0000:10:10.2")
    assert f"  pci 0000:10:10.2 vfio-pci group {vf_group}  override vfio-pci  held" in out
    assert not any("0000:10:10.0" in line for line in out)  # on its own driver: quiet


@pytest.fixture
def served_host(monkeypatch):
    """An in-process host behind the real control socket server (no FUSE):
    what `simulate reboot|enable-vfs|driver-reload|status DIR` talk to."""
    import shutil
    import tempfile
    import threading

    from accel_agent.simulator.model import SimulatedHost
    from accel_agent.simulator.profiles import build_spec

    host = SimulatedHost(build_spec(["nvidia-vfio", "mtty"], gpus=2, vfs=2))
    rundir = tempfile.mkdtemp(prefix="accel-sim-cli-", dir="/tmp")
    path = os.path.join(rundir, "s.sock")
    server = control._Server(path, host, "/x", threading.Event(), lambda: None)
    # A short poll interval: shutdown() waits for the loop to notice.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    monkeypatch.setattr(cli, "_client", lambda args: control.SimulatorClient(path, "/x"))
    try:
        yield host
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(rundir, ignore_errors=True)


def test_reboot_vfs_disabled_then_enable_vfs_through_the_control_socket(served_host, capsys):
    host = served_host
    host.write("bus/pci/devices/0000:c1:00.5/nvidia/current_vgpu_type", "1150")
    assert run(["simulate", "reboot", "/x", "--vfs-disabled"]) == 0
    assert host.read("bus/pci/devices/0000:c1:00.0/sriov_numvfs") == b"0\n"
    assert run(["simulate", "status", "/x"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  pf 0000:c1:00.0 nvidia  vfs 0/32  VFs disabled (simulate enable-vfs)" in out
    assert run(["simulate", "status", "/x", "--json"]) == 0
    pfs = json.loads(capsys.readouterr().out)["sriov_pfs"]
    assert [(p["address"], p["vfs_enabled"], p["vgpu"]) for p in pfs] == [
        ("0000:c1:00.0", False, True), ("0000:c2:00.0", False, True)]
    assert run(["simulate", "enable-vfs", "/x", "0000:c2:00.0"]) == 0
    assert capsys.readouterr().out == "Enabled VFs on 0000:c2:00.0\n"
    assert run(["simulate", "enable-vfs", "/x", "ALL"]) == 0
    assert capsys.readouterr().out == ("Enabled VFs on 0000:c1:00.0\n"
                                       "GPU at 0000:c2:00.0 already has VFs enabled.\n")
    assert host.read("bus/pci/devices/0000:c1:00.0/sriov_numvfs") == b"32\n"
    assert host.read("bus/pci/devices/0000:c1:00.5/nvidia/current_vgpu_type") == b"0\n"
    assert run(["simulate", "status", "/x"]) == 0
    assert "  pf 0000:c1:00.0 nvidia  vfs 32/32" in capsys.readouterr().out.splitlines()
    assert run(["simulate", "reboot", "/x"]) == 0  # a plain reboot: the boot VFs
    assert host.read("bus/pci/devices/0000:c1:00.0/sriov_numvfs") == b"2\n"


def test_driver_reload_through_the_control_socket(served_host, capsys):
    host = served_host
    host.hold("0000:c1:00.4")
    assert run(["simulate", "driver-reload", "/x"]) == 1
    err = capsys.readouterr().err
    assert "rmmod nvidia: module in use" in err and err.count("\n") == 1
    assert host.read("bus/pci/devices/0000:c1:00.0/sriov_numvfs") == b"2\n"
    host.release("0000:c1:00.4")
    assert run(["simulate", "driver-reload", "/x", "--driver", "nvidia"]) == 0
    assert capsys.readouterr().out == (
        "reloaded nvidia: 2 device(s) bound again (0000:c1:00.0, 0000:c2:00.0)\n")
    assert host.read("bus/pci/devices/0000:c1:00.0/sriov_numvfs") == b"0\n"


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "enable-vfs", "/x", "0000:84:00.0"], "is not an NVIDIA vGPU 17+ GPU"),
    (["simulate", "enable-vfs", "/x", "gpu0"], "neither a PCI address nor ALL"),
    (["simulate", "driver-reload", "/x", "--driver", "nouveau"], "no PCI device is bound"),
])
def test_new_actions_fail_with_one_line_and_change_nothing(served_host, argv, needle, capsys):
    generation = served_host.generation
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert served_host.generation == generation


@pytest.mark.parametrize("request_", [
    {"op": "reboot", "vfs_disabled": "yes"},
    {"op": "enable-vfs"},
    {"op": "enable-vfs", "pf": 7},
    {"op": "driver-reload", "driver": ""},
])
def test_bad_control_requests_are_refused(served_host, request_):
    client = cli._client(None)
    generation = served_host.generation
    with pytest.raises(Exception, match="bad request"):
        client.call(**request_)
    assert served_host.generation == generation


@pytest.mark.parametrize("argv", [
    ["simulate", "enable-vfs", "/x"],                 # no PF|ALL
    ["simulate", "reboot", "/x", "--vfs-disabled=1"],  # a flag takes no value
])
def test_new_actions_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 2


def test_gpu_reset_and_nvml_through_the_control_socket(served_host, capsys):
    """The agent's NVML client and `simulate gpu-reset` against the control
    socket the tree names: NVML's errors come back as their own class."""
    from accel_agent import exception
    from accel_agent.nvml.simulated import SimulatedNvmlClient

    host, pf = served_host, "0000:c1:00.0"
    gpus = SimulatedNvmlClient(cli._client(None).socket_path)
    assert gpus.set_heterogeneous_mode(pf, True) is True
    assert run(["simulate", "status", "/x"]) == 0
    assert "  gpu 0000:c1:00.0 mixed-size on" in capsys.readouterr().out.splitlines()
    host.write("bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type", "1150")
    with pytest.raises(exception.NvmlInUse, match="1 vGPU"):
        gpus.set_heterogeneous_mode(pf, False)
    with pytest.raises(exception.NvmlNotSupported, match="no MIG"):
        gpus.set_mig_mode(pf, True)
    assert run(["simulate", "gpu-reset", "/x", pf]) == 1  # a vGPU uses it
    assert "is in use" in capsys.readouterr().err
    assert gpus.heterogeneous_mode(pf) is True
    host.write("bus/pci/devices/0000:c1:00.4/nvidia/current_vgpu_type", "0")
    assert run(["simulate", "gpu-reset", "/x", pf]) == 0
    assert capsys.readouterr().out == f"reset GPU {pf}\n"
    assert gpus.heterogeneous_mode(pf) is False
    assert run(["simulate", "gpu-reset", "/x", "0000:99:00.0"]) == 1
    assert "no NVIDIA vGPU GPU at this address" in capsys.readouterr().err


@pytest.mark.parametrize("request_", [
    {"op": "nvml", "call": "format_the_disk", "args": {}},
    {"op": "nvml", "call": "heterogeneous_mode", "args": ["0000:c1:00.0"]},
    {"op": "nvml", "call": "set_heterogeneous_mode", "args": {"gpu": "0000:c1:00.0"}},
    {"op": "nvml", "call": "create_gpu_instance",
     "args": {"gpu": "0000:c1:00.0", "profile_id": 9, "placement": [0, 4]}},
    {"op": "gpu-reset"},
])
def test_bad_nvml_requests_are_refused_and_change_nothing(served_host, request_):
    client = cli._client(None)
    generation = served_host.generation
    with pytest.raises(Exception, match="bad request"):
        client.call(**request_)
    assert served_host.generation == generation
