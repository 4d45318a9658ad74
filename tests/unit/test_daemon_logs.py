"""The daemon's logging set-up and what a reload changes (accel_agent.daemon.logs),
and ``use_journal = true`` without the systemd bindings (config/values.py)."""

from __future__ import annotations

import logging

import pytest

from accel_agent.config import registry
from accel_agent.config import values as config_values
from accel_agent.daemon import logs
from tests.configutil import make_conf


def conf_of(tmp_path, ini: str):
    conf = make_conf(ini, directory=str(tmp_path))
    registry.register(conf)
    return conf


@pytest.fixture
def root_level():
    root = logging.getLogger()
    level = root.level
    try:
        yield root
    finally:
        root.setLevel(level)


def test_a_reload_that_turns_debug_on_or_off_sets_the_root_level(tmp_path, root_level):
    off = conf_of(tmp_path, "[DEFAULT]\ndebug = false\n")
    on = conf_of(tmp_path, "[DEFAULT]\ndebug = true\n")
    root_level.setLevel(logging.INFO)
    assert logs.apply_reload(off, on) == []
    assert root_level.level == logging.DEBUG
    assert logs.apply_reload(on, off) == []
    assert root_level.level == logging.INFO


def test_a_reload_that_leaves_debug_alone_leaves_the_level_alone(tmp_path, root_level):
    # A level an operator's log_config_append file set is not overridden.
    same = conf_of(tmp_path, "[DEFAULT]\ndebug = false\n")
    root_level.setLevel(logging.WARNING)
    assert logs.apply_reload(same, conf_of(tmp_path, "[DEFAULT]\ndebug = false\n")) == []
    assert root_level.level == logging.WARNING


def test_logging_options_that_need_a_restart_are_noted(tmp_path, root_level):
    old = conf_of(tmp_path, "[DEFAULT]\n")
    new = conf_of(tmp_path, "[DEFAULT]\nlog_file = /tmp/x.log\nuse_json = true\n")
    assert logs.apply_reload(old, new) == [
        "[DEFAULT] log_file changed; it applies at the next restart",
        "[DEFAULT] use_json changed; it applies at the next restart",
    ]


def test_use_journal_without_the_bindings_is_an_error_naming_the_file(tmp_path, monkeypatch):
    conf = conf_of(tmp_path, "[DEFAULT]\nuse_journal = true\n")
    monkeypatch.setattr(config_values, "journal_available", lambda: False)
    errors = config_values.value_errors(conf)
    assert len(errors) == 1
    assert errors[0].endswith(
        ":2: [DEFAULT] use_journal = true: needs the systemd Python bindings, which are not "
        "installed (pip install 'accel-agent[journal]', i.e. systemd-python); or log to "
        "stderr, which systemd's journal records too"
    ), errors
    monkeypatch.setattr(config_values, "journal_available", lambda: True)
    assert config_values.value_errors(conf) == []
    assert config_values.value_errors(conf_of(tmp_path, "[DEFAULT]\nuse_journal = false\n")) == []


def test_journal_available_says_whether_systemd_journal_imports():
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        assert config_values.journal_available() is False
    else:
        assert config_values.journal_available() is True
