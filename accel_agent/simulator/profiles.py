"""Ready-made hosts: ``PROFILES`` maps a name to a builder returning a HostSpec.

Builders take keyword options (``gpus``, ``vfs``, ``parents``, ``types``);
:func:`build_spec` combines several profiles into one host and hands each
builder only the options it accepts, so ``--profile nvidia-pf --profile mtty
--gpus 4`` works.  Addresses never overlap between profiles:

============  =========================================  ======================
profile       devices                                    counts
============  =========================================  ======================
nvidia-pf     0000:84:00.0, 0000:85:00.0, ... (M60 PFs)  nvidia-equal-size
nvidia-sriov  VFs 0000:41:00.4.. of PF 0000:41:00.0, ... nvidia-vf (A100 VFs)
nvidia-vfio   L40S PFs 0000:c1:00.0, 0000:c2:00.0, ...;  no mdev: VFs typed via
              VFs 0000:c1:00.4.. (vGPU 17+)              nvidia/current_vgpu_type
nvidia-l4     L4 PFs 0000:21:00.0, ... (vGPU 17+)        mixed-size placements
nvidia-h200   H200 PFs 0000:61:00.0, ... (vGPU 17+)      MIG (mode lost at reboot)
nvidia-a100-  A100-class PFs 0000:a1:00.0, ...           MIG (mode kept at reboot)
mig
igb-sriov     82576 ports 0000:10:00.0, 0000:10:00.1,    no mdev: VFs 10:10.0..
              0000:11:00.0, ... (netdev enp16s0f0, ...)  via sriov_numvfs
i915-gvtg     0000:00:02.0                               shared, weights
mtty          mtty (virtual, values measured in tests/realkernel/)    global, 24 ports
mdpy          mdpy (virtual)                             core counter (EUSERS)
nova          0000:06:00.0, 0000:07:00.0 (Nova's tests)  independent
synthetic     0001:BB:SS.F (benchmarks)                  independent
============  =========================================  ======================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from accel_agent import exception
from accel_agent.simulator import profiles_nvidia
from accel_agent.simulator.spec import (
    HostSpec,
    MdevSpec,
    ParentSpec,
    PciDeviceSpec,
    SriovPfSpec,
    TypeSpec,
    VgpuTypeSpec,
)
from accel_agent.simulator.spec_nvidia import MigSpec

NVIDIA = 0x10DE
INTEL = 0x8086


def _nvidia_desc(heads: int, frl: int, fb_mb: int, res: str, max_instance: int) -> str:
    return (f"num_heads={heads}, frl_config={frl}, framebuffer={fb_mb}M, "
            f"max_resolution={res}, max_instance={max_instance}")


# Tesla M60 (Maxwell) GRID types as the NVIDIA driver lists them.
M60_TYPES = (
    TypeSpec("nvidia-35", name="GRID M60-0B",
             description=_nvidia_desc(2, 45, 512, "2560x1600", 16)),
    TypeSpec("nvidia-36", name="GRID M60-0Q",
             description=_nvidia_desc(2, 60, 512, "2560x1600", 16)),
    TypeSpec("nvidia-15", name="GRID M60-1Q",
             description=_nvidia_desc(4, 60, 1024, "4096x2160", 8)),
    TypeSpec("nvidia-18", name="GRID M60-2Q",
             description=_nvidia_desc(4, 60, 2048, "4096x2160", 4)),
    TypeSpec("nvidia-20", name="GRID M60-4Q",
             description=_nvidia_desc(4, 60, 4096, "4096x2160", 2)),
    TypeSpec("nvidia-22", name="GRID M60-8Q",
             description=_nvidia_desc(4, 60, 8192, "4096x2160", 1)),
)

# A100 40GB time-sliced C-series types (max_instance is per physical GPU).
A100_TYPES = (
    TypeSpec("nvidia-471", name="NVIDIA A100-4C",
             description=_nvidia_desc(1, 60, 4096, "4096x2160", 10)),
    TypeSpec("nvidia-472", name="NVIDIA A100-5C",
             description=_nvidia_desc(1, 60, 5120, "4096x2160", 8)),
    TypeSpec("nvidia-473", name="NVIDIA A100-8C",
             description=_nvidia_desc(1, 60, 8192, "4096x2160", 5)),
    TypeSpec("nvidia-474", name="NVIDIA A100-10C",
             description=_nvidia_desc(1, 60, 10240, "4096x2160", 4)),
    TypeSpec("nvidia-475", name="NVIDIA A100-20C",
             description=_nvidia_desc(1, 60, 20480, "4096x2160", 2)),
    TypeSpec("nvidia-476", name="NVIDIA A100-40C",
             description=_nvidia_desc(1, 60, 40960, "4096x2160", 1)),
)


def _gvtg(instances: int, low: int, high: int, res: str) -> TypeSpec:
    # intel_vgpu_configs[]: weight = VGPU_MAX_WEIGHT (16) / instances; the pool is 16 units.
    weight = 16 // instances
    return TypeSpec(
        f"i915-GVTg_V5_{instances}", name=f"GVTg_V5_{instances}",
        description=(f"low_gm_size: {low}MB\nhigh_gm_size: {high}MB\nfence: 4\n"
                     f"resolution: {res}\nweight: {weight}"),
        weight=weight)


def _check_count(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise exception.SimulatorSpecInvalid(
            reason=f"option {name} must be an integer in {low}..{high}, got {value!r}")
    return value


def nvidia_pf(gpus: int = 2) -> HostSpec:
    """Classic time-sliced NVIDIA vGPU on PFs (Tesla M60-like): one type per pGPU."""
    _check_count("gpus", gpus, 1, 60)
    parents = [
        ParentSpec(name=f"0000:{0x84 + i:02x}:00.0", driver="nvidia", vendor_id=NVIDIA,
                   device_id=0x13F2, class_code=0x030000, numa_node=i % 2,
                   policy="nvidia-equal-size", types=M60_TYPES)
        for i in range(gpus)
    ]
    return HostSpec(parents=parents, profiles=("nvidia-pf",))


def vf_address(pf: str, index: int) -> str:
    """The kernel's VF numbering for first_vf_offset 4, stride 1: 00.4 .. 00.7, 01.0 .."""
    domain, bus, _ = pf.split(":")
    devfn = 4 + index
    return f"{domain}:{bus}:{devfn // 8:02x}.{devfn % 8}"


