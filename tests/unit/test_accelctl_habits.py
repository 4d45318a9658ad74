"""The command-line habits operators expect of accelctl and accel-agent
(issue 25): ``--version``, the global options after the command as well as
before it, and no configuration at all being an error rather than an empty
listing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

import accel_agent
from accel_agent.cmd import agent, common, ctl, plain_listing
from accel_agent.config import cache as config_cache
from accel_agent.config import files as config_files
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.configutil import write_conf

# --- --version ---------------------------------------------------------------------------

# The console script's own entry (accel_agent.cmd.accelctl), plain path first.
ACCELCTL = "import sys; from accel_agent.cmd.accelctl import main; sys.exit(main())"


def test_accelctl_version_names_the_installed_package():
    proc = subprocess.run(
        [sys.executable, "-c", ACCELCTL, "--version"],
        capture_output=True, text=True, timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"accelctl {metadata.version('accel-agent')}\n"
    assert metadata.version("accel-agent") == accel_agent.__version__


def test_accel_agent_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        agent.parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"accel-agent {accel_agent.__version__}\n"


def test_version_falls_back_to_the_source_tree(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert common.package_version() == accel_agent.__version__


def test_building_the_parser_reads_no_package_metadata():
    """``--version`` reads the metadata when given, not every command."""
    probe = (
        "import sys; from accel_agent.cmd import ctl; ctl.build_parser(); "
        "print('importlib.metadata' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout.strip() == "False"


# --- global options after the command ------------------------------------------------------

GLOBAL = {
    "--config-file": ["a.conf"],
    "--config-dir": ["conf.d"],
    "--sysfs-root": ["/tmp"],
    "--offline": [],
    "-v": [],
    "--verbose": [],
}
COMMANDS = [
    ["check-config"],
    ["types", "--json"],
    ["inventory"],
    ["allocate", "vm", "--count", "1"],
    ["attach", "vm", "--vgpu", "VGPU"],
    ["domain-xml", "vm", "--json"],
    ["adopt", "--from-libvirt", "--dry-run"],
    ["migration", "claim", "vm", "--mdev", "c2177883-f1bb-47f0-914d-32a22e3a8804=nvidia-35"],
    ["migration", "abort", "vm"],
    ["ledger", "upgrade"],
    ["nova-pci-config", "--per-gpu", "2"],
    ["xml", "list", "--json"],
]


def _comparable(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"} | {
        "func": getattr(args.func, "__qualname__", None)
    }


@pytest.mark.parametrize("option", list(GLOBAL))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_a_global_option_after_the_command_means_what_it_means_before(option, command):
    given = [option, *GLOBAL[option]]
    before = ctl.parse([*given, *command])
    after = ctl.parse([*command, *given])
    assert _comparable(after) == _comparable(before)
    # ... and means something: the option is not left at its default.
    assert _comparable(after) != _comparable(ctl.parse(command))
    assert not any(name.endswith(ctl.AFTER) for name in vars(after))


def test_every_command_takes_every_global_option_after_it():
    """Each command's own parser (``simulate`` excepted, whose words go to
    the simulator's parser) has the global options."""
    main = ctl.build_parser()
    wanted = {
        s for a in main._actions for s in a.option_strings if s not in ("-h", "--help", "--version")
    }
    leaves = ctl._leaf_commands(main)
    assert {p.prog for p in leaves} >= {"accelctl types", "accelctl migration claim",
                                       "accelctl ledger upgrade", "accelctl xml rewrite"}
    for leaf in leaves:
        assert wanted <= set(leaf._option_string_actions), leaf.prog


