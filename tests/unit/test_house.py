"""Which room may import which (issue 14, item 8), checked on the source.

The neutral rooms (manager, ledger, inventory, policy) name no device
model; a backend (and the sriov_vf backend's pool service, sriov/) uses the
sysfs reader and the privileged writer, never the manager; wiring.py, which
builds the backends, names none of them; the daemon does not reach into
the console scripts' room, and in that room accelctl's command modules meet
only in ctl.py's registration; nothing below the daemon imports the daemon;
the core's options and the ledger import no other room's; the configuration
room has no circle and registers every option from one place; the
privileged package and the ledger's are used through their facades only,
and what runs as root imports little.  Each rule lists the imports the package really has, so a
new arrow the wrong way fails here by name.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

from accel_agent.backends.base import DeviceBackend, DeviceWriter
from accel_agent.devices.ledger import Ledger
from accel_agent.devices.nodedevs import NodeDevices
from accel_agent.nvml.base import Nvml

PACKAGE = Path(__file__).resolve().parents[2] / "accel_agent"


@cache  # each rule reads the whole package: parse each module once
def _imports(path: Path) -> frozenset[str]:
    """Every module ``path`` imports, at any depth (function-level imports
    included: a lazy import is still an arrow)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(name for name in found if name.startswith("accel_agent"))


def _module_files(*relative: str) -> list[Path]:
    files: list[Path] = []
    for name in relative:
        path = PACKAGE / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def _outside(*relative: str) -> list[Path]:
    """Every module of the package but those of ``relative``."""
    inside = set(_module_files(*relative))
    return [path for path in _module_files(".") if path not in inside]


def _offenders(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in files
        for name in _imports(path)
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    )


DEVICE_MODELS = (
    "accel_agent.backends.mdev",
    "accel_agent.backends.nvidia_vfio",
    "accel_agent.sysfs.nvidia_vfio",
    "accel_agent.backends.sriov_vf",
    "accel_agent.sysfs.sriov",
    "accel_agent.sriov",
    "accel_agent.simulator",
)


@pytest.mark.parametrize(
    ("rooms", "forbidden"),
    [
        # The one decider drives backends through the interface only.
        (("devices",), DEVICE_MODELS),
        # A backend (and its service) is driven; it never decides, nor builds
        # itself into the agent.
        (
            ("backends", "sriov"),
            (
                "accel_agent.devices.manager",
                "accel_agent.wiring",
                "accel_agent.daemon",
                "accel_agent.service",
                "accel_agent.cmd",
            ),
        ),
        # What builds the backends loads every registered one, each building
        # its own service from the configuration: it names no device model.
        (("wiring.py",), DEVICE_MODELS),
        # Everything but the console scripts themselves stays out of cmd/.
        (
            (
                "service.py",
                "daemon",
                "wiring.py",
                "config",
                "devices",
                "backends",
                "api",
                "reporting",
                "migration",
                "sysfs",
                "privileged",
                "explain",
            ),
            ("accel_agent.cmd",),
        ),
        # The core's options, their types and the ledger (every module of its
        # package): no reporter, no privileged side.
        (
            ("config/options.py", "config/types.py", "devices/ledger"),
            ("accel_agent.reporting", "accel_agent.privileged", "accel_agent.cmd"),
        ),
        # The configuration is read by the daemon and the console scripts,
        # and reads neither (nor the daemon's service loop).
        (
            ("config",),
            ("accel_agent.daemon", "accel_agent.service", "accel_agent.cmd"),
        ),
    ],
    ids=["neutral-rooms", "backends", "wiring", "not-into-cmd", "core-options", "config-room"],
)
def test_no_arrow_goes_the_wrong_way(rooms: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    assert _offenders(_module_files(*rooms), forbidden) == []


def _names_a_backend(path: Path) -> list[str]:
    """Every string of ``path`` (docstrings aside) that is the entry point
    name of a built-in backend: looking one up by name is naming it."""
    from accel_agent.backends import BUILTIN

    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{path.name}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in BUILTIN and id(node) not in docstrings
    ]


