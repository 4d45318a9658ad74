"""``[devices] enabled_gpu_layouts`` and ``[gpu_layout_<name>]`` as written,
checked and turned into :class:`~accel_agent.devices.gpu_layouts.GpuLayout`
records (issue 36; docs/operations.md, "Mixed-size GPU layouts").

Which sections exist is said by ``[devices] enabled_gpu_layouts``, as
``enabled_vf_pools`` says it for ``[vf_pool_<name>]`` and
``enabled_mdev_types`` for ``[mdev_<type>]``: oslo.config registers a group
only for a name it is given, an operator can keep a layout in the files
while it is off, and a section nobody enabled is named in a warning
(policy._unused_sections) instead of being guessed at.

Every refusal is collected (``check-config`` prints them all) and names the
section and the option.  The rules the policy applies across sections (a
GPU in two layouts, or in a layout and in an ``[mdev_<type>]
device_addresses``) are :func:`resolve_layouts`' too, so that the one
resolution of the policy (policy.resolve_policy: check-config, ``--check``,
the start and every reload) says them all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.devices.gpu_layouts import SECTION_PREFIX, GpuLayout
from accel_agent.sysfs import address

if TYPE_CHECKING:
    from oslo_config import cfg

# A type a layout may place: an NVIDIA vGPU type of a vendor-VFIO VF, which
# the agent names nvidia-<id> (backends/nvidia_vfio.py: the id written to
# nvidia/current_vgpu_type).
LAYOUT_TYPE = re.compile(r"^nvidia-[0-9]{1,9}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# A GPU instance profile's name as NVIDIA writes it, without "MIG " (1g.18gb, 1g.18gb+me).
PROFILE_NAME = re.compile(r"^[0-9]{1,2}g\.[0-9]{1,4}gb(\+[a-z]{1,8})?$")
# A MIG GPU has at most 7 GPU instances (8 memory slices, NVIDIA's MIG guide).
MAX_GPU_INSTANCES = 7
# Each GPU carries at most this many vGPUs of one type (a GPU has at most a
# few dozen VFs: the fit check says how many fit; this only bounds the text).
MAX_COUNT = 65535
REPORTERS = ("agent", "nova")
# Nova 34 cannot hand out the VFs of one GPU that carry several types: its
# PCI-in-Placement translator puts a PF's VFs in one provider of one resource
# class (nova/compute/pci_placement_translator.py, PciResourceProvider:
# PlacementPciMixedResourceClassException, and ...MixedTraitsException for
# traits), and without Placement an alias tells VFs apart by vendor and
# product id only, which every type of one GPU shares
# (tests/nova/test_nova_mixed_layout.py runs Nova's code on it).
NOVA_MIXED = (
    "{section} reported_by = nova with several types: Nova (34) cannot tell one GPU's VFs "
    "of different types apart (in Placement a PF's VFs must share one resource class and "
    "one set of traits, 'VFs from the same PF cannot be configured with different "
    "resource_class values'; without it an alias matches vendor and product ids, which "
    "the types share); use reported_by = agent, or give the layout one type"
)


@dataclass(frozen=True, slots=True)
class LayoutOptions:
    """One ``[gpu_layout_<name>]`` section as written (nothing checked yet)."""

    name: str
    gpus: tuple[str, ...] = ()
    vgpus: tuple[str, ...] = ()
    reported_by: str = "agent"
    mig: tuple[str, ...] = ()

    def to_list(self) -> list[Any]:
        return [self.name, list(self.gpus), list(self.vgpus), self.reported_by,
                list(self.mig)]

    @classmethod
    def from_list(cls, data: list[Any]) -> LayoutOptions:
        # Four items: a cache written before ``mig`` existed (issue 37).
        name, gpus, vgpus, reported_by, *rest = data
        mig = rest[0] if rest else []
        return cls(str(name), tuple(str(g) for g in gpus), tuple(str(v) for v in vgpus),
                   str(reported_by), tuple(str(m) for m in mig))


def read_layout_options(
    conf: cfg.ConfigOpts, errors: list[exception.AccelAgentException]
) -> tuple[tuple[str, ...], tuple[LayoutOptions, ...]]:
    """The enabled layout names and each one's section, as written.  A
    value oslo.config refuses (``reported_by = cyborg``) is one error and
    the section is left out (the value check names its file and line)."""
    from oslo_config import cfg

    from accel_agent.config import options as agent_conf

    enabled = tuple(conf.devices.enabled_gpu_layouts or [])
    agent_conf.register_layout_opts(conf)
    found = []
    for name in dict.fromkeys(enabled):
        if not NAME.fullmatch(name):
            continue  # refused by resolve_layouts, naming it
        group = conf[SECTION_PREFIX + name]
        try:
            found.append(LayoutOptions(name, tuple(group.gpus or []), tuple(group.vgpus or []),
                                       group.reported_by, tuple(group.mig or [])))
        except (ValueError, cfg.Error):
            errors.append(exception.InvalidMdevConfig(
                reason=f"[{SECTION_PREFIX}{name}] reported_by must be agent or nova"))
    return enabled, tuple(found)


def resolve_layouts(
    enabled: tuple[str, ...],
    sections: tuple[LayoutOptions, ...],
    enabled_types: tuple[str, ...],
    type_addresses: Mapping[str, str],
    standing: Mapping[str, int],
) -> tuple[tuple[GpuLayout, ...], list[exception.AccelAgentException]]:
    """The layouts, and every reason to refuse them.

    ``type_addresses``: each normalised ``[mdev_<type>] device_addresses``
    entry and its type (a GPU there may not be in a layout); ``standing``:
    each type's ``[mdev_<type>] standing``, for the words of that refusal."""
    errors: list[exception.AccelAgentException] = []
    for name in dict.fromkeys(enabled):
        if not NAME.fullmatch(name):
            errors.append(_invalid(
                f"layout {name!r} in [devices] enabled_gpu_layouts is no layout name: "
                "lower-case letters, digits, '_' and '-', at most 32, starting with a letter "
                "or digit"))
        elif (count := enabled.count(name)) > 1:
            errors.append(_invalid(
                f"layout {name} is listed {count} times in [devices] enabled_gpu_layouts"))
    layouts: list[GpuLayout] = []
    owner: dict[str, str] = {}  # GPU -> the first layout section naming it
    for options in sections:
        section = f"[{SECTION_PREFIX}{options.name}]"
        gpus = _gpus(options, section, errors)
        vgpus = _vgpus(options, section, enabled_types, errors)
        if options.reported_by not in REPORTERS:
            errors.append(_invalid(f"{section} reported_by must be agent or nova"))
        elif options.reported_by == "nova" and len(vgpus) > 1:
            errors.append(_invalid(NOVA_MIXED.format(section=section)))
        for gpu in gpus:
            mdev_type = type_addresses.get(gpu)
            if mdev_type is not None:
                held = standing.get(mdev_type, 0)
                errors.append(exception.DuplicateLayoutAddress(
                    address=gpu, first=f"{section} gpus",
                    second=f"[mdev_{mdev_type}] device_addresses",
                    why=(f" (and its standing = {held} would lay the GPU out twice)"
                         if held > 0 else "")
                    + ": a GPU has one layout; remove it from one of them"))
            elif gpu in owner:
                errors.append(exception.DuplicateLayoutAddress(
                    address=gpu, first=f"{owner[gpu]} gpus", second=f"{section} gpus",
                    why=": a GPU has one layout; remove it from one of them"))
            else:
                owner[gpu] = section
        mig = _mig(options, section, errors)
        layouts.append(GpuLayout(options.name, tuple(sorted(set(gpus))), vgpus,
                                 options.reported_by, mig))
    return tuple(layouts), errors


