"""The configuration as operators write it, through the real commands
(accelctl and accel-agent as processes): a comment after a value, the
examples of the docs, the shipped sample with --strict, a VF pool's
section, and check-config --json."""

from __future__ import annotations

import grp
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.simulator.profiles import igb_port

REPO = Path(__file__).resolve().parents[2]
PF = igb_port(0)[0]


def run(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def accelctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run("accel_agent.cmd.ctl", "--offline", *args)


def agent(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run("accel_agent.cmd.agent", "--config-file", str(config), *args)


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("host") / "sys"
    materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty", "igb-sriov"], gpus=2)),
                str(path))
    return str(path)


@pytest.fixture
def paths(tmp_path, root) -> str:
    """[DEFAULT] and [api] lines that keep a command on the simulated host
    and in tmp_path (a later file wins, so they may follow any config)."""
    return (
        f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\n"
        f"[api]\nsocket_path = {tmp_path / 'api.sock'}\n[libvirt]\nuri =\n"
    )


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# --- a comment after a value --------------------------------------------------------------

BAD = [
    ("[DEFAULT]\n", "host = compute1   # the root resource provider"),
    ("[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\n",
     "max_instances = 4   # per physical GPU"),
]


@pytest.mark.parametrize("head, bad", BAD)
def test_a_comment_after_a_value_refuses_check_config_and_the_start(tmp_path, paths, head, bad):
    config = write(tmp_path / "agent.conf", paths + head + bad + "\n")
    line = line_of(config, bad)
    name, _, value = bad.partition(" = ")
    comment = value[value.index("#"):]
    expected = (f"{config}:{line}: [{head.splitlines()[-1][1:-1]}] {name} = {value}: "
                f"oslo.config has no inline comments, {comment!r} is part of the value; put "
                "the comment on a line of its own")
    check = accelctl("--config-file", str(config), "check-config")
    assert check.returncode == 1
    assert f"error: {expected}" in errors(check), check.stderr
    # The daemon's start, with and without --check: refused before it starts anything.
    for proc in (agent(config, "--check"), agent(config)):
        assert proc.returncode == 1, proc.stderr
        assert errors(proc)[:2] == ["error: refusing to start: invalid configuration",
                                    f"error: {expected}"], proc.stderr
        assert not (tmp_path / "api.sock").exists()


def test_a_comment_in_a_free_string_is_a_warning_and_an_error_with_strict(tmp_path, paths):
    # The directory as oslo.config reads the value, comment and all: it exists,
    # so the start (which opens a log file in it) takes it, and only the
    # comment is said.
    logs = f"{tmp_path}/logs   # kept 30 days"
    os.mkdir(logs)
    config = write(tmp_path / "agent.conf", paths + f"[DEFAULT]\nlog_dir = {logs}\n")
    line = line_of(config, "log_dir")
    proc = accelctl("--config-file", str(config), "check-config")
    assert proc.returncode == 0, proc.stderr
    assert (f"warning: {config}:{line}: [DEFAULT] log_dir = {logs}: "
            "'# kept 30 days' is part of the value") in proc.stderr
    strict = accelctl("--config-file", str(config), "check-config", "--strict")
    assert strict.returncode == 1
    assert any(e.startswith(f"error: {config}:{line}: [DEFAULT] log_dir")
               for e in errors(strict)), strict.stderr


def ini_blocks(document: Path) -> list[str]:
    return re.findall(r"```ini\n(.*?)```", document.read_text(), re.DOTALL)


@pytest.mark.parametrize(
    "document, index",
    [(d, i) for d in ("README.md", "docs/operations.md")
     for i in range(len(ini_blocks(REPO / d)))],
)
def test_the_examples_of_the_docs_say_what_they_mean(tmp_path, paths, document, index):
    """Every ini example of README and the operations guide, with this
    host's paths (and a group of this host for the socket's, which the start
    would refuse otherwise) after it, passes check-config with no comment in
    a value."""
    block = ini_blocks(REPO / document)[index]
    example = write(tmp_path / "example.conf", block)
    group = grp.getgrgid(os.getgid()).gr_name
    local = write(tmp_path / "local.conf", paths + f"[api]\nsocket_group = {group}\n")
    proc = accelctl("--config-file", str(example), "--config-file", str(local), "check-config")
    assert "inline comments" not in proc.stderr, proc.stderr
    assert "unknown" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


# --- the shipped sample passes --strict ---------------------------------------------------


def test_the_shipped_sample_passes_check_config_strict(tmp_path, paths):
    sample = REPO / "etc" / "accel-agent.conf"
    assert "[mdev_$(mdev_type)]" in sample.read_text()  # the stand-in is still there
    local = tmp_path / "conf.d"
    local.mkdir()
    write(local / "local.conf", paths)
    proc = accelctl("--config-file", str(sample), "--config-dir", str(local),
                    "check-config", "--strict")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("configuration OK: 0 mdev type(s) enabled")
    started = run("accel_agent.cmd.agent", "--config-file", str(sample), "--config-dir",
                  str(local), "--check")
    assert started.returncode == 0, started.stderr
    assert "ignored" not in started.stdout + started.stderr


def test_an_option_set_below_the_sample_s_stand_in_is_named(tmp_path, paths):
    sample = (REPO / "etc" / "accel-agent.conf").read_text()
    config = write(tmp_path / "agent.conf", sample.replace(
        "[mdev_$(mdev_type)]\n", "[mdev_$(mdev_type)]\nmax_instances = 2\n"))
    # The paths in a file of their own: the sample's [DEFAULT] written again
    # in one file would be warned about too.
    local = write(tmp_path / "paths.conf", paths)
    line = line_of(config, "max_instances = 2")
    proc = accelctl("--config-file", str(config), "--config-file", str(local),
                    "check-config", "--strict")
    assert proc.returncode == 1
    assert errors(proc) == [
        f"error: {config}:{line}: max_instances is set in [mdev_$(mdev_type)], the sample's "
        "stand-in for one section per name; it applies to nothing: name the section after "
        "the type, e.g. [mdev_nvidia-35]"
    ], proc.stderr


# --- [vf_pool_<name>] -------------------------------------------------------------------

POOL = f"""
[devices]
enabled_vf_pools = nic_a
[vf_pool_nic_a]
device_addresses = {PF}
resource_class = CUSTOM_NIC_A
traits = CUSTOM_FAST_NIC
num_vfs = 2
"""


def test_an_enabled_vf_pool_section_is_not_unknown(tmp_path, paths):
    config = write(tmp_path / "agent.conf", paths + POOL)
    proc = accelctl("--config-file", str(config), "check-config", "--strict")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    started = agent(config, "--check")  # its warnings go to its log (stderr)
    assert started.returncode == 0, started.stderr
    assert "unknown" not in started.stdout + started.stderr


def test_a_misspelt_vf_pool_section_is_unknown(tmp_path, paths):
    config = write(tmp_path / "agent.conf",
                   paths + POOL + "[vf_pools_nic_a]\nnum_vfs = 4\n")
    line = line_of(config, "[vf_pools_nic_a]")
    expected = f"{config}:{line}: unknown section [vf_pools_nic_a]; it is ignored"
    proc = accelctl("--config-file", str(config), "check-config")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {expected}" in proc.stderr.splitlines()
    started = agent(config, "--check")
    assert started.returncode == 0, started.stderr
    assert f"WARNING accel_agent [-] {expected}" in started.stdout + started.stderr


# --- check-config --json ----------------------------------------------------------------


def check_json(*args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = accelctl(*args, "check-config", "--json")
    assert proc.stderr == ""
    return proc, json.loads(proc.stdout)


def test_json_of_a_good_configuration(tmp_path, paths):
    config = write(tmp_path / "agent.conf", paths + POOL.replace(
        "[devices]\n", "[devices]\nenabled_mdev_types = mtty-2\n"))
    proc, document = check_json("--config-file", str(config))
    assert proc.returncode == 0
    assert document == {
        "ok": True, "strict": False, "errors": [], "warnings": [],
        "summary": {"mdev_types": 1, "providers": 1, "parents": 3},
        "nova_conf": [], "counted_twice": [],  # no --nova-conf (issue 23)
    }


def test_json_names_file_line_section_and_option_of_each_problem(tmp_path, paths, root):
    config = write(
        tmp_path / "agent.conf",
        paths + "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\n"
        "device_addresses = 0000:42:00.0\n[api]\nthreads = 4   # as many as cores\n"
        "[devics]\n",
    )
    proc, document = check_json("--config-file", str(config))
    assert proc.returncode == 1
    assert document["ok"] is False and document["summary"] is None
    (error,) = document["errors"]
    assert error == {
        "message": error["message"], "file": str(config),
        "line": line_of(config, "threads"), "section": "api", "option": "threads",
    }
    assert "oslo.config has no inline comments" in error["message"]
    warnings = {w["message"]: w for w in document["warnings"]}
    unknown = f"{config}:{line_of(config, '[devics]')}: unknown section [devics]; it is ignored"
    assert warnings[unknown] == {"message": unknown, "file": str(config),
                                 "line": line_of(config, "[devics]"), "section": "devics",
                                 "option": None}
    # With accelctl explain's verdict (accel_agent.explain.diagnose).
    absent = ("0000:42:00.0 (configured for nvidia-35) is not an mdev parent on this host: "
              f"there is no PCI device 0000:42:00.0 under {os.path.realpath(root)}; check the "
              "address (lspci -D lists the host's)")
    assert warnings[absent] == {"message": absent, "file": None, "line": None,
                                "section": None, "option": None}
    # The same messages as the text output, the same exit status.
    text = accelctl("--config-file", str(config), "check-config")
    assert text.returncode == 1
    assert [m["message"] for m in document["errors"]] == [e[len("error: "):]
                                                          for e in errors(text)]


def test_json_with_strict_counts_the_warnings_as_errors(tmp_path, paths):
    config = write(tmp_path / "agent.conf", paths + "[devics]\n")
    proc, document = check_json("--config-file", str(config))
    assert proc.returncode == 0 and document["ok"] is True
    assert [w["section"] for w in document["warnings"]] == ["devics"]
    proc = accelctl("--config-file", str(config), "check-config", "--strict", "--json")
    document = json.loads(proc.stdout)
    assert proc.returncode == 1 and document["ok"] is False and document["strict"] is True
    assert [e["section"] for e in document["errors"]] == ["devics"]
    assert document["warnings"] == []


def test_json_of_a_configuration_that_cannot_be_read(tmp_path):
    proc, document = check_json("--config-file", str(tmp_path))
    assert proc.returncode == 1
    assert document["ok"] is False and document["summary"] is None
    assert document["errors"] == [{
        "message": f"Invalid configuration: --config-file {tmp_path} is a directory; give a "
        "directory of *.conf files with --config-dir",
        "file": str(tmp_path), "line": None, "section": None, "option": None,
    }]
    missing = tmp_path / "nope.conf"
    proc, document = check_json("--config-file", str(missing))
    assert proc.returncode == 1
    assert [e["file"] for e in document["errors"]] == [str(missing)], document
