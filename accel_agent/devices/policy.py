"""Which mdev type goes on which parent: Nova's semantics, made stricter.

Nova (docs/design.md §3.2; nova/virt/libvirt/driver.py
``_get_supported_vgpu_types``) walks ``enabled_mdev_types`` in order: a type
with ``device_addresses`` applies to exactly those parents; the first type
without addresses is the default for every other parent; later address-less
types are ignored with a warning; one address given twice refuses to start.

What we do better (docs/design.md §3.3): addresses are normalised (case, ``BB:SS.F``)
before matching and before the duplicate check, the duplicate message names
both types, every error is collected so ``check-config`` prints them all, and
the default type's ``mdev_class`` is honoured (Nova reports it as VGPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.devices.gpu_layout_config import (
    LayoutOptions,
    read_layout_options,
    resolve_layouts,
)
from accel_agent.devices.gpu_layouts import SECTION_PREFIX, GpuLayout
from accel_agent.devices.requests import is_type_name
from accel_agent.sysfs import address
from accel_agent.sysfs.model import HostSnapshot, Parent
from accel_agent.sysfs.scanner import MDEV_BUS

if TYPE_CHECKING:
    from oslo_config import cfg

LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TypeConfig:
    mdev_type: str
    # Normalised parent names (PCI addresses lower-case long form).
    device_addresses: tuple[str, ...]
    mdev_class: str
    max_instances: int | None
    # [mdev_<type>] standing: devices each GPU of the type carries at all times.
    standing: int = 0
    # [mdev_<type>] reported_by: "agent" or "nova" (Nova reports and assigns them).
    reported_by: str = "agent"

    @property
    def nova_reports(self) -> bool:
        return self.reported_by == "nova"


@dataclass(frozen=True, slots=True)
class DevicePolicy:
    # Effective types in configured order; ignored address-less types are
    # not here (Nova drops them from its supported list too).
    types: tuple[TypeConfig, ...] = ()
    parent_types: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    default_type: str | None = None
    warnings: tuple[str, ...] = ()
    # [gpu_layout_<name>] sections: mixed-size layouts (devices/gpu_layouts.py).
    gpu_layouts: tuple[GpuLayout, ...] = ()

    def type_for(self, parent: Parent | str) -> str | None:
        """The configured type of a parent, explicit or default.

        A vendor-VFIO VF (a parent whose backend is not ``mdev``) is configured
        through its GPU: ``device_addresses`` names PFs, as operators know
        their cards, unless the VF itself is listed."""
        key = parent if isinstance(parent, str) else (parent.pci_address or parent.name)
        key = address.normalise_parent(key)
        found = self.parent_types.get(key)
        if found is not None:
            return found
        if (
            not isinstance(parent, str)
            and parent.backend != "mdev"
            and parent.physfn is not None
            and parent.physfn in self.parent_types
        ):
            return self.parent_types[parent.physfn]
        if self.gpu_layout_for(parent) is not None:
            # A layout's GPU carries several types (types_on): no single
            # one, and never the default type of the unlisted parents.
            return None
        return self.default_type

    def types_on(self, parent: Parent | str) -> tuple[str, ...]:
        """Every type the configuration gives the parent: its mixed-size
        layout's types, or its one type (:meth:`type_for`), or none."""
        layout = self.gpu_layout_for(parent)
        if layout is not None:
            return layout.types
        found = self.type_for(parent)
        return (found,) if found is not None else ()

    def type_for_name(self, name: str, parents: Mapping[str, Parent]) -> str | None:
        """:meth:`type_for` of the parent called ``name`` as the scan found
        it (so a VF finds its PF's type), or of the bare name when it is gone."""
        return self.type_for(parents.get(name, name))

    def config_of(self, mdev_type: str) -> TypeConfig | None:
        return next((t for t in self.types if t.mdev_type == mdev_type), None)

    def standing_for(self, parent: Parent | str) -> tuple[str, int] | None:
        """(type, N) when the parent's configured type has a standing layout."""
        mdev_type = self.type_for(parent)
        config = self.config_of(mdev_type) if mdev_type else None
        if config is None or config.standing <= 0:
            return None
        return config.mdev_type, config.standing

    def gpu_layout_for(self, parent: Parent | str) -> GpuLayout | None:
        """The mixed-size layout of the parent's GPU: a PF a layout names in
        ``gpus``, or a VF of one."""
        if not self.gpu_layouts:
            return None
        keys = {address.normalise_parent(parent if isinstance(parent, str)
                                         else (parent.pci_address or parent.name))}
        if not isinstance(parent, str) and parent.physfn is not None:
            keys.add(parent.physfn)
        return next((g for g in self.gpu_layouts if keys & set(g.gpus)), None)

    def wanted_on(self, parent: Parent | str) -> tuple[tuple[str, int], ...]:
        """What the parent's GPU carries at all times, ``(type, count)``
        each: its mixed-size layout's vGPUs, or its standing layout, or
        nothing."""
        layout = self.gpu_layout_for(parent)
        if layout is not None:
            return layout.vgpus
        found = self.standing_for(parent)
        return (found,) if found is not None else ()

    def reported_by_nova(self, mdev_type: str | None) -> bool:
        config = self.config_of(mdev_type) if mdev_type else None
        return config is not None and config.nova_reports

    def nova_reports_on(self, parent: Parent | str, mdev_type: str | None) -> bool:
        """Whether Nova reports and assigns the parent's devices of
        ``mdev_type``: its GPU's layout's ``reported_by``, or the type's."""
        layout = self.gpu_layout_for(parent)
        if layout is not None:
            return layout.nova_reports
        return self.reported_by_nova(mdev_type)

    @property
    def any_nova_reports(self) -> bool:
        return any(t.nova_reports for t in self.types) or any(
            g.nova_reports for g in self.gpu_layouts)

    @property
    def enabled(self) -> bool:
        return bool(self.types)


