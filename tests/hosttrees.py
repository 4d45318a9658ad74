"""Hosts for ``accelctl explain`` as static trees: the real H200 capture
(tests/fixtures/real-hosts/h200-passthrough) and simulated hosts in the
states an operator meets (IOMMU off, VFs not enabled, a vGPU 17+ host, an
Intel GPU with and without GVT-g, an AMD GPU).

Each builder writes ``<directory>/sys`` and returns it (the ``sysfs_root``);
``<directory>/proc`` holds what a host's ``/proc`` showed, where there is one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.spec import HostSpec, PciDeviceSpec
from accel_agent.simulator.static import materialise

FIXTURES = Path(__file__).parent / "fixtures" / "real-hosts"
H200 = "0000:00:06.0"
INTEL_IGPU = "0000:00:02.0"
AMD_GPU = "0000:03:00.0"


def _place(top: Path, path: str) -> Path:
    """``/sys/x`` -> ``<top>/sys/x``, ``/proc/y`` -> ``<top>/proc/y``; the
    parent directory resolved (a captured path may go through a link)."""
    relative = Path(path.lstrip("/"))
    parent = top / relative.parent
    parent.mkdir(parents=True, exist_ok=True)
    real = Path(os.path.realpath(parent))
    assert real == top.resolve() or top.resolve() in real.parents, path
    return real / relative.name


def capture_tree(capture: Path, directory: Path) -> str:
    """The capture's ``sysfs.json`` (and ``proc-modules``) as a tree under
    ``directory``; returns its ``sys``."""
    entries = json.loads((capture / "sysfs.json").read_text())
    top = directory
    (top / "sys").mkdir(parents=True, exist_ok=True)
    # Links first (the PCI list's bus links lead to device directories), then
    # directories and files through them, shortest path first.
    order = sorted(entries, key=lambda p: ("link" not in entries[p], p.count("/"), p))
    for path in order:
        entry = entries[path]
        if entry.get("absent") or "err" in entry:
            continue
        target = _place(top, path)
        if "link" in entry:
            if not target.is_symlink():
                target.symlink_to(entry["link"])
            if "class" in entry:  # a PCI list entry: its device directory
                device = Path(os.path.realpath(target))
                if not device.exists():
                    device.mkdir(parents=True)
                    (device / "class").write_text(entry["class"] + "\n")
                    (device / "vendor").write_text(entry["vendor"] + "\n")
                    if entry.get("driver"):
                        (device / "driver").symlink_to(
                            os.path.relpath(top / "sys/bus/pci/drivers" / entry["driver"], device))
        elif "dir" in entry:
            target.mkdir(parents=True, exist_ok=True)
        elif "value" in entry:
            target.write_text(entry["value"])
            target.chmod(int(entry["mode"], 8) | 0o400)
        elif entry.get("skipped"):
            target.touch()
            target.chmod(int(entry.get("mode", "0o200"), 8))
    modules = capture / "proc-modules"
    if modules.exists():
        (top / "proc").mkdir(exist_ok=True)
        (top / "proc" / "modules").write_text(modules.read_text())
    return str(top / "sys")


def h200_tree(directory: Path) -> str:
    return capture_tree(FIXTURES / "h200-passthrough", directory)


def simulated_tree(host: SimulatedHost | HostSpec, directory: Path) -> str:
    return materialise(host, directory / "sys")


def iommu_off(root: str) -> str:
    """The same tree as a host booted without an IOMMU: no group anywhere."""
    groups = Path(root) / "kernel" / "iommu_groups"
    for path in Path(root).rglob("iommu_group"):
        if path.is_symlink():
            path.unlink()
    for group in groups.iterdir():
        for link in (group / "devices").iterdir():
            link.unlink()
        (group / "devices").rmdir()
        group.rmdir()
    return root


def vgpu17(gpus: int = 1, vfs: int = 4, vfs_enabled: bool = True) -> SimulatedHost:
    """NVIDIA L40S GPUs on vGPU 17+ (the simulator's nvidia-vfio profile),
    their VFs enabled as NVIDIA's nvidia-sriov.service does at boot, or not."""
    host = SimulatedHost(profiles.build_spec(["nvidia-vfio"], gpus=gpus, vfs=vfs))
    if not vfs_enabled:
        host.reboot(vfs_disabled=True)
    return host


def intel_gvtg() -> HostSpec:
    """An Intel iGPU (8086:3e92) on i915 with GVT-g: an mdev parent."""
    return profiles.i915_gvtg()


def intel_without_gvtg() -> HostSpec:
    """The same iGPU on i915 with GVT-g off: no mdev types."""
    return HostSpec(devices=[PciDeviceSpec(address=INTEL_IGPU, driver="i915",
                                           vendor_id=profiles.INTEL, device_id=0x3E92,
                                           class_code=0x030000)])


def amd_gpu() -> HostSpec:
    """An AMD Instinct MI210 (1002:740f, class 0x038000) on amdgpu: no mdev
    types, no SR-IOV visible (amdgpu shares nothing on the host)."""
    return HostSpec(devices=[PciDeviceSpec(address=AMD_GPU, driver="amdgpu", vendor_id=0x1002,
                                           device_id=0x740F, class_code=0x038000, numa_node=0)])
