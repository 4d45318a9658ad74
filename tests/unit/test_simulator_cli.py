"""``accelctl simulate`` commands that need no FUSE, and its argparse wiring."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from accel_agent.simulator import cli, control
from accel_agent.simulator.spec import HostSpec


def run(argv: list[str]) -> int:
    """Like accelctl: a top-level parser with subparsers(dest='command')."""
    parser = argparse.ArgumentParser(prog="accelctl")
    subparsers = parser.add_subparsers(dest="command")
    cli.register(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


def test_spec_prints_a_loadable_spec(capsys):
    assert run(["simulate", "spec", "--profile", "mtty", "--profile", "nvidia-sriov",
                "--vfs", "2"]) == 0
    spec = HostSpec.from_json(capsys.readouterr().out)
    assert spec.profiles == ("mtty", "nvidia-sriov")
    assert sorted(p.name for p in spec.parents) == ["0000:41:00.4", "0000:41:00.5", "mtty"]


def test_default_profile_and_spec_file(tmp_path, capsys):
    assert run(["simulate", "spec"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"] == ["nvidia-pf"]
    path = tmp_path / "host.json"
    assert run(["simulate", "spec", "--profile", "mtty"]) == 0
    path.write_text(capsys.readouterr().out)
    assert run(["simulate", "spec", "--spec", str(path), "--profile", "nova"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"] == ["mtty", "nova"]


def test_materialise(tmp_path, capsys):
    target = tmp_path / "tree"
    assert run(["simulate", "materialise", str(target), "--profile", "synthetic",
                "--parents", "3", "--types", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert len(os.listdir(target / "class" / "mdev_bus")) == 3


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "spec", "--profile", "nvidia-pf", "--vfs", "2"], "vfs not used"),
    (["simulate", "materialise", "/proc/self/nonexistent-dir", "--profile", "mtty"],
     "cannot use"),
    (["simulate", "spec", "--spec", "/nonexistent.json"], "cannot read /nonexistent.json"),
    (["simulate", "reboot", "/nonexistent-mountpoint"], "no simulator is serving"),
])
def test_errors_exit_1_with_a_message(argv, needle, capsys):
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["simulate", "mount"],                          # no directory
    ["simulate", "spec", "--profile", "nope"],      # unknown profile
    ["simulate", "spec", "--gpus", "0"],            # not >= 1
])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 2


def test_missing_action_is_usage(capsys):
    assert run(["simulate"]) == 2
    assert "action is required" in capsys.readouterr().err


def test_profiles_lists_every_profile(capsys):
    assert cli.main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("nvidia-pf", "nvidia-sriov", "i915-gvtg", "mtty", "synthetic"):
        assert name in out


def test_mount_without_fuse_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(control, "fuse_unavailable_reason", lambda: "/dev/fuse does not exist")
    assert run(["simulate", "mount", str(tmp_path / "sys"), "--profile", "mtty"]) == 1
    assert "FUSE is not available: /dev/fuse does not exist" in capsys.readouterr().err
    assert not (tmp_path / "sys").exists()