def nvidia_sriov(gpus: int = 1, vfs: int = 16) -> HostSpec:
    """NVIDIA vGPU on SR-IOV VFs (A100-like): the PF is not a parent, each VF is,
    with available_instances 0/1 and a per-PF budget of ``max_instance``."""
    _check_count("gpus", gpus, 1, 60)
    _check_count("vfs", vfs, 1, 252)
    devices, parents = [], []
    for g in range(gpus):
        pf = f"0000:{0x41 + g:02x}:00.0"
        devices.append(PciDeviceSpec(address=pf, driver="nvidia", vendor_id=NVIDIA,
                                     device_id=0x20F1, class_code=0x030200, numa_node=g % 2))
        parents += [
            ParentSpec(name=vf_address(pf, i), driver="nvidia", vendor_id=NVIDIA,
                       device_id=0x20F1, class_code=0x030200, numa_node=g % 2, physfn=pf,
                       policy="nvidia-vf", types=A100_TYPES)
            for i in range(vfs)
        ]
    return HostSpec(parents=parents, devices=devices, profiles=("nvidia-sriov",))


# NVIDIA L40S (Ada, 48 GiB) time-sliced vGPU types as its vGPU 17+ driver lists
# them, with placements (profiles_nvidia.py says which numbers are read).
L40S_DEVICE_ID = 0x26B9
L40S_TOTAL_VFS = profiles_nvidia.L40S_TOTAL_VFS
L40S_VGPU_TYPES = profiles_nvidia.L40S_VGPU_TYPES


def nvidia_vfio_pf(index: int) -> str:
    return f"0000:{0xC1 + index:02x}:00.0"


