"""config.values.value_errors: every option the daemon reads, read once, each bad
value one line naming its file and line; and every numeric option bounded."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
from oslo_config import cfg, types

from accel_agent.config import options as agent_conf
from accel_agent.config import registry
from accel_agent.config import values as config_values
from accel_agent.config.types import FiniteFloat

# Names every per-name group is registered for, and an auth plugin with options.
REGISTER_ALL = """
[devices]
enabled_mdev_types = nvidia-35
enabled_vf_pools = nic
enabled_gpu_layouts = l4
[vf_pool_nic]
device_addresses = 0000:3b:00.0
[placement]
auth_type = password
"""


def parse(tmp_path: Path, text: str, name: str = "agent.conf") -> tuple[cfg.ConfigOpts, Path]:
    """A fresh ConfigOpts with the agent's options, parsed from ``text``
    (also ``[DEFAULT]`` paths), as the daemon's reload builds one."""
    path = tmp_path / name
    path.write_text(
        f"[DEFAULT]\nhost = h\nsysfs_root = {tmp_path}\nstate_dir = {tmp_path}/state\n"
        + textwrap.dedent(text)
    )
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf(["--config-file", str(path)], project="accel-agent", default_config_files=[])
    return conf, path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def every_option() -> list[tuple[str, cfg.Opt]]:
    """Every option the daemon registers once the names above are enabled:
    the agent's, [placement]'s with the password plugin's, oslo.log's, the
    privileged helpers', one [mdev_<type>] and one [vf_pool_<name>]."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        conf, _path = parse(Path(tmp), REGISTER_ALL)
        registry.register(conf)
        return list(config_values.registered_options(conf))


def generator_options() -> list[tuple[str, cfg.Opt]]:
    """The generator's list (sample config, docs/config.md): the same options
    with the per-name groups as placeholders and both documented plugins."""
    from importlib.metadata import entry_points

    found = []
    for point in entry_points(group="oslo.config.opts"):
        if point.name in ("accel_agent", "oslo.log"):
            for group, opts in point.load()():
                found += [(group or "DEFAULT", opt) for opt in opts]
    return found


def numeric(opt: cfg.Opt) -> bool:
    kind = opt.type.item_type if isinstance(opt.type, types.List) else opt.type
    return isinstance(kind, types.Integer | types.Float) or kind in (int, float)


def bounds(section: str, opt: cfg.Opt) -> tuple[float | None, float | None]:
    own = config_values.LIBRARY_BOUNDS.get((section, opt.dest), (None, None))
    kind = opt.type.item_type if isinstance(opt.type, types.List) else opt.type
    low = getattr(kind, "min", None)
    high = getattr(kind, "max", None)
    return (own[0] if low is None else low, own[1] if high is None else high)


NUMERIC = sorted(
    {(s, o.dest): o for s, o in every_option() if numeric(o)}.items(), key=lambda i: i[0]
)


def ids(item) -> str:
    (section, name), _opt = item
    return f"{section}.{name}"


# --- every numeric option is bounded; every float refuses nan and inf ----------------------


def test_the_walk_sees_every_option_kind():
    """The lists below are not empty by accident: they hold the agent's,
    the per-name groups', keystoneauth's, oslo.log's and oslo.privsep's."""
    names = {f"{s}.{n}" for (s, n), _o in NUMERIC}
    assert {
        "DEFAULT.event_debounce", "api.threads", "mdev_nvidia-35.max_instances",
        "vf_pool_nic.num_vfs", "placement.timeout", "placement.connect_retries",
        "DEFAULT.rate_limit_burst", "accel_agent_privileged.thread_pool_size",
        "migration.claim_timeout",
    } <= names


@pytest.mark.parametrize("section, opt", [(s, o) for s, o in generator_options() if numeric(o)],
                         ids=lambda v: v if isinstance(v, str) else v.dest)
def test_every_numeric_option_of_the_generators_list_has_a_range(section, opt):
    low, high = bounds(section, opt)
    assert low is not None and high is not None, f"[{section}] {opt.dest} has no range"


@pytest.mark.parametrize("item", NUMERIC, ids=ids)
def test_every_numeric_option_has_a_range_that_value_errors_enforces(tmp_path, item):
    (section, name), opt = item
    low, high = bounds(section, opt)
    assert low is not None and high is not None, f"[{section}] {name} has no range"
    for value in (high + 1, low - 1):
        conf, path = parse(tmp_path, REGISTER_ALL + f"[{section}]\n{name} = {value}\n")
        errors = config_values.value_errors(conf)
        line = len(path.read_text().splitlines())
        assert [e for e in errors if e.startswith(f"{path}:{line}: [{section}] {name} = ")], (
            value, errors)


FLOATS = [item for item in NUMERIC if isinstance(item[1].type, types.Float)]


@pytest.mark.parametrize("item", FLOATS, ids=ids)
def test_every_float_option_refuses_nan_and_inf(tmp_path, item):
    (section, name), opt = item
    assert isinstance(opt.type, FiniteFloat)
    for value in ("nan", "inf", "-inf", "1e999", "NaN"):
        conf, path = parse(tmp_path, REGISTER_ALL + f"[{section}]\n{name} = {value}\n")
        line = len(path.read_text().splitlines())
        assert config_values.value_errors(conf) == [
            f"{path}:{line}: [{section}] {name} = {value}: must be a finite number"
        ]


def test_the_float_list_is_every_float():
    floats = {key for key, opt in NUMERIC if isinstance(opt.type, types.Float)}
    assert {("DEFAULT", "rescan_interval"), ("DEFAULT", "remove_timeout"),
            ("DEFAULT", "event_debounce"), ("api", "request_timeout"),
            ("api", "shutdown_timeout"), ("placement", "timeout"),
            ("placement", "connect_retry_delay")} <= floats


def test_a_library_float_without_finite_type_is_still_refused(tmp_path):
    """The generic rule behind FiniteFloat: any float value read must be finite."""
    conf, path = parse(tmp_path, "[extra]\nratio = nan\n")
    conf.register_opt(cfg.FloatOpt("ratio"), group="extra")
    assert config_values.value_errors(conf) == [
        f"{path}:{line_of(path, 'ratio')}: [extra] ratio = nan: must be a finite number"
    ]


# --- one line per bad value, naming file and line ----------------------------------------


@pytest.mark.parametrize(
    "section, line, reason",
    [
        ("DEFAULT", "event_debounce = 50", "must be at most 10"),
        ("DEFAULT", "rescan_interval = nan", "must be a finite number"),
        ("DEFAULT", "rescan_interval = 1e999", "must be a finite number"),
        ("DEFAULT", "rescan_interval = abc", "not a number"),
        ("DEFAULT", "debug = maybe", "not a boolean (true/false, yes/no, on/off, 1/0)"),
        ("DEFAULT", "udev_events = maybe", "not a boolean (true/false, yes/no, on/off, 1/0)"),
        ("DEFAULT", "log_rotation_type = weekly", "valid values are"),
        ("DEFAULT", "rate_limit_burst = -1", "must be at least 0"),
        ("DEFAULT", "host = $nope", "its $-substitution names no option"),
        ("api", "threads = 100000", "must be at most 256"),
        ("migration", "claim_timeout = abc", "not an integer"),
        ("libvirt", "qemu_globals = not-a-setting", "doesn't match regex"),
        ("placement", "enabled = maybe", "not a boolean"),
        ("placement", "timeout = nan", "must be a finite number"),
        ("placement", "auth_url = $nope", "its $-substitution names no option"),
        ("accel_agent_privileged", "thread_pool_size = 0", "must be at least 1"),
        ("mdev_nvidia-35", "mdev_class = lower", "doesn't match regex"),
        ("mdev_nvidia-35", "max_instances = 0", "must be at least 1"),
        ("vf_pool_nic", "num_vfs = 99999", "must be at most 65535"),
        ("vf_pool_nic", "num_vfs = -1", "must be at least 0"),
        ("vf_pool_nic", "resource_class = custom_lower",
         "resource class 'custom_lower' is neither CUSTOM_[A-Z0-9_]+ nor a standard"),
        ("vf_pool_nic", "resource_class = NOT_A_CLASS", "is neither"),
        ("vf_pool_nic", "traits = CUSTOM_OK, bad-trait",
         "trait 'bad-trait' is neither CUSTOM_[A-Z0-9_]+ nor a standard trait"),
        ("vf_pool_nic", "traits = NOT_A_TRAIT", "is neither"),
    ],
)
def test_a_bad_value_is_one_line_naming_file_line_section_and_option(
    tmp_path, section, line, reason
):
    conf, path = parse(tmp_path, REGISTER_ALL + f"[{section}]\n{line}\n# after\n")
    (error,) = config_values.value_errors(conf)
    name, _, value = line.partition(" = ")
    head = f"{path}:{line_of(path, line)}: [{section}] {name} = {value}: "
    assert error.startswith(head) and reason in error[len(head):], error
    assert "\n" not in error


@pytest.mark.parametrize(
    "line",
    [
        "resource_class = FPGA", "resource_class = CUSTOM_NIC", "resource_class = PCI_DEVICE",
        "traits = CUSTOM_A, HW_NIC_SRIOV", "num_vfs = 0", "num_vfs = 65535",
    ],
)
def test_what_placement_accepts_is_accepted(tmp_path, line):
    conf, _path = parse(tmp_path, REGISTER_ALL + f"[vf_pool_nic]\n{line}\n")
    assert config_values.value_errors(conf) == []


def test_every_bad_value_is_reported_in_file_order(tmp_path):
    conf, path = parse(
        tmp_path,
        "[api]\nthreads = 0\n[DEFAULT]\ndebug = maybe\nevent_debounce = -1\n",
    )
    errors = config_values.value_errors(conf)
    assert [e.split(": [")[0] for e in errors] == [
        f"{path}:{line_of(path, 'threads')}",
        f"{path}:{line_of(path, 'debug')}",
        f"{path}:{line_of(path, 'event_debounce')}",
    ]


def test_the_file_and_line_oslo_config_took_the_value_from(tmp_path):
    """Of two files the later wins; of two lines, the later one."""
    conf, first = parse(tmp_path, "event_debounce = 50\n")
    second = tmp_path / "second.conf"
    second.write_text("[DEFAULT]\nevent_debounce = 1\nevent_debounce = 40\n")
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf(["--config-file", str(first), "--config-file", str(second)], default_config_files=[])
    assert config_values.value_errors(conf) == [
        f"{second}:3: [DEFAULT] event_debounce = 40: must be at most 10"
    ]
    second.write_text("[DEFAULT]\nevent_debounce = 1\n")  # a good later value hides it
    conf.reload_config_files()
    assert config_values.value_errors(conf) == []


def test_a_value_from_the_environment_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("OS_DEFAULT__EVENT_DEBOUNCE", "nan")
    conf, _path = parse(tmp_path, "event_debounce = 1\n")
    assert config_values.value_errors(conf) == [
        "environment variable OS_DEFAULT__EVENT_DEBOUNCE: [DEFAULT] event_debounce = nan: "
        "must be a finite number"
    ]


def test_a_control_character_in_a_value_is_escaped(tmp_path):
    conf, _path = parse(tmp_path, "debug = may\x1bbe\n")
    (error,) = config_values.value_errors(conf)
    assert "may\\x1bbe" in error and "\x1b" not in error


def test_the_default_of_a_library_option_is_not_the_agents_to_refuse(tmp_path):
    """oslo.privsep's thread_pool_size defaults to the CPU count, which may
    pass the agent's maximum on a big host: only a written value is bounded."""
    conf, path = parse(tmp_path, "")
    registry.register(conf)
    conf.set_default("thread_pool_size", 4096, group="accel_agent_privileged")
    assert config_values.value_errors(conf) == []
    with path.open("a") as handle:
        handle.write("[accel_agent_privileged]\nthread_pool_size = 4096\n")
    conf.reload_config_files()
    assert config_values.value_errors(conf) == [
        f"{path}:{line_of(path, 'thread_pool_size')}: [accel_agent_privileged] "
        "thread_pool_size = 4096: must be at most 256"
    ]


