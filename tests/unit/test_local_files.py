"""Local files that are not files, or are someone else's (issue 33, items 3
and 10; issue 34: the default directory), as the start, a reload and
check-config read them: one error naming the path, never a hang, never code
run from a file another user could write.

In process (config.load.load_config is what the start, accelctl and check-config
call; daemon.reloads.load_new_config what a reload calls).  A call that
could block in a FIFO runs in a thread with a generous bound, and the FIFO
is opened from the other side afterwards whatever happened, so a failing
test hangs nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from oslo_config import cfg

from accel_agent import exception, wiring
from accel_agent.cmd import ctl
from accel_agent.config import check, registry
from accel_agent.config import files as safe_files
from accel_agent.config import lint as config_lint
from accel_agent.config import load as config_load
from accel_agent.config import options as agent_conf
from accel_agent.daemon import logs, reloads
from tests.unit.test_sysfs_hostile import bounded

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of another owner")
NOBODY = 65534


def fresh_conf() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    return conf


def load(files: list[Path], dirs: list[Path] = ()) -> cfg.ConfigOpts:
    return config_load.load_config([str(f) for f in files], [str(d) for d in dirs], "accelctl",
                                   conf=fresh_conf())


def refusal(files: list[Path], dirs: list[Path] = (), fifos: list[Path] = ()) -> str:
    """The one message load_config refuses these files with (in a thread:
    a FIFO must not hang the test)."""

    def call() -> str:
        try:
            load(files, dirs)
        except exception.InvalidConfig as exc:
            return exc.message
        raise AssertionError("the files were accepted")

    return bounded(call, [str(f) for f in fifos])


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "accel-agent.conf"
    path.write_text(f"[DEFAULT]\nhost = fromfile\nstate_dir = {tmp_path / 'state'}\n")
    return path


@pytest.fixture
def conf_d(tmp_path) -> Path:
    directory = tmp_path / "accel-agent.conf.d"
    directory.mkdir()
    return directory


# --- files that are not files ----------------------------------------------------------


def test_a_fifo_in_the_config_directory_is_one_error_naming_it(config, conf_d):
    fifo = conf_d / "50-local.conf"
    os.mkfifo(fifo)
    message = refusal([config], [conf_d], fifos=[fifo])
    assert message == (
        f"Invalid configuration: config file {fifo} is a FIFO, not a regular file; the agent "
        "reads only regular files (a link to one is fine)"
    )


def test_a_reload_refuses_a_fifo_in_the_config_directory_instead_of_hanging(config, conf_d):
    # Before: SIGHUP's reload blocked in open() for ever, POST /v1/reload hung,
    # health said ok and SIGTERM waited for someone to write to the FIFO.
    fifo = conf_d / "50-local.conf"
    os.mkfifo(fifo)

    def call() -> str:
        try:
            reloads.load_new_config([str(config)], [str(conf_d)])
        except exception.ReloadRefused as exc:
            return reloads.refusal_reason(exc)
        raise AssertionError("the reload read the FIFO")

    reason = bounded(call, [str(fifo)])
    assert reason.endswith(f"config file {fifo} is a FIFO, not a regular file; the agent reads "
                           "only regular files (a link to one is fine)")


def test_a_config_file_that_is_a_link_to_dev_zero_is_one_error(tmp_path, config):
    zero = tmp_path / "zero.conf"
    zero.symlink_to("/dev/zero")
    # Before: check-config read it until MemoryError and printed a traceback.
    message = refusal([config, zero])
    assert message == (
        f"Invalid configuration: config file {zero} (a link to /dev/zero) is a character "
        "device, not a regular file; the agent reads only regular files (a link to one is fine)"
    )


def test_a_config_file_larger_than_the_bound_is_not_read(tmp_path, config):
    big = tmp_path / "big.conf"
    big.write_bytes(b"# " + b"x" * safe_files.MAX_CONFIG_BYTES + b"\n")
    assert refusal([config, big]) == (
        f"Invalid configuration: config file {big} is larger than "
        f"{safe_files.MAX_CONFIG_BYTES} bytes; the agent does not read it"
    )


def test_a_config_file_that_is_a_link_to_a_regular_file_is_read(tmp_path, config):
    # Operators link config files: a link to a regular file is fine.
    elsewhere = tmp_path / "kept" / "agent.conf"
    elsewhere.parent.mkdir()
    elsewhere.write_text("[DEFAULT]\nhost = linked\n")
    link = tmp_path / "linked.conf"
    link.symlink_to(elsewhere)
    assert load([config, link]).host == "linked"


def test_check_config_says_it_in_one_line_and_its_json_names_the_file(config, conf_d, capsys):
    fifo = conf_d / "50-local.conf"
    os.mkfifo(fifo)
    args = ["--offline", "--config-file", str(config), "--config-dir", str(conf_d),
            "check-config"]
    assert bounded(lambda: ctl.main(args), [str(fifo)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: Invalid configuration: config file {fifo} is a FIFO, not a regular file; the "
        "agent reads only regular files (a link to one is fine)"
    ]
    assert bounded(lambda: ctl.main([*args, "--json"]), [str(fifo)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [(e["file"], e["line"]) for e in document["errors"]] == [(str(fifo), None)]


@pytest.mark.parametrize("companion", ["", "-wal", "-shm"])
@pytest.mark.parametrize("reader", ["listing", "daemon"])
def test_a_fifo_among_the_ledger_s_files_is_one_error_naming_it(tmp_path, companion, reader):
    from accel_agent.devices.ledger import Ledger

    state = tmp_path / "state"
    Ledger(str(state)).close()  # a ledger as the agent leaves it
    fifo = state / f"ledger.sqlite3{companion}"
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)

    def call() -> str:
        try:
            if reader == "listing":  # accelctl --offline, check-config, the start's check
                wiring.read_ledger(str(state))
            else:
                Ledger(str(state)).close()  # the daemon's own connection
        except exception.LedgerError as exc:
            return exc.message
        raise AssertionError("the ledger was opened")

    assert bounded(call, [str(fifo)]) == (
        f"mdev ledger error: the mdev ledger's file {fifo} is a FIFO, not a regular file; the "
        "agent reads only regular files (a link to one is fine): move it aside (the agent "
        "refuses to start until it is one)"
    )


def test_an_offline_listing_over_a_fifo_ledger_is_one_error(tmp_path, config, capsys):
    from accel_agent.simulator import build_spec, materialise

    root = materialise(build_spec(["mtty"]), tmp_path / "sys")
    state = tmp_path / "state"
    state.mkdir()
    fifo = state / "ledger.sqlite3"
    os.mkfifo(fifo)
    with config.open("a") as handle:
        handle.write(f"sysfs_root = {root}\n")
    status = bounded(
        lambda: ctl.main(["--offline", "--config-file", str(config), "mdevs"]), [str(fifo)]
    )
    assert status == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(fifo) in err[0] and "is a FIFO" in err[0], err


def test_a_file_replaced_between_the_check_and_oslo_config_s_read_is_refused(
    config, monkeypatch
):
    # oslo.config opens the files again by path: what it read must be what
    # was checked (only root can change it in between, e.g. an editor saving
    # during a reload).
    checked = config_lint.named_file_errors

    def replaced_meanwhile(read):
        swap = config.with_name("swap.conf")
        swap.write_text("[DEFAULT]\nhost = other\n")
        swap.replace(config)
        return checked(read)

    monkeypatch.setattr(config_lint, "named_file_errors", replaced_meanwhile)
    assert refusal([config]) == (
        f"Invalid configuration: config file {config} changed while it was being read; "
        "nothing was applied: try again"
    )


# --- files someone else could change -----------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_config_directory_others_can_write_is_refused_naming_it_and_its_mode(
    config, conf_d, mode
):
    (conf_d / "10-types.conf").write_text("[DEFAULT]\nhost = fromdir\n")
    conf_d.chmod(mode)
    # A sticky config directory too: anyone could add a file to it.
    assert refusal([config], [conf_d]) == (
        f"Invalid configuration: config directory {conf_d} could be changed by another user "
        f"than root: {conf_d} (directory, mode {mode:04o}, owner root) is writable by others; "
        "the agent runs as root and trusts only what root alone can change (as sshd's "
        "StrictModes): chmod go-w, chown root"
    )


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_a_config_file_others_can_write_is_refused_naming_it_and_its_mode(config, mode):
    config.chmod(mode)
    message = refusal([config])
    assert message.startswith(
        f"Invalid configuration: config file {config} could be changed by another user than "
        f"root: {config} (regular file, mode {mode:04o}, owner root) is writable by others;"
    ), message


@ROOT_ONLY
def test_a_config_file_of_another_user_is_refused(config):
    os.chown(config, NOBODY, -1)
    assert f"{config} (regular file, mode 0644, owner nobody) is owned by another user, who " \
        "can change it" in refusal([config])


def test_a_link_into_a_directory_others_can_write_is_refused_naming_that_directory(
    tmp_path, config
):
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "agent.conf"
    target.write_text("[DEFAULT]\nhost = x\n")
    shared.chmod(0o777)
    link = tmp_path / "linked.conf"
    link.symlink_to(target)
    assert f"{shared} (directory, mode 0777, owner root) is writable by others" in refusal(
        [config, link]
    )


@ROOT_ONLY
def test_an_entry_of_root_in_a_sticky_directory_is_fine_another_user_s_is_not(tmp_path):
    # /tmp: mode 1777, where only an entry's owner may rename or delete it.
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    mine = sticky / "agent"
    mine.mkdir()
    config = mine / "agent.conf"
    config.write_text("[DEFAULT]\nhost = sticky\n")
    assert load([config]).host == "sticky"
    os.chown(mine, NOBODY, -1)
    assert f": {sticky} (directory, mode 1777, owner root) is writable by others and its " \
        f"entry {mine} is owned by nobody, whom the sticky bit lets replace it;" in refusal(
            [config])


def test_the_suite_s_own_layout_is_accepted(tmp_path, config, conf_d):
    # pytest's tmp_path: /tmp (1777) / pytest-of-<user> (0700) / ...
    (conf_d / "10.conf").write_text("[DEFAULT]\nhost = fromdir\n")
    assert load([config], [conf_d]).host == "fromdir"


def test_log_config_append_naming_a_file_others_can_write_is_refused_at_start_and_reload(
    tmp_path, config
):
    ini = tmp_path / "logging.ini"
    ini.write_text("[loggers]\nkeys = root\n")
    ini.chmod(0o666)
    with config.open("a") as handle:
        handle.write(f"log_config_append = {ini}\n")
    expected = (
        f"{config}:4: [DEFAULT] log_config_append = {ini}: the logging configuration (oslo.log "
        f"runs what it names, as root) {ini} could be changed by another user than root: {ini} "
        "(regular file, mode 0666, owner root) is writable by others; the agent runs as root "
        "and trusts only what root alone can change (as sshd's StrictModes): chmod go-w, "
        "chown root"
    )
    # The start and every accelctl command (check-config too) load through here.
    assert refusal([config]) == expected
    with pytest.raises(exception.ReloadRefused) as refused:
        reloads.load_new_config([str(config)], [])
    assert reloads.refusal_reason(refused.value) == expected


def test_a_logging_configuration_others_can_write_is_not_loaded_where_it_is_used(
    tmp_path, config
):
    """daemon.logs checks again what oslo.log will load (a value whose
    $-substitution only oslo.config resolves, a file changed since): the
    ini's handler would run code as root."""
    marker = tmp_path / "ran"
    ini = tmp_path / "logging.ini"
    ini.write_text(
        "[loggers]\nkeys = root\n[handlers]\nkeys = h\n[formatters]\nkeys =\n"
        "[logger_root]\nhandlers = h\n"
        f"[handler_h]\nclass = __import__('pathlib').Path('{marker}').touch() or "
        "StreamHandler\nargs = ()\n"
    )
    ini.chmod(0o666)
    with config.open("a") as handle:
        handle.write(f"log_dir = {tmp_path}\nlog_config_append = $log_dir/logging.ini\n")
    old = load([config])  # the raw value names no file: left to the use
    new = load([config])
    registry.register(old)
    registry.register(new)
    assert new.log_config_append == str(ini)
    assert logs.log_config_problem(new) is not None
    notes = logs.apply_reload(old, new)
    assert any(n.startswith("[DEFAULT] log_config_append: the logging configuration") and
               n.endswith("; the logging is unchanged") for n in notes), notes
    with pytest.raises(SystemExit, match=f"error: refusing to start: .*{ini}"):
        logs.setup(new)
    assert not marker.exists()


