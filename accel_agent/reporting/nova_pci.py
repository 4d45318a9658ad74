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
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple

from accel_agent import exception
from accel_agent.devices.policy import DevicePolicy
from accel_agent.sysfs.model import HostSnapshot, Mdev, Parent

BACKEND = "nvidia_vfio"
# The PCI vendor id of the vendor-VFIO GPUs (NVIDIA), as Nova's device_spec writes it.
NVIDIA_VENDOR = "10de"


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
    policy: DevicePolicy,
    owned: Iterable[str],
    per_gpu: int | None = None,
) -> list[VfSpec]:
    """The VFs Nova should be given: every VF the agent owns a typed vGPU
    on, and with ``per_gpu`` also the untyped VFs the agent would type next
    (in VF order, within the type's per-GPU limit) until each configured GPU
    has that many.  A VF typed by someone else is never offered.

    On a GPU of a mixed-size layout each VF is given under its own vGPU's
    type (its resource class), so one GPU carries several classes; a
    layout's VFs are typed at start, so ``per_gpu`` adds none there."""
    owned_set = set(owned)
    typed: dict[str, list[VfSpec]] = {}
    free: dict[str, list[VfSpec]] = {}
    limits: dict[str, int | None] = {}
    typed_vfs = {m.parent: m for m in snapshot.mdevs.values() if m.backend == BACKEND}
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        if parent.backend != BACKEND:
            continue
        layout_spec = _layout_vf(parent, policy, typed_vfs.get(parent.name), owned_set)
        if layout_spec is not False:
            if layout_spec is not None:
                typed.setdefault(parent.physical_gpu, []).append(layout_spec)
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


def _layout_vf(
    parent: Parent, policy: DevicePolicy, device: Mdev | None, owned: set[str]
) -> VfSpec | Literal[False] | None:
    """A VF of a mixed-size layout's GPU as Nova should be given it: under
    its own vGPU's type when the agent typed it with one of the layout's
    types; None when it is not to be given (untyped, another's, another
    type); False when its GPU has no layout."""
    layout = policy.gpu_layout_for(parent)
    if layout is None:
        return False
    if device is None or device.uuid not in owned or device.mdev_type not in layout.types:
        return None
    config = policy.config_of(device.mdev_type)
    if config is None:  # pragma: no cover - the policy keeps every layout type
        return None
    return VfSpec(
        address=parent.pci_address or parent.name,
        mdev_type=device.mdev_type,
        resource_class=resource_class_for(device.mdev_type, config.mdev_class),
        physical_gpu=parent.physical_gpu,
        typed=True,
    )


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
class SpecLine:
    """One ``[pci] device_spec`` value and where it is written."""

    value: Mapping[str, object]
    file: str
    line: int


@dataclass(frozen=True)
class NovaPciFile:
    """What a nova.conf's ``[pci]`` section says: device specs by address
    (the ones that name one) and aliases by name; ``entries``: every
    device_spec value with its file and line, in the file's order."""

    specs: Mapping[str, Mapping[str, object]]
    aliases: Mapping[str, Mapping[str, object]]
    problems: tuple[str, ...]
    entries: tuple[SpecLine, ...] = field(default=())


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
    entries: list[SpecLine] = []
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
            else:
                entries.append(SpecLine(entry, name, number))
                if isinstance(entry.get("address"), str):
                    specs[entry["address"].lower()] = entry
    return NovaPciFile(specs=specs, aliases=aliases, problems=tuple(problems),
                       entries=tuple(entries))


