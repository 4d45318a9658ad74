"""Every option of the agent, registered from one place.

Each room declares its options in its own module; the one table of them is
:func:`rooms`, in the order of the sample config, ending with the option
modules of the installed device backends (:func:`backend_rooms`: the one
hook by which a backend, in this package or another, brings options of its
own, ``DeviceBackend.opts``).  From it:

* :func:`list_opts`: every room's options, for ``oslo-config-generator``
  (the ``accel_agent`` namespace of pyproject.toml's ``oslo.config.opts``
  entry points and etc/oslo-config-generator/accel-agent.conf) and the
  generated docs/config.md;
* :func:`register`: everything a process of the agent reads, on one
  ConfigOpts, idempotent: the rooms' options, oslo.log's, the options of the
  keystoneauth plugin ``[placement] auth_type`` names, and the per-name
  groups (``[mdev_<type>]``, ``[vf_pool_<name>]``) of the enabled names.  The
  daemon calls it before it parses its files; ``check-config``, the start
  and every reload through the value check (config/values.py), once the
  enabled names are known;
* :func:`register_room`, :func:`register_backend`: one room's options
  alone (a backend's, before it reads them: ``accelctl`` acting directly
  registers only the core's).

A room is a module with ``list_opts()`` (its groups as the sample lists
them, a per-name group as its stand-in: ``[vf_pool_$(pool)]``) and, when it
has any, ``registered_opts()`` (what a process registers, where the sample
differs) and ``named_opts(conf)`` (the per-name groups of the names ``conf``
enables).  Two rooms may list the same group (the ``sriov_vf`` backend's
``enabled_vf_pools`` is in ``[devices]``): :func:`list_opts` gives it once,
its options in the rooms' order.

The core's options alone (what every command reads, cheaply) are
config/options.py's :func:`~accel_agent.config.options.register_opts`.  No
module outside the configuration room registers an option
(tests/unit/test_house.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from types import ModuleType
from typing import Any

from oslo_config import cfg

from accel_agent.config import options

# The generator's namespace of oslo.log (etc/oslo-config-generator/accel-agent.conf).
OSLO_LOG = "oslo.log"

Groups = list[tuple[str | None, list[cfg.Opt]]]


def rooms() -> tuple[ModuleType, ...]:
    """The one table: the module of each room that declares options, each
    with ``list_opts()`` (the sample's groups) and, where a process
    registers other options than the sample lists, ``registered_opts()``.
    Imported when asked for: privileged pulls in oslo.privsep, the
    reporter keystoneauth1."""
    from accel_agent import privileged
    from accel_agent.migration import opts as migration_opts
    from accel_agent.nvml import opts as nvml_opts
    from accel_agent.reporting import placement_opts

    return (
        options, privileged, migration_opts, placement_opts, nvml_opts, *backend_rooms()
    )


def backend_rooms() -> tuple[ModuleType, ...]:
    """The option modules of the installed device backends: each backend
    class registered under the ``accel_agent.backends`` entry points names
    its own (``DeviceBackend.opts``, a dotted module name, or None), in the
    entry points' name order, each module once.

    Found through the entry points, never imported by name: the
    configuration room knows no backend (the ``sriov_vf`` backend's pools
    read their options through it: tests/unit/test_house.py).  A backend
    class that cannot be loaded is left out here; loading the backends
    refuses it, naming it (``accel_agent.backends.classes``)."""
    from importlib.metadata import entry_points

    from accel_agent.backends.base import NAMESPACE

    found: dict[str, ModuleType] = {}
    for point in sorted(entry_points(group=NAMESPACE), key=lambda p: p.name):
        try:
            backend = point.load()
        except Exception:  # named, refused, by the backends' loading
            continue
        room = backend_room(backend)
        if room is not None:
            found.setdefault(room.__name__, room)
    return tuple(found.values())


def backend_room(backend: type) -> ModuleType | None:
    """The module that declares ``backend``'s options (the class attribute
    ``opts`` names it), or None when it declares none."""
    from importlib import import_module

    name = getattr(backend, "opts", None)
    return import_module(name) if isinstance(name, str) and name else None


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """Every room's options (``oslo-config-generator``'s ``accel_agent``
    namespace), a group two rooms list given once: the generator would
    print it twice (its "From accel_agent" header each time)."""
    merged: dict[str, list[cfg.Opt]] = {}
    for room in rooms():
        for group, opts in room.list_opts():
            merged.setdefault(group, []).extend(opts)
    return list(merged.items())


@cache
def oslo_log_opts() -> Groups:
    """oslo.log's options, as its ``oslo.config.opts`` entry point lists
    them (the sample's ``oslo.log`` namespace)."""
    from importlib.metadata import entry_points

    (point,) = (p for p in entry_points(group="oslo.config.opts") if p.name == OSLO_LOG)
    return point.load()()


def register(conf: cfg.ConfigOpts) -> None:
    """Register on ``conf`` every option a process of the agent reads
    (idempotent; before or after parsing): every room's options (the
    sample's stand-ins for the per-name groups left out), oslo.log's,
    ``[placement]``'s auth options with those of the plugin ``auth_type``
    names, and the per-name groups of the enabled mdev types and of every
    room's enabled names (the VF pools': none before parsing, the names are
    read from the files)."""
    for room in rooms():
        register_room(conf, room)
    register_groups(conf, oslo_log_opts())
    enabled_types = _read_or_none(lambda: list(conf.devices.enabled_mdev_types or []))
    options.register_dynamic_opts(conf, enabled_types or [])
    _register_auth(conf)


def register_room(conf: cfg.ConfigOpts, room: ModuleType, named: bool = True) -> None:
    """Register on ``conf`` the options of one room (idempotent): its groups,
    the sample's stand-ins for the per-name groups left out, and, with
    ``named``, the per-name groups of the names ``conf`` enables (the
    room's ``named_opts``; none before parsing, or while the names cannot
    be read: the value check reports that)."""
    groups = getattr(room, "registered_opts", room.list_opts)()
    register_groups(conf, [(group, opts) for group, opts in groups if "$(" not in group])
    named_opts = getattr(room, "named_opts", None)
    if named and named_opts is not None:
        register_groups(conf, _read_or_none(lambda: named_opts(conf)) or [])


def register_groups(conf: cfg.ConfigOpts, groups: Groups) -> None:
    """Register on ``conf`` the options of ``groups`` it lacks."""
    for group, opts in groups:
        _register_missing(conf, group, opts)


def register_backend(conf: cfg.ConfigOpts, backend: type) -> None:
    """Register on ``conf`` the options of one device backend (its room:
    :func:`backend_room`), before it reads them (wiring.build_backends)."""
    room = backend_room(backend)
    if room is not None:
        register_room(conf, room)


def _register_missing(conf: cfg.ConfigOpts, group: str | None, opts: Iterable[cfg.Opt]) -> None:
    """Register the options ``conf`` lacks, as plain (file) options: after the
    command line was parsed oslo.config takes no more CLI options, and the
    agent gives oslo.config no command-line values anyway."""
    section = None if group in (None, "DEFAULT") else group
    for opt in opts:
        # "in" on a ConfigOpts or a group looks at names only, never a value.
        if section is None and opt.dest in conf:
            continue
        if section is not None and section in conf and opt.dest in conf[section]:
            continue
        conf.register_opt(opt, group=section)


def _read_or_none(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # reported by the value check with the rest
        return None


def _register_auth(conf: cfg.ConfigOpts) -> None:
    """``[placement] auth_type`` and ``auth_section`` as keystoneauth
    registers them, and the options keystoneauth registers when it loads the
    plugin (equal to the ones registered here, so its own registration later
    is a no-op), in the section ``auth_section`` names when it names one."""
    from keystoneauth1 import loading as ks_loading

    from accel_agent.reporting.placement_opts import GROUP

    ks_loading.register_auth_conf_options(conf, GROUP)
    section = _read_or_none(lambda: conf[GROUP].auth_section) or GROUP
    if section != GROUP:
        ks_loading.register_auth_conf_options(conf, section)
    plugin = _read_or_none(lambda: conf[section].auth_type)
    if not plugin:
        return
    try:
        opts = ks_loading.get_auth_plugin_conf_options(plugin)
    except Exception:  # an unknown plugin: build_adapter names it at start-up
        return
    _register_missing(conf, section, opts)