def _virtual_parent_name(sysfs_root: str, name: str) -> str | None:
    """Resolve a configured non-PCI parent: ``mtty`` (our form, the mdev_bus
    link name) or Nova's libvirt form ``mtty_mtty`` (devices/virtual/mtty/mtty)."""
    if not address.is_virtual_parent_name(name):
        return None
    if os.path.lexists(os.path.join(sysfs_root, MDEV_BUS, name)):
        return name
    virtual = os.path.join(sysfs_root, "devices", "virtual", *name.split("_"))
    if "_" in name and os.path.isdir(virtual):
        return os.path.basename(virtual)
    return None


@dataclass(frozen=True, slots=True)
class TypeOptions:
    """One ``[mdev_<type>]`` group as written (addresses not yet normalised)."""

    mdev_type: str
    device_addresses: tuple[str, ...] = ()
    mdev_class: str = "VGPU"
    max_instances: int | None = None
    standing: int = 0
    reported_by: str = "agent"


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """What the configuration says about types, before it meets the host:
    oslo.config's answer, as plain data (the read-only listings keep it in a
    cache so that they need not import oslo.config; see config_cache.py)."""

    enabled: tuple[str, ...] = ()
    type_options: tuple[TypeOptions, ...] = ()
    # Every section of the config files, for the unused-section warnings.
    sections: tuple[str, ...] = ()
    # [devices] enabled_gpu_layouts, and each enabled [gpu_layout_<name>].
    enabled_layouts: tuple[str, ...] = ()
    layout_options: tuple[LayoutOptions, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": list(self.enabled),
            "type_options": [
                [t.mdev_type, list(t.device_addresses), t.mdev_class, t.max_instances,
                 t.standing, t.reported_by]
                for t in self.type_options
            ],
            "sections": list(self.sections),
            "enabled_layouts": list(self.enabled_layouts),
            "layout_options": [o.to_list() for o in self.layout_options],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyInputs:
        return cls(
            enabled=tuple(str(t) for t in data["enabled"]),
            type_options=tuple(
                TypeOptions(
                    str(t),
                    tuple(str(a) for a in addresses),
                    str(mdev_class),
                    None if max_instances is None else int(max_instances),
                    int(standing),
                    str(reported_by),
                )
                for t, addresses, mdev_class, max_instances, standing, reported_by
                in data["type_options"]
            ),
            sections=tuple(str(s) for s in data["sections"]),
            enabled_layouts=tuple(str(n) for n in data.get("enabled_layouts", ())),
            layout_options=tuple(
                LayoutOptions.from_list(o) for o in data.get("layout_options", ())),
        )


def _read_type_options(
    conf: cfg.ConfigOpts, mdev_type: str, errors: list[exception.AccelAgentException]
) -> TypeOptions:
    group_name = f"mdev_{mdev_type}"
    group = conf[group_name]

    def read(option: str, default: Any, refused: Callable[[str], Any]) -> Any:
        """The option's value; a value oslo.config refuses is one error
        (``refused(raw)``, naming what was written) and the default."""
        from oslo_config import cfg

        try:
            return getattr(group, option)
        except (ValueError, cfg.ConfigFileValueError):
            errors.append(refused(_raw_value(conf, group_name, option)))
            return default

    def invalid(option: str, rule: str) -> Callable[[str], Any]:
        return lambda raw: exception.InvalidMdevConfig(
            reason=f"{option} {raw} of type {mdev_type} must be {rule}"
        )

    return TypeOptions(
        mdev_type,
        tuple(group.device_addresses or []),
        read("mdev_class", "VGPU",
             lambda raw: exception.InvalidMdevClass(mdev_class=raw, mdev_type=mdev_type)),
        read("max_instances", None, invalid("max_instances", "an integer >= 1")),
        read("standing", 0, invalid("standing", "an integer from 0 to 65535")),
        read("reported_by", "agent", invalid("reported_by", "agent or nova")),
    )


def _raw_value(conf: cfg.ConfigOpts, group: str, option: str) -> str:
    """The value as written in the file, for error messages."""
    # oslo.config's validation error does not always carry the value; the
    # parsed namespace does (last file wins, like oslo.config itself).
    try:
        values, _location = conf._namespace._get_file_value([(group, option)])
        return str(values[-1] if isinstance(values, list) else values)
    except Exception:  # pragma: no cover - best effort for a message only
        return "(unreadable)"


def read_policy_inputs(
    conf: cfg.ConfigOpts,
) -> tuple[PolicyInputs, list[exception.AccelAgentException]]:
    """The type options of a loaded oslo.config object, and the values it
    refused (each an error naming the value and the type)."""
    from accel_agent.config import options as agent_conf

    enabled = tuple(conf.devices.enabled_mdev_types or [])
    agent_conf.register_dynamic_opts(conf, enabled)
    errors: list[exception.AccelAgentException] = []
    options = tuple(_read_type_options(conf, t, errors) for t in dict.fromkeys(enabled))
    try:
        sections = tuple(conf.list_all_sections())
    except Exception:  # pragma: no cover - not parsed from files
        sections = ()
    layouts_enabled, layout_options = read_layout_options(conf, errors)
    return PolicyInputs(enabled, options, sections, layouts_enabled, layout_options), errors


def build_policy(conf: cfg.ConfigOpts | None = None) -> DevicePolicy:
    """Resolve the configuration into a :class:`DevicePolicy`.

    Raises ConfigErrors listing every error.  Needs the sysfs root only to
    accept virtual parent names (``mtty``), like Nova's check of
    ``/sys/devices/virtual``.
    """
    if conf is None:
        from accel_agent.config import options as agent_conf

        conf = agent_conf.CONF
    inputs, errors = read_policy_inputs(conf)
    return resolve_policy(inputs, conf.sysfs_root, errors)


def resolve_policy(
    inputs: PolicyInputs,
    sysfs_root: str,
    errors: list[exception.AccelAgentException] | None = None,
) -> DevicePolicy:
    """Nova's semantics over plain inputs; raises ConfigErrors with every
    error (``errors`` are those found while reading the options)."""
    errors = list(errors or [])
    warnings: list[str] = []
    types: list[TypeConfig] = []
    owner_of: dict[str, str] = {}
    default_type: str | None = None
    seen_types: set[str] = set()
    options = {t.mdev_type: t for t in inputs.type_options}
    errors += _unusable_type_names(inputs.enabled)
    # Types a mixed-size layout places: kept even when a later address-less
    # type would be dropped (the layout is where they are used).
    layout_types = {
        t for o in inputs.layout_options for item in o.vgpus
        if (t := item.rpartition(":")[0].strip())
    }

    for mdev_type in inputs.enabled:
        if mdev_type in seen_types:
            continue
        seen_types.add(mdev_type)
        if (count := inputs.enabled.count(mdev_type)) > 1:
            # Stricter than a warning: which of the two places did the
            # operator mean?  (Nova refuses it too.)
            errors.append(exception.DuplicateMdevType(mdev_type=mdev_type, count=count))
        option = options.get(mdev_type, TypeOptions(mdev_type))
        mdev_class, max_instances = option.mdev_class, option.max_instances
        layout = {"standing": option.standing, "reported_by": option.reported_by}
        if option.reported_by == "nova" and option.standing <= 0:
            errors.append(
                exception.InvalidMdevConfig(
                    reason=f"[mdev_{mdev_type}] reported_by = nova needs standing >= 1: Nova "
                    "hands out only devices that exist, and the agent makes them only for a "
                    "standing layout"
                )
            )
        if not option.device_addresses:
            if default_type is None:
                default_type = mdev_type
                types.append(TypeConfig(mdev_type, (), mdev_class, max_instances, **layout))
            elif mdev_type in layout_types:
                types.append(TypeConfig(mdev_type, (), mdev_class, max_instances, **layout))
            else:
                warnings.append(
                    f"Mdev type default already set to {default_type} so {mdev_type} "
                    "will not be used."
                )
            continue
        parents: list[str] = []
        for raw in option.device_addresses:
            parent = _normalise_configured(sysfs_root, raw, mdev_type, errors)
            if parent is None:
                continue
            if parent in owner_of:
                errors.append(
                    exception.DuplicateDeviceAddress(
                        address=parent, first_type=owner_of[parent], second_type=mdev_type
                    )
                )
                continue
            owner_of[parent] = mdev_type
            parents.append(parent)
        types.append(
            TypeConfig(mdev_type, tuple(parents), mdev_class, max_instances, **layout)
        )

    gpu_layouts, layout_errors = resolve_layouts(
        inputs.enabled_layouts, inputs.layout_options, inputs.enabled, owner_of,
        {t.mdev_type: t.standing for t in inputs.type_options},
    )
    errors += layout_errors
    warnings.extend(_unused_sections(inputs.sections, set(inputs.enabled),
                                     set(inputs.enabled_layouts)))
    if errors:
        raise exception.ConfigErrors(errors)
    for warning in warnings:
        LOG.warning("%s", warning)
    return DevicePolicy(
        types=tuple(types),
        parent_types=MappingProxyType(owner_of),
        default_type=default_type,
        warnings=tuple(warnings),
        gpu_layouts=gpu_layouts,
    )


def _unusable_type_names(enabled: tuple[str, ...]) -> list[exception.AccelAgentException]:
    """Types that cannot be a sysfs directory name (``/``, ``..``, blanks,
    an empty item from ``a,,b``): no parent could offer them, and the
    name would become part of a path.  Each is named (escaped)."""
    errors: list[exception.AccelAgentException] = []
    for name in dict.fromkeys(enabled):
        if name in (".", "..") or not is_type_name(name):
            what = "an empty item (a stray comma?)" if not name else f"type {name!r}"
            errors.append(
                exception.InvalidMdevConfig(
                    reason=f"{what} in [devices] enabled_mdev_types is no mdev type name: a type "
                    "is a sysfs directory name of letters, digits, '_', '.' and '-' (at most "
                    "64), not '.' or '..'"
                )
            )
    return errors


def _normalise_configured(
    sysfs_root: str, raw: str, mdev_type: str, errors: list[exception.AccelAgentException]
) -> str | None:
    text = raw.strip()
    if not text:
        # "a,,b": a stray comma, or an address lost in an edit.
        errors.append(
            exception.InvalidDeviceAddress(
                address="''",
                where=f" (an empty item in [mdev_{mdev_type}] device_addresses; "
                "remove the extra comma)",
            )
        )
        return None
    if address.is_pci_address(text):
        return address.parse_pci_address(text)
    virtual = _virtual_parent_name(sysfs_root, text)
    if virtual is not None:
        return virtual
    errors.append(
        exception.InvalidDeviceAddress(
            address=raw,
            where=f" (in [mdev_{mdev_type}] device_addresses; expected a PCI address such "
            "as 0000:84:00.0 or 84:00.0, or the name of a virtual mdev parent under "
            f"{os.path.join(sysfs_root, MDEV_BUS)})",
        )
    )
    return None


def _unused_sections(
    sections: tuple[str, ...], enabled: set[str], layouts: set[str] = frozenset()
) -> list[str]:
    """``[mdev_X]`` sections for types that are not enabled are silently
    ignored by Nova; say so instead.  So for a ``[gpu_layout_X]`` that
    ``[devices] enabled_gpu_layouts`` does not name."""
    found = []
    for section in sections:
        if "$(" in section:
            continue  # the sample's stand-in [mdev_$(mdev_type)]; config_lint names its options
        if section.startswith(SECTION_PREFIX):
            if section[len(SECTION_PREFIX):] not in layouts:
                found.append(f"section [{section}] is ignored: layout "
                             f"{section[len(SECTION_PREFIX):]} is not in [devices] "
                             "enabled_gpu_layouts")
            continue
        for prefix in ("mdev_", "vgpu_"):
            if section.startswith(prefix) and section[len(prefix) :] not in enabled:
                found.append(
                    f"section [{section}] is ignored: type {section[len(prefix) :]} is not in "
                    "[devices] enabled_mdev_types"
                )
    return sorted(set(found))


def host_warnings(policy: DevicePolicy, snapshot: HostSnapshot) -> list[str]:
    """What the config says that the host cannot honour (warnings; errors
    under ``--strict``): addresses that are no mdev parent, each with the
    verdict ``accelctl explain`` gives it and its next step, and default
    types that no parent offers.  A listed parent that lacks its type is
    reported by the inventory, which skips it."""
    warnings: list[str] = []
    by_key = {(p.pci_address or p.name): p for p in snapshot.parents.values()}
    # A vendor-VFIO GPU is configured by its PF address; its VFs are the parents.
    gpus = {p.physfn for p in snapshot.parents.values() if p.backend != "mdev"}
    for type_config in policy.types:
        for parent_name in type_config.device_addresses:
            parent = by_key.get(parent_name)
            if parent is None and parent_name not in gpus:
                warnings.append(
                    f"{parent_name} (configured for {type_config.mdev_type}) is not an "
                    f"mdev parent on this host: {_diagnosis(policy, snapshot, parent_name)}"
                )
        offered = any(
            type_config.mdev_type in p.types and policy.type_for(p) == type_config.mdev_type
            for p in snapshot.parents.values()
        )
        used_by_layouts = any(type_config.mdev_type in g.types for g in policy.gpu_layouts)
        if not offered and type_config.mdev_type == policy.default_type and not used_by_layouts:
            warnings.append(
                f"default type {type_config.mdev_type} is offered by no unlisted parent"
            )
    for layout in policy.gpu_layouts:
        for gpu in layout.gpus:
            if gpu not in gpus:
                warnings.append(
                    f"{gpu} (in [{layout.section}] gpus) has no vGPU VFs on this host: "
                    f"{_diagnosis(policy, snapshot, gpu)}"
                )
    return warnings


def _diagnosis(policy: DevicePolicy, snapshot: HostSnapshot, name: str) -> str:
    """Why ``name`` offers nothing, in ``accelctl explain``'s words."""
    from accel_agent import explain  # reads PCI facts: only when there is a warning

    return explain.diagnose(snapshot, name, explain.Asks.of(policy, None))