@pytest.mark.parametrize(("section", "option"), [
    ("placement", "cafile"), ("placement", "certfile"), ("placement", "keyfile"),
    ("accel_agent_privileged", "helper_command"),
])
def test_other_files_the_configuration_trusts_are_refused_too(tmp_path, config, section,
                                                              option):
    named = tmp_path / "named"
    named.write_text("#!/bin/sh\n")
    named.chmod(0o646)
    value = f"{named} --config-file x" if option == "helper_command" else str(named)
    with config.open("a") as handle:
        handle.write(f"[{section}]\n{option} = {value}\n")
    message = refusal([config])
    assert message.startswith(f"{config}:5: [{section}] {option} = {named}: "), message
    assert f"{named} (regular file, mode 0646, owner root) is writable by others" in message


def test_a_private_key_others_can_read_is_a_warning(tmp_path, config):
    key = tmp_path / "client.key"
    key.write_text("secret\n")
    key.chmod(0o644)
    with config.open("a") as handle:
        handle.write(f"[placement]\nkeyfile = {key}\n")
    load([config])  # read by another user is no way in: not an error
    assert config_lint.lint([str(config)]) == [
        f"{config}:5: [placement] keyfile = {key}: the client certificate's key is readable "
        "by others (mode 0644): chmod 0600 it"
    ]
    key.chmod(0o600)
    assert config_lint.lint([str(config)]) == []


