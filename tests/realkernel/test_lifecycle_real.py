"""The agent's write side on a REAL kernel (mtty): the privileged writer's errno
mapping, the real privsep daemon, and ``accelctl allocate/release/recover``.

Runs in the lab guest only (see conftest.py).  Every lifecycle command is a
fresh ``accelctl`` process that starts its own privsep daemon, exactly as an
operator's would; its ledger lives in a per-test ``state_dir`` on the guest's
tmpfs.  A missing command FAILS here (exit 2, usage), it is never skipped.
The guest has no libvirtd, so the config sets ``[libvirt] uri =`` (none).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from accel_agent.privileged import mdev as mdev_writer
from tests.realkernel import mdevlab
from tests.realkernel.mdevlab import DEVICES_DIR, SYSFS

# --- privileged.write_create / write_remove, in process (no daemon) -----------------


def test_write_create_and_remove_round_trip() -> None:
    uuid = mdevlab.new_uuid()
    privileged.write_create(SYSFS, "mtty", "mtty-2", uuid)
    assert mdevlab.mdevs() == {uuid: "mtty-2"}
    assert mdevlab.available() == mdevlab.expected_available(2)

    privileged.write_remove(SYSFS, uuid, timeout=30)
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE
    # the kernel says ENOENT for the stale remove file
    with pytest.raises(exception.MdevNotFound):
        privileged.write_remove(SYSFS, uuid, timeout=30)


def test_eexist_maps_to_mdev_already_exists() -> None:
    uuid = mdevlab.new_uuid()
    mdevlab.create("mtty-2", uuid)
    for mdev_type in ("mtty-2", "mtty-1"):
        with pytest.raises(exception.MdevAlreadyExists) as info:
            privileged.write_create(SYSFS, "mtty", mdev_type, uuid)
        assert info.value.kwargs["uuid"] == uuid
    assert mdevlab.mdevs() == {uuid: "mtty-2"}


def test_kernel_einval_maps_to_mdev_create_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    # A canonical UUID never draws EINVAL from the kernel (mtty's probe has no EINVAL
    # path), and the validator refuses anything else before the kernel sees it:
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(SYSFS, "mtty", "mtty-1", "not-a-uuid")
    # so let the kernel's own EINVAL through the real write path once.
    monkeypatch.setattr(mdev_writer, "validate_uuid", lambda value: value)
    with pytest.raises(exception.MdevCreateInvalid) as info:
        privileged.write_create(SYSFS, "mtty", "mtty-1", "not-a-uuid")
    assert (info.value.kwargs["mdev_type"], info.value.kwargs["parent"]) == ("mtty-1", "mtty")
    assert mdevlab.mdevs() == {}


def test_enospc_maps_to_insufficient_capacity() -> None:
    for _ in range(12):
        mdevlab.create("mtty-2", mdevlab.new_uuid())
    refused = mdevlab.new_uuid()
    for mdev_type in ("mtty-1", "mtty-2"):
        with pytest.raises(exception.InsufficientCapacity) as info:
            privileged.write_create(SYSFS, "mtty", mdev_type, refused)
        assert info.value.kwargs["mdev_type"] == mdev_type
        assert "ENOSPC" in info.value.message
    assert refused not in mdevlab.mdevs()
    assert len(mdevlab.mdevs()) == 12


def test_missing_type_or_parent_is_named() -> None:
    with pytest.raises(exception.MdevTypeNotSupported):
        privileged.write_create(SYSFS, "mtty", "mtty-3", mdevlab.new_uuid())
    with pytest.raises(exception.ParentNotFound):
        privileged.write_create(SYSFS, "mtty9", "mtty-1", mdevlab.new_uuid())
    assert mdevlab.mdevs() == {}


# --- the real privsep daemon ---------------------------------------------------------


def test_privsep_daemon_creates_removes_and_maps_errors(tmp_path: Path) -> None:
    config = tmp_path / "privsep.conf"
    config.write_text(f"[DEFAULT]\nsysfs_root = {SYSFS}\n")
    privileged.start_privsep([str(config)], [])
    try:
        uuid = mdevlab.new_uuid()
        privileged.create_mdev("mtty", "mtty-2", uuid)
        assert mdevlab.mdevs() == {uuid: "mtty-2"}
        # errors cross the privsep channel with their class and kwargs
        with pytest.raises(exception.MdevAlreadyExists) as info:
            privileged.create_mdev("mtty", "mtty-1", uuid)
        assert info.value.kwargs["uuid"] == uuid
        for _ in range(11):
            mdevlab.create("mtty-2", mdevlab.new_uuid())
        with pytest.raises(exception.InsufficientCapacity):
            privileged.create_mdev("mtty", "mtty-2", mdevlab.new_uuid())
        privileged.remove_mdev(uuid, 30)
        assert uuid not in mdevlab.mdevs()
    finally:
        privileged.stop_privsep()


# --- accelctl allocate / release / recover --------------------------------------------


def _allocate(config: Path, instance: str, count: int, *extra: str) -> dict[str, str]:
    """accelctl allocate --json; returns uuid -> type from its output, after
    checking that each one is a real mdev on parent mtty."""
    document = mdevlab.ok_json(
        mdevlab.accelctl(
            "allocate", instance, "--count", str(count), *extra, "--json", config=config
        )
    )
    assert document["instance"] == instance, document
    allocated = {m["uuid"]: m["mdev_type"] for m in document["mdevs"]}
    assert len(allocated) == count, document
    for mdev in document["mdevs"]:
        assert mdev["parent"] == "mtty", document
        device = os.path.realpath(f"{DEVICES_DIR}/{mdev['uuid']}")
        assert device == f"{SYSFS}/devices/virtual/mtty/mtty/{mdev['uuid']}"
    return allocated


def test_allocate_recover_release_on_the_real_kernel(agent_config: Path) -> None:
    """The whole life of an instance's mdevs, one process per step as an operator
    would run them (one story: each step costs ~12 s in the TCG guest)."""
    # allocate: real mdevs of the configured type, counters move
    allocated = _allocate(agent_config, "vm-1", 2, "--parent", "mtty")
    assert allocated == dict.fromkeys(allocated, "mtty-2")
    assert mdevlab.mdevs() == allocated
    assert mdevlab.available() == mdevlab.expected_available(4) == {"mtty-1": 20, "mtty-2": 10}

    # what a host reboot does to mdevs: they vanish behind the agent's back
    for uuid in allocated:
        mdevlab.remove(uuid)
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE

    # recover: the same UUIDs again, same parent, same type; the counters agree
    report = mdevlab.ok_json(mdevlab.accelctl("recover", "--json", config=agent_config))
    assert sorted(report["recreated"]) == sorted(allocated), report
    assert mdevlab.mdevs() == allocated
    for uuid in allocated:
        assert os.path.realpath(f"{DEVICES_DIR}/{uuid}") == (
            f"{SYSFS}/devices/virtual/mtty/mtty/{uuid}"
        )
    assert mdevlab.available() == mdevlab.expected_available(4)

    # release --remove: gone from the kernel, counters back to idle
    mdevlab.ok(mdevlab.accelctl("release", "vm-1", "--remove", config=agent_config))
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE


def test_allocate_beyond_capacity_fails_and_leaves_nothing(agent_config: Path) -> None:
    result = mdevlab.accelctl("allocate", "vm-big", "--count", "13", "--json", config=agent_config)
    assert result.returncode == 1, mdevlab.describe(result)
    assert "insufficient capacity" in result.stderr.lower(), mdevlab.describe(result)
    # all or nothing
    assert mdevlab.mdevs() == {}
    assert mdevlab.available() == mdevlab.IDLE_AVAILABLE


# --- never remove an mdev in use ----------------------------------------------------------

HOLD_GROUP = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)  # what QEMU holds while a guest runs
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def _privsep_daemons() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if b"--privsep_context" in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_release_remove_keeps_an_mdev_whose_vfio_group_is_held(agent_config: Path) -> None:
    """A process holding /dev/vfio/<group> (as QEMU does) makes the kernel's
    remove write block until it lets go.  The agent probes the group first:
    release --remove returns, the mdev stays (free, owned), and no remove
    write is left blocked in the kernel to complete later behind its back."""
    with agent_config.open("a") as handle:
        handle.write("\n[DEFAULT]\nremove_timeout = 5\n")
    (uuid,) = _allocate(agent_config, "vm-held", 1, "--parent", "mtty")
    group = os.path.basename(os.readlink(f"{DEVICES_DIR}/{uuid}/iommu_group"))
    node = f"/dev/vfio/{group}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_GROUP, node],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # The kernel's own answer, the probe's premise: one opener at a time.
        with pytest.raises(OSError) as info:
            os.close(os.open(node, os.O_RDONLY))
        assert info.value.errno == errno.EBUSY
        result = mdevlab.accelctl("release", "vm-held", "--remove", config=agent_config)
        assert result.returncode == 1, mdevlab.describe(result)
        assert "is in use" in result.stderr and uuid in result.stderr, mdevlab.describe(result)
        assert mdevlab.mdevs() == {uuid: "mtty-2"}
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    # A remove write blocked in the kernel would finish now that the holder is
    # gone; wait until no privsep daemon is left, then the mdev must be there.
    deadline = time.monotonic() + 60
    while _privsep_daemons() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _privsep_daemons() == []
    assert mdevlab.mdevs() == {uuid: "mtty-2"}
    listing = mdevlab.ok_json(mdevlab.accelctl("mdevs", "--json", config=agent_config))
    (entry,) = [m for m in listing["mdevs"] if m["uuid"] == uuid]
    assert entry["owned"] is True and entry["instance"] is None  # free, kept for reuse
