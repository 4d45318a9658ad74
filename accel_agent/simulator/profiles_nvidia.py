"""The NVIDIA vGPU 17+ GPUs of the ready-made hosts: their vGPU types with
placements, their MIG profile tables, and where each number comes from.

Three kinds of number, each labelled where it is used:

* **read**: from NVIDIA's own text or a real GPU (a source named);
* **derived**: computed by a stated rule from read numbers;
* **assumed**: no source gives it; a stand-in with the right shape, which
  nothing in the agent may depend on (it must read the GPU's own answers,
  through NVML, on a real host).

The placement rule used for every time-sliced type (**assumed**, except
where marked read): a type of ``G`` GB has placement size ``G`` and supports
the ids ``0, G, 2G, ...``, one per vGPU of its per-GPU maximum.  It matches
the one published example: NVIDIA vGPU 17 User Guide §2.12, an L4-6Q of
placement size 6 with placement ids ``0 6 12 18`` (4 = the L4-6Q's maximum),
and the guide's rule that "the number of supported placement IDs is the
maximum number of vGPUs of the type allowed on the GPU in mixed-size mode".
How NVIDIA really lays out the other types is not published.
"""

from __future__ import annotations

from accel_agent.simulator.spec_nvidia import GpuInstanceProfileSpec, MigSpec
from accel_agent.simulator.spec_sriov import VgpuTypeSpec

NVIDIA = 0x10DE


def timesliced(type_id: int, name: str, gib: int, max_instances: int) -> VgpuTypeSpec:
    """A time-sliced type with the module's placement rule (assumed but for the L4-6Q)."""
    return VgpuTypeSpec(type_id, name, gib * 1024, max_instances, placement_size=gib,
                        placements=tuple(k * gib for k in range(max_instances)))


def mig_backed(type_id: int, name: str, profile: GpuInstanceProfileSpec) -> VgpuTypeSpec:
    """A MIG-backed type: one vGPU per GPU instance of its profile (assumed:
    NVML's ``nvmlVgpuTypeGetMaxInstancesPerGpuInstance`` was not read), its
    framebuffer the instance's memory."""
    return VgpuTypeSpec(type_id, name, profile.memory_mib, profile.instance_count,
                        gpu_instance_profile=profile.profile_id)


# ----------------------------------------------------------------------------- L40S

