"""``accelctl check-config --nova-conf FILE`` (issue 23): a GPU that Nova's
``[pci] device_spec`` and the agent would both report to Placement is an
error naming it, its type and what to change; without the flag, one note
says it was not checked.  On the simulator's NVIDIA vGPU 17+ GPUs (a
materialised tree: check-config only reads), each command a real accelctl
process; the nova.conf is what ``accelctl nova-pci-config`` prints, as an
operator would paste it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accel_agent.simulator import SimulatedHost, build_spec, materialise

TYPE = "nvidia-1150"
GPUS = ["0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0", "0000:c4:00.0"]
# The simulator's VFs: offset 4, stride 1 (profiles.nvidia_vfio).
VFS = {gpu: [f"{gpu[:-1]}{fn}" for fn in range(4, 8)] for gpu in GPUS}
TWICE = "would be counted twice"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vfio") / "sys"
    materialise(SimulatedHost(build_spec(["nvidia-vfio"], gpus=len(GPUS), vfs=4)), str(path))
    return str(path)


def agent_conf(tmp_path: Path, root: str, layout: str = "") -> Path:
    path = tmp_path / "agent.conf"
    path.write_text(
        f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\n"
        f"[api]\nsocket_path = {tmp_path / 'api.sock'}\n"
        f"[devices]\nenabled_mdev_types = {TYPE}\n"
        f"[mdev_{TYPE}]\ndevice_addresses = {', '.join(GPUS)}\n{layout}"
        "[libvirt]\nuri =\n"
    )
    return path


def ctl(config: Path, *args: str, rc: int | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--offline", "--config-file", str(config),
         *args],
        capture_output=True, text=True, timeout=120,
        env={"ACCEL_AGENT_CACHE_DIR": "", "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if rc is not None:
        assert proc.returncode == rc, (args, proc.stdout, proc.stderr)
    return proc


def check_json(config: Path, *args: str, rc: int) -> dict:
    proc = ctl(config, "check-config", "--json", *args, rc=rc)
    assert proc.stderr == ""  # --json: nothing on stderr, as without --nova-conf
    return json.loads(proc.stdout)


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def line_of(path: Path, vf: str) -> int:
    """The line of ``vf``'s device_spec (not of the comment above it)."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith("device_spec") and f'"{vf}"' in line)


def message(gpu: str, vfs: list[str]) -> str:
    return (
        f"GPU {gpu} ({TYPE}) {TWICE}: [pci] device_spec gives Nova its VF(s) "
        f"{', '.join(vfs)}, and the agent reports the GPU to Placement too; set "
        f"[mdev_{TYPE}] reported_by = nova with standing >= 1 (Nova then reports it alone), "
        "or drop those device_spec lines"
    )