# --- what the daemon reads after the check cannot raise ----------------------------------


def test_no_option_is_registered_after_the_check(tmp_path):
    """Everything the daemon builds from a checked configuration (Placement's
    adapter with its auth plugin, the policy, the VF pools) reads options
    value_errors has read already: none is registered later."""
    from accel_agent.devices import policy
    from accel_agent.reporting.placement import PlacementReporter
    from accel_agent.sriov.pools import build_pools

    conf, _path = parse(
        tmp_path,
        REGISTER_ALL.replace("auth_type = password", "auth_type = password\nenabled = true\n"
                             "auth_url = http://127.0.0.1:5000\nusername = u\npassword = p\n"),
    )
    assert config_values.value_errors(conf) == []
    before = {(s, o.dest) for s, o in config_values.registered_options(conf)}
    PlacementReporter.from_conf(conf)
    policy.read_policy_inputs(conf)
    build_pools(conf)
    after = {(s, o.dest) for s, o in config_values.registered_options(conf)}
    assert after - before == set()


def test_after_no_error_every_registered_option_reads(tmp_path):
    conf, _path = parse(tmp_path, REGISTER_ALL)
    assert config_values.value_errors(conf) == []
    for section, opt in config_values.registered_options(conf):
        value = conf[opt.dest] if section == "DEFAULT" else conf[section][opt.dest]
        assert not (isinstance(value, float) and not math.isfinite(value))


def test_value_errors_is_idempotent_and_registers_on_a_conf_with_cli_opts_parsed(tmp_path):
    """On a parsed ConfigOpts oslo.log's command-line options cannot be
    registered as such any more: they are added as file options, and a
    second call finds them registered."""
    conf, path = parse(tmp_path, "debug = maybe\n")
    first = config_values.value_errors(conf)
    assert first == config_values.value_errors(conf) == [
        f"{path}:{line_of(path, 'debug')}: [DEFAULT] debug = maybe: "
        "not a boolean (true/false, yes/no, on/off, 1/0)"
    ]


def test_the_auth_section_a_placement_section_names_is_read_too(tmp_path):
    """keystoneauth reads the plugin's options from ``auth_section`` when set."""
    conf, path = parse(
        tmp_path,
        "[placement]\nauth_section = keystone\n"
        "[keystone]\nauth_type = password\nauth_url = $nope\n",
    )
    assert config_values.value_errors(conf) == [
        f"{path}:{line_of(path, 'auth_url')}: [keystone] auth_url = $nope: "
        "its $-substitution names no option (write $$ for a literal $)"
    ]
