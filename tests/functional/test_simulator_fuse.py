"""The FUSE-mounted simulator seen through real syscalls and a real shell."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib

import pytest

from accel_agent.simulator import control
from accel_agent.simulator.profiles import build_spec
from accel_agent.simulator.testing import fuse_unavailable_reason, mounted

pytestmark = pytest.mark.fuse

_REASON = fuse_unavailable_reason()
if _REASON:
    pytest.skip(f"FUSE simulator unavailable: {_REASON}", allow_module_level=True)

MTTY = "class/mdev_bus/mtty/mdev_supported_types"
PF = "class/mdev_bus/0000:84:00.0/mdev_supported_types"


def new() -> str:
    return str(uuidlib.uuid4())


@pytest.fixture(scope="module")
def module_sim(tmp_path_factory):
    spec = build_spec(["mtty", "mdpy", "nvidia-pf"], gpus=1)
    with mounted(spec, tmp_path_factory.mktemp("fuse") / "sys") as sim:
        yield sim


@pytest.fixture
def sim(module_sim):
    module_sim.reboot()  # every test starts from an empty host
    return module_sim


def read(sim, rel: str) -> str:
    with open(sim.path(rel)) as f:
        return f.read()


def avail(sim, rel_type_dir: str) -> int:
    return int(read(sim, f"{rel_type_dir}/available_instances"))


def write_errno(path: str, data: bytes) -> int:
    """One open + one write(2), like the kernel ABI is used; 0 on success."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)
    return 0


def test_shell_echo_creates_and_counters_move(sim):
    uuid = new()
    create = sim.path(MTTY, "mtty-2", "create")
    res = subprocess.run(["sh", "-c", f"echo {uuid.upper()} > '{create}'"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    link = sim.path("bus/mdev/devices", uuid)
    assert os.path.islink(link)
    assert os.readlink(link) == f"../../../devices/virtual/mtty/mtty/{uuid}"
    assert os.path.realpath(link) == sim.path("devices/virtual/mtty/mtty", uuid)
    assert os.readlink(os.path.join(link, "mdev_type")) == "../mdev_supported_types/mtty-2"
    assert (avail(sim, f"{MTTY}/mtty-1"), avail(sim, f"{MTTY}/mtty-2")) == (22, 11)
    assert os.listdir(sim.path(MTTY, "mtty-2", "devices")) == [uuid]
    # a duplicate through the shell reports the kernel's message (dash only says "I/O error")
    res = subprocess.run(["bash", "-c", f"echo {uuid} > '{create}'"],
                         capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "File exists" in res.stderr


def test_os_write_sees_the_kernel_errno(sim):
    uuid = new()
    mtty1 = sim.path(MTTY, "mtty-1", "create")
    assert write_errno(mtty1, uuid.encode() + b"\n") == 0
    assert write_errno(sim.path(MTTY, "mtty-2", "create"), uuid.upper().encode()) == errno.EEXIST
    assert write_errno(mtty1, b"not-a-uuid-but-exactly-36-chars-long") == errno.EINVAL
    assert write_errno(mtty1, uuid.encode() + b"\r\n") == errno.EINVAL
    for _ in range(23):
        assert write_errno(mtty1, new().encode()) == 0
    assert write_errno(mtty1, new().encode()) == errno.ENOSPC
    mdpy = sim.path("class/mdev_bus/mdpy/mdev_supported_types/mdpy-vga/create")
    for _ in range(4):
        assert write_errno(mdpy, new().encode()) == 0
    assert write_errno(mdpy, new().encode()) == errno.EUSERS
    assert write_errno(sim.path(PF, "nvidia-18", "create"), new().encode()) == 0
    assert write_errno(sim.path(PF, "nvidia-35", "create"), new().encode()) == errno.EINVAL
    with pytest.raises(OSError) as info, open(sim.path(MTTY, "mtty-1", "create"), "rb") as f:
        f.read()
    assert info.value.errno == errno.EIO
    assert len(os.listdir(sim.path("bus/mdev/devices"))) == 24 + 4 + 1


def test_stale_fd_after_unregister_is_enodev(sim):
    fd = os.open(sim.path(MTTY, "mtty-1", "create"), os.O_WRONLY)
    try:
        sim.unregister("mtty")
        assert not os.path.exists(sim.path("class/mdev_bus/mtty"))
        with pytest.raises(OSError) as info:
            os.write(fd, new().encode())
        assert info.value.errno == errno.ENODEV
    finally:
        os.close(fd)
        sim.register("mtty")
    assert avail(sim, f"{MTTY}/mtty-1") == 24


def test_remove_through_the_shell(sim):
    uuid = new()
    assert write_errno(sim.path(MTTY, "mtty-2", "create"), uuid.encode()) == 0
    remove = sim.path("bus/mdev/devices", uuid, "remove")
    assert write_errno(remove, b"0\n") == 0
    assert write_errno(remove, b"yes\n") == errno.EINVAL
    assert os.path.isdir(sim.path("bus/mdev/devices", uuid))
    res = subprocess.run(["sh", "-c", f"echo 1 > '{remove}'"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert not os.path.lexists(sim.path("bus/mdev/devices", uuid))
    assert avail(sim, f"{MTTY}/mtty-2") == 12


def test_held_device_blocks_remove_until_released(sim):
    uuid = new()
    assert write_errno(sim.path(PF, "nvidia-22", "create"), uuid.encode()) == 0
    sim.hold(uuid)
    result: list[int] = []
    writer = threading.Thread(
        target=lambda: result.append(write_errno(sim.path("bus/mdev/devices", uuid, "remove"),
                                                 b"1\n")))
    writer.start()
    deadline = time.monotonic() + 10
    while not sim.status(counters=False)["blocked_removes"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [b["outcome"] for b in sim.status(counters=False)["blocked_removes"]] == ["waiting"]
    assert writer.is_alive() and result == []
    assert os.path.isdir(sim.path("bus/mdev/devices", uuid))
    sim.release(uuid)
    writer.join(15)
    assert not writer.is_alive()
    assert result == [0]
    assert not os.path.lexists(sim.path("bus/mdev/devices", uuid))
    assert sim.status(counters=False)["blocked_removes"][-1]["outcome"] == "released"


def test_reboot_through_the_control_socket(module_sim):
    sim = module_sim
    for _ in range(3):
        assert write_errno(sim.path(MTTY, "mtty-1", "create"), new().encode()) == 0
    assert avail(sim, f"{MTTY}/mtty-1") < 24
    before = sim.status(counters=False)["boot_count"]
    sim.reboot()
    assert os.listdir(sim.path("bus/mdev/devices")) == []
    assert avail(sim, f"{MTTY}/mtty-1") == 24
    assert sim.status(counters=False)["boot_count"] == before + 1


def test_mount_cleans_up_after_an_exception(tmp_path):
    root = tmp_path / "sys"
    with pytest.raises(RuntimeError, match="boom"), \
            mounted(build_spec(["mtty"]), root) as sim:
        assert control.is_mounted(str(root))
        socket_path, proc = sim.socket_path, sim.process
        raise RuntimeError("boom")
    assert not control.is_mounted(str(root))
    assert proc.poll() is not None
    assert not os.path.exists(socket_path)
    assert os.listdir(root) == []


def test_cli_mount_status_umount(tmp_path):
    # A short run dir of its own: unix socket paths are limited to 107 bytes.
    rundir = tempfile.mkdtemp(prefix="accel-sim-cli-", dir="/tmp")
    env = dict(os.environ, ACCEL_SIM_RUNDIR=rundir)
    mp = str(tmp_path / "sys")
    cmd = [sys.executable, "-m", "accel_agent.simulator"]
    try:
        res = subprocess.run([*cmd, "mount", mp, "--profile", "nova"], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        assert control.mount_fstype(mp) == control.FSTYPE  # live when mount returned
        assert read_text(mp, "class/mdev_bus/0000:07:00.0/mdev_supported_types/"
                             "nvidia-11/available_instances") == "7\n"
        res = subprocess.run([*cmd, "status", mp], env=env, capture_output=True, text=True,
                             timeout=30, check=False)
        assert res.returncode == 0 and "nvidia-11=15" in res.stdout
        res = subprocess.run([*cmd, "mount", mp, "--profile", "mtty"], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 1 and "already a mountpoint" in res.stderr
        res = subprocess.run([*cmd, "umount", mp], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        assert not control.is_mounted(mp)
        res = subprocess.run([*cmd, "umount", mp], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 1 and "no simulator is serving" in res.stderr
    finally:
        if control.is_mounted(mp):
            control.fusermount_unmount(mp, lazy=True)
        shutil.rmtree(rundir, ignore_errors=True)


def read_text(root: str, rel: str) -> str:
    with open(os.path.join(root, rel)) as f:
        return f.read()
