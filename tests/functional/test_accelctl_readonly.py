"""accelctl and accel-agent as processes: exit codes, stderr, JSON, tables."""

import json
import os
import subprocess
import sys

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.simulator import testing as sim_testing
from accel_agent.simulator.profiles import NOVA_MDEV_06
from tests.configutil import write_conf

DUPLICATE = """
[devices]
enabled_mdev_types = nvidia-11, nvidia-12
[mdev_nvidia-11]
device_addresses = 0000:06:00.0
[mdev_nvidia-12]
device_addresses = 06:00.0
"""


def run(*args, check_rc=None):
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def agent(*args):
    return subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def nova_root(tmp_path):
    root = tmp_path / "sys"
    materialise(SimulatedHost(build_spec(["nova"])), str(root))
    return str(root)


def test_duplicate_address_fails_check_config_and_agent_start_with_same_message(
    tmp_path, nova_root
):
    conf = write_conf(str(tmp_path / "a.conf"), DUPLICATE, nova_root)
    proc = run("--config-file", conf, "check-config", check_rc=1)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "0000:06:00.0" in errors[0]
    assert "nvidia-11" in errors[0] and "nvidia-12" in errors[0]
    started = agent("--config-file", conf)
    assert started.returncode == 1
    assert errors[0] in started.stderr.splitlines()


def test_each_error_on_its_own_line_naming_the_value(tmp_path, nova_root):
    conf = write_conf(
        str(tmp_path / "a.conf"),
        "[devices]\nenabled_mdev_types = a, b\n[mdev_a]\ndevice_addresses = whoops\n"
        "[mdev_b]\nmdev_class = lower\n",
        nova_root,
    )
    proc = run("--config-file", conf, "check-config", check_rc=1)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2
    assert any("whoops" in e for e in errors) and any("lower" in e for e in errors)


def test_valid_config_passes_and_strict_turns_warnings_into_errors(tmp_path, nova_root):
    ok = write_conf(
        str(tmp_path / "ok.conf"),
        "[devices]\nenabled_mdev_types = nvidia-11\n[mdev_nvidia-11]\n"
        "device_addresses = 0000:06:00.0\n",
        nova_root,
    )
    proc = run("--config-file", ok, "check-config", check_rc=0)
    assert "configuration OK" in proc.stdout
    warn = write_conf(
        str(tmp_path / "warn.conf"),
        "[devices]\nenabled_mdev_types = nvidia-12\n[mdev_nvidia-12]\n"
        "device_addresses = 0000:06:00.0, 0000:42:00.0\n",
        nova_root,
    )
    proc = run("--config-file", warn, "check-config", check_rc=0)
    assert "warning:" in proc.stderr and "0000:42:00.0" in proc.stderr
    proc = run("--config-file", warn, "check-config", "--strict", check_rc=1)
    assert "error:" in proc.stderr and "0000:42:00.0" in proc.stderr


def test_usage_and_missing_config_exit_codes(tmp_path):
    assert run("no-such-command").returncode == 2
    assert run("types", "--bogus").returncode == 2
    assert run().returncode == 2
    proc = run("--config-file", str(tmp_path / "missing.conf"), "types", check_rc=1)
    assert "missing.conf" in proc.stderr


def test_json_listings(tmp_path, nova_root):
    conf = write_conf(
        str(tmp_path / "a.conf"), "[devices]\nenabled_mdev_types = nvidia-11\n", nova_root
    )
    types = json.loads(run("--config-file", conf, "types", "--json", check_rc=0).stdout)
    assert types["host"] == "testhost"
    p07 = next(p for p in types["parents"] if p["name"] == "0000:07:00.0")
    assert p07["configured_type"] == "nvidia-11"
    assert {t["type_id"]: t["available_instances"] for t in p07["types"]} == {
        "nvidia-11": 7,
        "nvidia-12": 10,
    }
    mdevs = json.loads(run("--config-file", conf, "mdevs", "--json", check_rc=0).stdout)
    entry = next(m for m in mdevs["mdevs"] if m["uuid"] == NOVA_MDEV_06)
    assert entry["owned"] is False and entry["configured"] is True
    inventory = json.loads(run("--config-file", conf, "inventory", "--json", check_rc=0).stdout)
    assert [(p["name"], p["inventory"]["total"], p["used"]) for p in inventory["providers"]] == [
        ("testhost_pci_0000_06_00_0", 16, 1),
        ("testhost_pci_0000_07_00_0", 8, 1),
    ]
    assert set(inventory["providers"][0]) >= {
        "name",
        "parent_provider",
        "parent_device",
        "pci_address",
        "physical_gpu",
        "mdev_type",
        "resource_class",
        "inventory",
        "used",
        "traits",
    }