def _invalid(reason: str) -> exception.InvalidMdevConfig:
    return exception.InvalidMdevConfig(reason=reason)


def _gpus(
    options: LayoutOptions, section: str, errors: list[exception.AccelAgentException]
) -> list[str]:
    if not options.gpus:
        errors.append(_invalid(f"{section} gpus is empty: name the PCI addresses of the GPUs "
                               "(their PFs) the layout is for"))
    found: list[str] = []
    for raw in options.gpus:
        text = raw.strip()
        if not address.is_pci_address(text):
            what = "''" if not text else raw
            errors.append(exception.InvalidDeviceAddress(
                address=what,
                where=f" (in {section} gpus; expected a GPU's PCI address such as "
                "0000:21:00.0 or 21:00.0" + ("; remove the extra comma" if not text else "")
                + ")"))
            continue
        gpu = address.parse_pci_address(text)
        if gpu in found:
            errors.append(_invalid(f"{section} gpus names {gpu} twice"))
            continue
        found.append(gpu)
    return found


def _mig(
    options: LayoutOptions, section: str, errors: list[exception.AccelAgentException]
) -> tuple[tuple[str, int], ...] | None:
    """``mig = <profile>:<count>, ...`` as (profile, count) pairs, None where
    the section has none (a time-sliced layout).  Whether the profiles exist
    and agree with the types is the GPU's to say (devices/gpu_layout_fit.py,
    from NVML); here only the text."""
    if not options.mig:
        return None
    found: dict[str, int] = {}
    for raw in options.mig:
        item = raw.strip()
        profile, colon, count_text = item.rpartition(":")
        profile, count_text = profile.strip(), count_text.strip()
        if not colon or not PROFILE_NAME.fullmatch(profile):
            errors.append(_invalid(f"{section} mig item {item!r} is not <profile>:<count> "
                                   "with a GPU instance profile as nvidia-smi mig -lgip "
                                   "names it (e.g. 1g.18gb:3)"))
            continue
        count = int(count_text) if re.fullmatch(r"[0-9]{1,3}", count_text) else None
        if count is None or not 1 <= count <= MAX_GPU_INSTANCES:
            errors.append(_invalid(f"{section} mig item {item!r}: the count must be an "
                                   f"integer from 1 to {MAX_GPU_INSTANCES}"))
            continue
        if profile in found:
            errors.append(_invalid(f"{section} mig names {profile} twice: give it once, "
                                   "with the whole count"))
            continue
        found[profile] = count
    return tuple(found.items())