# --- written twice -------------------------------------------------------------------------


def test_an_option_set_twice_in_one_file_is_a_warning_naming_both_lines(tmp_path):
    path = tmp_path / "agent.conf"
    path.write_text("[devices]\nenabled_mdev_types = nvidia-35\n\n"
                    "[api]\nthreads = 4\n[devices]\nenabled-mdev-types = nvidia-36\n")
    warnings = config_lint.lint([str(path)])
    assert f"{path}:7: [devices] enabled-mdev-types is set again (also at {path}:2); this " \
        f"value wins and the one at {path}:2 is ignored: set it once" in warnings
    assert f"{path}:6: section [devices] is written again (also at {path}:1); oslo.config " \
        "reads both as one, an option set in both takes the later value: write the section " \
        "once" in warnings
    assert len(warnings) == 2
    where = [config_lint.locate(w) for w in warnings]
    assert {(w.file, w.line, w.section, w.option) for w in where} == {
        (str(path), 6, "devices", None), (str(path), 7, "devices", "enabled-mdev-types"),
    }


def test_an_option_in_two_files_is_the_drop_in_s_point_not_a_warning(config, conf_d):
    drop_in = conf_d / "10.conf"
    drop_in.write_text("[DEFAULT]\nhost = fromdir\n")
    assert config_lint.lint([str(config), str(drop_in)]) == []