def test_global_options_before_and_after_add_up():
    args = ctl.parse(["--config-file", "a", "--sysfs-root", "/x", "types",
                      "--config-file", "b", "--config-dir", "d", "--sysfs-root", "/y"])
    assert (args.config_file, args.config_dir, args.sysfs_root) == (["a", "b"], ["d"], "/y")
    kept = ctl.parse(["--config-file", "a", "--offline", "-v", "types", "--json"])
    assert (kept.config_file, kept.offline, kept.verbose, kept.json) == (["a"], True, True, True)
    nothing = ctl.parse(["types"])
    assert (nothing.config_file, nothing.config_dir, nothing.sysfs_root, nothing.offline,
            nothing.verbose) == ([], [], None, False, False)


def test_an_abbreviation_keeps_meaning_the_commands_own_option():
    """argparse takes unique prefixes; the global options added after each
    command must not make one of its own ambiguous (``--s`` was --strict)."""
    assert ctl.parse(["check-config", "--s"]).strict is True
    assert ctl.parse(["allocate", "vm", "--cou", "3"]).count == 3
    # ... and the global ones may still be abbreviated after the command.
    offline = ctl.parse(["types", "--offl", "--config-f", "a"])
    assert (offline.offline, offline.config_file) == (True, ["a"])


def test_an_empty_sysfs_root_after_the_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        ctl.parse(["types", "--sysfs-root="])
    assert exit_.value.code == 2
    assert "--sysfs-root needs a directory" in capsys.readouterr().err


@pytest.fixture
def nova_conf(tmp_path):
    root = tmp_path / "sys"
    materialise(SimulatedHost(build_spec(["nova"])), str(root))
    return write_conf(
        str(tmp_path / "a.conf"), "[devices]\nenabled_mdev_types = nvidia-11\n", str(root)
    )


