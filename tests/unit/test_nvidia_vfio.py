"""NVIDIA vGPU 17+ (vendor-specific VFIO): the read side, the capacity rules,
the policy's VF -> GPU mapping and the privileged type writes, on the
simulator's model (in process) and static trees of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from accel_agent.backends import builtin
from accel_agent.backends.host import scan_host
from accel_agent.devices import inventory as inventory_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.privileged import validate
from accel_agent.simulator import build_spec
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.static import materialise
from accel_agent.sysfs import nvidia_vfio
from tests.configutil import make_conf

PF = "0000:c1:00.0"
VF0, VF1, VF2, VF3 = (f"0000:c1:00.{f}" for f in (4, 5, 6, 7))
Q4, Q24, Q48, Q1 = 1150, 1155, 1156, 1147  # L40S-4Q, -24Q, -48Q, -1Q


def l40s(vfs: int = 4, gpus: int = 1) -> SimulatedHost:
    return SimulatedHost(build_spec(["nvidia-vfio"], gpus=gpus, vfs=vfs))


def type_vf(host: SimulatedHost, vf: str, type_id: int) -> None:
    host.write(f"bus/pci/devices/{vf}/nvidia/current_vgpu_type", str(type_id))


def tree(host: SimulatedHost, tmp_path: Path, name: str = "sys") -> str:
    return materialise(host, tmp_path / name)


# --- parsing ----------------------------------------------------------------------------


def test_creatable_types_parse_leniently_and_refuse_garbage() -> None:
    text = (
        "ID    : vGPU Name\n"
        "1414 : NVIDIA H200X-1-18C\n"
        "1415  NVIDIA H200X-2-35C\n"
        "  1416:NVIDIA H200X-3-71C\n"
        "0 : not a type\n"
        "99999999 : too big\n"
        "abc : no id\n"
        "\n"
    )
    assert nvidia_vfio.parse_creatable(text) == {
        1414: "NVIDIA H200X-1-18C",
        1415: "NVIDIA H200X-2-35C",
        1416: "NVIDIA H200X-3-71C",
    }
    assert nvidia_vfio.parse_creatable("ID    : vGPU Name\n") == {}


@pytest.mark.parametrize(
    ("name", "size"),
    [("NVIDIA L40S-4Q", 4), ("NVIDIA L40S-48Q", 48), ("NVIDIA H200X-1-18C", 18),
     ("NVIDIA L40S-3B", 3), ("no size here", None), ("NVIDIA L40S-Q", None)],
)
def test_framebuffer_from_the_type_name(name: str, size: int | None) -> None:
    assert nvidia_vfio.framebuffer_gb(name) == size


def test_per_gpu_limit_is_the_card_over_the_type_at_most_one_per_vf() -> None:
    types = {Q1: "NVIDIA L40S-1Q", Q4: "NVIDIA L40S-4Q", Q48: "NVIDIA L40S-48Q", 9: "odd"}
    assert nvidia_vfio.per_gpu_limits(types, vfs=32) == {Q1: 32, Q4: 12, Q48: 1, 9: None}
    assert nvidia_vfio.per_gpu_limits(types, vfs=4)[Q4] == 4


def test_type_names_and_device_uuids() -> None:
    assert nvidia_vfio.type_name(1414) == "nvidia-1414"
    assert nvidia_vfio.type_id_of("nvidia-1414") == 1414
    for bad in ("nvidia-", "nvidia-01", "nvidia-1e3", "nvidia-٣", "mtty-1", "nvidia-1234567"):
        assert nvidia_vfio.type_id_of(bad) is None
    assert nvidia_vfio.device_uuid(VF0) == nvidia_vfio.device_uuid(VF0) != (
        nvidia_vfio.device_uuid(VF1)
    )


# --- discovery ---------------------------------------------------------------------------


def test_each_vf_is_a_parent_of_its_gpu_and_a_typed_vf_is_a_device(tmp_path: Path) -> None:
    host = l40s()
    type_vf(host, VF0, Q4)
    snapshot = scan_host(tree(host, tmp_path), builtin())
    vfs = {n: p for n, p in snapshot.parents.items() if p.backend == "nvidia_vfio"}
    assert sorted(vfs) == [VF0, VF1, VF2, VF3]
    assert {p.physical_gpu for p in vfs.values()} == {PF}
    # A typed VF offers nothing more; a free one offers what it lists (the
    # equal-size rule: 4 GB types only, once a 4 GB vGPU is on the card).
    assert vfs[VF0].types["nvidia-1150"].available_instances == 0
    assert vfs[VF1].types["nvidia-1150"].available_instances == 1
    assert "nvidia-1155" not in vfs[VF1].types  # 24 GB: not on this card now
    (device,) = snapshot.mdevs.values()
    assert device.uuid == nvidia_vfio.device_uuid(VF0)
    assert (device.parent, device.mdev_type, device.backend, device.address) == (
        VF0, "nvidia-1150", "nvidia_vfio", VF0
    )
    assert snapshot.mdevs_on(VF0, "nvidia-1150") == [device]


def test_an_unknown_card_is_bounded_by_what_its_lists_prove(tmp_path: Path) -> None:
    host = l40s(vfs=16)
    for vf in ("0000:c1:00.4", "0000:c1:00.5"):
        type_vf(host, vf, Q24)  # 24 GB: two fill the 48 GB card
    snapshot = scan_host(tree(host, tmp_path), builtin())
    # Never seen empty: only 24 GB types are listed, so the card's size is
    # unknown; it holds two and lists none more: no room, not "14 free VFs".
    limits = {p.types["nvidia-1155"].per_gpu_limit for p in snapshot.parents.values()}
    assert limits == {2}
    assert sum(p.types["nvidia-1155"].available_instances for p in snapshot.parents.values()) == 0


def test_a_card_seen_empty_is_known_and_kept_in_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    host = l40s(vfs=16)
    agent = nvidia_vfio.VfioScanner(tree(host, tmp_path, "empty"), str(state), persist=True)
    limits = {p.types["nvidia-1155"].per_gpu_limit for p in agent.scan().parents.values()}
    assert limits == {2}  # 48 GB // 24 GB, from the whole table
    saved = json.loads((state / nvidia_vfio.TABLES_FILE).read_text())
    assert saved[PF][str(Q48)] == "NVIDIA L40S-48Q"
    # A listing in another process, on the card now partly used, reads it.
    type_vf(host, VF0, Q4)
    root = tree(host, tmp_path, "used")
    known = scan_host(root, builtin(), state_dir=str(state))
    free = known.parents["0000:c1:00.5"].types["nvidia-1150"]
    assert free.per_gpu_limit == 12 and free.available_instances == 1
    # A listing never writes state.
    before = (state / nvidia_vfio.TABLES_FILE).stat().st_mtime_ns
    scan_host(root, builtin(), state_dir=str(state))
    assert (state / nvidia_vfio.TABLES_FILE).stat().st_mtime_ns == before


def test_a_stale_table_is_dropped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / nvidia_vfio.TABLES_FILE).write_text(json.dumps({PF: {"1": "NVIDIA L40S-48Q"}}))
    host = l40s()
    type_vf(host, VF0, Q24)
    scanner = nvidia_vfio.VfioScanner(tree(host, tmp_path), str(state), persist=True)
    # The card lists 24 GB types the table lacks: a new driver; the table is gone.
    limits = {p.types["nvidia-1155"].per_gpu_limit for p in scanner.scan().parents.values()}
    assert limits == {2}  # one held + one more listed
    assert json.loads((state / nvidia_vfio.TABLES_FILE).read_text()) == {}


def test_a_gpu_without_vfs_is_explained(tmp_path: Path) -> None:
    host = l40s()
    host.write(f"bus/pci/devices/{PF}/sriov_numvfs", "0")
    notes: list[str] = []
    snapshot = scan_host(tree(host, tmp_path), builtin(), notes=notes)
    assert not [p for p in snapshot.parents.values() if p.backend == "nvidia_vfio"]
    (note,) = notes
    assert PF in note and "sriov-manage -e 0000:c1:00.0" in note


def test_a_hostile_vendor_file_is_skipped_not_followed(tmp_path: Path) -> None:
    root = Path(tree(l40s(), tmp_path))
    device = Path(os.path.realpath(root / "bus/pci/devices" / VF0))
    (device / "nvidia/current_vgpu_type").unlink()
    os.mkfifo(device / "nvidia/current_vgpu_type")  # would hang a plain open()
    secret = tmp_path / "secret"
    secret.write_text("1414 : NVIDIA secret-1Q\n")
    (device / "nvidia/creatable_vgpu_types").unlink()
    (device / "nvidia/creatable_vgpu_types").symlink_to(secret)
    snapshot = scan_host(str(root), builtin())
    assert VF0 not in snapshot.parents
    assert any(VF0 in w for w in snapshot.warnings)
    assert "nvidia-1414" not in {t for p in snapshot.parents.values() for t in p.types}


# --- configuration and inventory ----------------------------------------------------------


def test_pf_addresses_configure_their_vfs_and_one_provider_per_gpu(tmp_path: Path) -> None:
    host = l40s(vfs=4, gpus=2)
    type_vf(host, VF0, Q4)
    root = tree(host, tmp_path)
    conf = make_conf(
        "[devices]\nenabled_mdev_types = nvidia-1150\n"
        f"[mdev_nvidia-1150]\ndevice_addresses = {PF}\n",
        sysfs_root=root,
    )
    policy = policy_mod.build_policy(conf)
    snapshot = scan_host(root, builtin())
    assert policy.type_for(snapshot.parents[VF1]) == "nvidia-1150"
    assert policy.type_for(snapshot.parents["0000:c2:00.4"]) is None  # the other GPU
    assert policy_mod.host_warnings(policy, snapshot) == []  # a PF, not "no mdev parent"
    inventory = inventory_mod.compute_inventory(snapshot, policy, "h")
    (provider,) = inventory.providers
    assert provider.name == "h_pci_0000_c1_00_0" and provider.parent_device == PF
    assert provider.parent_devices == (VF0, VF1, VF2, VF3)
    # Never seen empty: one held and one more listed, not yet min(48 // 4, 4 VFs).
    assert (provider.total, provider.used) == (2, 1)


def test_a_gpu_offering_none_of_its_type_is_one_warning(tmp_path: Path) -> None:
    root = tree(l40s(vfs=8), tmp_path)
    conf = make_conf(
        "[devices]\nenabled_mdev_types = nvidia-1414\n"
        f"[mdev_nvidia-1414]\ndevice_addresses = {PF}\n",
        sysfs_root=root,
    )
    inventory = inventory_mod.compute_inventory(
        scan_host(root, builtin()), policy_mod.build_policy(conf), "h"
    )
    assert inventory.providers == ()
    warnings = list(dict.fromkeys(inventory.warnings))
    assert len(warnings) == 1 and PF in warnings[0] and "nvidia-1414" in warnings[0]


# --- the privileged writes ---------------------------------------------------------------


@pytest.mark.parametrize("vf", ["0000:C1:00.4", "c1:00.4", "0000:c1:00.4\n", "../x", 7, None])
def test_a_vf_must_be_named_canonically(vf: object) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        validate.validate_vf(vf)


@pytest.mark.parametrize("type_id", [0, -1, True, "1150", 1.0, 10**7])
def test_a_type_id_must_be_a_positive_int(type_id: object) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        validate.validate_vgpu_type_id(type_id)


def test_typing_refuses_a_typed_vf_and_a_type_not_listed_writing_nothing(tmp_path: Path) -> None:
    host = l40s()
    type_vf(host, VF0, Q4)
    root = tree(host, tmp_path)
    current = Path(os.path.realpath(f"{root}/bus/pci/devices/{VF0}")) / "nvidia/current_vgpu_type"
    with pytest.raises(exception.VfAlreadyTyped, match=VF0):
        privileged.write_vgpu_type(root, VF0, Q4)
    other = Path(os.path.realpath(f"{root}/bus/pci/devices/{VF1}")) / "nvidia/current_vgpu_type"
    with pytest.raises(exception.InsufficientCapacity, match=f"VF {VF1} does not list 1155"):
        privileged.write_vgpu_type(root, VF1, Q24)  # another size: not creatable now
    assert (current.read_text(), other.read_text()) == ("1150\n", "0\n")


def test_typing_writes_the_id_without_a_newline_and_reads_it_back(tmp_path: Path) -> None:
    root = tree(l40s(), tmp_path)
    current = Path(os.path.realpath(f"{root}/bus/pci/devices/{VF1}")) / "nvidia/current_vgpu_type"
    current.write_text("0")
    privileged.write_vgpu_type(root, VF1, Q4)
    assert current.read_bytes() == b"1150"  # a plain file: exactly what was written


def test_a_current_vgpu_type_outside_the_root_is_refused(tmp_path: Path) -> None:
    root = tree(l40s(), tmp_path)
    outside = tmp_path / "elsewhere" / VF1 / "nvidia"
    outside.mkdir(parents=True)
    (outside / "current_vgpu_type").write_text("0\n")
    link = Path(root) / "bus/pci/devices" / VF1
    link.unlink()
    link.symlink_to(outside.parent)
    with pytest.raises(exception.PrivilegedInputRejected, match="outside"):
        privileged.write_vgpu_type(root, VF1, Q4)
    assert (outside / "current_vgpu_type").read_text() == "0\n"


def test_a_function_skipped_as_no_vf_is_looked_at_again_when_its_link_changes(
    tmp_path: Path,
) -> None:
    root = Path(tree(l40s(), tmp_path))
    link = root / "bus/pci/devices" / VF0
    real = os.readlink(link)
    # Another function at VF0's name: no physfn, no SR-IOV; skipped, and
    # remembered as such while its link stays the same.
    other = root / "devices/elsewhere" / VF0
    other.mkdir(parents=True)
    (other / "driver").symlink_to(os.path.realpath(root / "bus/pci/drivers/nvidia"))
    link.unlink()
    link.symlink_to(os.path.relpath(other, link.parent))
    scanner = nvidia_vfio.VfioScanner(str(root))
    assert VF0 not in scanner.scan().parents
    assert VF0 not in scanner.scan().parents
    # The VF is back under its own link: read again, found.
    link.unlink()
    link.symlink_to(real)
    assert VF0 in scanner.scan().parents
