"""Every option of the agent, registered from one place.

Each room declares its options in its own module; the one table of them is
:func:`rooms`, in the order of the sample config.  From it:

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
  enabled names are known.

The core's options alone (what every command reads, cheaply) are
config/options.py's :func:`~accel_agent.config.options.register_opts`.  No
module outside the configuration room registers an option
(tests/unit/test_house.py).
"""

from __future__ import annotations

import re
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

    return (options, privileged, migration_opts, placement_opts, nvml_opts)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """Every room's options (``oslo-config-generator``'s ``accel_agent``
    namespace)."""
    return [group for room in rooms() for group in room.list_opts()]


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
    names, and the per-name groups of the enabled mdev types and VF pools
    (none before parsing: the names are read from the files)."""
    for room in rooms():
        groups = getattr(room, "registered_opts", room.list_opts)()
        for group, opts in groups:
            if "$(" not in group:
                _register_missing(conf, group, opts)
    for group, opts in oslo_log_opts():
        _register_missing(conf, group, opts)
    enabled_types = _read_or_none(lambda: list(conf.devices.enabled_mdev_types or []))
    options.register_dynamic_opts(conf, enabled_types or [])
    pools = _read_or_none(lambda: list(conf.devices.enabled_vf_pools or [])) or []
    options.register_vf_pool_opts(
        conf, [p for p in pools if re.fullmatch(options.VF_POOL_NAME_REGEX, p)]
    )
    _register_auth(conf)


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
