"""NVIDIA vGPU 17+ VFs through the agent, as an operator runs it: accelctl
processes writing through the REAL privsep helper onto the FUSE simulator's
``nvidia-vfio`` GPUs (beside classic mdev GPUs on the same host), every
outcome read back from the simulated sysfs itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accel_agent.sysfs import nvidia_vfio
from tests import ledger_sql
from tests.functional.killharness import typed_vfs
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
CONF = (
    "[devices]\nenabled_mdev_types = nvidia-35, nvidia-1150\n"
    f"[mdev_nvidia-35]\n[mdev_nvidia-1150]\ndevice_addresses = {GPU1}, {GPU2}\n"
    "[libvirt]\nuri =\n"
)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(
        tmp_path_factory.mktemp("vfio"), ["nvidia-pf", "nvidia-vfio"], gpus=2, vfs=4
    ) as host:
        yield host


@pytest.fixture
def host(sim):
    sim.reset()  # a reboot: every VF back to 0, no ledger
    return sim


def ctl(config, *args, rc=0):
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", config, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == rc, (args, proc.stdout, proc.stderr)
    return proc


def typed(host) -> dict[str, int]:
    """VF -> vGPU type id, for every typed VF, read from sysfs."""
    return {vf: value for vf, value in typed_vfs(host.root).items() if value}


def owners(host) -> dict[str, tuple[str, str | None, str]]:
    return {r.uuid: (r.parent, r.owner, r.backend) for r in ledger_sql.rows(host.state_dir)}


def allocate(config, instance, count, *extra):
    out = json.loads(ctl(config, "allocate", instance, "--count", str(count), *extra,
                         "--json").stdout)
    return [(m["parent"], m["mdev_type"], m["uuid"]) for m in out["mdevs"]]


def test_allocate_types_vfs_on_the_least_used_gpu_and_release_untypes_them(host):
    config = host.config(CONF)
    first = allocate(config, "vm-a", 2, "--type", "nvidia-1150")
    assert [p[:11] for p, _, _ in first] == ["0000:c1:00."] * 2  # one GPU holds both
    assert typed(host) == {p: 1150 for p, _, _ in first}
    assert [u for _, _, u in first] == [nvidia_vfio.device_uuid(p) for p, _, _ in first]
    second = allocate(config, "vm-b", 1, "--type", "nvidia-1150")
    assert second[0][0].startswith("0000:c2:00.")  # the least used GPU
    assert {owner for _, owner, _ in owners(host).values()} == {"vm-a", "vm-b"}
    assert {b for _, _, b in owners(host).values()} == {"nvidia_vfio"}
    # mdev GPUs on the same host are unaffected and still served.
    (mdev,) = allocate(config, "vm-m", 1, "--type", "nvidia-35")
    assert mdev[0] == "0000:84:00.0" and mdev[2] in host.sysfs_uuids()

    ctl(config, "release", "vm-a", "--remove")
    assert typed(host) == {second[0][0]: 1150}
    assert {owner for _, owner, _ in owners(host).values()} == {"vm-b", "vm-m"}


def test_mdevs_lists_typed_vfs_with_address_type_name_and_owner(host):
    config = host.config(CONF)
    ((vf, _, uuid),) = allocate(config, "vm-l", 1, "--type", "nvidia-1150")
    listing = json.loads(ctl(config, "mdevs", "--json").stdout)["mdevs"]
    assert listing == [
        {
            "uuid": uuid, "parent": vf, "mdev_type": "nvidia-1150",
            "iommu_group": listing[0]["iommu_group"], "physical_gpu": GPU1,
            "configured": True, "owned": True, "instance": "vm-l",
            "backend": "nvidia_vfio", "address": vf, "type_name": "NVIDIA L40S-4Q",
            "libvirt": None,  # [libvirt] uri is empty: not known
            "standing": False,  # no standing layout configured
            "draining": False,
            "in_use": None,  # no standing layout: not looked at
        }
    ]
    assert isinstance(listing[0]["iommu_group"], int)
    inventory = json.loads(ctl(config, "inventory", "--json").stdout)["providers"]
    gpus = {p["name"]: p for p in inventory if p["mdev_type"] == "nvidia-1150"}
    assert sorted(gpus) == ["testhost_pci_0000_c1_00_0", "testhost_pci_0000_c2_00_0"]
    assert gpus["testhost_pci_0000_c1_00_0"]["used"] == 1
    assert gpus["testhost_pci_0000_c1_00_0"]["parent_device"] == GPU1


def test_a_refused_type_write_rolls_back_the_whole_allocation(host):
    config = host.config(CONF)
    host.sim.fail_next_vgpu_write("EIO", vf="0000:c1:00.5")
    proc = ctl(config, "allocate", "vm-f", "--count", "2", "--type", "nvidia-1150", rc=1)
    assert "0000:c1:00.5" in proc.stderr and "nvidia-1150" in proc.stderr
    assert "EIO" in proc.stderr
    assert typed(host) == {}  # the VF typed first was untyped again
    assert owners(host) == {}
    assert ledger_sql.pending_intents(host.state_dir) == 0
    assert ledger_sql.unsettled(host.state_dir) == []


def test_a_vgpu_whose_vf_is_held_is_kept_not_untyped(host):
    config = host.config(CONF)
    ((vf, _, uuid),) = allocate(config, "vm-h", 1, "--type", "nvidia-1150")
    host.sim.hold(vf)
    try:
        proc = ctl(config, "release", "vm-h", "--remove", rc=1)
        assert "in use" in proc.stderr
        assert typed(host) == {vf: 1150}
        assert owners(host) == {uuid: (vf, None, "nvidia_vfio")}  # free, owned, kept
    finally:
        host.sim.release(vf)
    # Reused by the next allocation of its type, not typed anew elsewhere.
    assert allocate(config, "vm-i", 1, "--type", "nvidia-1150") == [(vf, "nvidia-1150", uuid)]


def test_a_host_reboot_is_repaired_by_retyping_the_same_vfs_for_the_same_owners(host):
    config = host.config(CONF)
    before = allocate(config, "vm-r", 3, "--type", "nvidia-1150")
    ledger_before = owners(host)
    host.sim.reboot()
    assert typed(host) == {}
    report = json.loads(ctl(config, "recover", "--json").stdout)
    assert sorted(report["recreated"]) == sorted(u for _, _, u in before)
    assert typed(host) == {p: 1150 for p, _, _ in before}
    assert owners(host) == ledger_before


def test_a_vf_typed_by_someone_else_is_foreign_until_adopted(host):
    config = host.config(CONF)
    vf = "0000:c2:00.4"
    path = os.path.join(host.root, "bus", "pci", "devices", vf, "nvidia", "current_vgpu_type")
    with open(path, "w") as handle:
        handle.write("1150")
    uuid = nvidia_vfio.device_uuid(vf)
    listing = json.loads(ctl(config, "mdevs", "--json").stdout)["mdevs"]
    assert [(m["uuid"], m["owned"]) for m in listing] == [(uuid, False)]
    placed = allocate(config, "vm-x", 1, "--type", "nvidia-1150")
    assert vf not in [p for p, _, _ in placed]
    ctl(config, "release", "vm-x", "--remove")
    assert typed(host) == {vf: 1150}  # never touched
    ctl(config, "adopt", uuid)
    assert owners(host)[uuid] == (vf, None, "nvidia_vfio")


def test_check_config_explains_a_gpu_whose_vfs_are_not_enabled(host):
    config = host.config(CONF)
    path = os.path.join(host.root, "bus", "pci", "devices", GPU2, "sriov_numvfs")
    with open(path, "w") as handle:
        handle.write("0")
    try:
        proc = ctl(config, "check-config")
        assert "sriov-manage -e 0000:c2:00.0" in proc.stderr + proc.stdout
        strict = ctl(config, "check-config", "--strict", rc=1)
        assert "sriov-manage" in strict.stderr
    finally:
        with open(path, "w") as handle:
            handle.write("4")


# --- accelctl nova-pci-config ------------------------------------------------------------


def _type_by_hand(host, vf: str, type_id: int) -> None:
    """What an operator's boot script does: type a VF behind the agent's back."""
    path = os.path.join(host.root, "bus", "pci", "devices", vf, "nvidia", "current_vgpu_type")
    with open(path, "w") as handle:
        handle.write(str(type_id))


def _spec_lines(text: str) -> list[dict]:
    return [json.loads(line.split("=", 1)[1])
            for line in text.splitlines() if line.startswith("device_spec =")]


def test_nova_pci_config_lists_the_vfs_the_agent_typed_never_foreign_ones(host, tmp_path):
    config = host.config(CONF)
    mine = [p for p, _, _ in allocate(config, "vm-n", 2, "--type", "nvidia-1150")]
    foreign = "0000:c2:00.6"
    _type_by_hand(host, foreign, 1150)
    text = ctl(config, "nova-pci-config").stdout
    assert _spec_lines(text) == [
        {"address": vf, "managed": "no", "resource_class": "CUSTOM_NVIDIA_1150"}
        for vf in sorted(mine)
    ]
    aliases = [json.loads(line.split("=", 1)[1]) for line in text.splitlines()
               if line.startswith("alias =")]
    assert aliases == [
        {"name": "nvidia-1150", "device_type": "type-VF", "resource_class": "CUSTOM_NVIDIA_1150"}
    ]
    # No [libvirt] uri: the versions Nova needs for live_migratable cannot be
    # checked, so the tag is left out and the text says why; asked for, it is on
    # every line (tests/nova proves what Nova does with it).
    assert "# No live_migratable tag: no [libvirt] uri" in text
    tagged = ctl(config, "nova-pci-config", "--live-migratable", "yes").stdout
    assert [spec["live_migratable"] for spec in _spec_lines(tagged)] == ["yes"] * len(mine)
    assert '"live_migratable": "yes"' in tagged.split("alias =", 1)[1]
    assert "[pci]" in text.splitlines()
    assert foreign not in text
    # --json (issue 25): the same values as objects, and each VF's type and GPU.
    document = json.loads(ctl(config, "nova-pci-config", "--json").stdout)
    assert document["device_spec"] == _spec_lines(text)
    assert document["alias"] == aliases
    assert [(v["address"], v["mdev_type"], v["typed"]) for v in document["vfs"]] == [
        (vf, "nvidia-1150", True) for vf in sorted(mine)
    ]
    assert document["host"] == "testhost"

    # --per-gpu 3: the untyped VFs the agent would type next, in VF order; the
    # hand-typed VF is skipped, the agent's two count towards GPU1's three.
    planned = _spec_lines(ctl(config, "nova-pci-config", "--per-gpu", "3").stdout)
    planned_json = json.loads(ctl(config, "nova-pci-config", "--per-gpu", "3", "--json").stdout)
    assert planned_json["device_spec"] == planned
    assert sum(not v["typed"] for v in planned_json["vfs"]) == len(planned) - 2
    by_gpu = {}
    for spec in planned:
        by_gpu.setdefault(spec["address"][:10], []).append(spec["address"])
    assert by_gpu["0000:c1:00"][:2] == sorted(mine) and len(by_gpu["0000:c1:00"]) == 3
    assert len(by_gpu["0000:c2:00"]) == 3 and foreign not in by_gpu["0000:c2:00"]
    assert typed(host) == {**{vf: 1150 for vf in mine}, foreign: 1150}  # nothing typed

    # --check: the printed lines match; every kind of drift is named, exit 1.
    # The lines match, but this host's agent reports the GPU to Placement too
    # (reported_by = agent): Nova would count it twice (issue 23).  A host that
    # gives Nova its VFs says reported_by = nova (test_standing_layout.py).
    good = tmp_path / "nova.conf"
    good.write_text("[DEFAULT]\ndebug = true\n" + text)
    twice = ctl(config, "nova-pci-config", "--check", str(good), rc=1).stderr
    assert twice.strip() == (
        f"error: GPU {GPU1} (nvidia-1150) would be counted twice: [pci] device_spec gives "
        f"Nova its VF(s) {', '.join(sorted(mine))}, and the agent reports the GPU to "
        "Placement too; set [mdev_nvidia-1150] reported_by = nova with standing >= 1 (Nova "
        "then reports it alone), or drop those device_spec lines"
    )
    lines = text.splitlines()
    drifted = [line for line in lines if mine[0] not in line]  # one VF missing
    drifted = [line.replace('"managed": "no"', '"managed": "yes"') if mine[1] in line else line
               for line in drifted]
    drifted.append(f'device_spec = {{"address": "{foreign}", "managed": "no"}}')
    drifted.append('device_spec = {"address": "0000:99:00.1"}')
    drifted.append("alias = not json")
    bad = tmp_path / "drift.conf"
    bad.write_text("\n".join(drifted) + "\n")
    errors = ctl(config, "nova-pci-config", "--check", str(bad), rc=1).stderr
    assert f"{mine[0]} (nvidia-1150) is not in [pci] device_spec" in errors
    assert f'{mine[1]}: device_spec must say "managed": "no"' in errors
    assert f"{foreign} is in [pci] device_spec but is not a vGPU the agent typed" in errors
    assert "0000:99:00.1 is in [pci] device_spec but is no vGPU VF of this host" in errors
    assert "alias is not JSON" in errors
    assert len(errors.strip().splitlines()) == 7, errors  # and both GPUs counted twice
    drift_json = ctl(config, "nova-pci-config", "--check", str(bad), "--json", rc=1)
    assert drift_json.stderr == errors  # the same lines on stderr, exit 1 as without --json
    checked = json.loads(drift_json.stdout)
    assert checked["matches"] is False
    assert checked["problems"] == [line.removeprefix("error: ") for line in errors.splitlines()]
    ctl(config, "nova-pci-config", "--check", str(tmp_path / "absent.conf"), rc=1)


# --- through the daemon: metrics ---------------------------------------------------------


def test_the_daemon_reports_vfio_gpus_and_typed_vfs_in_its_metrics(host, tmp_path):
    """Metrics work for both backends alike (issue 14, item 3): per-GPU
    capacity and use for the PF, and the typed VF as a device."""
    from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir, wait_for

    body = CONF.split("[libvirt]")[0]
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(tmp_path / "agent.conf", host.root, host.state_dir,
                              socket_path, body)
        with AgentDaemon(config, socket_path, tmp_path).start() as daemon:
            ((vf, _, uuid),) = allocate(str(config), "vm-metrics", 1, "--type", "nvidia-1150")
            gpu = {"provider": "testhost_pci_0000_c1_00_0", "physical_gpu": GPU1,
                   "mdev_type": "nvidia-1150", "pci_bus_id": "00000000:C1:00.0"}  # DCGM form
            wait_for(lambda: daemon.metric("accel_agent_provider_used", **gpu) == 1.0,
                     what="accel_agent_provider_used of GPU1")
            assert daemon.metric("accel_agent_provider_capacity", **gpu) == 4.0
            assert daemon.metric(
                "accel_agent_mdev_info", uuid=uuid, instance_id="vm-metrics", parent=vf,
                physical_gpu=GPU1, mdev_type="nvidia-1150", state="assigned",
            ) == 1.0
            assert daemon.metric("accel_agent_allocations_total") == 1.0  # via the API