def nvidia_vfio(gpus: int = 1, vfs: int = 16) -> HostSpec:
    """NVIDIA vGPU 17+ on L40S GPUs: no mdev; VFs bound to nvidia, typed via nvidia/.

    docs/design.md §10.3: each PF (10de:26b9, bound to
    ``nvidia``) has ``vfs`` VFs enabled at boot (``sriov_totalvfs`` 32; a boot
    script enabled them: NVIDIA's own ``sriov-manage -e`` enables all 32, which
    is what ``simulate enable-vfs`` does after ``reboot --vfs-disabled`` or
    ``driver-reload``), at first VF offset 4, stride 1 (00.4, 00.5,
    ...), sharing the PF's vendor:device id, bound to ``nvidia``, each in its
    own IOMMU group with a ``vfio/<group>`` node, each with
    ``nvidia/creatable_vgpu_types`` and ``nvidia/current_vgpu_type`` (see
    :mod:`.nvidia_vfio`).  Nothing appears in ``class/mdev_bus``.
    """
    _check_count("gpus", gpus, 1, 60)
    _check_count("vfs", vfs, 1, L40S_TOTAL_VFS)
    pfs = [SriovPfSpec(address=nvidia_vfio_pf(g), driver="nvidia", vf_driver="nvidia",
                       total_vfs=L40S_TOTAL_VFS, num_vfs=vfs, vendor_id=NVIDIA,
                       device_id=L40S_DEVICE_ID, vf_device_id=L40S_DEVICE_ID,
                       class_code=0x030200, numa_node=g % 2, vf_offset=4, vf_stride=1,
                       vgpu_types=L40S_VGPU_TYPES, heterogeneous=True)
           for g in range(gpus)]
    return HostSpec(sriov_pfs=pfs, profiles=("nvidia-vfio",))


def _vfio_gpus(name: str, first_bus: int, gpus: int, vfs: int, total_vfs: int,
               device_id: int, types: tuple[VgpuTypeSpec, ...], heterogeneous: bool,
               mig: MigSpec | None) -> HostSpec:
    _check_count("gpus", gpus, 1, 8)
    _check_count("vfs", vfs, 1, total_vfs)
    pfs = [SriovPfSpec(address=f"0000:{first_bus + g:02x}:00.0", driver="nvidia",
                       vf_driver="nvidia", total_vfs=total_vfs, num_vfs=vfs, vendor_id=NVIDIA,
                       device_id=device_id, vf_device_id=device_id, class_code=0x030200,
                       numa_node=g % 2, vf_offset=4, vf_stride=1, vgpu_types=types,
                       heterogeneous=heterogeneous, mig=mig)
           for g in range(gpus)]
    return HostSpec(sriov_pfs=pfs, profiles=(name,))


def nvidia_l4(gpus: int = 1, vfs: int = 8) -> HostSpec:
    """NVIDIA vGPU 17+ on L4 GPUs (0000:21:00.0, ...): mixed-size mode with the
    guide's L4-6Q placements (profiles_nvidia.py); no MIG."""
    return _vfio_gpus("nvidia-l4", 0x21, gpus, vfs, profiles_nvidia.L4_TOTAL_VFS,
                      profiles_nvidia.L4_DEVICE_ID, profiles_nvidia.L4_VGPU_TYPES, True, None)


def nvidia_h200(gpus: int = 1, vfs: int = 8) -> HostSpec:
    """NVIDIA vGPU 17+ on H200 GPUs (0000:61:00.0, ...): MIG with the profile
    table a real H200 reported, MIG-backed and time-sliced types, mixed-size
    capable; the MIG mode is lost at a reboot (profiles_nvidia.py)."""
    return _vfio_gpus("nvidia-h200", 0x61, gpus, vfs, profiles_nvidia.H200_TOTAL_VFS,
                      profiles_nvidia.H200_DEVICE_ID, profiles_nvidia.H200_VGPU_TYPES, True,
                      profiles_nvidia.H200_MIG)


def nvidia_a100_mig(gpus: int = 1, vfs: int = 8) -> HostSpec:
    """An A100-class GPU served the vGPU 17+ way (0000:a1:00.0, ...): MIG whose
    mode survives a reboot while its GPU instances do not (profiles_nvidia.py)."""
    return _vfio_gpus("nvidia-a100-mig", 0xA1, gpus, vfs, profiles_nvidia.A100_TOTAL_VFS,
                      profiles_nvidia.A100_DEVICE_ID, profiles_nvidia.A100_VGPU_TYPES, False,
                      profiles_nvidia.A100_MIG)


