"""The privileged write path, called directly (no daemon) against a temp tree.

Every refusal must happen before any filesystem access, and nothing outside
the sysfs root may ever be touched: a sentinel file outside the root keeps
its content and mtime through every attempt.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import uuid as uuid_mod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accel_agent import exception, privileged
from accel_agent.privileged import mdev, validate, writes
from accel_agent.privileged import wire as wire_format

PCI = "0000:84:00.0"
NV = "nvidia-35"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"


class Tree:
    def __init__(self, base: Path) -> None:
        self.root = base / "sys"
        self.outside = base / "outside"
        dev = self.root / "devices" / "pci0000:80" / PCI
        self.dev = dev
        (dev / "mdev_supported_types" / NV).mkdir(parents=True)
        (dev / "mdev_supported_types" / NV / "create").touch()
        (dev / U1).mkdir()
        (dev / U1 / "remove").touch()
        (self.root / "class" / "mdev_bus").mkdir(parents=True)
        (self.root / "class" / "mdev_bus" / PCI).symlink_to(f"../../devices/pci0000:80/{PCI}")
        (self.root / "class" / "mdev_bus" / "mtty").mkdir()
        (self.root / "bus" / "mdev" / "devices").mkdir(parents=True)
        (self.root / "bus" / "mdev" / "devices" / U1).symlink_to(
            f"../../../devices/pci0000:80/{PCI}/{U1}"
        )
        # What an escape would hit: files named like the real ones, outside.
        (self.outside / "mdev_supported_types" / NV).mkdir(parents=True)
        self.sentinel = self.outside / "mdev_supported_types" / NV / "create"
        self.sentinel.write_text("sentinel")
        (self.outside / U1).mkdir()
        (self.outside / U1 / "remove").write_text("sentinel")
        self._stamp = self._stamps()

    @property
    def create(self) -> Path:
        return self.dev / "mdev_supported_types" / NV / "create"

    @property
    def remove(self) -> Path:
        return self.dev / U1 / "remove"

    def _stamps(self) -> dict[Path, tuple[bytes, int]]:
        return {
            p: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in self.outside.rglob("*")
            if p.is_file()
        }

    def assert_outside_untouched(self) -> None:
        assert self._stamps() == self._stamp


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


@pytest.fixture
def no_fs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail loudly if the code under test touches the filesystem at all."""
    touched: list[str] = []

    def guard(name: str) -> Any:
        def boom(*args: Any, **kwargs: Any) -> Any:
            touched.append(name)
            raise AssertionError(f"filesystem access ({name}) before validation")

        return boom

    monkeypatch.setattr(os, "open", guard("open"))
    monkeypatch.setattr(os.path, "realpath", guard("realpath"))
    monkeypatch.setattr(os.path, "isdir", guard("isdir"))
    monkeypatch.setattr(os.path, "lexists", guard("lexists"))
    yield touched
    monkeypatch.undo()


# --- the happy path ----------------------------------------------------------------


def test_create_writes_uuid_through_in_root_symlink(tree: Tree) -> None:
    privileged.write_create(str(tree.root), PCI, NV, U1)
    assert tree.create.read_bytes() == U1.encode()
    tree.assert_outside_untouched()


def test_remove_writes_one(tree: Tree) -> None:
    privileged.write_remove(str(tree.root), U1, 5.0)
    assert tree.remove.read_bytes() == b"1"


def test_virtual_parent_is_accepted(tree: Tree) -> None:
    (tree.root / "class" / "mdev_bus" / "mtty" / "mdev_supported_types" / "mtty-1").mkdir(
        parents=True
    )
    create = tree.root / "class" / "mdev_bus" / "mtty" / "mdev_supported_types" / "mtty-1"
    (create / "create").touch()
    privileged.write_create(str(tree.root), "mtty", "mtty-1", U1)
    assert (create / "create").read_bytes() == U1.encode()