def test_wiring_looks_up_no_backend_by_name(tmp_path: Path) -> None:
    """wiring.py builds every registered backend alike: no import of one
    (test_no_arrow_goes_the_wrong_way[wiring]) and no lookup by name."""
    assert _names_a_backend(PACKAGE / "wiring.py") == []
    module = tmp_path / "m.py"
    module.write_text('"""sriov_vf"""\ndef f(m):\n    return m.backends.get("sriov_vf")\n')
    assert _names_a_backend(module) == ["m.py:3 'sriov_vf'"]


def test_nothing_below_the_daemon_imports_the_daemon() -> None:
    """The daemon is built around the decider and the configuration, never
    the other way: only the daemon's rooms (daemon/, service.py) and the
    console scripts that start it (cmd/) know its threads."""
    below = _outside("daemon", "service.py", "cmd")
    assert PACKAGE / "config" / "values.py" in below  # the rule is not vacuous
    assert _offenders(below, ("accel_agent.daemon", "accel_agent.service")) == []


CMD = PACKAGE / "cmd"
# accelctl's entry points (and accel-agent's), and what accelctl's commands share.
CMD_ENTRY_POINTS = ("ctl", "accelctl", "plain_listing", "agent")
CMD_SHARED = ("__init__", "common", "daemon", "loading", "output", "listings")
# Every other module of cmd/ is a command module: one group of accelctl's
# subcommands, registered by ctl.py (a new module is one unless named above).
COMMAND_MODULES = tuple(
    path.stem
    for path in sorted(CMD.glob("*.py"))
    if path.stem not in CMD_ENTRY_POINTS + CMD_SHARED
)


def _cmd(*stems: str) -> tuple[str, ...]:
    return tuple(f"accel_agent.cmd.{stem}" for stem in stems)


def test_accelctl_command_modules_meet_only_in_its_registration() -> None:
    """ctl.py assembles the parser from the command modules; none of them
    imports another, or an entry point, and nothing else in cmd/ imports one:
    a group's code is found in its module alone."""
    assert {"ctl_devices", "ctl_migration", "ledger_upgrade"} <= set(COMMAND_MODULES)
    offenders = []
    for path in sorted(CMD.glob("*.py")):
        if path.stem == "ctl":
            continue
        others = _cmd(*(m for m in COMMAND_MODULES if m != path.stem))
        if path.stem in COMMAND_MODULES:
            others += _cmd(*CMD_ENTRY_POINTS)
        offenders += _offenders([path], others)
    assert offenders == []
    # ... and ctl.py registers every one of them.
    assert set(_cmd(*COMMAND_MODULES)) <= _imports(CMD / "ctl.py")


PRIVILEGED = PACKAGE / "privileged"
# The modules behind the facade (accel_agent/privileged/__init__.py).
PRIVILEGED_MODULES = tuple(
    f"accel_agent.privileged.{path.stem}"
    for path in sorted(PRIVILEGED.glob("*.py"))
    if path.stem != "__init__"
)


def test_the_privileged_package_is_used_through_its_facade_only() -> None:
    """What the agent may use of the privileged side is what the facade
    exports: a reviewer of the facade sees every way in."""
    assert "accel_agent.privileged.mdev" in PRIVILEGED_MODULES  # the rule is not vacuous
    outside = [path for path in _module_files(".") if PRIVILEGED not in path.parents]
    assert _offenders(outside, PRIVILEGED_MODULES) == []


# What runs as root may import, beside itself: the exceptions, the agent's
# options (the helper's own sysfs_root for a caller without one), the PCI
# address parser and, for the net writer, the netlink link and the VF
# settings' validation.  Packages' own __init__ are named by the from-imports.
PRIVILEGED_MAY_IMPORT = (
    "accel_agent",
    "accel_agent.exception",
    "accel_agent.config",
    "accel_agent.config.options",
    "accel_agent.sysfs",
    "accel_agent.sysfs.address",
    "accel_agent.sriov",
    "accel_agent.sriov.netlink",
    "accel_agent.sriov.vfconfig",
)


