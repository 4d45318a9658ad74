"""Nova ``[pci]`` lines for vendor-VFIO vGPUs, for operators who keep
handing VFs to Nova as static PCI passthrough devices (issue 14, item 7).

On NVIDIA vGPU 17+ a vGPU is an SR-IOV VF typed through
``nvidia/current_vgpu_type``; Nova does not type VFs, it only passes through
the ones an operator typed, listed in ``[pci] device_spec`` with
``"managed": "no"`` (the VF must stay bound to ``nvidia``: libvirt's
managed mode would rebind it to vfio-pci and destroy the vGPU) and a
``resource_class`` per vGPU type, requested through a ``[pci] alias``.

This module says which lines match this host (what the agent typed, or
would type for a given count per GPU) and where a nova.conf drifted from
it.  It reads; it never writes sysfs or Nova's files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from accel_agent.devices.policy import MdevPolicy
from accel_agent.sysfs.model import HostSnapshot

BACKEND = "nvidia_vfio"


@dataclass(frozen=True)
class VfSpec:
    """One VF as Nova's ``device_spec`` should list it."""

    address: str
    mdev_type: str
    resource_class: str
    physical_gpu: str
    # True: typed now (by the agent); False: the agent would type it for
    # the count asked (``--per-gpu``).
    typed: bool


def resource_class_for(mdev_type: str, mdev_class: str) -> str:
    """The Placement resource class Nova should track this type's VFs under.

    A configured custom class is kept.  The default ``VGPU`` is not: Nova
    reports its own mdev vGPUs as ``VGPU`` on the same compute node, and a
    PCI device in Placement needs a class of its own per type, so
    ``nvidia-1414`` becomes ``CUSTOM_NVIDIA_1414`` (Nova's own
    normalisation: upper case, anything outside ``[A-Z0-9_]`` to ``_``).
    """
    if mdev_class.startswith("CUSTOM_"):
        return mdev_class
    return "CUSTOM_" + re.sub(r"[^A-Z0-9_]+", "_", mdev_type.upper())


def plan(
    snapshot: HostSnapshot,
    policy: MdevPolicy,
    owned: Iterable[str],
    per_gpu: int | None = None,
) -> list[VfSpec]:
    """The VFs Nova should be given: every VF the agent owns a typed vGPU
    on, and with ``per_gpu`` also the untyped VFs the agent would type next
    (in VF order, within the type's per-GPU limit) until each configured GPU
    has that many.  A VF typed by someone else is never offered."""
    owned_set = set(owned)
    typed: dict[str, list[VfSpec]] = {}
    free: dict[str, list[VfSpec]] = {}
    limits: dict[str, int | None] = {}
    typed_vfs = {m.parent: m for m in snapshot.mdevs.values() if m.backend == BACKEND}
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        if parent.backend != BACKEND:
            continue
        mdev_type = policy.type_for(parent)
        config = policy.config_of(mdev_type) if mdev_type else None
        if mdev_type is None or config is None:
            continue
        spec = VfSpec(
            address=parent.pci_address or parent.name,
            mdev_type=mdev_type,
            resource_class=resource_class_for(mdev_type, config.mdev_class),
            physical_gpu=parent.physical_gpu,
            typed=False,
        )
        device = typed_vfs.get(parent.name)
        if device is not None:
            if device.uuid in owned_set and device.mdev_type == mdev_type:
                typed.setdefault(parent.physical_gpu, []).append(replace(spec, typed=True))
            continue
        if config.standing > 0:
            # A standing layout types its VFs at start, before READY: Nova is
            # given exactly those, never a VF that may stay untyped.
            continue
        offered = parent.types.get(mdev_type)
        if offered is not None and offered.available_instances > 0:
            free.setdefault(parent.physical_gpu, []).append(spec)
            limits[parent.physical_gpu] = offered.per_gpu_limit
    specs: list[VfSpec] = []
    for gpu in sorted(set(typed) | set(free)):
        chosen = typed.get(gpu, [])
        if per_gpu is not None:
            wanted = per_gpu
            limit = limits.get(gpu)
            if limit is not None:
                wanted = min(wanted, limit)
            chosen = chosen + free.get(gpu, [])[: max(0, wanted - len(chosen))]
        specs += chosen
    return specs


