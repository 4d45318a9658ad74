"""A clumsy or hostile configuration, through the real commands (accelctl and
accel-agent as processes): one clear line naming the file, the line or the
value; never a traceback, never a silent misreading."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise

GOOD = """
[devices]
enabled_mdev_types = nvidia-35, nvidia-36
[mdev_nvidia-35]
[mdev_nvidia-36]
device_addresses = 0000:85:00.0
"""


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def accelctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run("accel_agent.cmd.ctl", *args)


def agent_check(config: Path) -> subprocess.CompletedProcess[str]:
    return run("accel_agent.cmd.agent", "--config-file", str(config), "--check")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("host") / "sys"
    materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty"], gpus=2)), str(path))
    return str(path)


class Config:
    def __init__(self, directory: Path, root: str) -> None:
        self.path = directory / "agent.conf"
        self.root = root
        self.state_dir = directory / "state"

    def write(self, body: str = GOOD, default: str = "") -> Path:
        head = (
            f"[DEFAULT]\nhost = testhost\nsysfs_root = {self.root}\n"
            f"state_dir = {self.state_dir}\n{default}"
        )
        self.path.write_text(head + textwrap.dedent(body))
        return self.path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def line_of(self, text: str) -> int:
        return next(i for i, line in enumerate(self.lines(), start=1) if text in line)


@pytest.fixture
def config(tmp_path, root) -> Config:
    return Config(tmp_path, root)


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def warnings(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("warning:")]


# --- files oslo.config could not read -----------------------------------------------------


def test_a_config_file_that_is_not_utf8_is_one_clear_error(config):
    path = config.write()
    path.write_bytes(path.read_bytes() + b"# caf\xe9 (latin-1)\n")
    line = len(config.path.read_bytes().splitlines())
    for proc in (accelctl("--config-file", str(path), "check-config"),
                 accelctl("--config-file", str(path), "types"),
                 agent_check(path)):
        assert proc.returncode == 1
        assert any(f"{path} is not UTF-8 text (byte 0xe9 on line {line})" in e
                   for e in errors(proc)), proc.stderr


def test_a_directory_given_as_config_file_is_one_clear_error(tmp_path):
    for proc in (accelctl("--config-file", str(tmp_path), "check-config"),
                 agent_check(tmp_path)):
        assert proc.returncode == 1
        assert any(f"--config-file {tmp_path} is a directory" in e for e in errors(proc)), (
            proc.stderr
        )


# --- what oslo.config ignores silently ----------------------------------------------------


def test_an_unknown_option_is_a_warning_naming_file_and_line_and_an_error_with_strict(config):
    path = config.write(GOOD.replace("device_addresses = 0000:85", "device_adresses = 0000:85"))
    line = config.line_of("device_adresses")
    proc = accelctl("--config-file", str(path), "check-config")
    assert proc.returncode == 0, proc.stderr
    expected = (f"{path}:{line}: unknown option device_adresses in [mdev_nvidia-36]; it is "
                "ignored; did you mean device_addresses?")
    assert f"warning: {expected}" in proc.stderr
    strict = accelctl("--config-file", str(path), "check-config", "--strict")
    assert strict.returncode == 1
    assert f"error: {expected}" in strict.stderr


def test_an_unknown_section_is_a_warning(config):
    path = config.write(GOOD + "[devics]\nenabled_mdev_types = nvidia-36\n")
    proc = accelctl("--config-file", str(path), "check-config")
    assert proc.returncode == 0
    line = config.line_of("[devics]")
    assert f"warning: {path}:{line}: unknown section [devics]; it is ignored" in proc.stderr


def test_known_options_of_every_section_are_not_warned_about(config):
    path = config.write(
        GOOD + textwrap.dedent(
            """
            [api]
            request_timeout = 5
            threads = 4
            [accel_agent_privileged]
            capabilities =
            [placement]
            enabled = false
            auth_type = v3applicationcredential
            application_credential_id = abc
            auth_url = http://keystone
            [vgpu_nvidia-36]
            device_addresses = 0000:85:00.0
            """
        ),
        default="debug = true\nlog_file = /tmp/x.log\n",
    )
    proc = accelctl("--config-file", str(path), "check-config", "--strict")
    assert proc.returncode == 0, proc.stderr
    assert not warnings(proc)


def test_a_deprecated_option_name_is_known(config):
    path = config.write(GOOD.replace("enabled_mdev_types", "enabled_vgpu_types"))
    proc = accelctl("--config-file", str(path), "check-config", "--strict")
    assert proc.returncode == 0, proc.stderr


def test_an_indented_section_header_is_warned_about(config):
    # Below an assignment, oslo.config reads it as that value's next line.
    path = config.write(
        "[devices]\nenabled_mdev_types = nvidia-35\n  [mdev_nvidia-35]\nmdev_class = VGPU\n"
    )
    line = config.line_of("  [mdev_nvidia-35]")
    proc = accelctl("--config-file", str(path), "check-config")
    assert (f"warning: {path}:{line}: the indented section header [mdev_nvidia-35] is read "
            "as the continuation of the value above it") in proc.stderr, proc.stderr
    # ...and what followed it landed in [devices].
    assert "unknown option mdev_class in [devices]" in proc.stderr


# --- paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sysfs_root", "state_dir"])
@pytest.mark.parametrize("value", ["", "relative/dir"])
def test_an_empty_or_relative_path_is_refused(config, name, value):
    path = config.write()
    path.write_text(path.read_text().replace(f"{name} = ", f"{name} = {value}\n# was: ", 1))
    for proc in (accelctl("--config-file", str(path), "check-config"), agent_check(path)):
        assert proc.returncode == 1
        assert any(f"[DEFAULT] {name} {value!r} must be an absolute path" in e
                   for e in errors(proc)), proc.stderr


def test_a_state_dir_that_is_a_file_is_one_clear_line(config):
    config.state_dir.write_text("not a directory\n")
    path = config.write()
    line = f"[DEFAULT] state_dir {config.state_dir} is not a directory"
    check = accelctl("--config-file", str(path), "check-config")
    assert check.returncode == 1 and f"error: {line}" in check.stderr, check.stderr
    start = agent_check(path)
    assert start.returncode == 1 and f"error: {line}" in start.stderr, start.stderr


@contextlib.contextmanager
def read_only_mount(where: Path) -> Iterator[None]:
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_state_dir_on_a_read_only_filesystem_is_one_clear_line(config, tmp_path):
    with read_only_mount(tmp_path / "ro"):
        config.state_dir = tmp_path / "ro" / "state"
        path = config.write()
        check = accelctl("--config-file", str(path), "check-config")
        assert check.returncode == 1
        assert any("is on a read-only filesystem" in e and str(config.state_dir) in e
                   for e in errors(check)), check.stderr
        assert agent_check(path).returncode == 1


# --- type names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "listed, named",
    [
        ("nvidia-35,,nvidia-36", "an empty item"),
        ("nvidia-35, ../../class", "'../../class'"),
        ("nvidia-35, ..", "'..'"),
        ("nvidia-35, nvidia 36", "'nvidia 36'"),
        ("nvidia-35, a/b", "'a/b'"),
    ],
)
def test_a_type_name_that_cannot_be_a_sysfs_directory_is_refused(config, listed, named):
    path = config.write(GOOD.replace("nvidia-35, nvidia-36", listed))
    for proc in (accelctl("--config-file", str(path), "check-config"), agent_check(path)):
        assert proc.returncode == 1
        assert any(named in e and "enabled_mdev_types" in e for e in errors(proc)), proc.stderr


# --- the commands never hang on a hostile sysfs -------------------------------------------


def test_accelctl_listings_do_not_hang_on_a_fifo_in_sysfs(config, tmp_path):
    tree = tmp_path / "sys"
    materialise(SimulatedHost(build_spec(["nvidia-pf"], gpus=1)), str(tree))
    counter = next(tree.glob("devices/**/nvidia-35/available_instances"))
    counter.unlink()
    os.mkfifo(counter)
    config.root = str(tree)
    path = config.write("[devices]\nenabled_mdev_types = nvidia-35\n")
    for command in ("types", "inventory", "check-config"):
        try:
            proc = accelctl("--config-file", str(path), "--offline", command)
        finally:
            with contextlib.suppress(OSError):  # a reader stuck in open() before the fix
                os.close(os.open(counter, os.O_WRONLY | os.O_NONBLOCK))
        assert proc.returncode == 0, proc.stderr
        assert "available_instances is a FIFO" in proc.stderr


# --- every value read once, as the daemon reads it (issue 21, item 3) ---------------------

POOL = "[devices]\nenabled_vf_pools = nic\n[vf_pool_nic]\ndevice_addresses = 0000:3b:00.0\n"
TYPE = "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\n"


@pytest.mark.parametrize(
    "body, bad, reason",
    [
        # The operator's cases.
        ("", "event_debounce = 50", "must be at most 10"),
        ("[api]\n", "threads = 100000", "must be at most 256"),
        ("", "rescan_interval = nan", "must be a finite number"),
        ("", "rescan_interval = 1e999", "must be a finite number"),
        ("", "rescan_interval = abc", "not a number"),
        ("", "debug = maybe", "not a boolean"),
        (POOL, "num_vfs = 99999", "must be at most 65535"),
        (POOL, "num_vfs = -1", "must be at least 0"),
        (POOL, "resource_class = custom_lower", "is neither CUSTOM_[A-Z0-9_]+ nor a standard"),
        (POOL, "traits = CUSTOM_OK, bad-trait", "trait 'bad-trait' is neither"),
        # One per option type.
        ("", "udev_events = maybe", "not a boolean"),  # BoolOpt (the agent's)
        ("[migration]\n", "claim_timeout = 1.5", "not an integer"),  # IntOpt
        ("[api]\n", "request_timeout = -inf", "must be a finite number"),  # FloatOpt
        ("[libvirt]\n", "qemu_globals = nonsense", "doesn't match regex"),  # ListOpt item
        (TYPE, "mdev_class = lower", "doesn't match regex"),  # StrOpt with a regex
        ("", "log_rotation_type = weekly", "valid values are"),  # StrOpt with choices
        ("[placement]\n", "timeout = nan", "must be a finite number"),  # keystoneauth's
        ("[placement]\n", "retriable_status_codes = 503, 42", "must be at least 100"),
        ("", "rate_limit_burst = -1", "must be at least 0"),  # oslo.log's, bounded here
        ("", "rate_limit_burst = abc", "not an integer"),  # read by the logging set-up
        ("[accel_agent_privileged]\n", "thread_pool_size = 0", "must be at least 1"),
        ("", "host = $nope", "its $-substitution names no option"),  # a value not convertible
    ],
)
def test_a_bad_value_is_refused_by_check_config_and_the_daemon_naming_file_and_line(
    config, body, bad, reason
):
    path = config.write(body + bad + "\n")
    line = config.line_of(bad)
    name, _, value = bad.partition(" = ")
    for proc in (accelctl("--config-file", str(path), "check-config"), agent_check(path)):
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert any(
            e.startswith(f"error: {path}:{line}: [") and f"] {name} = {value}: " in e
            and reason in e
            for e in errors(proc)
        ), proc.stderr
        assert "configuration OK" not in proc.stdout


def test_a_good_config_with_every_kind_of_value_passes(config):
    path = config.write(
        GOOD + "[api]\nthreads = 256\nrequest_timeout = 0.5\n[placement]\ntimeout = 10\n"
        "retriable_status_codes = 503\n" + POOL
        + "resource_class = FPGA\ntraits = CUSTOM_A, HW_NIC_SRIOV\nnum_vfs = 4\n",
        default="event_debounce = 10\nrescan_interval = 0.1\ndebug = yes\n",
    )
    proc = accelctl("--config-file", str(path), "check-config")
    assert proc.returncode == 0, proc.stderr
    assert agent_check(path).returncode == 0


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from tests.functional.privsep_fixture import skip_unless_root
    from tests.functional.simhost import simulated_host

    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("reload"), ["mtty"]) as host:
        yield host


RELOAD_CASES = ["event_debounce = 50", "rescan_interval = abc", "rescan_interval = nan",
                "debug = maybe", "event_debounce = 0.5   # seconds"]
def sighup_with(live, tmp_path, bad: str) -> tuple[str, Path, int]:
    """A daemon reloads a config with ``bad`` added to [DEFAULT]; (its refusal
    reason, the config, the bad line).  Asserts it keeps serving, unchanged."""
    from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir, wait_for

    body = "[devices]\nenabled_mdev_types = mtty-2\n"
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = tmp_path / "agent.conf"
        agent_config(config, live.root, live.state_dir, socket_path, body)
        with AgentDaemon(config, socket_path, tmp_path).start() as daemon:
            pid = daemon.pid
            providers = daemon.client().inventory()["providers"]
            agent_config(config, live.root, live.state_dir, socket_path, body,
                         extra=f"[DEFAULT]\n{bad}\n")
            line = next(n for n, text in enumerate(config.read_text().splitlines(), 1)
                        if text == bad)
            daemon.sighup()
            wait_for(lambda: daemon.health()["config"]["last_reload_result"] == "refused",
                     what="the refusal")
            # Still serving, the same process, with the old configuration.
            assert daemon.running and daemon.pid == pid
            assert daemon.client().inventory()["providers"] == providers
            assert "Traceback" not in daemon.log()
            return daemon.health()["config"]["last_reload_error"], config, line


@pytest.mark.fuse
@pytest.mark.privsep
@pytest.mark.parametrize("bad", RELOAD_CASES)
def test_a_reload_with_a_bad_value_is_refused_and_the_daemon_keeps_running(live, tmp_path, bad):
    reason, _config, _line = sighup_with(live, tmp_path, bad)
    assert bad.partition(" = ")[0] in reason


@pytest.mark.fuse
@pytest.mark.privsep
@pytest.mark.parametrize("bad", RELOAD_CASES)
def test_a_refused_reload_names_the_file_and_line(live, tmp_path, bad):
    reason, config, line = sighup_with(live, tmp_path, bad)
    name, _, value = bad.partition(" = ")
    assert f"{config}:{line}: [DEFAULT] {name} = {value}: " in reason


@pytest.mark.fuse
@pytest.mark.privsep
def test_a_reload_refuses_a_fifo_and_a_logging_configuration_others_can_write(live, tmp_path):
    """Issue 33: a FIFO in the config directory hung SIGHUP's reload (and the
    SIGTERM behind it) for ever; a logging configuration in a directory
    anyone could write ran its code as root at the next SIGHUP.  Now each is
    a refused reload naming the file; the daemon serves on and stops on
    SIGTERM."""
    from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir, wait_for

    body = "[devices]\nenabled_mdev_types = mtty-2\n"
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    shared.mkdir()
    ini = shared / "logging.ini"
    ini.write_text(
        "[loggers]\nkeys = root\n[handlers]\nkeys = h\n[formatters]\nkeys =\n"
        "[logger_root]\nhandlers = h\n"
        f"[handler_h]\nclass = __import__('pathlib').Path('{marker}').touch() or "
        "StreamHandler\nargs = ()\n"
    )
    shared.chmod(0o777)  # any local user could have written it
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = tmp_path / "agent.conf"
        agent_config(config, live.root, live.state_dir, socket_path, body)
        daemon = AgentDaemon(config, socket_path, tmp_path)
        with daemon.start("--config-dir", str(conf_d)):
            fifo = conf_d / "50-local.conf"
            os.mkfifo(fifo)
            try:
                daemon.sighup()
                wait_for(lambda: str(fifo) in (daemon.health()["config"]["last_reload_error"]
                                               or ""), what="the FIFO's refusal")
            finally:
                with contextlib.suppress(OSError):  # free a reader stuck in open()
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            assert "is a FIFO, not a regular file" in daemon.health()["config"][
                "last_reload_error"]
            fifo.unlink()
            (conf_d / "50-local.conf").write_text(f"[DEFAULT]\nlog_config_append = {ini}\n")
            daemon.sighup()
            wait_for(lambda: str(ini) in (daemon.health()["config"]["last_reload_error"] or ""),
                     what="the logging configuration's refusal")
            assert f"{shared} (directory, mode 0777, owner root) is writable by others" in (
                daemon.health()["config"]["last_reload_error"])
            assert daemon.running
            assert "Traceback" not in daemon.log()
        assert daemon.proc is not None and daemon.proc.returncode == 0  # SIGTERM acted on
    assert not marker.exists()


@pytest.mark.parametrize("command", ["types", "inventory", "mdevs"])
def test_a_value_every_command_reads_that_cannot_be_read_is_one_line(config, command):
    """sysfs_root, state_dir, host and [api] socket_path are read right after
    loading, by every command: a '$' naming no option is one line, no traceback."""
    path = config.write()
    path.write_text(path.read_text().replace("host = testhost", "host = $nope"))
    line = config.line_of("host = $nope")
    proc = accelctl("--config-file", str(path), "--offline", command)
    assert proc.returncode == 1
    assert errors(proc) == [
        f"error: {path}:{line}: [DEFAULT] host = $nope: its $-substitution names no option "
        "(write $$ for a literal $)"
    ], proc.stderr