def igb_port(index: int) -> tuple[str, str]:
    """Port ``index`` of the igb-sriov profile: its PCI address and netdev name
    (dual-port cards on buses 0x10.., systemd's ``enp<bus>s<slot>f<fn>``)."""
    bus, fn = 0x10 + index // 2, index % 2
    return f"0000:{bus:02x}:00.{fn}", f"enp{bus}s0f{fn}"


def igb_sriov(nics: int = 1) -> HostSpec:
    """Intel 82576 SR-IOV NIC ports (igb): VFs created by writing sriov_numvfs.

    Values from docs/design.md §10.4 (QEMU's ``-device igb``
    with Debian's igb/igbvf): PF 8086:10c9 bound to ``igb``, ``sriov_totalvfs``
    7, no VF at boot (igb's ``max_vfs`` defaults to 0); VFs 8086:10ca bound to
    ``igbvf``, each in its own IOMMU group, at VF offset 0x80 and stride 2
    (QEMU's IGB_VF_OFFSET/IGB_VF_STRIDE, as on the real card: port 0's VFs
    are 10.0, 10.2, ..., port 1's 10.1, 10.3, ...).  The PF's netdev is
    ``net/<ifname>`` under it (and ``class/net/<ifname>``).
    """
    _check_count("nics", nics, 1, 16)
    pfs = []
    for i in range(nics):
        addr, ifname = igb_port(i)
        pfs.append(SriovPfSpec(address=addr, driver="igb", vf_driver="igbvf", total_vfs=7,
                               num_vfs=0, vendor_id=INTEL, device_id=0x10C9,
                               vf_device_id=0x10CA, class_code=0x020000, numa_node=0,
                               vf_offset=0x80, vf_stride=2, netdev=ifname))
    return HostSpec(sriov_pfs=pfs, profiles=("igb-sriov",))


def i915_gvtg() -> HostSpec:
    """Intel GVT-g on the iGPU: four types drawing on one pool per GPU (ENOSPC)."""
    types = (_gvtg(8, 64, 384, "1024x768"), _gvtg(4, 128, 512, "1920x1200"),
             _gvtg(2, 256, 1024, "1920x1200"), _gvtg(1, 512, 2048, "1920x1200"))
    parent = ParentSpec(name="0000:00:02.0", driver="i915", vendor_id=INTEL, device_id=0x3E92,
                        class_code=0x030000, numa_node=-1, policy="shared", capacity=16,
                        mdev_driver="vfio_mdev", types=types)
    return HostSpec(parents=[parent], profiles=("i915-gvtg",))


def mtty() -> HostSpec:
    """The kernel's mtty sample exactly as measured on a real kernel
    (docs/design.md §4.2, §4.3): 24 ports module-wide, mtty-1 uses one,
    mtty-2 two, no description, ENOSPC when full."""
    parent = ParentSpec(
        name="mtty", kind="virtual", driver="mtty", policy="global", capacity=24,
        types=(TypeSpec("mtty-1", name="Single port serial", weight=1),
               TypeSpec("mtty-2", name="Dual port serial", weight=2)))
    return HostSpec(parents=[parent], profiles=("mtty",))


def mdpy() -> HostSpec:
    """The mdpy sample: the mdev core's per-parent counter (count=4), EUSERS when full."""
    types = tuple(
        TypeSpec(f"mdpy-{n}", name=n, description=f"virtual display, {res} framebuffer")
        for n, res in (("vga", "640x480"), ("xga", "1024x768"), ("hd", "1920x1080")))
    parent = ParentSpec(name="mdpy", kind="virtual", driver="mdpy", policy="core", capacity=4,
                        types=types)
    return HostSpec(parents=[parent], profiles=("mdpy",))


NOVA_MDEV_06 = "c2b4f0c6-5e6b-4bf5-8d7a-4b3c56d3f5a1"
NOVA_MDEV_07 = "e4c0f2a8-91d4-4c7e-a1b9-0d6f3e2b7c55"