def test_the_privileged_side_imports_little_of_the_agent() -> None:
    found = sorted(
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in _module_files("privileged")
        for name in _imports(path)
        if name not in PRIVILEGED_MAY_IMPORT
        and not (name == "accel_agent.privileged" or name.startswith("accel_agent.privileged."))
    )
    assert found == []


def test_the_rule_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The scan finds a lazy import inside a function (what the old
    ``service.py -> cmd.common`` was)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from accel_agent.cmd import common\n")
    assert _imports(module) == {"accel_agent.cmd", "accel_agent.cmd.common"}


LEDGER = PACKAGE / "devices" / "ledger"
# The modules behind the ledger's facade (accel_agent/devices/ledger/__init__.py).
LEDGER_MODULES = tuple(
    f"accel_agent.devices.ledger.{path.stem}"
    for path in sorted(LEDGER.glob("*.py"))
    if path.stem != "__init__"
)


def test_the_ledger_package_is_used_through_its_facade_only() -> None:
    """The rest of the agent imports the ledger's facade, never one of its
    modules: how the ledger is split stays its own business."""
    assert "accel_agent.devices.ledger.connection" in LEDGER_MODULES  # not vacuous
    outside = [path for path in _module_files(".") if LEDGER not in path.parents]
    assert _offenders(outside, LEDGER_MODULES) == []


