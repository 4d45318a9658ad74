"""accelctl's cache of what oslo.config resolved for the listings: a hit only
when every input is unchanged, never a different answer than oslo.config."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from accel_agent import exception, wiring
from accel_agent.config import cache as config_cache
from accel_agent.config import load as config_load
from accel_agent.devices import policy as policy_mod

CONF_TEXT = """
[DEFAULT]
sysfs_root = {root}
state_dir = {root}/state
host = cachehost
[devices]
enabled_mdev_types = nvidia-11, nvidia-12, nvidia-13
[mdev_nvidia-11]
device_addresses = 0000:06:00.0
max_instances = 3
[mdev_nvidia-12]
mdev_class = CUSTOM_TWELVE
[mdev_nvidia-99]
device_addresses = 0000:07:00.0
[api]
socket_path = {root}/api.sock
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(config_cache.CACHE_DIR_ENV, str(directory))
    for name in [k for k in os.environ if k.startswith("OS_")]:
        monkeypatch.delenv(name)
    return directory


@pytest.fixture
def conf_file(tmp_path) -> Path:
    path = tmp_path / "agent.conf"
    path.write_text(CONF_TEXT.format(root=tmp_path))
    return path


def listing(files, dirs=()):
    return wiring.listing_config([str(f) for f in files], [str(d) for d in dirs], "accelctl")


def oslo_must_not_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("oslo.config was loaded on a cache hit")

    monkeypatch.setattr(config_load, "load_config", refuse)


def rewrite(path: Path, text: str) -> None:
    # A different mtime even on file systems with coarse timestamps.
    before = path.stat().st_mtime_ns
    path.write_text(text)
    while path.stat().st_mtime_ns == before:
        time.sleep(0.01)
        path.write_text(text)


def test_a_hit_is_what_oslo_config_said_without_loading_it(cache_dir, conf_file, monkeypatch):
    first, errors = listing([conf_file])
    assert errors == []
    assert first.host == "cachehost" and first.api_socket_path.endswith("api.sock")
    assert first.policy_inputs.enabled == ("nvidia-11", "nvidia-12", "nvidia-13")
    assert len(list(cache_dir.iterdir())) == 1
    oslo_must_not_run(monkeypatch)
    second, errors = listing([conf_file])
    assert (second, errors) == (first, [])
    # The policy from cached inputs is the policy from oslo.config itself.
    from tests.configutil import make_conf

    direct = policy_mod.build_policy(make_conf(CONF_TEXT.format(root=conf_file.parent)))
    assert second.policy() == direct
    assert any("[mdev_nvidia-99] is ignored" in w for w in direct.warnings)


def test_an_edited_file_is_read_again(cache_dir, conf_file, tmp_path):
    listing([conf_file])
    rewrite(conf_file, CONF_TEXT.format(root=tmp_path).replace("cachehost", "renamed"))
    again, _ = listing([conf_file])
    assert again.host == "renamed"


