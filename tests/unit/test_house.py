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
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

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


# The decider's use cases ask the operation protocol to run their changes;
# only accel_agent/devices/protocol.py opens an operation's transactions, writes
# and settles intents, makes and unmakes devices and names the crash points.
USE_CASES = (
    "devices/allocations.py",
    "devices/attach.py",
    "devices/claims.py",
    "devices/takeover.py",
    "devices/recovery.py",
    "devices/planning.py",
    "devices/manager.py",
)
PROTOCOL_ONLY = frozenset({
    "transaction",
    "begin_intent",
    "finish_intent",
    "record_create_intent",
    "record_remove_intent",
    "settle_created",
    "cancel_remove",
    "reserve",
    "forget",
    "make",
    "destroy",
    "on_step",
})


def _protocol_calls(path: Path) -> list[str]:
    """Every call in ``path`` of a method only the protocol may call, as
    ``file:line name()``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in PROTOCOL_ONLY
        ):
            found.append(f"{path.name}:{node.lineno} {node.func.attr}()")
    return found


def test_use_cases_change_the_host_only_through_the_protocol() -> None:
    offenders = [call for name in USE_CASES for call in _protocol_calls(PACKAGE / name)]
    assert offenders == []
    # ... and the protocol is where they are (the rule would pass vacuously
    # if the names moved away from it).
    found = {call.rsplit(" ", 1)[1] for call in _protocol_calls(PACKAGE / "devices/protocol.py")}
    assert {"transaction()", "begin_intent()", "make()", "destroy()", "on_step()"} <= found


def test_the_protocol_rule_sees_a_use_case_opening_a_transaction(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f(m):\n    with m.ledger.transaction():\n        pass\n")
    assert [c.split(" ")[1] for c in _protocol_calls(module)] == ["transaction()"]



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