def test_loading_the_ledger_loads_no_reporter_and_no_privsep() -> None:
    """At run time too: the ledger and the core's options alone."""
    code = (
        "import sys, accel_agent.devices.ledger, accel_agent.config.options;"
        "print(sorted(m for m in sys.modules if m.startswith(('accel_agent.reporting',"
        " 'accel_agent.privileged', 'oslo_privsep', 'keystoneauth1'))));"
        "print(sorted(m for m in sys.modules if m.startswith('accel_agent.devices.ledger.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    forbidden, loaded = result.stdout.splitlines()
    assert forbidden == "[]"
    # Not vacuous: the import loaded every module of the ledger's package (one
    # loaded later, lazily, would escape this check).
    assert "accel_agent.devices.ledger.connection" in LEDGER_MODULES
    assert loaded == str(sorted(LEDGER_MODULES))


# --- one writer: the operation protocol (docs/design.md §5.7) ----------------------------
#
# The decider's use cases decide what to change and ask the operation protocol
# (accel_agent/devices/protocol/) to run it: only the protocol opens an
# operation's ledger transaction, calls a method of the ledger that writes,
# writes or settles an intent, calls a privileged write, a backend's make,
# destroy or host preparation, or a libvirt definition's write, and names the
# crash points.  What counts as a write is derived from the interfaces below,
# and every module of the agent but the protocol and the writes' own
# implementations is checked, so a new use case (or a new writing method) is
# covered the day it is added.

PROTOCOL = PACKAGE / "devices" / "protocol"
PROTOCOL_MODULES = tuple(
    f"accel_agent.devices.protocol.{path.stem}"
    for path in sorted(PROTOCOL.glob("*.py"))
    if path.stem != "__init__"
)
# The use cases (docs/architecture.md, "The rooms"); the rule checks every
# module, these are named so that the rule provably sees them.
USE_CASES = (
    "devices/allocations.py",
    "devices/attach.py",
    "devices/claims.py",
    "devices/layout.py",
    "devices/takeover.py",
    "devices/recovery.py",
    "devices/planning.py",
    "devices/manager.py",
)


def _methods(cls: type) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    return {fn.name: fn for fn in body.body if isinstance(fn, ast.FunctionDef)}


def _ledger_writes() -> frozenset[str]:
    """Every public method of the ledger's stores (the mixins ``Ledger`` is
    made of) that writes: one that opens a transaction, itself or through
    another of its methods."""
    calls: dict[str, set[str]] = {}
    for cls in Ledger.__mro__:
        if not cls.__module__.startswith("accel_agent.devices.ledger"):
            continue
        for name, fn in _methods(cls).items():
            calls.setdefault(name, set()).update(
                node.func.attr
                for node in ast.walk(fn)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            )
    writes = {"transaction"}
    while grown := {name for name, called in calls.items() if called & writes} - writes:
        writes |= grown
    return frozenset(name for name in writes if not name.startswith("_"))


def _done_for_effect(cls: type) -> frozenset[str]:
    """The public methods of an interface that return nothing: called for
    what they change."""
    return frozenset(
        name
        for name, fn in _methods(cls).items()
        if not name.startswith("_") and isinstance(fn.returns, ast.Constant)
        and fn.returns.value in (None, "None")
    )


LEDGER_WRITES = _ledger_writes()
def _writer_protocols() -> list[type]:
    """Every writer protocol a backend declares beside it (a ``Protocol``
    class of ``accel_agent/backends/``, ``MdevWriter``, ``VgpuWriter``, ...):
    what a backend may call on the privileged writer."""
    import importlib
    from typing import Protocol

    found = []
    for path in _module_files("backends"):
        module = importlib.import_module(
            ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        )
        found += [
            value for value in vars(module).values()
            if isinstance(value, type) and Protocol in value.__mro__[1:]
            and value.__module__ == module.__name__ and value is not DeviceWriter
            and _methods(value)
        ]
    return found


# Every method of a backend's writer protocol is a privileged write.
PRIVILEGED_WRITES = frozenset(
    name for protocol in _writer_protocols() for name in _methods(protocol)
    if not name.startswith("_")
)
BACKEND_WRITES = _done_for_effect(DeviceBackend)
LIBVIRT_WRITES = _done_for_effect(NodeDevices)
# NVML's writes (accel_agent/nvml/base.py: the set_/create_/destroy_ methods):
# mixed-size mode, MIG mode, GPU instances change the host as a device write does.
NVML_WRITES = frozenset(
    name for name in _methods(Nvml) if name.startswith(("set_", "create_", "destroy_"))
)

# Where each kind of write is implemented (the only callers beside the protocol).
_LEDGER_ROOM = ("devices/ledger",)
_DEVICE_ROOMS = ("backends", "sriov", "privileged", "simulator", "devices/writers.py")
_LIBVIRT_ROOMS = ("devices/nodedevs.py",)
_NVML_ROOMS = ("nvml", "privileged", "simulator")


def _receiver(node: ast.expr) -> str:
    """The last name of what a method is called on: ``m.ledger`` ->
    ``ledger``, ``m.backend(name)`` -> ``backend``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _receiver(node.func)
    return ""


def _within(path: Path, rooms: tuple[str, ...]) -> bool:
    return any(path == PACKAGE / room or (PACKAGE / room) in path.parents for room in rooms)


def _protocol_calls(path: Path, source: str | None = None) -> list[str]:
    """Every call in ``path`` (or in ``source``, read as ``path``) that only
    the protocol may make, as ``file:line what name()``: a ledger write (on
    the ledger), a privileged write (on a writer), a backend's make, destroy
    or host preparation, a libvirt definition's write, a crash point."""
    found = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, on = node.func.attr, _receiver(node.func.value)
        what = None
        if name in LEDGER_WRITES and on == "ledger" and not _within(path, _LEDGER_ROOM):
            what = "ledger write"
        elif name in PRIVILEGED_WRITES and "writer" in on and not _within(path, _DEVICE_ROOMS):
            what = "privileged write"
        elif name in BACKEND_WRITES and not _within(path, _DEVICE_ROOMS):
            what = "device write"
        elif name in LIBVIRT_WRITES and not _within(path, _LIBVIRT_ROOMS):
            what = "libvirt write"
        elif name in NVML_WRITES and on == "nvml" and not _within(path, _NVML_ROOMS):
            what = "NVML write"
        elif name == "on_step":
            what = "crash point"
        if what is not None:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {what} {name}()")
    return found


def test_what_counts_as_a_write_is_derived_from_the_interfaces() -> None:
    """Not vacuous: the derivations find the writes the protocol is about."""
    assert {
        "transaction", "begin_intent", "finish_intent", "record_create_intent",
        "record_remove_intent", "settle_created", "cancel_remove", "reserve", "forget",
        "assign", "adopt", "release", "release_owner", "set_layout", "commit_claim",
        "record_attach_request",
    } <= LEDGER_WRITES
    assert not LEDGER_WRITES & {"get", "all", "by_owner", "pending_intents", "attach_request"}
    assert {"create", "remove", "set_num_vfs", "bind_vfio", "unbind_vfio"} <= PRIVILEGED_WRITES
    assert {"make", "create", "destroy", "prepare_host", "place"} == BACKEND_WRITES
    assert {"set_heterogeneous_mode", "set_mig_mode", "create_gpu_instance",
            "destroy_gpu_instance"} == NVML_WRITES
    assert {"define", "define_xml", "undefine", "set_autostart"} == LIBVIRT_WRITES


def test_only_the_protocol_writes() -> None:
    checked = [
        path for path in _module_files(".")
        if PROTOCOL not in path.parents
    ]
    assert {PACKAGE / name for name in USE_CASES} <= set(checked)  # the rule sees them
    offenders = [call for path in checked for call in _protocol_calls(path)]
    assert offenders == []
    # ... and the protocol is where they are: every ledger write has its
    # caller there (the rule would pass vacuously if the names moved away).
    found = {
        call.rsplit(" ", 1)[1].removesuffix("()")
        for path in _module_files("devices/protocol")
        for call in _protocol_calls(path)
    }
    assert found >= LEDGER_WRITES
    assert {"make", "destroy", "prepare_host", "undefine", "define", "define_xml",
            "on_step"} <= found


def test_the_protocol_package_is_used_through_its_facade_only() -> None:
    """The use cases ask the protocol through its facade
    (accel_agent/devices/protocol/__init__.py): its runs' modules are its own."""
    assert "accel_agent.devices.protocol.operation" in PROTOCOL_MODULES  # not vacuous
    outside = [path for path in _module_files(".") if PROTOCOL not in path.parents]
    assert _offenders(outside, PROTOCOL_MODULES) == []



# --- the configuration room -------------------------------------------------------------

CONFIG = PACKAGE / "config"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (a name imported from
    a module stands for that module; a package for its ``__init__``)."""
    modules = {_module_name(path): path for path in _module_files(".")}

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        name: {found for imported in _imports(path) if (found := module_of(imported))} - {name}
        for name, path in modules.items()
    }


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str]:
    """The shortest chain of imports from ``start`` back to ``start``, as
    module names; [] when none leads back."""
    came_from: dict[str, str] = {}
    queue = sorted(graph.get(start, ()))
    for name in queue:
        came_from.setdefault(name, start)
    while queue:
        name = queue.pop(0)
        if name == start:
            chain = [start]
            while (name := came_from[name]) != start:
                chain.append(name)
            return [start, *reversed(chain[1:]), start]
        for following in sorted(graph.get(name, ())):
            if following not in came_from:
                came_from[following] = name
                queue.append(following)
    return []


def test_no_module_of_the_configuration_imports_one_that_imports_it_back() -> None:
    """No circle through a module of accel_agent/config/ (issue 35): not
    inside the room, nor out of it and back (wiring, the daemon's rooms).
    Lazy imports count: a circle closed inside a function is still one."""
    graph = _import_graph()
    config = sorted(_module_name(path) for path in _module_files("config"))
    assert "accel_agent.config.check" in config and graph["accel_agent.config.check"]
    cycles = [" -> ".join(chain) for name in config if (chain := _cycle_through(graph, name))]
    assert cycles == []


def test_the_cycle_rule_sees_a_circle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycle_through(graph, "a") == ["a", "b", "c", "a"]
    assert _cycle_through(graph, "d") == []


# Calls that register oslo.config options (oslo.config's own, oslo.log's and
# keystoneauth's helpers): made by the configuration room alone.
REGISTERING = frozenset({
    "register_opt",
    "register_opts",
    "register_cli_opt",
    "register_cli_opts",
    "register_options",
    "register_auth_conf_options",
    "register_session_conf_options",
    "register_adapter_conf_options",
})


def _registering_calls(path: Path) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.func.attr}()"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in REGISTERING
    ]


def test_options_are_registered_from_the_configuration_room_only() -> None:
    """Every room declares its options in its own module; only
    config/options.py (the core's, the per-name groups) and
    config/registry.py (every room's, from its one table) register them."""
    offenders = [
        call for path in _outside("config/options.py", "config/registry.py")
        for call in _registering_calls(path)
    ]
    assert offenders == []
    assert _registering_calls(CONFIG / "registry.py")  # the rule is not vacuous


def _registered(conf) -> set[tuple[str, str, int]]:
    from accel_agent.config import values

    return {(section, opt.dest, id(opt)) for section, opt in values.registered_options(conf)}


def test_registering_twice_is_a_no_op_and_every_group_is_one_of_the_table(tmp_path: Path) -> None:
    """config.registry.register, before and after parsing, twice: the same
    options (the very objects); and every group registered is one a room of
    the table lists (the per-name groups as the sample's stand-ins), or
    oslo.log's."""
    from oslo_config import cfg

    from accel_agent.config import registry

    path = tmp_path / "agent.conf"
    path.write_text(
        "[devices]\nenabled_mdev_types = nvidia-35\nenabled_vf_pools = nic\n"
        "[vf_pool_nic]\ndevice_addresses = 0000:3b:00.0\n[placement]\nauth_type = password\n"
    )
    conf = cfg.ConfigOpts()
    registry.register(conf)
    registry.register(conf)
    before_parsing = _registered(conf)
    conf(["--config-file", str(path)], project="accel-agent", default_config_files=[])
    registry.register(conf)
    once = _registered(conf)
    registry.register(conf)
    assert _registered(conf) == once
    assert before_parsing < once  # the per-name groups and the plugin's, once named

    lists = [*(group for room in registry.rooms() for group in room.list_opts()),
             *registry.oslo_log_opts()]
    listed = {(group or "DEFAULT", opt.dest) for group, opts in lists for opt in opts}
    stand_ins = {"mdev_nvidia-35": "mdev_$(mdev_type)", "vf_pool_nic": "vf_pool_$(pool)"}
    registered = {(stand_ins.get(section, section), dest) for section, dest, _id in once}
    bare = cfg.ConfigOpts()  # oslo.config's own (config_file, config_dir, ...)
    bare([], project="accel-agent", default_config_files=[])
    assert registered - listed == {(section, dest) for section, dest, _id in _registered(bare)}
    groups = {section for section, _dest, _id in once}
    assert {"placement", "migration", "accel_agent_privileged", "mdev_nvidia-35"} <= groups
    assert ("placement", "username") in registered  # the plugin's, as the sample lists them
@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("with m.ledger.transaction():\n        pass", "ledger write transaction()"),
        ("m.ledger.begin_intent('allocate', 'vm')", "ledger write begin_intent()"),
        ("m.ledger.assign(uuid, 'vm')", "ledger write assign()"),
        ("m.writer.set_num_vfs('0000:10:00.0', 4)", "privileged write set_num_vfs()"),
        ("m.backend(name).make(m.writer, p, t, uuid, None)", "device write make()"),
        ("backend.prepare_host()", "device write prepare_host()"),
        ("m.nodedevs.undefine(uuid)", "libvirt write undefine()"),
        ("m.on_step('allocate.intent')", "crash point on_step()"),
    ],
)
def test_the_protocol_rule_sees_a_use_case_writing(body: str, what: str) -> None:
    """A module of the decider's room (a new use case) that writes is named."""
    source = f"def f(m, uuid, name, p, t, backend):\n    {body}\n"
    calls = _protocol_calls(PACKAGE / "devices" / "a_new_use_case.py", source)
    assert [call.split(" ", 1)[1] for call in calls] == [what]