# Nova 34 reads ``live_migratable`` in both options (nova/conf/pci.py):
# - in a device_spec, PciDeviceSpec normalises it to "true" and the tracker
#   copies it onto the device and its stats pool (pci/devspec.py,
#   enhanced_pci_device_with_spec_tags; pci/stats.py pool tags), and the
#   Placement translator gives the provider the HW_PCI_LIVE_MIGRATABLE trait
#   (compute/pci_placement_translator.py, _get_traits_for_dev);
# - in an alias, the request asks for such devices only, and the conductor
#   refuses to live-migrate an instance whose flavor's PCI requests do not all
#   say so (conductor/tasks/live_migrate.py, _check_can_migrate_pci).
# The agent's migration gates are its version floors (migration/versions.py),
# checked per migration between two hosts; none is per type.  Nova itself
# refuses to start with the tag in a device_spec below libvirt 10.0.0 / QEMU
# 8.2.2 (libvirt driver, _check_pci_whitelist), and Debian bookworm ships
# libvirt 9.0: so the tag is printed only where this host's libvirt and QEMU
# meet that floor (live_migratable_here), and the text form says why not.
LIVE_MIGRATABLE = "yes"
NOVA_LIVE_MIGRATABLE_FLOOR = "libvirt >= 10.0.0 and QEMU >= 8.2.2"
NOVA_LIVE_MIGRATABLE_LIBVIRT = (10, 0, 0)
NOVA_LIVE_MIGRATABLE_QEMU = (8, 2, 2)


def live_migratable_here(uri: str) -> tuple[bool, str]:
    """(whether to print ``live_migratable``, why not): this host's libvirt
    and QEMU, as ``[libvirt] uri`` reports them, against Nova's floor."""
    if not uri:
        return False, "no [libvirt] uri, so the libvirt and QEMU versions Nova needs for it " \
            f"({NOVA_LIVE_MIGRATABLE_FLOOR}) cannot be checked"
    from accel_agent.migration import versions

    try:
        found = versions.probe_uri(uri)
    except Exception as exc:  # libvirt unreachable or missing: not known, so no tag
        return False, f"libvirt at {uri} cannot be asked its versions ({exc})"
    if found.libvirt >= NOVA_LIVE_MIGRATABLE_LIBVIRT and found.qemu >= NOVA_LIVE_MIGRATABLE_QEMU:
        return True, ""
    return False, (
        f"this host has libvirt {versions.text(found.libvirt)} and QEMU "
        f"{versions.text(found.qemu)}; nova-compute refuses the tag below "
        f"{NOVA_LIVE_MIGRATABLE_FLOOR}"
    )


def device_spec(spec: VfSpec, live_migratable: bool = True) -> dict[str, str]:
    """One ``[pci] device_spec`` value (a JSON object in nova.conf)."""
    value = {"address": spec.address, "managed": "no", "resource_class": spec.resource_class}
    if live_migratable:
        value["live_migratable"] = LIVE_MIGRATABLE
    return value


def alias(mdev_type: str, resource_class: str, live_migratable: bool = True) -> dict[str, str]:
    """One ``[pci] alias`` value (a JSON object in nova.conf)."""
    value = {"name": mdev_type, "device_type": "type-VF", "resource_class": resource_class}
    if live_migratable:
        value["live_migratable"] = LIVE_MIGRATABLE
    return value


def aliases(specs: list[VfSpec], live_migratable: bool = True) -> list[dict[str, str]]:
    """The aliases ``specs`` need: one per type, sorted."""
    return [
        alias(*pair, live_migratable=live_migratable)
        for pair in sorted({(s.mdev_type, s.resource_class) for s in specs})
    ]


def device_spec_line(spec: VfSpec, live_migratable: bool = True) -> str:
    return "device_spec = " + json.dumps(device_spec(spec, live_migratable))


def alias_line(mdev_type: str, resource_class: str, live_migratable: bool = True) -> str:
    return "alias = " + json.dumps(alias(mdev_type, resource_class, live_migratable))


def render(specs: list[VfSpec], host: str, live_migratable: bool = True,
           why_not: str = "") -> str:
    """The ``[pci]`` section as nova.conf takes it."""
    lines = [
        f"# Nova [pci] lines for the vendor-VFIO vGPUs of {host}, from accelctl nova-pci-config.",
        "# managed=no: the VF stays bound to nvidia (libvirt must not rebind it).",
        "# Needs [pci] report_in_placement = True for the resource classes to be used.",
        # Nova 34's alias check (pci/request.py, _validate_required_ids): an
        # alias without vendor_id/product_id is refused unless this is set.
        "# And [filter_scheduler] pci_in_placement = True where nova-api and nova-scheduler "
        "run (Nova refuses an alias with only a resource_class otherwise).",
        "# live_migratable=yes: nova-compute (Nova 34) then needs "
        f"{NOVA_LIVE_MIGRATABLE_FLOOR} to start."
        if live_migratable else f"# No live_migratable tag: {why_not}.",
    ]
    if not specs:
        lines.append("# (no typed VF: nothing to pass through; try --per-gpu N)")
    lines.append("[pci]")
    for spec in specs:
        # A comment of its own line: oslo.config keeps an inline "# ..." in the
        # value, and Nova would then fail to parse the JSON.
        if not spec.typed:
            lines.append(f"# {spec.address}: not typed yet (the agent types it when asked)")
        lines.append(device_spec_line(spec, live_migratable))
    for mdev_type, resource_class in sorted({(s.mdev_type, s.resource_class) for s in specs}):
        lines.append(alias_line(mdev_type, resource_class, live_migratable))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class NovaPciFile:
    """What a nova.conf's ``[pci]`` section says: device specs by address
    (the ones that name one) and aliases by name."""

    specs: Mapping[str, Mapping[str, object]]
    aliases: Mapping[str, Mapping[str, object]]
    problems: tuple[str, ...]