def test_write_never_creates_a_file(tree: Tree) -> None:
    (tree.dev / "mdev_supported_types" / "nvidia-36").mkdir()
    with pytest.raises(exception.MdevTypeNotSupported):
        privileged.write_create(str(tree.root), PCI, "nvidia-36", U1)
    assert not (tree.dev / "mdev_supported_types" / "nvidia-36" / "create").exists()


# --- refusals before any filesystem access -----------------------------------------

BAD_UUIDS = [
    U1.upper(),
    "{" + U1 + "}",
    U1.replace("-", ""),
    U1 + "\n",
    " " + U1,
    U1 + "\x00",
    U1[:-1],
    U1 + "0",
    U1.replace("-", "_"),
    "g" + U1[1:],
    "../" + U1,
    "/" + U1,
    "",
    None,
    b"83b8f4f2-509f-382f-3c1e-e6bfe0fa1001",
    42,
]
BAD_TYPES = [
    "../nvidia-35",
    "..",
    ".",
    "/etc",
    "a/b",
    "",
    "x" * 65,
    "nvidia-35\x00",
    "nvidia 35",
    "nvidia-35\n",
    "nvídia",
    None,
]
BAD_PARENTS = [
    "..",
    ".",
    "../..",
    "/sys",
    "/",
    "a/b",
    "",
    "x" * 65,
    "mtty\x00",
    "mtty\n",
    " mtty",
    "0000:AF:00.0",  # PCI, but not the kernel's spelling
    "84:00.0",  # short form: canonical is 0000:84:00.0
    "-mtty",
    None,
]


@pytest.mark.parametrize("bad", BAD_UUIDS)
def test_bad_uuid_refused_before_fs(tree: Tree, no_fs: list[str], bad: Any) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(str(tree.root), PCI, NV, bad)
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_remove(str(tree.root), bad, 5.0)
    assert no_fs == []


@pytest.mark.parametrize("bad", BAD_TYPES)
def test_bad_type_refused_before_fs(tree: Tree, no_fs: list[str], bad: Any) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(str(tree.root), PCI, bad, U1)
    assert no_fs == []


@pytest.mark.parametrize("bad", BAD_PARENTS)
def test_bad_parent_refused_before_fs(tree: Tree, no_fs: list[str], bad: Any) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(str(tree.root), bad, NV, U1)
    assert no_fs == []


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5", None, 1e9])
def test_bad_timeout_refused_before_fs(tree: Tree, no_fs: list[str], bad: Any) -> None:
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_remove(str(tree.root), U1, bad)
    assert no_fs == []


def test_bad_inputs_leave_every_file_alone(tree: Tree) -> None:
    for bad in BAD_PARENTS:
        with pytest.raises(exception.PrivilegedInputRejected):
            privileged.write_create(str(tree.root), bad, NV, U1)
    for bad in BAD_TYPES:
        with pytest.raises(exception.PrivilegedInputRejected):
            privileged.write_create(str(tree.root), PCI, bad, U1)
    for bad in BAD_UUIDS:
        with pytest.raises(exception.PrivilegedInputRejected):
            privileged.write_create(str(tree.root), PCI, NV, bad)
        with pytest.raises(exception.PrivilegedInputRejected):
            privileged.write_remove(str(tree.root), bad, 5.0)
    assert tree.create.read_bytes() == b""
    assert tree.remove.read_bytes() == b""
    tree.assert_outside_untouched()


@given(st.text(max_size=80))
def test_accepted_parent_is_one_safe_component(text: str) -> None:
    try:
        validate.validate_parent(text)
    except exception.PrivilegedInputRejected:
        return
    assert "/" not in text and "\x00" not in text and text not in (".", "..")
    assert text.isprintable() and not any(c.isspace() for c in text)
    assert 0 < len(text) <= validate.MAX_PARENT_LEN