def test_a_listing_with_its_options_after_it_prints_the_same(tmp_path, nova_conf):
    """Through the console script: the plain path (options after the listing
    included) and the parser path (``-v`` sends it there) alike."""

    def accelctl(*argv):
        proc = subprocess.run(
            [sys.executable, "-c", ACCELCTL, *argv], capture_output=True, text=True,
            timeout=120, env={**os.environ, "ACCEL_AGENT_CACHE_DIR": str(tmp_path / "cache")},
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    before = accelctl("--offline", "--config-file", nova_conf, "types", "--json")
    assert json.loads(before)["parents"]  # a real listing, not an empty one
    assert accelctl("types", "--json", "--offline", "--config-file", nova_conf) == before
    assert accelctl("types", "--config-file", nova_conf, "--json", "--offline") == before
    assert accelctl("--offline", "types", "-v", "--json", "--config-file", nova_conf) == before


# --- no configuration at all ---------------------------------------------------------------


@pytest.fixture
def no_default_config(tmp_path, monkeypatch):
    """A host without /etc/accel-agent (stand-ins that do not exist)."""
    file = tmp_path / "etc" / "accel-agent.conf"
    directory = tmp_path / "etc" / "accel-agent.conf.d"
    monkeypatch.setattr(config_files, "DEFAULT_CONFIG_FILE", str(file))
    monkeypatch.setattr(config_files, "DEFAULT_CONFIG_DIR", str(directory))
    return file, directory


NEEDS_CONFIG = [
    ["types"],
    ["mdevs", "--json"],
    ["inventory", "--json"],
    ["check-config"],
    ["reload"],
    ["allocate", "vm", "--count", "1"],
    ["release", "vm"],
    ["domain-xml", "vm", "--json"],
    ["recover"],
    ["adopt", "--from-libvirt"],
    ["migration", "abort", "vm"],
    ["ledger", "upgrade"],
    ["nova-pci-config", "--json"],
]


@pytest.mark.parametrize("command", NEEDS_CONFIG, ids=lambda c: "-".join(c[:2]))
def test_no_configuration_at_all_is_an_error_naming_where_it_looked(
    command, no_default_config, capsys
):
    file, directory = no_default_config
    assert ctl.main(command) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: no configuration: ")
    assert str(file) in err and str(directory) in err and "--config-file FILE" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("present", ["file", "directory"])
def test_the_default_file_or_directory_is_a_configuration(present, no_default_config):
    file, directory = no_default_config
    if present == "file":
        file.parent.mkdir()
        file.write_text("")
    else:
        directory.mkdir(parents=True)
    assert common.missing_config([], []) is None


def test_a_config_given_needs_no_default(no_default_config):
    """(``--sysfs-root`` without any configuration, a look at a tree with the
    default options: tests/functional/test_accelctl_readonly.py.)"""
    assert common.missing_config([], []) is not None
    assert common.missing_config(["x.conf"], []) is None
    assert common.missing_config([], ["x.d"]) is None


@pytest.mark.parametrize(
    "argv", [["--help"], ["types", "--help"], ["--version"]], ids=["help", "types-help", "version"]
)
def test_help_and_version_need_no_configuration(argv, no_default_config, capsys):
    with pytest.raises(SystemExit) as exit_:
        ctl.main(argv)
    assert exit_.value.code == 0
    assert "no configuration" not in capsys.readouterr().err


def test_commands_that_read_no_configuration_need_none(no_default_config, capsys):
    assert ctl.main(["simulate", "profiles"]) == 0
    assert "nvidia-pf" in capsys.readouterr().out
    assert ctl.main([]) == 2  # no command: the usage, as before


def test_the_plain_listing_path_leaves_a_missing_configuration_to_the_parser_path(
    no_default_config, monkeypatch
):
    """Without this, a cached answer for "no config files" would print a
    listing (exit 0) where the parser path says there is no configuration."""

    def cached(files, dirs):
        return {"api_socket_path": "/nonexistent.sock"}

    monkeypatch.setattr(config_cache, "load", cached)
    monkeypatch.setattr(plain_listing, "_offline", lambda request, cached: 0)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert plain_listing.answer(["types", "--json"]) is None
    # The control: with a configuration the same cached answer is printed.
    assert plain_listing.answer(["--config-file", "x.conf", "types", "--json"]) == 0


# --- --json --------------------------------------------------------------------------------

MDEV = "c2177883-f1bb-47f0-914d-32a22e3a8804"


def test_domain_xml_json_splits_the_devices_from_the_domain_part():
    from accel_agent.cmd import ctl_devices
    from accel_agent.libvirt_xml import MdevDevice, PciHostdev, device_xml, instance_devices_xml

    devices = [MdevDevice(MDEV.upper()), PciHostdev("0000:C1:00.5")]
    text = instance_devices_xml(devices, ["vfio-pci.enable-migration=on"])
    document = ctl_devices.domain_xml_document("vm-1", text)
    assert document == {
        "instance": "vm-1",
        "devices": [
            {"type": "mdev", "uuid": MDEV, "xml": device_xml(devices[0])},
            {"type": "pci", "address": "0000:c1:00.5", "xml": device_xml(devices[1])},
        ],
        "qemu_commandline": text.splitlines()[-1],
        "xml": text,
    }
    assert 'xmlns:qemu="' in document["qemu_commandline"]  # a whole element on its own
    bare = ctl_devices.domain_xml_document("vm-1", instance_devices_xml(devices[:1]))
    assert bare["qemu_commandline"] is None and len(bare["devices"]) == 1


def test_simulate_status_json_is_the_simulators_status(capsys, monkeypatch):
    from accel_agent.simulator import cli as simulator_cli
    from accel_agent.simulator.model import SimulatedHost as Host

    status = json.loads(json.dumps(Host(build_spec(["mtty"])).status()))
    status.update(pid=1, mountpoint="/x", mounted=True, profiles=["mtty"])

    class Fake:
        def status(self, counters: bool = True) -> dict:
            return status

    monkeypatch.setattr(simulator_cli, "_client", lambda args: Fake())
    assert ctl.main(["simulate", "status", "/x", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == status
    assert {"mountpoint", "pid", "mounted", "boot_count", "profiles", "parents", "mdevs",
            "blocked_removes"} <= set(printed)
