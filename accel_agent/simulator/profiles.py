"""Ready-made hosts: ``PROFILES`` maps a name to a builder returning a HostSpec.

Builders take keyword options (``gpus``, ``vfs``, ``parents``, ``types``);
:func:`build_spec` combines several profiles into one host and hands each
builder only the options it accepts, so ``--profile nvidia-pf --profile mtty
--gpus 4`` works.  Addresses never overlap between profiles:

============  =========================================  ======================
profile       parents                                    counts
============  =========================================  ======================
nvidia-pf     0000:84:00.0, 0000:85:00.0, ... (M60 PFs)  nvidia-equal-size
nvidia-sriov  VFs 0000:41:00.4.. of PF 0000:41:00.0, ... nvidia-vf (A100 VFs)
i915-gvtg     0000:00:02.0                               shared, weights
mtty          mtty (virtual, values from mtty-lab.md)    global, 24 ports
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
from accel_agent.simulator.spec import HostSpec, MdevSpec, ParentSpec, PciDeviceSpec, TypeSpec

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


def i915_gvtg() -> HostSpec:
    """Intel GVT-g on the iGPU: four types drawing on one pool per GPU (ENOSPC)."""
    types = (_gvtg(8, 64, 384, "1024x768"), _gvtg(4, 128, 512, "1920x1200"),
             _gvtg(2, 256, 1024, "1920x1200"), _gvtg(1, 512, 2048, "1920x1200"))
    parent = ParentSpec(name="0000:00:02.0", driver="i915", vendor_id=INTEL, device_id=0x3E92,
                        class_code=0x030000, numa_node=-1, policy="shared", capacity=16,
                        mdev_driver="vfio_mdev", types=types)
    return HostSpec(parents=[parent], profiles=("i915-gvtg",))


def mtty() -> HostSpec:
    """The kernel's mtty sample exactly as measured in mtty-lab.md: 24 ports
    module-wide, mtty-1 uses one, mtty-2 two, no description, ENOSPC when full."""
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