def test_a_gpu_the_agent_reports_whose_vfs_nova_conf_lists_is_named_exit_1(tmp_path, root):
    config = agent_conf(tmp_path, root)  # reported_by = agent, the default
    # What an operator pastes: nova-pci-config's lines for 2 VFs per GPU.
    nova = tmp_path / "nova.conf"
    lines = ctl(config, "nova-pci-config", "--per-gpu", "2", rc=0).stdout
    nova.write_text("[DEFAULT]\ndebug = true\n" + lines)

    # Without --nova-conf: clean, and one note says what was not checked and
    # how; a note, not a warning (--strict passes).
    plain = ctl(config, "check-config", "--strict", rc=0)
    assert plain.stderr.splitlines() == [
        "note: Nova's [pci] device_spec was not checked for GPUs counted twice (4 vendor-VFIO "
        "GPU(s) the agent reports itself, reported_by = agent): pass --nova-conf "
        "/etc/nova/nova.conf to check it"
    ]

    proc = ctl(config, "check-config", "--nova-conf", str(nova), rc=1)
    assert errors(proc) == [
        f"error: {nova}:{line_of(nova, VFS[gpu][0])}: {message(gpu, VFS[gpu][:2])}"
        for gpu in GPUS
    ]
    assert "note:" not in proc.stderr and proc.stdout == ""
    # The same comparison as nova-pci-config --check: the same words.
    drift = ctl(config, "nova-pci-config", "--check", str(nova), rc=1)
    assert [e for e in errors(drift) if TWICE in e] == [
        f"error: {message(gpu, VFS[gpu][:2])}" for gpu in GPUS
    ]

    document = check_json(config, "--nova-conf", str(nova), rc=1)
    assert document["ok"] is False and document["nova_conf"] == [str(nova)]
    assert [e["message"] for e in document["errors"]] == [e[7:] for e in errors(proc)]
    assert {(e["file"], e["section"], e["option"]) for e in document["errors"]} == {
        (str(nova), "pci", "device_spec")
    }
    assert document["counted_twice"][0] == {
        "gpu": GPUS[0], "type": TYPE, "vfs": VFS[GPUS[0]][:2],
        "device_spec": [
            {"file": str(nova), "line": line_of(nova, vf),
             "value": {"address": vf, "managed": "no", "resource_class": "CUSTOM_NVIDIA_1150"}}
            for vf in VFS[GPUS[0]][:2]
        ],
    }
    assert [item["gpu"] for item in document["counted_twice"]] == GPUS


def test_every_address_form_nova_matches_is_compared(tmp_path, root):
    """Nova matches a device_spec address by glob (upper or lower case, the
    domain left out, ``*``), a PF's full address names its VFs, and no
    address with the VFs' ids names them all (nova/pci/devspec.py): each
    form names its GPU, and a line naming nothing of the agent's names no
    GPU.  Two files, as nova-compute reads several --config-file."""
    config = agent_conf(tmp_path, root)
    first = tmp_path / "nova.conf"
    first.write_text(
        "[pci]\n"
        '# upper case\ndevice_spec = {"address": "0000:C1:00.5", "managed": "no"}\n'
        '# no domain, short slot\ndevice_spec = {"address": "c2:0.6"}\n'
        "[libvirt]\n"
        '# not [pci]: not Nova\'s device_spec\ndevice_spec = {"address": "0000:c1:00.4"}\n'
    )
    second = tmp_path / "nova.conf.d" / "gpu.conf"
    second.parent.mkdir()
    second.write_text(
        "[pci]\n"
        'device_spec = [{"address": "0000:c3:00.*"}, {"address": "0000:C4:00.0"}]\n'
        '# nothing of the agent: a function no VF has, a NIC by vendor, another card\n'
        'device_spec = {"address": "*:c1:01.*"}\n'
        'device_spec = {"vendor_id": "8086", "product_id": "1520"}\n'
        'device_spec = {"vendor_id": "10de", "product_id": "2236"}\n'
        '# a regex address: not told\n'
        'device_spec = {"address": {"bus": "c[1-4]"}, "vendor_id": "10de"}\n'
    )
    document = check_json(config, "--nova-conf", str(first), "--nova-conf", str(second), rc=1)
    found = {item["gpu"]: (item["vfs"], [(d["file"], d["line"]) for d in item["device_spec"]])
             for item in document["counted_twice"]}
    assert found == {
        GPUS[0]: ([VFS[GPUS[0]][1]], [(str(first), 3)]),
        GPUS[1]: ([VFS[GPUS[1]][2]], [(str(first), 5)]),
        GPUS[2]: (VFS[GPUS[2]], [(str(second), 2)]),
        GPUS[3]: (VFS[GPUS[3]], [(str(second), 2)]),
    }
    assert [w["message"] for w in document["warnings"]] == [
        f"{second}:8: [pci] device_spec names devices by a regex address: not checked for "
        "GPUs counted twice"
    ]
    strict = check_json(config, "--nova-conf", str(second), "--strict", rc=1)
    assert strict["warnings"] == [] and any(
        e["line"] == 8 and "not checked" in e["message"] for e in strict["errors"]
    )
    # NVIDIA's VFs by their ids alone, no address: Nova takes every one.
    ids = tmp_path / "ids.conf"
    ids.write_text('[pci]\ndevice_spec = {"vendor_id": "10de", "product_id": "26B9"}\n')
    by_ids = check_json(config, "--nova-conf", str(ids), rc=1)["counted_twice"]
    assert [(item["gpu"], item["vfs"]) for item in by_ids] == [(g, VFS[g]) for g in GPUS]