def _vgpus(
    options: LayoutOptions,
    section: str,
    enabled_types: tuple[str, ...],
    errors: list[exception.AccelAgentException],
) -> tuple[tuple[str, int], ...]:
    if not options.vgpus:
        errors.append(_invalid(f"{section} vgpus is empty: name the vGPUs each GPU carries, "
                               "<type>:<count>, ..."))
    found: dict[str, int] = {}
    for raw in options.vgpus:
        item = raw.strip()
        device_type, colon, count_text = item.rpartition(":")
        device_type, count_text = device_type.strip(), count_text.strip()
        if not colon or not device_type:
            errors.append(_invalid(f"{section} vgpus item {item!r} is not <type>:<count> "
                                   "(e.g. nvidia-1186:2)"))
            continue
        count = int(count_text) if re.fullmatch(r"[0-9]{1,6}", count_text) else None
        if count is None or not 1 <= count <= MAX_COUNT:
            errors.append(_invalid(f"{section} vgpus item {item!r}: the count must be an "
                                   f"integer from 1 to {MAX_COUNT}"))
            continue
        if not LAYOUT_TYPE.fullmatch(device_type):
            errors.append(_invalid(
                f"{section} vgpus item {item!r}: {device_type} is no NVIDIA vGPU type of a "
                "vendor-VFIO VF (nvidia-<id>, backend nvidia_vfio): a layout places the vGPUs "
                "of NVIDIA vGPU 17+ GPUs in mixed-size mode"))
            continue
        if device_type not in enabled_types:
            errors.append(_invalid(
                f"{section} vgpus item {item!r}: type {device_type} is not in [devices] "
                "enabled_mdev_types"))
            continue
        if device_type in found:
            errors.append(_invalid(f"{section} vgpus names {device_type} twice: give it once, "
                                   "with the whole count"))
            continue
        found[device_type] = count
    return tuple(found.items())
