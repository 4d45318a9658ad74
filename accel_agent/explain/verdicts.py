"""The verdict on one device: what stands between it and devices for VMs,
each problem with its next step, the most basic first.

How a vGPU manager is told (NVIDIA), from what the host shows, never by
running ``nvidia-smi``:

* **present**: the ``nvidia`` driver registered mdev types on the GPU or its
  VFs (``class/mdev_bus``: vGPU 16 and earlier; docs/design.md §4.1), or
  the GPU's VFs have the vGPU files ``nvidia/creatable_vgpu_types`` (vGPU 17
  and later; docs/design.md §10.3), or the module ``nvidia_vgpu_vfio`` is
  loaded: NVIDIA's vGPU for Linux KVM host package builds it
  (``kernel/nvidia-vgpu-vfio/``) and vGPU hosts list it in ``lsmod`` (NVIDIA's
  "Verifying the installation of the NVIDIA vGPU software" steps; OpenNebula's
  and Cloudpods' vGPU guides show the same ``lsmod | grep vfio`` output),
  while NVIDIA's datacenter driver, open or proprietary, ships only the
  interface to it (``nv-vgpu-vfio-interface.c`` in open-gpu-kernel-modules);
* **absent**: none of these while the loaded modules are visible
  (``<proc>/modules``, else ``<sysfs>/module``).  The real H200 of
  tests/fixtures/real-hosts/h200-passthrough showed exactly this: modules
  ``nvidia`` and ``nvidia_uvm`` only, ``/proc/driver/nvidia/version`` "NVIDIA
  UNIX Open Kernel Module for x86_64 580.159.04", no mdev bus, no SR-IOV
  files; ``nvidia-smi vgpu`` answered "No supported devices in vGPU mode"
  and ``nvidia-smi -q`` "Virtualization Mode: Pass-Through" (a vGPU host's
  says "Host VGPU");
* **unknown**: none of the signs, and the modules not visible (a tree
  without ``/proc`` or ``module/``): the verdict says "not visible" rather
  than "not loaded".

A device whose vGPUs or VFs go to VMs as PCI functions needs an IOMMU group
(VFIO hands out groups); an mdev does not, the mdev core gives each its own
group (docs/design.md §4.6), so a device that offers
mdev types is not refused for its own missing group.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accel_agent.explain.facts import FunctionFacts, HostFacts
from accel_agent.sysfs.model import Parent

NVIDIA, INTEL, AMD = "10de", "8086", "1002"
DISPLAY, ACCELERATOR = 0x03, 0x12
# NVIDIA's device ids from 0x2000 on are Ampere (GA100 0x20b0) and later
# (Hopper 0x233x, Ada 0x26xx-0x28xx, Blackwell 0x29xx-): their vGPUs live on
# SR-IOV VFs (docs/design.md §4.2 for Ampere's mdev VFs, §10.3 for vGPU 17+).
NVIDIA_SRIOV_FROM = 0x2000
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"

IOMMU_ON = (
    "turn the IOMMU on: VT-d (Intel) or AMD-Vi (AMD) in the firmware, intel_iommu=on on "
    "Intel (AMD's is on unless amd_iommu=off) and iommu=pt on the kernel command line, then "
    "reboot; in a virtual machine the hypervisor must expose a vIOMMU (QEMU: -device "
    "intel-iommu,intremap=on; libvirt: <iommu model='intel'/>)"
)
INSTALL_MANAGER = (
    "install NVIDIA's vGPU manager (host driver) for this GPU, where NVIDIA's vGPU software "
    "lists its model: the Linux KVM package of NVIDIA vGPU software or NVIDIA AI Enterprise "
    "(NVIDIA-Linux-x86_64-<version>-vgpu-kvm.run or its distribution package) in place of the "
    "datacenter driver, then reboot; nvidia-smi -q then says Virtualization Mode: Host VGPU"
)


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    summary: str
    next_step: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "summary": self.summary, "next_step": self.next_step}

    @property
    def line(self) -> str:
        """The verdict as one line (check-config's warnings)."""
        return f"{self.summary}; {self.next_step}"


@dataclass(frozen=True, slots=True)
class Subject:
    """One device as the verdict sees it."""

    name: str
    facts: FunctionFacts | None  # None: a virtual mdev parent (mtty)
    # The scan's parents on it: itself, or its VFs (physical_gpu is its name).
    parents: tuple[Parent, ...]
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: Problem
    problems: tuple[Problem, ...]
    nvidia: dict[str, Any] | None


def driver_label(version_line: str | None) -> str:
    """``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...``
    -> ``580.159.04, open kernel module``; "" when not visible."""
    if not version_line:
        return ""
    found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", version_line)
    version = found.group(1) if found else version_line
    return f"{version}, open kernel module" if "Open Kernel Module" in version_line else version


def _offered(subject: Subject) -> dict[str, int]:
    """Type -> how many of its parents can make one now."""
    offered: dict[str, int] = {}
    for parent in subject.parents:
        for type_id, mdev_type in parent.types.items():
            offered[type_id] = offered.get(type_id, 0) + (mdev_type.available_instances > 0)
    return offered


def _listed(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def vgpu_manager(subject: Subject, host: HostFacts) -> tuple[str, str]:
    """("loaded" | "absent" | "unknown", how that was told): module docstring."""
    facts = subject.facts
    if any(p.driver == "nvidia" and p.backend == "mdev" for p in subject.parents):
        return "loaded", "the nvidia driver registered mdev types on it"
    with_files = [v for v in (facts.vfs if facts else ()) if v.vgpu_files]
    if with_files or any(p.backend != "mdev" for p in subject.parents):
        return "loaded", f"{len(with_files)} of its VFs have vGPU files (nvidia/)"
    loaded = host.vgpu_vfio_loaded
    if loaded:
        return "loaded", "the nvidia_vgpu_vfio module is loaded"
    if loaded is False:
        return "absent", ("no mdev types, no VF with vGPU files, and no nvidia_vgpu_vfio among "
                          "the loaded modules")
    return "unknown", "no mdev types and no VF with vGPU files; the loaded modules are not visible"


def _iommu_problem(subject: Subject, host: HostFacts) -> Problem | None:
    facts = subject.facts
    if facts is None:
        return None
    ungrouped = facts.iommu_group is None or any(v.iommu_group is None for v in facts.vfs)
    if not ungrouped:
        return None
    if not host.iommu_groups:
        summary = ("IOMMU is off: the kernel made no IOMMU groups (kernel/iommu_groups is "
                   "empty), so VFIO can give neither this device nor its VFs to a VM")
    else:
        summary = (f"no IOMMU group: the kernel put this device (or a VF of it) in none, though "
                   f"the host has {host.iommu_groups}, so VFIO cannot give it to a VM")
    return Problem("iommu-off", summary, IOMMU_ON)


def _guest_note(host: HostFacts) -> str:
    if not host.guest_hint:
        return ""
    return (f"; this host looks like a virtual machine ({host.guest_hint}) with the GPU passed "
            "through: the vGPU manager runs on the hypervisor that owns the GPU, not in a guest")


def _driver_problem(subject: Subject, vendor: str | None) -> Problem | None:
    facts = subject.facts
    assert facts is not None
    driver = facts.driver
    if driver is None:
        step = {
            NVIDIA: "install NVIDIA's vGPU manager (host driver) and reboot",
            INTEL: "load i915 (or xe on newer GPUs)",
            AMD: "load amdgpu, or AMD's GIM host driver on an MxGPU card",
        }.get(vendor or "", "load its driver (lspci -k names the candidates)")
        return Problem("no-driver", "no driver is bound: nothing on the host uses it", step)
    if driver == "vfio-pci":
        return Problem(
            "passthrough",
            "bound to vfio-pci: the whole device is kept for passing through to one VM; "
            "nothing is shared from it",
            "to share it, give it back to its own driver (drop it from vfio-pci's ids and any "
            "driver_override)" + (" with NVIDIA's vGPU manager installed" if vendor == NVIDIA
                                  else ""),
        )
    if vendor == NVIDIA and driver != "nvidia":
        return Problem(
            "wrong-driver",
            f"bound to {driver}, not nvidia: NVIDIA's vGPU manager works through its own "
            "nvidia driver",
            f"blacklist {driver}, install NVIDIA's vGPU manager (host driver), then reboot",
        )
    return None


def _vfs_not_enabled(subject: Subject, vendor: str | None, state: str) -> Problem:
    facts = subject.facts
    assert facts is not None and facts.sriov_total
    name, total = subject.name, facts.sriov_total
    if vendor == NVIDIA:
        return Problem(
            "vfs-not-enabled",
            f"VFs not enabled: the GPU has SR-IOV ({total} VFs) but none is enabled, and its "
            "vGPUs (vGPU 17 and later) live on VFs",
            f"run {SRIOV_MANAGE} -e {name} (NVIDIA's vGPU manager ships it; its "
            "nvidia-sriov.service runs it at boot)"
            + ("; no vGPU manager is visible: install it first if it is not" if state == "unknown"
               else ""),
        )
    step = f"echo N > /sys/bus/pci/devices/{name}/sriov_numvfs (N from 1 to {total})"
    pool = subject.config.get("vf_pool")
    if pool:
        step += (f"; VF pool {pool['name']} enables {pool['num_vfs']} itself when the agent "
                 "starts" if pool.get("num_vfs") else
                 f"; or give VF pool {pool['name']} a num_vfs for the agent to do it")
    if vendor == AMD:
        step += "; on an MxGPU card AMD's GIM host driver enables them when it loads"
    return Problem("vfs-not-enabled",
                   f"VFs not enabled: SR-IOV capable ({total} VFs), sriov_numvfs is 0", step)


def _ready(subject: Subject, offered: dict[str, int]) -> Problem:
    configured = subject.config.get("mdev_type")
    layout = subject.config.get("gpu_layout")
    if offered and layout:
        # What a VF offers shrinks as the layout's vGPUs take placements (a
        # VF holding one offers nothing): NVML's supported types, which
        # check-config's fit check reads, say what the GPU can hold.
        wanted = [v["mdev_type"] for v in layout["vgpus"]]
        return Problem("ready", f"ready: its VFs are laid out by its mixed-size layout "
                       f"[gpu_layout_{layout['name']}] ({_listed(wanted)})",
                       "nothing: the agent serves it; accelctl check-config says whether the "
                       "layout fits")
    if offered:
        if configured in offered:
            return Problem("ready", f"ready: offers {configured} ({offered[configured]} "
                           "can be made now)", "nothing: the agent serves it")
        names = sorted(offered)
        return Problem(
            "ready",
            f"ready: offers {_listed(names)}; the configuration gives it "
            + (f"the default type {configured}, which it does not offer" if configured
               else "no type"),
            "to use it, name it in the device_addresses of one of these types and enable that "
            "type (accelctl types lists them)",
        )
    facts = subject.facts
    assert facts is not None
    drivers = sorted({v.driver or "no driver" for v in facts.vfs})
    pool = subject.config.get("vf_pool")
    return Problem(
        "ready",
        f"ready: {facts.sriov_num} VFs enabled ({', '.join(drivers) or 'none listed'})",
        f"nothing: VF pool {pool['name']} hands them out" if pool else
        "to hand them out, name this PF in the device_addresses of a VF pool "
        "(enabled_vf_pools)",
    )


def _nvidia_problems(subject: Subject, host: HostFacts, state: str, evidence: str,
                     offered: dict[str, int]) -> list[Problem]:
    facts = subject.facts
    assert facts is not None
    found: list[Problem] = []
    if not offered:
        label = driver_label(host.nvidia_version)
        if state == "absent":
            found.append(Problem(
                "no-vgpu-manager",
                "no vGPU manager is loaded: the GPU is on NVIDIA's datacenter driver"
                + (f" ({label})" if label else "")
                + f", which makes no vGPUs ({evidence})",
                INSTALL_MANAGER + _guest_note(host),
            ))
        elif facts.sriov_total and not facts.sriov_num:
            found.append(_vfs_not_enabled(subject, NVIDIA, state))
        elif state == "unknown":
            found.append(Problem(
                "no-vgpu-manager",
                "no vGPU manager is visible: the nvidia driver"
                + (f" ({label})" if label else "") + f" makes no vGPUs here ({evidence})",
                INSTALL_MANAGER + _guest_note(host),
            ))
        else:
            found.append(Problem(
                "no-vgpu-types",
                f"the vGPU manager is loaded ({evidence}) but gives this GPU no vGPU types",
                "check that NVIDIA's vGPU software supports this GPU model, and the vGPU "
                "manager's log (journalctl -u nvidia-vgpu-mgr; dmesg | grep NVRM)",
            ))
        device = int(facts.device_id, 16) if facts.device_id else 0
        if facts.sriov_total is None and device >= NVIDIA_SRIOV_FROM:
            found.append(Problem(
                "no-sriov-capability",
                "no SR-IOV capability visible (no sriov_totalvfs): the vGPUs of NVIDIA's "
                f"Ampere and later GPUs (device id {NVIDIA_SRIOV_FROM:x} and up, as this "
                f"{facts.device_id}) live on SR-IOV VFs",
                "on bare metal, enable SR-IOV in the firmware (BIOS) and check that NVIDIA's "
                "vGPU software supports this model; a GPU passed through whole to a virtual "
                "machine shows none (the hypervisor does not expose the capability)",
            ))
    return found


def _other_problems(subject: Subject, vendor: str | None, offered: dict[str, int]) -> list[Problem]:
    facts = subject.facts
    assert facts is not None
    if offered or (facts.sriov_total and facts.sriov_num):
        return []
    if facts.sriov_total:
        return [_vfs_not_enabled(subject, vendor, "loaded")]
    if vendor == INTEL and facts.driver == "i915" and facts.base_class == DISPLAY:
        return [Problem(
            "gvt-g-off",
            "offers no GVT-g types: i915 registers them only with GVT-g on",
            "boot with i915.enable_gvt=1 and load kvmgt (GVT-g covers Intel's integrated GPUs "
            "from Broadwell to Comet Lake); newer Intel GPUs share through SR-IOV VFs instead",
        )]
    step = "it can only be passed through whole (bind it to vfio-pci; Nova's PCI passthrough)"
    if vendor == AMD:
        step += ("; AMD's GPU sharing (MxGPU) needs an SR-IOV card (Instinct, Radeon Pro "
                 "V-series) and AMD's GIM host driver")
    return [Problem(
        "no-sharing",
        f"offers no mdev types and no SR-IOV VFs: {facts.driver} shares nothing of it",
        step,
    )]


def _nvidia_state(facts: FunctionFacts, host: HostFacts, state: str,
                  evidence: str) -> dict[str, Any]:
    """The ``nvidia`` object of an NVIDIA GPU: driver, vGPU manager, its VFs."""
    with_files = [v for v in facts.vfs if v.vgpu_files]
    creatable = {f"nvidia-{i}": n for v in with_files for i, n in v.creatable}
    return {
        "driver_version": host.nvidia_version,
        "vgpu_manager": state,
        "evidence": evidence,
        "vfs_with_vgpu_files": len(with_files),
        "typed_vfs": {v.address: f"nvidia-{v.current_vgpu_type}"
                      for v in with_files if v.current_vgpu_type},
        "creatable_types": [{"type_id": t, "name": n} for t, n in sorted(creatable.items())],
    }


def judge(subject: Subject, host: HostFacts) -> Verdict:
    """Every problem of ``subject`` in the order to fix them, and the verdict."""
    facts = subject.facts
    offered = _offered(subject)
    if facts is None:  # a virtual parent
        verdict = _ready(subject, offered) if offered else Problem(
            "offers-nothing", "offers no mdev types", "check its driver's log (dmesg)")
        return Verdict(verdict, () if offered else (verdict,), None)
    vendor = facts.vendor_id
    nvidia_gpu = vendor == NVIDIA and facts.base_class == DISPLAY and facts.physfn is None
    problems: list[Problem] = []
    nvidia = None
    if facts.physfn is not None and not offered:
        vf = facts.vf
        if vf is not None and vf.vgpu_files:
            typed = f"typed nvidia-{vf.current_vgpu_type}" if vf.current_vgpu_type else "free"
            verdict = Problem("ready", f"ready: a vGPU VF of {facts.physfn} ({typed})",
                              "nothing: the agent serves it")
        else:
            verdict = Problem("vf", f"a VF of {facts.physfn}, bound to {facts.driver or 'nothing'}",
                              f"accelctl explain {facts.physfn} explains its PF")
        iommu = _iommu_problem(subject, host)
        problems = [iommu] if iommu else []
        return Verdict(problems[0] if problems else verdict, tuple(problems), None)
    driver_problem = _driver_problem(subject, vendor) if not offered else None
    if driver_problem is not None:
        problems.append(driver_problem)
    if nvidia_gpu:
        state, evidence = vgpu_manager(subject, host)
        nvidia = _nvidia_state(facts, host, state, evidence)
        if driver_problem is None:
            problems += _nvidia_problems(subject, host, state, evidence, offered)
    elif driver_problem is None:
        problems += _other_problems(subject, vendor, offered)
    # An mdev has a group of its own; a PCI function handed out needs its own.
    if not any(p.backend == "mdev" for p in subject.parents):
        iommu = _iommu_problem(subject, host)
        if iommu is not None:
            problems.append(iommu)
    configured = subject.config.get("mdev_type")
    if (offered and configured and configured not in offered
            and subject.config.get("source") == "device_addresses"):
        problems.append(Problem(
            "type-not-offered",
            f"offers {_listed(sorted(offered))} but not {configured}, the type configured "
            "for it",
            "configure a type it offers (accelctl types lists them)",
        ))
    if problems:
        return Verdict(problems[0], tuple(problems), nvidia)
    return Verdict(_ready(subject, offered), (), nvidia)