def test_a_gpu_nova_reports_alone_checks_clean(tmp_path, root):
    config = agent_conf(tmp_path, root, "standing = 2\nreported_by = nova\n")
    nova = tmp_path / "nova.conf"
    # Every VF of every GPU, the PFs too: Nova reports these GPUs, the agent not.
    nova.write_text(
        "[pci]\n"
        + "".join(f'device_spec = {{"address": "{vf}", "managed": "no"}}\n'
                  for gpu in GPUS for vf in [gpu, *VFS[gpu]])
    )
    proc = ctl(config, "check-config", "--nova-conf", str(nova), rc=0)
    assert proc.stderr == "" and proc.stdout.startswith("configuration OK")
    plain = ctl(config, "check-config", rc=0)
    assert plain.stderr == ""  # nothing left unchecked: no note
    document = check_json(config, "--nova-conf", str(nova), rc=0)
    assert document["ok"] is True and document["counted_twice"] == []
    assert document["errors"] == [] and document["warnings"] == []


@pytest.fixture(scope="module")
def nova_host(tmp_path_factory, root) -> tuple[Path, dict]:
    """A host whose GPUs Nova reports alone, and its check-config --json
    without --nova-conf."""
    config = agent_conf(tmp_path_factory.mktemp("nova"), root,
                        "standing = 2\nreported_by = nova\n")
    base = check_json(config, rc=0)
    assert base["nova_conf"] == [] and base["counted_twice"] == []
    return config, base


def test_a_nova_conf_that_cannot_be_read_is_one_clear_error_and_nothing_else_changes(
    tmp_path, nova_host
):
    """Missing, a directory, not UTF-8, a device_spec that is not JSON: one
    error each, naming the file (and line), given together as nova-compute
    takes several files; the rest is what check-config says without them."""
    config, base = nova_host
    missing, directory = tmp_path / "missing.conf", tmp_path / "nova.conf.d"
    directory.mkdir()
    binary, garbled = tmp_path / "binary.conf", tmp_path / "garbled.conf"
    binary.write_bytes(b"[pci]\ndevice_spec = \xff\xfe\x00\n")
    garbled.write_text('[pci]\ndevice_spec = {"address": "0000:c1:00.4"\n')
    before = {path: path.read_bytes() for path in (binary, garbled)}
    files = [str(path) for path in (missing, directory, binary, garbled)]
    given = [arg for path in files for arg in ("--nova-conf", path)]
    document = check_json(config, *given, rc=1)
    messages = [error["message"] for error in document["errors"]]
    assert len(messages) == 4, messages
    for message_, path in zip(messages[:3], files, strict=False):
        assert message_.startswith(f"Invalid configuration: cannot read {path}: "), messages
    assert "No such file" in messages[0] and "Is a directory" in messages[1]
    assert "'utf-8' codec can't decode" in messages[2]
    assert messages[3] == f"{garbled}:2: device_spec is not JSON (Expecting ',' delimiter)"
    assert document["errors"][3]["file"] == str(garbled) and document["errors"][3]["line"] == 2
    # Everything else is what check-config says without them.
    assert document["warnings"] == base["warnings"] and document["strict"] == base["strict"]
    assert document["counted_twice"] == [] and document["summary"] is None
    assert document["nova_conf"] == files
    text = ctl(config, "check-config", *given, rc=1)
    assert text.stderr.splitlines() == [f"error: {m}" for m in messages]
    assert text.stdout == ""
    assert {path: path.read_bytes() for path in before} == before  # read, never written