@given(st.text(max_size=80))
def test_accepted_type_is_one_safe_component(text: str) -> None:
    try:
        validate.validate_mdev_type(text)
    except exception.PrivilegedInputRejected:
        return
    assert "/" not in text and "\x00" not in text and text not in (".", "..")
    assert 0 < len(text) <= validate.MAX_TYPE_LEN


@given(st.one_of(st.uuids().map(str), st.text(max_size=40)))
def test_accepted_uuid_is_canonical(text: str) -> None:
    try:
        validate.validate_uuid(text)
    except exception.PrivilegedInputRejected:
        return
    assert str(uuid_mod.UUID(text)) == text


# --- confinement after resolution ----------------------------------------------------


def test_parent_link_escaping_root_is_refused(tree: Tree) -> None:
    (tree.root / "class" / "mdev_bus" / "evil").symlink_to(tree.outside)
    with pytest.raises(exception.PrivilegedInputRejected, match="outside"):
        privileged.write_create(str(tree.root), "evil", NV, U1)
    tree.assert_outside_untouched()


def test_relative_link_escaping_root_is_refused(tree: Tree) -> None:
    (tree.root / "class" / "mdev_bus" / "evil").symlink_to("../../../outside")
    with pytest.raises(exception.PrivilegedInputRejected, match="outside"):
        privileged.write_create(str(tree.root), "evil", NV, U1)
    tree.assert_outside_untouched()


def test_create_file_symlink_escaping_root_is_refused(tree: Tree) -> None:
    type_dir = tree.root / "class" / "mdev_bus" / "mtty" / "mdev_supported_types" / NV
    type_dir.mkdir(parents=True)
    (type_dir / "create").symlink_to(tree.sentinel)
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(str(tree.root), "mtty", NV, U1)
    tree.assert_outside_untouched()


def test_create_link_to_other_file_inside_root_is_refused(tree: Tree) -> None:
    """Inside the root but not a <type>/create: still refused."""
    type_dir = tree.root / "class" / "mdev_bus" / "mtty" / "mdev_supported_types" / NV
    type_dir.mkdir(parents=True)
    (type_dir / "create").symlink_to(tree.remove)
    with pytest.raises(exception.PrivilegedInputRejected):
        privileged.write_create(str(tree.root), "mtty", NV, U1)
    assert tree.remove.read_bytes() == b""


def test_device_link_escaping_root_is_refused(tree: Tree) -> None:
    u2 = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    (tree.outside / u2).mkdir()
    (tree.outside / u2 / "remove").write_text("sentinel")
    tree._stamp = tree._stamps()
    (tree.root / "bus" / "mdev" / "devices" / u2).symlink_to(tree.outside / u2)
    with pytest.raises(exception.PrivilegedInputRejected, match="outside"):
        privileged.write_remove(str(tree.root), u2, 5.0)
    tree.assert_outside_untouched()


def test_root_that_is_itself_a_symlink_works(tree: Tree, tmp_path: Path) -> None:
    link = tmp_path / "sys-link"
    link.symlink_to(tree.root)
    privileged.write_create(str(link), PCI, NV, U1)
    assert tree.create.read_bytes() == U1.encode()


def test_missing_root_is_reported(tmp_path: Path) -> None:
    with pytest.raises(exception.SysfsRootNotFound):
        privileged.write_create(str(tmp_path / "nope"), PCI, NV, U1)


# --- errno mapping -------------------------------------------------------------------