def test_a_new_file_in_the_config_dir_is_read(cache_dir, conf_file, tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    assert listing([conf_file], [conf_d])[0].host == "cachehost"
    (conf_d / "10-host.conf").write_text("[DEFAULT]\nhost = fromdir\n")
    assert listing([conf_file], [conf_d])[0].host == "fromdir"
    (conf_d / "10-host.conf").unlink()
    assert listing([conf_file], [conf_d])[0].host == "cachehost"


def test_an_os_environment_override_is_honoured(cache_dir, conf_file, monkeypatch):
    assert listing([conf_file])[0].host == "cachehost"
    monkeypatch.setenv("OS_DEFAULT__HOST", "fromenv")
    assert listing([conf_file])[0].host == "fromenv"


def test_a_change_in_the_code_that_declares_options_is_a_miss(
    cache_dir, conf_file, tmp_path, monkeypatch
):
    code = tmp_path / "conf.py"
    code.write_text("# v1\n")
    monkeypatch.setattr(config_cache, "_CODE_FILES", (str(code),))
    listing([conf_file])
    rewrite(code, "# version two\n")
    loads = []
    real_load = config_load.load_config
    monkeypatch.setattr(
        config_load, "load_config", lambda *a, **k: loads.append(1) or real_load(*a, **k)
    )
    listing([conf_file])
    assert loads == [1]


def test_the_code_files_that_key_the_cache_exist():
    # A path that is not there stats the same forever: a moved module
    # would stop invalidating the cache without any error (it did: the
    # paths pointed one directory too high, and at a policy.py since moved).
    import accel_agent.config.options
    import accel_agent.devices.policy

    assert all(os.path.isfile(path) for path in config_cache._CODE_FILES)
    assert accel_agent.config.options.__file__ in config_cache._CODE_FILES
    assert accel_agent.devices.policy.__file__ in config_cache._CODE_FILES
    assert wiring.__file__ in config_cache._CODE_FILES


def test_refused_values_are_reported_every_time_and_never_cached(cache_dir, tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text(
        f"[DEFAULT]\nsysfs_root = {tmp_path}\n[devices]\nenabled_mdev_types = nvidia-11\n"
        "[mdev_nvidia-11]\nmdev_class = lowercase\n"
    )
    for _ in range(2):
        found, errors = listing([bad])
        assert [type(e) for e in errors] == [exception.InvalidMdevClass]
        with pytest.raises(exception.ConfigErrors):
            found.policy(errors)
    assert not cache_dir.exists() or not list(cache_dir.iterdir())


def test_a_duplicate_address_is_refused_from_cached_inputs_too(cache_dir, tmp_path, monkeypatch):
    dup = tmp_path / "dup.conf"
    dup.write_text(
        f"[DEFAULT]\nsysfs_root = {tmp_path}\n[devices]\nenabled_mdev_types = a-1, b-2\n"
        "[mdev_a-1]\ndevice_addresses = 0000:06:00.0\n[mdev_b-2]\ndevice_addresses = 06:00.0\n"
    )
    listing([dup])
    oslo_must_not_run(monkeypatch)
    cached, errors = listing([dup])
    with pytest.raises(exception.ConfigErrors) as caught:
        cached.policy(errors)
    assert "a-1" in caught.value.errors[0].message and "b-2" in caught.value.errors[0].message


@pytest.mark.parametrize("damage", ["garbage", "foreign-key", "group-writable"])
def test_a_damaged_or_untrusted_entry_is_ignored_and_replaced(
    cache_dir, conf_file, tmp_path, damage
):
    listing([conf_file])
    (entry,) = cache_dir.iterdir()
    if damage == "garbage":
        entry.write_text("{not json")
    elif damage == "foreign-key":
        data = json.loads(entry.read_text())
        data["value"]["host"] = "forged"
        data["key"]["files"][0][1] = [0, 0, 0, 0, 0]
        entry.write_text(json.dumps(data))
    else:
        data = json.loads(entry.read_text())
        data["value"]["host"] = "forged"
        entry.write_text(json.dumps(data))
        entry.chmod(0o664)
    assert listing([conf_file])[0].host == "cachehost"
    assert json.loads(entry.read_text())["value"]["host"] == "cachehost"


def test_an_empty_cache_dir_setting_turns_the_cache_off(tmp_path, conf_file, monkeypatch):
    monkeypatch.setenv(config_cache.CACHE_DIR_ENV, "")
    monkeypatch.chdir(tmp_path)
    before = set(tmp_path.rglob("*"))
    assert listing([conf_file])[0].host == "cachehost"
    assert set(tmp_path.rglob("*")) == before


def test_the_cache_directory_is_private(cache_dir, conf_file):
    listing([conf_file])
    assert cache_dir.stat().st_mode & 0o777 == 0o700
    (entry,) = cache_dir.iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600


def test_policy_inputs_survive_the_round_trip():
    inputs = policy_mod.PolicyInputs(
        enabled=("x-1", "y-2"),
        type_options=(
            policy_mod.TypeOptions("x-1", ("0000:06:00.0", "mtty"), "CUSTOM_X", 4),
            policy_mod.TypeOptions("y-2"),
        ),
        sections=("DEFAULT", "devices", "mdev_x-1"),
    )
    assert policy_mod.PolicyInputs.from_dict(json.loads(json.dumps(inputs.to_dict()))) == inputs
