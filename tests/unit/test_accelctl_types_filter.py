"""``accelctl types --type/--parent/--configured`` (issue 34): a vGPU 17+
host lists every creatable type of every VF, ~1,500 rows for 2 GPUs x 32
VFs; the filters keep what an operator asks about, in the table and in
``--json`` (the same document shape, fewer parents and types)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.configutil import write_conf

GPUS = ["0000:c1:00.0", "0000:c2:00.0"]
TYPE = "nvidia-1150"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    base = tmp_path_factory.mktemp("types")
    root = str(base / "sys")
    materialise(SimulatedHost(build_spec(["nvidia-vfio"], gpus=2, vfs=4)), root)
    conf = write_conf(
        str(base / "a.conf"),
        f"""
        state_dir = {base}/state
        [api]
        socket_path = {base}/api.sock
        [devices]
        enabled_mdev_types = {TYPE}
        [mdev_{TYPE}]
        device_addresses = {GPUS[1]}
        """,
        root,
    )
    return conf


def types(conf: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--offline", "--config-file", conf,
         "types", "--json", *args],
        capture_output=True, text=True, timeout=120,
        env={"ACCEL_AGENT_CACHE_DIR": "", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def rows(document: dict) -> set[tuple[str, str]]:
    return {(p["name"], t["type_id"]) for p in document["parents"] for t in p["types"]}


def test_filters_keep_what_matches_and_the_shape(host):
    everything = types(host)
    assert len(rows(everything)) > 8 * 4  # every VF lists several types
    vfs_of = {gpu: {p["name"] for p in everything["parents"] if p["physical_gpu"] == gpu}
              for gpu in GPUS}

    by_type = types(host, "--type", TYPE)
    assert rows(by_type) == {(vf, TYPE) for gpu in GPUS for vf in vfs_of[gpu]}

    # A GPU's short address names all of its VFs; a VF's names itself.
    by_gpu = types(host, "--parent", GPUS[0][5:])
    assert {name for name, _ in rows(by_gpu)} == vfs_of[GPUS[0]]
    one_vf = sorted(vfs_of[GPUS[0]])[0]
    assert {name for name, _ in rows(types(host, "--parent", one_vf))} == {one_vf}

    # Only the configured type of the configured GPU; filters combine.
    configured = types(host, "--configured")
    assert rows(configured) == {(vf, TYPE) for vf in vfs_of[GPUS[1]]}
    assert rows(types(host, "--configured", "--parent", GPUS[0])) == set()

    # The same document, only fewer entries: every kept entry is as it was.
    original = {p["name"]: p for p in everything["parents"]}
    for parent in configured["parents"]:
        whole = original[parent["name"]]
        assert {k: v for k, v in parent.items() if k != "types"} == {
            k: v for k, v in whole.items() if k != "types"}
        assert all(t in whole["types"] for t in parent["types"])
    assert set(configured) == set(everything)