def _kernel_answers(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every sysfs write fails with ``code``, as the kernel would refuse it."""

    def fail(path: str, data: bytes) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(mdev, "write_once", fail)  # create
    monkeypatch.setattr(writes, "write_once", fail)  # remove, in its RemoveWriter


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (errno.EEXIST, exception.MdevAlreadyExists),
        (errno.EINVAL, exception.MdevCreateInvalid),
        (errno.ENOSPC, exception.InsufficientCapacity),
        (errno.EUSERS, exception.InsufficientCapacity),
        (errno.EDQUOT, exception.InsufficientCapacity),
        (errno.ENODEV, exception.ParentGone),
        (errno.EACCES, exception.SysfsWriteFailed),
        (errno.EIO, exception.SysfsWriteFailed),
        (errno.ELOOP, exception.PrivilegedInputRejected),
    ],
)
def test_create_errno_mapping(
    tree: Tree, monkeypatch: pytest.MonkeyPatch, code: int, cls: type
) -> None:
    _kernel_answers(monkeypatch, code)
    with pytest.raises(exception.AccelAgentException) as info:
        privileged.write_create(str(tree.root), PCI, NV, U1)
    assert type(info.value) is cls
    if cls is exception.SysfsWriteFailed:
        assert info.value.kwargs["errno"] == errno.errorcode[code]


def test_create_enoent_tells_parent_from_type(tree: Tree) -> None:
    with pytest.raises(exception.ParentNotFound):
        privileged.write_create(str(tree.root), "0000:85:00.0", NV, U1)
    with pytest.raises(exception.MdevTypeNotSupported):
        privileged.write_create(str(tree.root), PCI, "nvidia-99", U1)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (errno.ENOENT, exception.MdevNotFound),
        (errno.ENODEV, exception.ParentGone),
        (errno.EAGAIN, exception.SysfsWriteFailed),
        (errno.EINVAL, exception.SysfsWriteFailed),
    ],
)
def test_remove_errno_mapping(
    tree: Tree, monkeypatch: pytest.MonkeyPatch, code: int, cls: type
) -> None:
    _kernel_answers(monkeypatch, code)
    with pytest.raises(exception.AccelAgentException) as info:
        privileged.write_remove(str(tree.root), U1, 5.0)
    assert type(info.value) is cls
    if cls is exception.ParentGone:
        assert info.value.kwargs["parent"] == PCI


def test_short_write_is_a_failure(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "write", lambda fd, data: len(data) - 1)
    with pytest.raises(exception.SysfsWriteFailed):
        privileged.write_create(str(tree.root), PCI, NV, U1)


def test_blocked_remove_times_out_and_one_writer_finishes_later(tree: Tree) -> None:
    u_fifo = "11111111-2222-4333-8444-555555555555"
    (tree.dev / u_fifo).mkdir()
    fifo = tree.dev / u_fifo / "remove"
    os.mkfifo(fifo)
    (tree.root / "bus" / "mdev" / "devices" / u_fifo).symlink_to(tree.dev / u_fifo)
    for _ in range(2):
        with pytest.raises(exception.MdevRemoveTimeout):
            privileged.write_remove(str(tree.root), u_fifo, 0.2)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    reader.join(60)
    assert got == [b"1"]


# --- the in-use probe before a remove ----------------------------------------------------


def _with_group(tree: Tree, group: str = "7") -> Path:
    """Give U1 an IOMMU group (as a VFIO mdev driver does); returns the vfio dir."""
    groups = tree.root / "kernel" / "iommu_groups" / group
    groups.mkdir(parents=True)
    (tree.dev / U1 / "iommu_group").symlink_to(groups)
    return tree.root / "vfio"


def test_remove_without_a_vfio_dir_to_check_keeps_the_mdev(tree: Tree) -> None:
    _with_group(tree)
    with pytest.raises(exception.MdevInUse, match="cannot check whether it is in use"):
        privileged.write_remove(str(tree.root), U1, 5)
    assert tree.remove.read_bytes() == b""  # nothing written


def test_remove_proceeds_when_the_group_node_opens_or_does_not_exist(tree: Tree) -> None:
    vfio = _with_group(tree)
    vfio.mkdir()
    privileged.write_remove(str(tree.root), U1, 5)  # no node: VFIO offers it to no one
    assert tree.remove.read_bytes() == b"1"
    tree.remove.write_bytes(b"")
    (vfio / "7").touch(mode=0o600)
    privileged.write_remove(str(tree.root), U1, 5)
    assert tree.remove.read_bytes() == b"1"


def test_ebusy_on_the_group_node_keeps_the_mdev(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    vfio = _with_group(tree)
    vfio.mkdir()
    (vfio / "7").touch(mode=0o600)
    real_open = os.open

    def held(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(vfio / "7"):
            assert flags & os.O_ACCMODE == os.O_RDONLY
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", held)
    with pytest.raises(exception.MdevInUse, match=r"VFIO group .*/vfio/7 is open"):
        privileged.write_remove(str(tree.root), U1, 5)
    assert tree.remove.read_bytes() == b""


def test_a_group_link_leaving_the_root_is_refused(tree: Tree) -> None:
    (tree.outside / "9").mkdir()
    (tree.dev / U1 / "iommu_group").symlink_to(tree.outside / "9")
    with pytest.raises(exception.PrivilegedInputRejected, match="iommu_group"):
        privileged.write_remove(str(tree.root), U1, 5)
    assert tree.remove.read_bytes() == b""
    tree.assert_outside_untouched()


def test_vfio_dev_dir_follows_the_sysfs_root() -> None:
    assert privileged.vfio_dev_dir("/sys") == "/dev/vfio"
    assert privileged.vfio_dev_dir("/sys/") == "/dev/vfio"
    assert privileged.vfio_dev_dir("/run/sim") == "/run/sim/vfio"
    assert privileged.vfio_dev_dir("/run/sim", "/dev/vfio") == "/dev/vfio"


# --- the privsep channel and the helper command ------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        exception.MdevTypeNotSupported(parent=PCI, mdev_type=NV),
        exception.SysfsWriteFailed(path="/x/create", error="EACCES (Permission denied)",
                                   errno="EACCES"),
        exception.MdevRemoveTimeout(uuid=U1, timeout=0.5),
        exception.PrivilegedInputRejected(reason="no"),
    ],
)
def test_exceptions_survive_the_wire_format(exc: exception.AccelAgentException) -> None:
    wire = wire_format.to_wire(exc)
    # What oslo.privsep does: class name + args, rebuilt with cls(*args).
    rebuilt_wire = type(wire)(*wire.args)
    back = wire_format.from_wire(rebuilt_wire)
    assert type(back) is type(exc)
    assert back.message == exc.message
    assert back.kwargs == exc.kwargs


def test_unknown_wire_class_degrades_to_base() -> None:
    back = wire_format.from_wire(wire_format.WireError("os.system", "boom", {}))
    assert type(back) is exception.AccelAgentException
    assert "boom" in back.message


def test_helper_command_as_root_uses_this_venv_without_sudo() -> None:
    cmd = privileged.helper_command(["/etc/a.conf", "b c.conf"], ["/etc/d"], as_root=True)
    import shlex

    argv = shlex.split(cmd)
    assert argv[:3] == [sys.executable, "-m", "accel_agent.privileged.helper"]
    assert argv[3:] == [
        "--config-file", "/etc/a.conf",
        "--config-file", os.path.abspath("b c.conf"),
        "--config-dir", "/etc/d",
    ]
    assert shlex.split(privileged.helper_command([], as_root=False))[0] == "sudo"


def test_context_holds_no_capabilities() -> None:
    from oslo_config import cfg

    assert cfg.CONF[privileged.CFG_SECTION].capabilities == []
    assert cfg.CONF[privileged.CFG_SECTION].user is None


def test_the_helper_finds_each_context_where_the_facade_exports_it() -> None:
    """The pypath is the helper's --privsep_context: oslo.privsep starts a
    helper only when it imports back to the very context.  The sysfs
    context's is the path it always had (accel_agent.privileged.sysfs_admin)."""
    from oslo_utils import importutils

    for context, path in [
        (privileged.sysfs_admin, "accel_agent.privileged.sysfs_admin"),
        (privileged.net_admin, "accel_agent.privileged.net_admin"),
    ]:
        assert context.pypath == path
        assert importutils.import_class(path) is context