# The L40S's type ids and names are read (a real creatable_vgpu_types quoted
# in harvester/pcidevices pkg/util/gpuhelper, see profiles.py); its maximum is
# derived (48 GiB / size, at most 32); its placements follow the module's rule
# (assumed); its mixed-size capability is assumed (NVIDIA's pages disagree on
# which GPUs have it: on a real host the agent reads the GPU's own answer).
L40S_FB_GIB = 48
L40S_TOTAL_VFS = 32
_L40S_TYPES = (
    (1145, "1B", 1), (1146, "2B", 2),
    *((1147 + i, f"{gib}Q", gib) for i, gib in enumerate((1, 2, 3, 4, 6, 8, 12, 16, 24, 48))),
    *((1157 + i, f"{gib}A", gib) for i, gib in enumerate((1, 2, 3, 4, 6, 8, 12, 16, 24, 48))),
    (2164, "3B", 3),
)
L40S_VGPU_TYPES = tuple(
    timesliced(type_id, f"NVIDIA L40S-{suffix}", gib, min(L40S_FB_GIB // gib, L40S_TOTAL_VFS))
    for type_id, suffix, gib in _L40S_TYPES)


# ----------------------------------------------------------------------------- L4

# NVIDIA L4 (Ada, 24 GB, 10de:27b8: the PCI ids database).  Mixed-size mode
# and the L4-6Q's placements (size 6, ids 0 6 12 18) are read: the vGPU 17
# User Guide's §2.12 example is an L4.  The other Q types' sizes (1, 2, 3, 4,
# 6, 8, 12, 24 GB) are NVIDIA's L4 type list; their ids and the VF count (32)
# are assumed.
L4_DEVICE_ID = 0x27B8
L4_FB_GIB = 24
L4_TOTAL_VFS = 32
L4_VGPU_TYPES = tuple(
    timesliced(1182 + i, f"NVIDIA L4-{gib}Q", gib, L4_FB_GIB // gib)
    for i, gib in enumerate((1, 2, 3, 4, 6, 8, 12, 24)))


# ----------------------------------------------------------------------------- H200

# The MIG profile table is read from a real H200 (driver 580.159.04, MIG off:
# ``nvidia-smi mig -lgip`` and ``-lgipp``): id, name, instances, memory in GiB
# (x 1024 = MiB), placements start:size (in memory slices: 1g.35gb takes 2).
# The slice count NVML reports (``sliceCount``) is derived from the name's
# compute slices (1g: 1, 7g: 7), as NVIDIA names its profiles.
def _profile(profile_id: int, name: str, instances: int, gib: float,
             starts: tuple[int, ...], size: int) -> GpuInstanceProfileSpec:
    return GpuInstanceProfileSpec(profile_id, name, int(name.split("g.", 1)[0]), instances,
                                  int(gib * 1024), tuple((s, size) for s in starts))


H200_MIG_PROFILES = (
    _profile(19, "1g.18gb", 7, 16.00, (0, 1, 2, 3, 4, 5, 6), 1),
    _profile(20, "1g.18gb+me", 1, 16.00, (0, 1, 2, 3, 4, 5, 6), 1),
    _profile(15, "1g.35gb", 4, 32.50, (0, 2, 4, 6), 2),
    _profile(14, "2g.35gb", 3, 32.50, (0, 2, 4), 2),
    _profile(9, "3g.71gb", 2, 69.75, (0, 4), 4),
    _profile(5, "4g.71gb", 1, 69.75, (0,), 4),
    _profile(0, "7g.141gb", 1, 140.00, (0,), 8),
)
# The H200's MIG mode does not survive a reboot: read for the H100 (NVIDIA
# gpu-admin-tools issue #2), assumed the same for the H200 (both Hopper).
H200_MIG = MigSpec(H200_MIG_PROFILES, mode_persists=False)
_H200_PROFILE = {p.profile_id: p for p in H200_MIG_PROFILES}
# Type names are read (NVIDIA vgpu-device-manager examples/config-example.yaml:
# H200X-1-18C ... H200X-7-141C, H200X-4C ... H200X-141C); the ids 1414
# (H200X-1-18C) and 1428 (H200X-141C) are read (vgpu-device-manager's
# pkg/vgpu/vfio tests); every other id is assumed.  The time-sliced sizes and
# maxima are read from NVIDIA's Hopper vGPU type table for the H200 NVL
# (H200-4C: 32 ... H200-141C: 1) and assumed the same for the SXM5's H200X.
H200_DEVICE_ID = 0x2335  # read: the real H200 (10de:2335)
H200_TOTAL_VFS = 32  # assumed
H200_VGPU_TYPES = (
    mig_backed(1414, "NVIDIA H200X-1-18C", _H200_PROFILE[19]),
    mig_backed(1415, "NVIDIA H200X-1-18CME", _H200_PROFILE[20]),
    mig_backed(1416, "NVIDIA H200X-1-35C", _H200_PROFILE[15]),
    mig_backed(1417, "NVIDIA H200X-2-35C", _H200_PROFILE[14]),
    mig_backed(1418, "NVIDIA H200X-3-71C", _H200_PROFILE[9]),
    mig_backed(1419, "NVIDIA H200X-4-71C", _H200_PROFILE[5]),
    mig_backed(1420, "NVIDIA H200X-7-141C", _H200_PROFILE[0]),
    *(timesliced(1421 + i, f"NVIDIA H200X-{gib}C", gib, count)
      for i, (gib, count) in enumerate(((4, 32), (7, 20), (8, 16), (14, 10), (17, 8),
                                        (28, 5), (35, 4)))),
    timesliced(1428, "NVIDIA H200X-141C", 141, 1),
    timesliced(1429, "NVIDIA H200X-70C", 70, 2),
)


# ----------------------------------------------------------------------------- A100-class

# An A100-class GPU: the one whose MIG mode survives a host reboot while its
# GPU instances do not (read: NVIDIA k8s-device-plugin issue #225).  A real
# A100 offers its vGPUs through the mdev framework, not vendor-specific VFIO;
# the simulator serves it the vGPU 17+ way so that one model of MIG-backed
# vGPUs covers both persistence rules.  The profile table is read from
# NVIDIA's MIG User Guide (A100-SXM4-40GB: ``nvidia-smi mig -lgip`` and
# ``-lgipp`` examples: 1g.5gb 19 7/7 4.75 GiB {0..6}:1, 1g.5gb+me 20,
# 1g.10gb 15 {0,2,4,6}:2, 2g.10gb 14 {0,2,4}:2, 3g.20gb 9 {0,4}:4, 4g.20gb 5
# {0}:4, 7g.40gb 0 {0}:8); its type ids are assumed, its 16 VFs read (the
# A100's sriov_totalvfs, as the nvidia-sriov profile has it).
A100_DEVICE_ID = 0x20F1
A100_TOTAL_VFS = 16
A100_MIG_PROFILES = (
    _profile(19, "1g.5gb", 7, 4.75, (0, 1, 2, 3, 4, 5, 6), 1),
    _profile(20, "1g.5gb+me", 1, 4.75, (0, 1, 2, 3, 4, 5, 6), 1),
    _profile(15, "1g.10gb", 4, 9.62, (0, 2, 4, 6), 2),
    _profile(14, "2g.10gb", 3, 9.62, (0, 2, 4), 2),
    _profile(9, "3g.20gb", 2, 19.62, (0, 4), 4),
    _profile(5, "4g.20gb", 1, 19.62, (0,), 4),
    _profile(0, "7g.40gb", 1, 39.50, (0,), 8),
)
A100_MIG = MigSpec(A100_MIG_PROFILES, mode_persists=True)
_A100_PROFILE = {p.profile_id: p for p in A100_MIG_PROFILES}
A100_VGPU_TYPES = (
    mig_backed(700, "NVIDIA A100-1-5C", _A100_PROFILE[19]),
    mig_backed(701, "NVIDIA A100-2-10C", _A100_PROFILE[14]),
    mig_backed(702, "NVIDIA A100-3-20C", _A100_PROFILE[9]),
    mig_backed(703, "NVIDIA A100-4-20C", _A100_PROFILE[5]),
    mig_backed(704, "NVIDIA A100-7-40C", _A100_PROFILE[0]),
    *(timesliced(471 + i, f"NVIDIA A100-{gib}C", gib, 40 // gib)
      for i, gib in enumerate((4, 5, 8, 10, 20, 40))),
)