def test_human_tables_are_aligned(tmp_path, nova_root):
    conf = write_conf(
        str(tmp_path / "a.conf"), "[devices]\nenabled_mdev_types = nvidia-11\n", nova_root
    )
    lines = run("--config-file", conf, "types", check_rc=0).stdout.splitlines()
    assert lines[0].split() == [
        "PARENT",
        "TYPE",
        "NAME",
        "API",
        "AVAILABLE",
        "MDEVS",
        "CONFIGURED",
    ]
    # Every row starts its TYPE column where the header does.
    column = lines[0].index("TYPE")
    assert all(line[column - 2 : column] == "  " for line in lines[1:])
    assert len(lines) == 4


def test_sysfs_root_override_and_empty_config(tmp_path, nova_root):
    proc = run("--sysfs-root", nova_root, "inventory", "--json", check_rc=0)
    assert json.loads(proc.stdout)["providers"] == []  # nothing enabled, nothing managed


@pytest.mark.fuse
def test_commands_on_a_mounted_simulator(tmp_path):
    if not sim_testing.fuse_available():
        pytest.skip(f"FUSE unavailable: {sim_testing.fuse_unavailable_reason()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, ACCEL_SIM_RUNDIR=str(tmp_path / "run"))

    def ctl(*args):
        return subprocess.run(
            [sys.executable, "-m", "accel_agent.cmd.ctl", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    mounted = ctl("simulate", "mount", str(mnt), "--profile", "nvidia-pf", "--profile", "mtty")
    assert mounted.returncode == 0, mounted.stderr
    try:
        conf = write_conf(
            str(tmp_path / "a.conf"),
            "[devices]\nenabled_mdev_types = nvidia-35, mtty-2\n"
            "[mdev_mtty-2]\ndevice_addresses = mtty\n",
            str(mnt),
        )
        assert ctl("--config-file", conf, "check-config").returncode == 0
        inv = json.loads(ctl("--config-file", conf, "inventory", "--json").stdout)
        assert {p["name"]: p["inventory"]["total"] for p in inv["providers"]} == {
            "testhost_pci_0000_84_00_0": 16,
            "testhost_pci_0000_85_00_0": 16,
            "testhost_mtty_mtty": 12,
        }
    finally:
        assert ctl("simulate", "umount", str(mnt)).returncode == 0


def test_a_listing_with_an_unchanged_config_does_not_import_oslo_config(tmp_path, nova_root):
    """The cold listing's budget (BENCHMARKS.md (a)) has no room for
    oslo.config's 70 ms import: the second run answers from the cache."""
    conf = write_conf(
        str(tmp_path / "a.conf"), "[devices]\nenabled_mdev_types = nvidia-11\n", nova_root
    )
    code = (
        "import sys; from accel_agent.cmd.ctl import main; rc = main(sys.argv[1:]); "
        "print('oslo_config' in sys.modules, file=sys.stderr); sys.exit(rc)"
    )
    env = dict(os.environ, ACCEL_AGENT_CACHE_DIR=str(tmp_path / "cache"))
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, "--offline", "--config-file", conf, "types", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=True,
        )
        for _ in range(2)
    ]
    assert [r.stderr.split()[-1] for r in runs] == ["True", "False"]
    assert runs[0].stdout == runs[1].stdout
    document = json.loads(runs[1].stdout)
    assert document["host"] == "testhost"
    assert {p["configured_type"] for p in document["parents"]} == {"nvidia-11"}


def test_a_reader_that_goes_away_ends_the_listing_without_a_traceback(tmp_path):
    """`accelctl types | head`: the pipe closes after a few lines."""
    root = tmp_path / "big"
    materialise(SimulatedHost(build_spec(["synthetic"], parents=64, types=24)), str(root))
    reader_r, writer_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--sysfs-root", str(root), "types"],
        stdout=writer_w,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(writer_w)
    with os.fdopen(reader_r, "rb") as reader:
        assert reader.readline().startswith(b"PARENT")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr
