"""accel_agent.privileged through the REAL privsep-helper daemon.

The sysfs tree is a temporary directory shaped like /sys with plain files
named create/remove (the FUSE simulator will later give kernel errnos); the
errnos used here are ones a plain tree can produce honestly: ENOENT (missing
parent/type/device), EACCES (a file the capability-less daemon may not open),
ENOSPC (a /dev/full character device named ``create``), and a FIFO named
``remove`` whose open blocks like a held device's remove write does.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from tests.functional.privsep_fixture import PrivsepDaemon, privsep_daemon

pytestmark = pytest.mark.privsep

PCI = "0000:84:00.0"
NV = "nvidia-35"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
U_FIFO = "11111111-2222-4333-8444-555555555555"
U_GONE = "99999999-2222-4333-8444-555555555555"


def _tree(root: Path) -> None:
    """A /sys-shaped tree: class/mdev_bus links into devices/, like the kernel."""
    dev = root / "devices" / "pci0000:80" / PCI
    for mdev_type in (NV, "nvidia-36", "nvidia-full", "nvidia-locked", "nvidia-foreign"):
        (dev / "mdev_supported_types" / mdev_type).mkdir(parents=True)
    for mdev_type in (NV, "nvidia-36"):
        create = dev / "mdev_supported_types" / mdev_type / "create"
        create.touch()
        create.chmod(0o200)
    # ENOSPC: /dev/full is char 1:7, every write fails with ENOSPC.
    os.mknod(dev / "mdev_supported_types" / "nvidia-full" / "create", stat.S_IFCHR | 0o200,
             os.makedev(1, 7))
    # EACCES: root-owned but no write bit for anyone; only CAP_DAC_OVERRIDE opens it.
    locked = dev / "mdev_supported_types" / "nvidia-locked" / "create"
    locked.touch()
    locked.chmod(0o000)
    # EACCES: owner-writable, but the owner is not root.
    foreign = dev / "mdev_supported_types" / "nvidia-foreign" / "create"
    foreign.touch()
    foreign.chmod(0o200)
    os.chown(foreign, 65534, 65534)
    (root / "class" / "mdev_bus").mkdir(parents=True)
    (root / "class" / "mdev_bus" / PCI).symlink_to(f"../../devices/pci0000:80/{PCI}")
    (root / "bus" / "mdev" / "devices").mkdir(parents=True)
    for uuid in (U1, U2, U_FIFO):
        (dev / uuid).mkdir()
        (root / "bus" / "mdev" / "devices" / uuid).symlink_to(
            f"../../../devices/pci0000:80/{PCI}/{uuid}"
        )
    for uuid in (U1, U2):
        (dev / uuid / "remove").touch()
        (dev / uuid / "remove").chmod(0o200)
    os.mkfifo(dev / U_FIFO / "remove", 0o200)
    # An escape attempt: a parent link pointing outside the root.
    outside = root.parent / "outside"
    (outside / "mdev_supported_types" / NV).mkdir(parents=True)
    (outside / "mdev_supported_types" / NV / "create").write_text("sentinel")
    (root / "class" / "mdev_bus" / "evil").symlink_to(outside)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivsepDaemon, Path]]:
    base = tmp_path_factory.mktemp("privsep")
    root = base / "sys"
    root.mkdir()
    _tree(root)
    with privsep_daemon(base, root) as daemon:
        yield daemon, root


def _type_file(root: Path, mdev_type: str) -> Path:
    return root / "devices" / "pci0000:80" / PCI / "mdev_supported_types" / mdev_type / "create"


def test_daemon_has_no_capabilities_and_stays_root(env: tuple[PrivsepDaemon, Path]) -> None:
    daemon, _ = env
    # Every thread: capsets are per thread, and the pool threads run the writes.
    for tid in daemon.thread_ids():
        status = daemon.status(tid)
        assert status["CapEff"] == "0000000000000000", status
        assert status["CapPrm"] == "0000000000000000", status
        assert status["CapInh"] == "0000000000000000", status
        assert status["Uid"].split() == ["0", "0", "0", "0"]


def test_create_writes_the_uuid(env: tuple[PrivsepDaemon, Path]) -> None:
    _, root = env
    privileged.create_mdev(PCI, NV, U1)
    # Exactly the 36 bytes; the kernel accepts 36 or 37 (trailing newline).
    assert _type_file(root, NV).read_bytes() == U1.encode()


def test_remove_writes_one(env: tuple[PrivsepDaemon, Path]) -> None:
    _, root = env
    privileged.remove_mdev(U2, 5.0)
    assert (root / "devices" / "pci0000:80" / PCI / U2 / "remove").read_bytes() == b"1"


def test_daemon_reads_its_own_sysfs_root(env: tuple[PrivsepDaemon, Path]) -> None:
    daemon, root = env
    # The client's CONF is not the daemon's: nothing here points at the tree.
    from accel_agent.config.options import CONF

    assert CONF.sysfs_root != str(root)
    assert f"sysfs_root = {root}" in daemon.config_file.read_text()
    privileged.create_mdev(PCI, "nvidia-36", U2)
    assert _type_file(root, "nvidia-36").read_bytes() == U2.encode()


@pytest.mark.parametrize(
    ("args", "cls", "kwargs"),
    [
        ((PCI, "nvidia-99", U1), exception.MdevTypeNotSupported,
         {"parent": PCI, "mdev_type": "nvidia-99"}),
        (("0000:85:00.0", NV, U1), exception.ParentNotFound, {"parent": "0000:85:00.0"}),
        ((PCI, "nvidia-full", U1), exception.InsufficientCapacity,
         {"mdev_type": "nvidia-full", "parents": PCI}),
        ((PCI, "nvidia-locked", U1), exception.SysfsWriteFailed, {"errno": "EACCES"}),
        ((PCI, "nvidia-foreign", U1), exception.SysfsWriteFailed, {"errno": "EACCES"}),
    ],
)
def test_create_errors_cross_the_channel_as_their_class(
    env: tuple[PrivsepDaemon, Path],
    args: tuple[str, str, str],
    cls: type[exception.AccelAgentException],
    kwargs: dict[str, str],
) -> None:
    with pytest.raises(exception.AccelAgentException) as info:
        privileged.create_mdev(*args)
    assert type(info.value) is cls
    for key, value in kwargs.items():
        assert info.value.kwargs[key] == value
    # Message and kwargs both survived: the daemon's message is what the
    # class renders from the kwargs the client now holds.
    assert info.value.message == cls.msg_fmt % info.value.kwargs


def test_enospc_message_names_the_errno(env: tuple[PrivsepDaemon, Path]) -> None:
    with pytest.raises(exception.InsufficientCapacity) as info:
        privileged.create_mdev(PCI, "nvidia-full", U1)
    assert info.value.kwargs["reason"].startswith("ENOSPC")


def test_remove_of_unknown_mdev_is_mdev_not_found(env: tuple[PrivsepDaemon, Path]) -> None:
    with pytest.raises(exception.MdevNotFound) as info:
        privileged.remove_mdev(U_GONE, 5.0)
    assert info.value.kwargs == {"uuid": U_GONE}


@pytest.mark.parametrize(
    "args",
    [
        ("../..", NV, U1),
        ("/etc", NV, U1),
        (PCI, "../../../../etc", U1),
        (PCI, NV, U1.upper()),
        (PCI, NV, "{" + U1 + "}"),
        (PCI, NV, U1 + "\x00"),
        (PCI, NV + "\x00", U1),
        ("0000:84:00.0\n", NV, U1),
        ("84:00.0", NV, U1),
        ("0000:AF:00.0", NV, U1),
        (PCI, "x" * 65, U1),
    ],
)
def test_daemon_validates_create_input(env: tuple[PrivsepDaemon, Path], args: tuple) -> None:
    _, root = env
    before = _type_file(root, NV).read_bytes()
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.create_mdev(*args)
    assert _type_file(root, NV).read_bytes() == before


@pytest.mark.parametrize("args", [("../" + U1, 5.0), (U1.upper(), 5.0), (U1, 0), (U1, "5")])
def test_daemon_validates_remove_input(env: tuple[PrivsepDaemon, Path], args: tuple) -> None:
    _, root = env
    remove = root / "devices" / "pci0000:80" / PCI / U1 / "remove"
    before = remove.read_bytes()
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.remove_mdev(*args)
    assert remove.read_bytes() == before


def test_daemon_refuses_symlink_escape(env: tuple[PrivsepDaemon, Path]) -> None:
    _, root = env
    sentinel = root.parent / "outside" / "mdev_supported_types" / NV / "create"
    st = sentinel.stat()
    with pytest.raises(exception.PrivilegedInputRejected) as info:
        privileged.create_mdev("evil", NV, U1)
    assert "outside" in info.value.message
    assert sentinel.read_text() == "sentinel"
    assert sentinel.stat().st_mtime_ns == st.st_mtime_ns


def test_blocked_remove_times_out_and_completes_later(env: tuple[PrivsepDaemon, Path]) -> None:
    """A held device's remove blocks: the call returns, the writer finishes later."""
    _, root = env
    fifo = root / "devices" / "pci0000:80" / PCI / U_FIFO / "remove"
    with pytest.raises(exception.MdevRemoveTimeout) as info:
        privileged.remove_mdev(U_FIFO, 0.5)
    assert info.value.kwargs == {"uuid": U_FIFO, "timeout": 0.5}
    # A retry waits on the same blocked writer instead of starting another.
    with pytest.raises(exception.MdevRemoveTimeout):
        privileged.remove_mdev(U_FIFO, 0.5)
    # The daemon is not wedged: other requests still run.
    privileged.create_mdev(PCI, NV, U2)
    assert _type_file(root, NV).read_bytes() == U2.encode()
    # "QEMU lets go": open the reading end; the pending writer completes.
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive()
    # One "1": two writers would both have been released by this open.
    assert got == [b"1"]