def read_nova_conf(path: str) -> NovaPciFile:
    """:func:`parse_nova_conf` of the file ``path``; a file that cannot be
    read (missing, a directory, not UTF-8 text) raises InvalidConfig naming
    it, so that every caller says the same."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise exception.InvalidConfig(reason=f"cannot read {path}: {exc}") from exc
    return parse_nova_conf(text, path)


# --- one GPU counted twice (issue 23) ----------------------------------------------------

_ANY = "*"
# Each part of a PCI address: (its width in hex digits, its largest value).
_PARTS = ((4, 0xFFFF), (2, 0xFF), (2, 0x1F), (1, 0x7))


def address_pattern(text: str) -> tuple[str, str, str, str] | None:
    """A device_spec's string ``address`` as Nova matches it (its glob form,
    nova/pci/devspec.py): ``[[[[domain]:]bus]:][slot][.[function]]``, each
    part hex or ``*``, a part left out or empty matching any; the parts
    normalised to the kernel's form (``C1`` and ``c1``, ``0`` and ``0000``
    are one).  None when it is not such an address (Nova refuses it)."""
    head, _, function = text.strip().partition(".")
    fields = head.split(":") if head else []
    if len(fields) > 3:
        return None
    raw = [_ANY] * (3 - len(fields)) + fields + [function]
    parts = []
    for value, (width, largest) in zip(raw, _PARTS, strict=True):
        value = value.strip() or _ANY
        if value != _ANY:
            try:
                number = int(value, 16)
            except ValueError:
                return None
            if not 0 <= number <= largest:
                return None
            value = f"{number:0{width}x}"
        parts.append(value)
    return parts[0], parts[1], parts[2], parts[3]


def _covers(pattern: tuple[str, ...], device: tuple[str, ...]) -> bool:
    return all(p in (_ANY, d) for p, d in zip(pattern, device, strict=True))


class ReportedVf(NamedTuple):
    """A VF whose GPU the agent reports to Placement itself."""

    gpu: str
    mdev_type: str
    # The VF's PCI ids as Nova compares them ("10de"), None when unknown.
    vendor_id: str | None = None
    product_id: str | None = None
    # The [gpu_layout_<name>] section of its GPU, None for a type's GPU.
    layout_section: str | None = None


class HostVf(NamedTuple):
    """A vendor-VFIO VF of the host as a device_spec is matched against it:
    its GPU (the PF) and its PCI ids ("10de"; None when unknown)."""

    gpu: str
    vendor_id: str | None = None
    product_id: str | None = None


def host_vfs(snapshot: HostSnapshot) -> dict[str, HostVf]:
    """Every vendor-VFIO VF of the host, typed or not, by address."""
    return {
        parent.pci_address or parent.name: HostVf(
            parent.physical_gpu, _pci_id(parent.vendor_id), _pci_id(parent.device_id)
        )
        for parent in snapshot.parents.values()
        if parent.backend == BACKEND
    }


def agent_reported(snapshot: HostSnapshot, policy: DevicePolicy) -> dict[str, ReportedVf]:
    """VF address -> its GPU, type and ids, for every vendor-VFIO VF whose
    configured type the agent reports to Placement itself
    (``[mdev_<type>] reported_by = agent``, the default)."""
    found = {}
    typed = {m.parent: m.mdev_type for m in snapshot.mdevs.values() if m.backend == BACKEND}
    for parent in snapshot.parents.values():
        if parent.backend != BACKEND:
            continue
        layout = policy.gpu_layout_for(parent)
        if layout is not None:
            # The agent reports the whole GPU: each VF under its vGPU's type
            # (the layout's first until the start typed it).
            if not layout.nova_reports:
                found[parent.pci_address or parent.name] = ReportedVf(
                    parent.physical_gpu, typed.get(parent.name) or layout.types[0],
                    _pci_id(parent.vendor_id), _pci_id(parent.device_id), layout.section)
            continue
        mdev_type = policy.type_for(parent)
        config = policy.config_of(mdev_type) if mdev_type else None
        if mdev_type is not None and config is not None and not config.nova_reports:
            found[parent.pci_address or parent.name] = ReportedVf(
                parent.physical_gpu, mdev_type, _pci_id(parent.vendor_id),
                _pci_id(parent.device_id),
            )
    return found


def _pci_id(value: object) -> str | None:
    """A vendor or product id as Nova's device_spec compares it: four hex
    digits, lower case ("0x10DE" and "10de" are one); None when it is none."""
    try:
        number = int(str(value).strip(), 16)
    except ValueError:
        return None
    return f"{number:04x}" if 0 <= number <= 0xFFFF else None


@dataclass(frozen=True)
class CountedTwice:
    """A GPU whose VFs Nova's device_spec lists while the agent reports the
    GPU to Placement itself: both would count its capacity."""

    gpu: str
    mdev_type: str
    vfs: tuple[str, ...]
    # The device_spec values that list them, in the order they are written.
    lines: tuple[SpecLine, ...]
    # The [gpu_layout_<name>] of the GPU, None for a type's GPU.
    layout_section: str | None = None

    def message(self) -> str:
        if self.layout_section is not None:
            return (
                f"GPU {self.gpu} ({self.mdev_type}) would be counted twice: [pci] device_spec "
                f"gives Nova its VF(s) {', '.join(self.vfs)}, and the agent reports the GPU "
                f"to Placement too; set [{self.layout_section}] reported_by = nova (Nova then "
                "reports it alone), or drop those device_spec lines"
            )
        return (
            f"GPU {self.gpu} ({self.mdev_type}) would be counted twice: [pci] device_spec "
            f"gives Nova its VF(s) {', '.join(self.vfs)}, and the agent reports the GPU to "
            f"Placement too; set [mdev_{self.mdev_type}] reported_by = nova with standing "
            ">= 1 (Nova then reports it alone), or drop those device_spec lines"
        )


class _Spec(NamedTuple):
    index: int
    address: tuple[str, str, str, str]
    vendor_id: str  # or _ANY
    product_id: str  # or _ANY


def _spec_of(index: int, value: Mapping[str, object]) -> _Spec | None:
    """A device_spec value as counted_twice compares it; None for one it
    cannot tell about (see :func:`not_by_address`) or that Nova refuses."""
    if "devname" in value:
        return None
    # Nova: no address (or an empty one) is any address.
    given = value.get("address") or ""
    address = address_pattern(given) if isinstance(given, str) else None
    ids = []
    for key in ("vendor_id", "product_id"):
        raw = value.get(key, _ANY)
        ids.append(_ANY if str(raw).strip() in (_ANY, "") else _pci_id(raw))
    if address is None or None in ids:
        return None
    return _Spec(index, address, ids[0], ids[1])


class SpecMatcher:
    """Which ``device_spec`` values name a VF, as Nova matches them
    (nova/pci/devspec.py, PciDeviceSpec.match): its address (the VF's own, a
    glob of it, or its GPU's full PF address; none: any) and its vendor and
    product ids where the value gives them.  One matcher serves
    :func:`counted_twice` and :func:`drift`, so that ``check-config
    --nova-conf`` and ``nova-pci-config --check`` read a line alike."""

    def __init__(self, entries: Iterable[SpecLine]) -> None:
        self.entries = list(entries)
        # A full address is looked up, only a glob is tried on every VF: a
        # thousand-GPU host's nova.conf lists thousands of VFs one by one.
        self._exact: dict[tuple[str, ...], list[_Spec]] = {}
        self._globs: list[_Spec] = []
        for index, entry in enumerate(self.entries):
            spec = _spec_of(index, entry.value)
            if spec is None:
                continue
            if _ANY in spec.address:
                self._globs.append(spec)
            else:
                self._exact.setdefault(spec.address, []).append(spec)

    def matching(self, vf: str, found: HostVf) -> list[int]:
        """The indexes of the entries that name ``vf``, in the file's order."""
        device = address_pattern(vf)
        if device is None:
            return []
        candidates = list(self._exact.get(device, ()))
        # The full address of a PF names every VF of it too (Nova's
        # WhitelistPciAddress.match): the GPU's own line.
        parent = address_pattern(found.gpu) if found.gpu else None
        if parent is not None and parent != device:
            candidates += self._exact.get(parent, ())
        candidates += [spec for spec in self._globs if _covers(spec.address, device)]
        return sorted({
            spec.index for spec in candidates
            if spec.vendor_id in (_ANY, found.vendor_id)
            and spec.product_id in (_ANY, found.product_id)
        })


def counted_twice(
    entries: Iterable[SpecLine], reported: Mapping[str, ReportedVf]
) -> list[CountedTwice]:
    """Every GPU counted twice: a VF of ``reported`` (see
    :func:`agent_reported`) that a device_spec value names as Nova matches
    it (:class:`SpecMatcher`); by GPU and type."""
    matcher = SpecMatcher(entries)
    vfs: dict[tuple[str, str], list[str]] = {}
    lines: dict[tuple[str, str], set[int]] = {}
    layouts: dict[tuple[str, str], str | None] = {}
    for vf, found in sorted(reported.items()):
        matching = matcher.matching(vf, HostVf(found.gpu, found.vendor_id, found.product_id))
        if matching:
            key = (found.gpu, found.mdev_type)
            vfs.setdefault(key, []).append(vf)
            lines.setdefault(key, set()).update(matching)
            layouts[key] = found.layout_section
    return [
        CountedTwice(gpu, mdev_type, tuple(vfs[gpu, mdev_type]),
                     tuple(matcher.entries[i] for i in sorted(lines[gpu, mdev_type])),
                     layouts[gpu, mdev_type])
        for gpu, mdev_type in sorted(vfs)
    ]


def not_by_address(entries: Iterable[SpecLine]) -> list[SpecLine]:
    """The device_spec values :func:`counted_twice` cannot tell about: a
    regex ``address`` object (Nova's other form), a ``devname`` (a network
    interface's name, resolved on the host by Nova)."""
    return [e for e in entries
            if "devname" in e.value or isinstance(e.value.get("address"), dict)]


def drift(
    expected: list[VfSpec],
    found: NovaPciFile,
    vfs: Mapping[str, HostVf],
    agent_reported: Mapping[str, ReportedVf] | None = None,
) -> list[str]:
    """Where the file and the host disagree, one line each (empty: none).

    ``vfs``: every vendor-VFIO VF of the host (:func:`host_vfs`), so that a
    spec for a VF the agent did not type is told apart from one for no VF at
    all.  A VF is listed by the first device_spec value Nova matches it with
    (:class:`SpecMatcher`: its own address, a glob, its GPU's PF address, ids),
    as Nova's whitelist takes the first spec that matches.
    ``agent_reported``: :func:`agent_reported`, the VFs whose GPU the agent
    reports to Placement itself (``[mdev_<type>] reported_by = agent``): Nova
    would count such a GPU a second time (:func:`counted_twice`)."""
    problems = list(found.problems)
    problems += [item.message() for item in counted_twice(found.entries, agent_reported or {})]
    matcher = SpecMatcher(found.entries)
    used: set[int] = set()
    wanted = {spec.address: spec for spec in expected}
    for address, spec in sorted(wanted.items()):
        matching = matcher.matching(address, vfs.get(address, HostVf(spec.physical_gpu)))
        if not matching:
            problems.append(f"{address} ({spec.mdev_type}) is not in [pci] device_spec")
            continue
        used.update(matching)
        entry = matcher.entries[matching[0]].value
        if str(entry.get("managed", "yes")).lower() not in ("no", "false"):
            problems.append(
                f"{address}: device_spec must say \"managed\": \"no\" (the VF stays on nvidia)"
            )
        if entry.get("resource_class") != spec.resource_class:
            problems.append(
                f"{address}: resource_class is {entry.get('resource_class')!r}, "
                f"the host's type {spec.mdev_type} needs {spec.resource_class!r}"
            )
    untyped: dict[int, list[str]] = {}
    for address, vf in sorted(vfs.items()):
        if address not in wanted:
            for index in matcher.matching(address, vf):
                untyped.setdefault(index, []).append(address)
    for index, entry in enumerate(matcher.entries):
        if index in used and index not in untyped:
            continue
        if _spec_of(index, entry.value) is None:
            continue  # a regex address or a devname: not compared (not_by_address)
        # A line naming one device by its full address is told in its words.
        address = _full_address(entry.value)
        if index in untyped:
            problems.append(
                f"{address} is in [pci] device_spec but is not a vGPU the agent typed"
                if untyped[index] == [address] else
                f"{entry.file}:{entry.line}: [pci] device_spec gives Nova VF(s) "
                f"{', '.join(untyped[index])}, which are not vGPUs the agent typed"
            )
        elif index not in used:
            problems.append(
                f"{address} is in [pci] device_spec but is no vGPU VF of this host"
                if address else
                f"{entry.file}:{entry.line}: [pci] device_spec "
                f"{json.dumps(dict(entry.value), sort_keys=True)} names no vGPU VF of this host"
            )
    by_class = {alias.get("resource_class"): name for name, alias in found.aliases.items()}
    for resource_class in sorted({spec.resource_class for spec in expected}):
        if resource_class not in by_class:
            problems.append(f"no [pci] alias requests resource_class {resource_class!r}")
    return problems


def _full_address(value: Mapping[str, object]) -> str | None:
    """The ``address`` of a device_spec value that names one device (no
    glob), in the kernel's form; None otherwise."""
    given = value.get("address")
    pattern = address_pattern(given) if isinstance(given, str) and given else None
    if pattern is None or _ANY in pattern:
        return None
    return f"{pattern[0]}:{pattern[1]}:{pattern[2]}.{pattern[3]}"
