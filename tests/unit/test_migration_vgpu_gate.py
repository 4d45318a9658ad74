"""The NVIDIA vGPU manager gate of a live migration's destination claim
(migration/versions.py, destination.py, source.py): an instance with vGPUs
of the nvidia_vfio backend is claimed only when both hosts' vGPU manager
versions are known and equal; an instance without them never asks.

In process: a manager over a materialised simulated host (nvidia-vfio GPUs
and mtty), the simulator's NVML in process, the real NVML implementation
with its /proc fallback pointed at a file."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from accel_agent import exception
from accel_agent.api import errors
from accel_agent.config import registry
from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices import manager as manager_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from accel_agent.migration import versions
from accel_agent.migration.destination import MigrationDestination, vgpu_types
from accel_agent.migration.source import MigrationSource
from accel_agent.nvml import real
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.simulator.nvml import DRIVER_VERSION, SimulatedNvml
from tests.configutil import make_conf

GPU1 = "0000:c1:00.0"
VGPU = "nvidia-1150"
SRC = [f"5a5a5a5a-0000-4000-8000-00000000000{i}" for i in range(1, 4)]
BASE = {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1"}
RECENT = versions.HostVersions.from_dict(BASE)
CONF = (
    f"[devices]\nenabled_mdev_types = {VGPU}, mtty-2\n[mdev_{VGPU}]\n"
    f"device_addresses = {GPU1}\n[mdev_mtty-2]\ndevice_addresses = mtty\n"
)


def source(nvidia: str | None = None) -> dict[str, str]:
    return BASE | ({} if nvidia is None else {"nvidia_vgpu_manager": nvidia})


@pytest.fixture
def root(tmp_path) -> str:
    path = str(tmp_path / "sys")
    materialise(SimulatedHost(build_spec(["nvidia-vfio", "mtty"], gpus=2, vfs=4)), path)
    return path


@pytest.fixture
def manager(root, tmp_path):
    conf = make_conf(CONF, sysfs_root=root)
    devices = manager_mod.DeviceManager(
        sysfs_root=root,
        policy=policy_mod.build_policy(conf),
        host="testhost",
        ledger=ledger_mod.Ledger(str(tmp_path / "state")),
        writer=writers.DirectWriter(root),
    )
    yield devices
    devices.ledger.close()


def destination(manager, here: Callable[[], str | None] | None) -> MigrationDestination:
    return MigrationDestination(manager, lambda: RECENT, vgpu_manager_version=here)


def typed_vfs(root: str) -> dict[str, str]:
    """VF -> its current_vgpu_type, for every VF typed in the tree."""
    found = {}
    devices = os.path.join(root, "bus", "pci", "devices")
    for name in sorted(os.listdir(devices)):
        path = os.path.join(devices, name, "nvidia", "current_vgpu_type")
        if os.path.isfile(path):
            with open(path) as handle:
                value = handle.read().strip()
            if value not in ("", "0"):
                found[name] = value
    return found


# ------------------------------------------------------------------ the versions


def test_the_source_versions_carry_the_vgpu_manager_add_only():
    assert versions.HostVersions.from_dict(BASE).nvidia_vgpu_manager is None
    assert versions.HostVersions.from_dict(BASE).to_dict() == {
        "libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0"}  # as before: no new key
    sent = versions.HostVersions.from_dict(source("535.104.05"))
    assert sent.nvidia_vgpu_manager == "535.104.05"  # text: "05" is not "5"
    assert sent.to_dict()["nvidia_vgpu_manager"] == "535.104.05"
    assert versions.HostVersions.from_dict(sent.to_dict()) == sent
    for bad in ("", "550", "abc", "550.54.16; reboot", "5.5.5.5.5", 550, None):
        with pytest.raises(exception.InvalidMigrationRequest, match="nvidia_vgpu_manager"):
            versions.HostVersions.from_dict(BASE | {"nvidia_vgpu_manager": bad})
    with pytest.raises(exception.InvalidMigrationRequest, match="exactly libvirt"):
        versions.HostVersions.from_dict(BASE | {"nvidia": "550.54.16"})


def test_the_gate_refuses_different_or_unknown_versions_naming_both():
    versions.check_vgpu_manager("550.54.16", "550.54.16", VGPU)
    with pytest.raises(exception.MigrationVgpuManagerMismatch) as info:
        versions.check_vgpu_manager("550.54.16", "550.90.07", VGPU)
    message = str(info.value)
    assert "source host 550.54.16" in message and "destination host 550.90.07" in message
    assert VGPU in message
    for sent, here, sides in ((None, "550.54.16", "source"), ("550.54.16", None, "destination"),
                              (None, None, "source and destination")):
        with pytest.raises(exception.MigrationVgpuManagerUnknown) as info:
            versions.check_vgpu_manager(sent, here, VGPU)
        assert f"of the {sides} host is unknown" in str(info.value)
        assert "cannot be shown equal" in str(info.value)
    assert errors.status_for(exception.MigrationVgpuManagerMismatch(
        source="1.1", destination="1.2", types=VGPU)) == 409
    assert errors.status_for(exception.MigrationVgpuManagerUnknown(
        sides="source", source="unknown", destination="1.2", types=VGPU)) == 409


def test_this_hosts_version_from_nvml_or_proc(tmp_path, monkeypatch, root):
    simulated = SimulatedNvml(SimulatedHost(build_spec(["nvidia-h200"])))
    assert versions.vgpu_manager_version(simulated) == DRIVER_VERSION
    # NVML cannot load: the /proc/driver/nvidia/version line (its path injected).
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 "
                    "01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    gpus = real.RealNvml(proc_version=str(proc))
    try:
        assert versions.vgpu_manager_version(gpus) == "535.104.05"
    finally:
        gpus.close()
    gpus = real.RealNvml(proc_version=str(tmp_path / "absent"))
    try:
        assert versions.vgpu_manager_version(gpus) is None
    finally:
        gpus.close()
    # A tree that is neither /sys nor a live simulator has no NVML: unknown.
    assert versions.host_vgpu_manager_version(root) is None


# ------------------------------------------------------------------ the claim


def test_a_vgpu_claim_between_different_versions_is_refused_and_changes_nothing(manager, root):
    assert VGPU in vgpu_types(manager.scan()) and "mtty-2" not in vgpu_types(manager.scan())
    before = typed_vfs(root)
    dest = destination(manager, lambda: "550.90.07")
    # An instance with a vGPU and an mdev: neither is claimed.
    with pytest.raises(exception.MigrationVgpuManagerMismatch) as info:
        dest.claim("vm-1", {SRC[0]: VGPU, SRC[1]: "mtty-2"}, source("550.54.16"))
    assert "550.54.16" in str(info.value) and "550.90.07" in str(info.value)
    assert manager.ledger.all() == [] and typed_vfs(root) == before


@pytest.mark.parametrize(
    ("sent", "here", "sides"),
    [
        (None, "550.54.16", "source"),  # the caller sent no versions at all
        (source(), "550.54.16", "source"),  # a source without NVIDIA
        (source("550.54.16"), None, "destination"),  # this host cannot read its own
    ],
)
def test_a_vgpu_claim_with_an_unknown_version_is_refused(manager, root, sent, here, sides):
    before = typed_vfs(root)
    with pytest.raises(exception.MigrationVgpuManagerUnknown) as info:
        destination(manager, lambda: here).claim("vm-1", {SRC[0]: VGPU}, sent)
    assert f"of the {sides} host is unknown" in str(info.value)
    assert manager.ledger.all() == [] and typed_vfs(root) == before


def test_the_destination_reads_its_own_version_by_default(manager, root):
    # The materialised tree has no NVML: its version is unknown, so refused.
    with pytest.raises(exception.MigrationVgpuManagerUnknown, match="destination host is"):
        destination(manager, None).claim("vm-1", {SRC[0]: VGPU}, source("550.54.16"))
    # As the daemon and accelctl build it, with or without [nvml] registered.
    conf = make_conf(CONF, sysfs_root=root)
    assert MigrationDestination.from_conf(conf, manager).vgpu_manager_version() is None
    registry.register(conf)
    assert MigrationDestination.from_conf(conf, manager).vgpu_manager_version() is None


def test_a_vgpu_claim_between_equal_versions_is_made(manager, root):
    mapping = destination(manager, lambda: "550.54.16").claim(
        "vm-1", {SRC[0]: VGPU, SRC[1]: "mtty-2"}, source("550.54.16"))
    assert set(mapping) == {SRC[0], SRC[1]}
    assert list(typed_vfs(root).values()) == ["1150"]


def test_an_instance_without_vgpus_never_asks(manager):
    asked = []
    dest = destination(manager, lambda: asked.append(1) or None)
    # No versions sent, none known here: mdevs alone migrate as before.
    mapping = dest.claim("vm-2", {SRC[2]: "mtty-2"})
    assert list(mapping) == [SRC[2]] and asked == []


# ------------------------------------------------------------------ the source


class _Domain:
    def connect(self) -> object:
        return object()


def test_the_source_sends_its_vgpu_manager_version_where_it_has_one(manager):
    def sent(found):
        return MigrationSource(manager, host_versions=lambda _conn: RECENT,
                               vgpu_manager_version=lambda: found).versions(_Domain())

    assert sent("550.54.16") == {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0",
                                 "nvidia_vgpu_manager": "550.54.16"}
    assert sent(None) == {"libvirt": "9.0.0", "qemu": "8.2.0", "kernel": "6.1.0"}
    # By default, the manager's host: a tree without NVML has no version.
    default = MigrationSource(manager, host_versions=lambda _conn: RECENT)
    assert "nvidia_vgpu_manager" not in default.versions(_Domain())