def nova() -> HostSpec:
    """The host of Nova's libvirt driver tests: 0000:06:00.0 offers nvidia-11 (16),
    0000:07:00.0 nvidia-11 (8) and nvidia-12 (10), one nvidia-11 mdev on each,
    so the counters read 15 / 7 / 10."""
    def parent(name: str, types: Iterable[tuple[str, str, int]]) -> ParentSpec:
        return ParentSpec(
            name=name, driver="nvidia", vendor_id=NVIDIA, device_id=0x13F2,
            class_code=0x030000, numa_node=0, policy="independent",
            types=tuple(TypeSpec(t, name=label, max_instances=n,
                                 description=_nvidia_desc(2, 45, 512, "2560x1600", n))
                        for t, label, n in types))

    return HostSpec(
        parents=[parent("0000:06:00.0", [("nvidia-11", "GRID M60-0B", 16)]),
                 parent("0000:07:00.0", [("nvidia-11", "GRID M60-0B", 8),
                                         ("nvidia-12", "GRID M60-0Q", 10)])],
        mdevs=[MdevSpec(NOVA_MDEV_06, "0000:06:00.0", "nvidia-11"),
               MdevSpec(NOVA_MDEV_07, "0000:07:00.0", "nvidia-11")],
        profiles=("nova",))


def synthetic_address(index: int) -> str:
    """Parent ``index`` of the synthetic profile, in PCI domain 0001 so it never
    collides with the other profiles: 8 functions x 32 slots per bus."""
    return f"0001:{0x01 + index // 256:02x}:{(index // 8) % 32:02x}.{index % 8}"


def synthetic(parents: int = 4, types: int = 4) -> HostSpec:
    """``parents`` x ``types`` independent counters, for benchmarks (256 x 24,
    1024 x 24) and scale tests."""
    _check_count("parents", parents, 1, 256 * 254)
    _check_count("types", types, 1, 4096)
    tspecs = tuple(
        TypeSpec(f"nvidia-{1000 + j}", name=f"NVIDIA SYN-{j}Q",
                 description=_nvidia_desc(1, 60, 1024 * (1 + j % 8), "4096x2160",
                                          1 + (j * 7) % 16))
        for j in range(types))
    parent_specs = [
        ParentSpec(name=synthetic_address(i), driver="nvidia", vendor_id=NVIDIA,
                   device_id=0x1EB8, class_code=0x030200, numa_node=i % 2,
                   policy="independent", types=tspecs)
        for i in range(parents)
    ]
    return HostSpec(parents=parent_specs, profiles=("synthetic",))


PROFILES: dict[str, Callable[..., HostSpec]] = {
    "nvidia-pf": nvidia_pf,
    "nvidia-sriov": nvidia_sriov,
    "nvidia-vfio": nvidia_vfio,
    "nvidia-l4": nvidia_l4,
    "nvidia-h200": nvidia_h200,
    "nvidia-a100-mig": nvidia_a100_mig,
    "igb-sriov": igb_sriov,
    "i915-gvtg": i915_gvtg,
    "mtty": mtty,
    "mdpy": mdpy,
    "nova": nova,
    "synthetic": synthetic,
}


def profile_options(name: str) -> list[str]:
    return list(inspect.signature(PROFILES[name]).parameters)


def build_spec(profiles: Iterable[str], **options: Any) -> HostSpec:
    """One host from several profiles.  Options set to None are ignored; an option
    that none of the chosen profiles takes is an error, not silently dropped."""
    names = list(profiles)
    if not names:
        raise exception.SimulatorSpecInvalid(reason="no profile given")
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise exception.SimulatorSpecInvalid(
            reason=f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(PROFILES)}")
    if len(set(names)) != len(names):
        raise exception.SimulatorSpecInvalid(reason=f"profile listed twice in {names}")
    given = {k: v for k, v in options.items() if v is not None}
    used: set[str] = set()
    specs = []
    for name in names:
        accepted = profile_options(name)
        kwargs = {k: v for k, v in given.items() if k in accepted}
        used.update(kwargs)
        specs.append(PROFILES[name](**kwargs))
    unused = sorted(set(given) - used)
    if unused:
        raise exception.SimulatorSpecInvalid(
            reason=f"option(s) {', '.join(unused)} not used by profile(s) {', '.join(names)}")
    return HostSpec.merge(specs)
