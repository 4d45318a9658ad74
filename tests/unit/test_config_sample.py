"""The checked-in sample config must be what oslo-config-generator produces."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sample_config_is_not_stale(tmp_path):
    out = tmp_path / "sample.conf"
    generator = os.path.join(os.path.dirname(sys.executable), "oslo-config-generator")
    subprocess.run(
        [
            generator,
            "--config-file",
            os.path.join(ROOT, "etc", "oslo-config-generator", "accel-agent.conf"),
            "--output-file",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    with open(os.path.join(ROOT, "etc", "accel-agent.conf")) as handle:
        checked_in = handle.read()
    assert out.read_text() == checked_in, "etc/accel-agent.conf is stale: run make sample-config"


def test_sample_documents_nova_compatible_options():
    with open(os.path.join(ROOT, "etc", "accel-agent.conf")) as handle:
        text = handle.read()
    for needle in (
        "#enabled_mdev_types =",
        "Deprecated group/name - [devices]/enabled_vgpu_types",
        "#device_addresses =",
        "#mdev_class = VGPU",
        "#max_instances = <None>",
        "#sysfs_root = /sys",
    ):
        assert needle in text


def test_common_knows_the_ledger_file_name():
    from accel_agent import wiring
    from accel_agent.devices import ledger

    assert wiring.LEDGER_FILENAME == ledger.LEDGER_FILENAME