def test_an_option_set_twice_is_an_error_with_strict(tmp_path):
    from accel_agent.simulator import build_spec, materialise

    root = materialise(build_spec(["mtty"]), tmp_path / "sys")
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nhost = a\nsysfs_root = {root}\nstate_dir = {tmp_path}/s\n"
                    "host = b\n")
    conf = load([path])
    twice = (f"{path}:5: [DEFAULT] host is set again (also at {path}:2); this value wins and "
             f"the one at {path}:2 is ignored: set it once")
    assert check.check(conf)[:2] == ([], [twice])
    assert check.check(conf, strict=True)[:2] == ([twice], [])


# --- the default directory (issue 34) ----------------------------------------------------


@pytest.fixture
def packaged(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Stand-ins for /etc/accel-agent/accel-agent.conf and its .conf.d."""
    etc = tmp_path / "etc"
    directory = etc / "accel-agent.conf.d"
    directory.mkdir(parents=True)
    file = etc / "accel-agent.conf"
    file.write_text("[DEFAULT]\nhost = packaged\n")
    (directory / "10.conf").write_text("[DEFAULT]\nhost = dropin\n")
    monkeypatch.setattr(safe_files, "DEFAULT_CONFIG_FILE", str(file))
    monkeypatch.setattr(safe_files, "DEFAULT_CONFIG_DIR", str(directory))
    return file, directory


def test_the_default_directory_follows_the_default_file_only(packaged, config, conf_d):
    file, directory = packaged
    # Nothing named, or the default file named (the systemd unit): then its drop-ins.
    assert load([]).host == "dropin"
    assert load([file]).host == "dropin"
    assert safe_files.config_sources([str(file)], []) == ([str(file)], [str(directory)])
    # Another file named: that file, not that file with the host's drop-ins over it.
    assert load([config]).host == "fromfile"
    assert safe_files.config_sources([str(config)], []) == ([str(config)], [])
    # --config-dir replaces the default directory.
    (conf_d / "10.conf").write_text("[DEFAULT]\nhost = named\n")
    assert load([config], [conf_d]).host == "named"
    assert load([file], [conf_d]).host == "named"