def test_a_garbled_line_does_not_hide_a_gpu_counted_twice(tmp_path, root):
    config = agent_conf(tmp_path, root)
    nova = tmp_path / "nova.conf"
    nova.write_text(
        "[pci]\ndevice_spec = {broken\n"
        f'device_spec = {{"address": "{VFS[GPUS[1]][0]}", "managed": "no"}}\n'
    )
    proc = ctl(config, "check-config", "--nova-conf", str(nova), rc=1)
    assert errors(proc) == [
        f"error: {nova}:2: device_spec is not JSON (Expecting property name enclosed in "
        "double quotes)",
        f"error: {nova}:3: {message(GPUS[1], VFS[GPUS[1]][:1])}",
    ]


@pytest.mark.parametrize("address", ["pf", "glob"])
def test_a_gpu_named_by_its_pf_address_reads_alike_in_both_commands(tmp_path, root, address):
    """Nova's device_spec may name a GPU's VFs by the PF's address, or a glob
    of them: ``nova-pci-config --check`` matches each VF as ``check-config
    --nova-conf`` does (Nova's rules), so the two never disagree about a line."""
    nova = tmp_path / "nova.conf"
    lines = ["[pci]"]
    for gpu in GPUS:
        named = gpu if address == "pf" else gpu[:-1] + "*"
        lines.append(
            'device_spec = {"address": "' + named + '", "managed": "no", "resource_class": '
            '"CUSTOM_NVIDIA_1150"}'
        )
    lines.append('alias = {"name": "nvidia-1150", "device_type": "type-VF", '
                 '"resource_class": "CUSTOM_NVIDIA_1150"}')
    nova.write_text("\n".join(lines) + "\n")
    # Only two VFs per GPU are the agent's to type: the line also gives Nova
    # the other two, which both the PF and the glob form name.
    config = agent_conf(tmp_path, root)
    drift = errors(ctl(config, "nova-pci-config", "--per-gpu", "2", "--check", str(nova),
                       rc=1))
    assert [d for d in drift if TWICE not in d] == [
        f"error: {nova}:{n}: [pci] device_spec gives Nova VF(s) {', '.join(VFS[gpu][2:])}, "
        "which are not vGPUs the agent typed"
        for n, gpu in enumerate(GPUS, start=2)
    ]
    # Every VF the agent's: the lines match it exactly, and both commands
    # name the same GPUs counted twice (the agent reports them), nothing else.
    twice = [e for e in errors(ctl(config, "check-config", "--nova-conf", str(nova), rc=1))]
    drift = [e for e in errors(ctl(config, "nova-pci-config", "--per-gpu", "4", "--check",
                                   str(nova), rc=1))]
    assert [e.split(": ", 2)[2] for e in twice] == [d[len("error: "):] for d in drift]
    assert len(drift) == len(GPUS) and all(TWICE in d for d in drift)


def test_libvirt_errors_are_said_once_in_the_agents_words(root, tmp_path):
    """Issue 34: libvirt's C library printed its own ``libvirt: XML-RPC
    error : ...`` line on stderr besides the agent's (its default error
    handler), from nova-pci-config and adopt --from-libvirt."""
    config = agent_conf(tmp_path, root)
    absent = f"qemu+unix:///system?socket={tmp_path}/no-libvirt-sock"
    config.write_text(config.read_text().replace("[libvirt]\nuri =\n",
                                                 f"[libvirt]\nuri = {absent}\n"))
    lines = ctl(config, "nova-pci-config", rc=0)
    assert lines.stderr == ""
    assert "cannot be asked its versions (Failed to connect socket" in lines.stdout
    adopt = ctl(config, "adopt", "--from-libvirt", "--dry-run", rc=1)
    assert adopt.stderr.startswith(f"error: cannot list the libvirt domains at {absent}: "
                                   "Failed to connect socket"), adopt.stderr
    assert len(adopt.stderr.splitlines()) == 1, adopt.stderr