_SECTION = re.compile(r"\[\s*([^\]]+?)\s*\]")


def parse_nova_conf(text: str, name: str = "nova.conf") -> NovaPciFile:
    """The ``[pci] device_spec`` and ``alias`` values of a nova.conf.

    Both options are multi-valued (one per line, repeated); each value is a
    JSON object (Nova also takes a JSON list of objects).  The older name
    ``passthrough_whitelist`` counts as ``device_spec``.  What cannot be
    read is reported by line, never guessed."""
    specs: dict[str, Mapping[str, object]] = {}
    aliases: dict[str, Mapping[str, object]] = {}
    problems: list[str] = []
    section = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = _SECTION.fullmatch(line)
        if header:
            section = header.group(1).lower()
            continue
        if section != "pci" or "=" not in line:
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        if key not in ("device_spec", "passthrough_whitelist", "alias"):
            continue
        try:
            decoded = json.loads(value)
        except ValueError as exc:
            problems.append(f"{name}:{number}: {key} is not JSON ({exc.msg})")
            continue
        for entry in decoded if isinstance(decoded, list) else [decoded]:
            if not isinstance(entry, dict):
                problems.append(f"{name}:{number}: {key} entry is not a JSON object")
            elif key == "alias":
                aliases[str(entry.get("name"))] = entry
            elif isinstance(entry.get("address"), str):
                specs[entry["address"].lower()] = entry
    return NovaPciFile(specs=specs, aliases=aliases, problems=tuple(problems))


def drift(
    expected: list[VfSpec],
    found: NovaPciFile,
    vf_addresses: Iterable[str],
    agent_reported: Mapping[str, str] | None = None,
) -> list[str]:
    """Where the file and the host disagree, one line each (empty: none).

    ``vf_addresses``: every vendor-VFIO VF of the host, so that a spec for
    a VF the agent did not type is told apart from one for no VF at all.
    ``agent_reported``: VF -> its GPU, for the VFs whose GPU the agent reports
    to Placement itself (``[mdev_<type>] reported_by = agent``): Nova would
    count such a GPU a second time."""
    problems = list(found.problems)
    twice: dict[str, list[str]] = {}
    for address in found.specs:
        gpu = (agent_reported or {}).get(address)
        if gpu is not None:
            twice.setdefault(gpu, []).append(address)
    for gpu, vfs in sorted(twice.items()):
        problems.append(
            f"GPU {gpu} would be counted twice: [pci] device_spec gives Nova its VF(s) "
            f"{', '.join(sorted(vfs))}, and the agent reports the GPU to Placement too; set "
            "[mdev_<type>] reported_by = nova (with a standing layout) for its type"
        )
    known_vfs = set(vf_addresses)
    wanted = {spec.address: spec for spec in expected}
    for address, spec in sorted(wanted.items()):
        entry = found.specs.get(address)
        if entry is None:
            problems.append(f"{address} ({spec.mdev_type}) is not in [pci] device_spec")
            continue
        if str(entry.get("managed", "yes")).lower() not in ("no", "false"):
            problems.append(
                f"{address}: device_spec must say \"managed\": \"no\" (the VF stays on nvidia)"
            )
        if entry.get("resource_class") != spec.resource_class:
            problems.append(
                f"{address}: resource_class is {entry.get('resource_class')!r}, "
                f"the host's type {spec.mdev_type} needs {spec.resource_class!r}"
            )
    for address in sorted(set(found.specs) - set(wanted)):
        if address in known_vfs:
            problems.append(
                f"{address} is in [pci] device_spec but is not a vGPU the agent typed"
            )
        else:
            problems.append(f"{address} is in [pci] device_spec but is no vGPU VF of this host")
    by_class = {alias.get("resource_class"): name for name, alias in found.aliases.items()}
    for resource_class in sorted({spec.resource_class for spec in expected}):
        if resource_class not in by_class:
            problems.append(f"no [pci] alias requests resource_class {resource_class!r}")
    return problems
