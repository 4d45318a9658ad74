"""A hostile sysfs tree: nothing in it may hang, explode or mislead a scan.

Real files on a static tree (the simulator's, materialised), with what an
unprivileged user (a FIFO, a socket, a link, a hard link) or a careless copy
(a device node) can put there.  "No hang" is proven with a generous bound:
a read blocked in a FIFO never returns, and the test then unblocks it itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accel_agent import exception, privileged
from accel_agent.devices import inventory as inventory_mod
from accel_agent.devices import ledger as ledger_mod
from accel_agent.devices import manager as manager_mod
from accel_agent.devices import policy as policy_mod
from accel_agent.devices import writers
from accel_agent.reporting.metrics import AgentMetrics
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from accel_agent.sysfs import attributes, scan
from accel_agent.sysfs.rescan import Rescanner
from tests.configutil import make_conf

GPU = "0000:84:00.0"
TYPE = "nvidia-35"
TYPES_DIR = f"class/mdev_bus/{GPU}/mdev_supported_types"
NO_HANG = 30.0  # seconds; a blocked open() or read() never returns at all
UUID = "11111111-2222-4333-8444-555555555555"

FORK_UNDER_EVENTLET = pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")


def make_tree(tmp_path, *profiles: str, **options: Any) -> str:
    host = SimulatedHost(build_spec(profiles or ("nvidia-pf",), **(options or {"gpus": 1})))
    root = tmp_path / "sys"
    materialise(host, str(root))
    return str(root)


def attribute_path(root: str, relative: str) -> str:
    return os.path.join(root, relative)


def replace(path: str, make: Callable[[str], Any]) -> Any:
    os.unlink(path)
    return make(path)


@contextlib.contextmanager
def released_fifos(paths: list[str]) -> Iterator[None]:
    """Whatever happens, unblock a reader or writer stuck in a FIFO's open()
    by opening its other end (so a failing test leaves no thread hanging)."""
    try:
        yield
    finally:
        for path in paths:
            for flags in (os.O_RDONLY, os.O_WRONLY):
                with contextlib.suppress(OSError):
                    os.close(os.open(path, flags | os.O_NONBLOCK))


def bounded(call: Callable[[], Any], fifos: list[str]) -> Any:
    """``call()`` in a thread; fails (and unblocks it) if it does not return in NO_HANG s."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # re-raised below
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    with released_fifos(fifos):
        thread.start()
        thread.join(NO_HANG)
        hung = thread.is_alive()
    thread.join(NO_HANG)
    assert not hung, f"hung for {NO_HANG} s on a FIFO"
    if "error" in result:
        raise result["error"]
    return result["value"]


# --- FIFOs, sockets, device nodes in place of attributes -------------------------------

TYPE_ATTRIBUTES = ["available_instances", "device_api", "name", "description"]
PARENT_ATTRIBUTES = ["vendor", "device", "numa_node"]


@pytest.mark.parametrize("attribute", TYPE_ATTRIBUTES + PARENT_ATTRIBUTES)
def test_a_fifo_in_place_of_an_attribute_never_hangs_a_scan(tmp_path, attribute):
    root = make_tree(tmp_path)
    relative = (
        f"{TYPES_DIR}/{TYPE}/{attribute}"
        if attribute in TYPE_ATTRIBUTES
        else f"class/mdev_bus/{GPU}/{attribute}"
    )
    fifo = attribute_path(root, relative)
    replace(fifo, os.mkfifo)
    snap = bounded(lambda: scan(root), [fifo])
    assert any(f"{attribute} is a FIFO" in w for w in snap.warnings), snap.warnings
    types = snap.parents[GPU].types
    if attribute in ("available_instances", "device_api"):
        assert TYPE not in types  # required: the type is skipped
    else:
        assert TYPE in types


@FORK_UNDER_EVENTLET
def test_a_fifo_never_hangs_a_forked_scan_worker(tmp_path):
    root = make_tree(tmp_path, "synthetic", parents=40, types=2)
    bus = os.path.join(root, "class/mdev_bus")
    last = sorted(os.listdir(bus))[-1]  # scanned by the second worker
    types = os.path.join(bus, last, "mdev_supported_types")
    fifo = os.path.join(types, sorted(os.listdir(types))[0], "available_instances")
    replace(fifo, os.mkfifo)
    snap = bounded(lambda: scan(root, workers=2), [fifo])
    assert len(snap.parents) == 40
    assert any("available_instances is a FIFO" in w for w in snap.warnings)


def test_a_fifo_never_hangs_a_steady_state_rescan(tmp_path):
    root = make_tree(tmp_path)
    rescanner = Rescanner(root)
    assert TYPE in rescanner.full().parents[GPU].types
    fifo = attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances")
    replace(fifo, os.mkfifo)
    snap = bounded(lambda: rescanner.rescan(), [fifo])
    assert TYPE not in snap.parents[GPU].types
    assert any("available_instances is a FIFO" in w for w in snap.warnings)


def test_a_fifo_with_a_writer_is_not_read_either(tmp_path):
    """A FIFO someone writes a plausible counter into is still no attribute."""
    root = make_tree(tmp_path)
    fifo = attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances")
    replace(fifo, os.mkfifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer may open
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, b"7\n")
        snap = bounded(lambda: scan(root), [fifo])
    finally:
        os.close(writer)
        os.close(reader)
    assert TYPE not in snap.parents[GPU].types


def test_a_socket_in_place_of_an_attribute_is_refused(tmp_path, monkeypatch):
    root = make_tree(tmp_path)
    path = attribute_path(root, f"{TYPES_DIR}/{TYPE}/name")
    os.unlink(path)
    monkeypatch.chdir(os.path.dirname(path))  # AF_UNIX paths are short
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("name")
        snap = scan(root)
    assert snap.parents[GPU].types[TYPE].name is None
    assert any("name is a socket" in w for w in snap.warnings)


def test_a_device_node_in_place_of_an_attribute_is_not_read(tmp_path):
    root = make_tree(tmp_path)
    path = attribute_path(root, f"{TYPES_DIR}/{TYPE}/name")
    os.unlink(path)
    try:
        os.mknod(path, stat.S_IFCHR | 0o444, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    snap = scan(root)
    assert snap.parents[GPU].types[TYPE].name is None
    assert any("name is a character device" in w for w in snap.warnings)


# --- links out of the root --------------------------------------------------------------


def test_an_attribute_that_is_a_link_out_of_the_root_is_not_followed(tmp_path):
    root = make_tree(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("root-only secret\n")
    for attribute in ("name", "description"):
        replace(attribute_path(root, f"{TYPES_DIR}/{TYPE}/{attribute}"),
                lambda p: os.symlink(str(secret), p))
    replace(attribute_path(root, f"class/mdev_bus/{GPU}/vendor"),
            lambda p: os.symlink(str(secret), p))
    snap = scan(root)
    mdev_type = snap.parents[GPU].types[TYPE]
    assert (mdev_type.name, mdev_type.description, snap.parents[GPU].vendor_id) == (
        None, None, None)
    assert "secret" not in repr(snap.parents)
    assert any("name is a symlink" in w for w in snap.warnings)


def test_a_counter_that_is_a_link_out_of_the_root_is_not_followed_by_a_rescan(tmp_path):
    root = make_tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.full()
    outside = tmp_path / "counter"
    outside.write_text("7\n")
    replace(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"),
            lambda p: os.symlink(str(outside), p))
    snap = rescanner.rescan()
    assert TYPE not in snap.parents[GPU].types
    assert any("available_instances is a symlink" in w for w in snap.warnings)


def test_a_types_directory_that_is_a_link_out_of_the_root_is_not_followed(tmp_path):
    root = make_tree(tmp_path)
    outside = tmp_path / "outside"
    (outside / "evil-1").mkdir(parents=True)
    (outside / "evil-1" / "device_api").write_text("vfio-pci\n")
    (outside / "evil-1" / "available_instances").write_text("5\n")
    (outside / "evil-1" / "name").write_text("root-only secret\n")
    types = attribute_path(root, TYPES_DIR)
    os.rename(types, str(tmp_path / "moved"))
    os.symlink(str(outside), types)
    snap = scan(root)
    assert dict(snap.parents[GPU].types) == {}
    assert any("mdev_supported_types is not a directory" in w for w in snap.warnings)


# --- numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, why",
    [
        ("9" * 4000 + "\n", "exceeds the maximum"),
        ("50000000\n", "exceeds the maximum"),
        (f"{attributes.MAX_INSTANCES + 1}\n", "exceeds the maximum"),
        ("\u0663\n", "is not a number"),  # ARABIC-INDIC DIGIT THREE: int() takes it
        ("1_000\n", "is not a number"),  # int() takes it
        ("+5\n", "is not a number"),
        ("-1\n", "is below 0"),
    ],
)
def test_a_counter_that_is_no_sane_number_skips_its_type(tmp_path, text, why):
    root = make_tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.full()
    with open(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"), "w") as f:
        f.write(text)
    for snap in (scan(root), rescanner.rescan()):
        assert TYPE not in snap.parents[GPU].types
        assert any(f"type {TYPE} available_instances" in w and why in w for w in snap.warnings)


def test_the_largest_believed_counter_is_kept(tmp_path):
    root = make_tree(tmp_path)
    with open(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"), "w") as f:
        f.write(f"{attributes.MAX_INSTANCES}\n")
    assert scan(root).parents[GPU].types[TYPE].available_instances == attributes.MAX_INSTANCES


def test_other_numbers_from_sysfs_are_ascii_and_bounded(tmp_path):
    root = make_tree(tmp_path)
    with open(attribute_path(root, f"class/mdev_bus/{GPU}/numa_node"), "w") as f:
        f.write("\u0663\n")
    description = attribute_path(root, f"{TYPES_DIR}/{TYPE}/description")
    with open(description, "w") as f:
        f.write("num_heads=4, max_instance=\u0664\n")
    snap = scan(root)
    assert snap.parents[GPU].numa_node is None
    assert snap.parents[GPU].types[TYPE].max_instance is None
    with open(description, "w") as f:
        f.write("max_instance=" + "9" * 4000 + "\n")
    assert scan(root).parents[GPU].types[TYPE].max_instance is None


def test_a_huge_counter_reaches_neither_the_inventory_nor_the_metrics(tmp_path):
    root = make_tree(tmp_path)
    with open(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"), "w") as f:
        f.write("9" * 4000 + "\n")
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    inventory = inventory_mod.compute_inventory(
        scan(root), policy_mod.build_policy(conf), "testhost", frozenset()
    )
    # Before: an OverflowError (int too large to convert to float).
    AgentMetrics().set_providers({p.name: (p.total, p.used) for p in inventory.providers})
    assert all(p.total <= attributes.MAX_INSTANCES for p in inventory.providers)


def test_a_large_counter_does_not_make_an_allocation_allocate_that_much(tmp_path):
    root = make_tree(tmp_path)
    with open(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"), "w") as f:
        f.write("5000000\n")
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    manager = manager_mod.DeviceManager(
        sysfs_root=root,
        policy=policy_mod.build_policy(conf),
        host="testhost",
        ledger=ledger_mod.Ledger(str(tmp_path / "state")),
        writer=writers.DirectWriter(root),
    )
    tracemalloc.start()
    try:
        with contextlib.suppress(exception.AccelAgentException):
            manager.allocate("vm-1", 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        manager.ledger.close()
    # Before: a plan of 5,000,000 slots (40 MB of list alone; 810 MB for 50,000,000).
    assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", [GPU + "\n", " " + GPU, "0000:8A:00.0", "84:00.0", "mtty\nx", "0000:84:00.0 "]
)
def test_a_parent_link_with_a_non_canonical_name_is_skipped(tmp_path, name):
    root = make_tree(tmp_path)
    bus = os.path.join(root, "class/mdev_bus")
    os.symlink(os.readlink(os.path.join(bus, GPU)), os.path.join(bus, name))
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    policy = policy_mod.build_policy(conf)
    honest = inventory_mod.compute_inventory(scan(make_tree(tmp_path / "b")), policy, "h",
                                             frozenset())
    for snap in (scan(root), Rescanner(root).rescan(), _rescanned(root, bus, name)):
        assert list(snap.parents) == [GPU]
        assert any(repr(name) in w and "not a canonical" in w for w in snap.warnings)
        inventory = inventory_mod.compute_inventory(snap, policy, "h", frozenset())
        assert [(p.name, p.total) for p in inventory.providers] == [
            (p.name, p.total) for p in honest.providers
        ]


def _rescanned(root: str, bus: str, name: str):
    """A steady-state rescan that meets the link for the first time."""
    os.rename(os.path.join(bus, name), os.path.join(root, "parked"))
    rescanner = Rescanner(root)
    rescanner.full()
    os.rename(os.path.join(root, "parked"), os.path.join(bus, name))
    return rescanner.rescan()


def test_a_regular_file_in_the_mdev_bus_is_not_an_mdev(tmp_path):
    root = make_tree(tmp_path)
    rescanner = Rescanner(root)
    rescanner.full()
    with open(os.path.join(root, "bus/mdev/devices", UUID), "w") as f:
        f.write("not a device\n")
    for snap in (scan(root), rescanner.rescan()):
        assert UUID not in snap.mdevs
        assert any(UUID in w for w in snap.warnings)


# --- the privileged writer --------------------------------------------------------------------


def test_the_privileged_writer_refuses_a_create_file_with_another_link(tmp_path):
    root = make_tree(tmp_path)
    outside = tmp_path / "outside-file"
    outside.write_text("precious\n")
    create = attribute_path(root, f"{TYPES_DIR}/{TYPE}/create")
    replace(create, lambda p: os.link(str(outside), p))
    with pytest.raises(exception.PrivilegedInputRejected, match="links"):
        privileged.write_create(root, GPU, TYPE, UUID)
    assert outside.read_text() == "precious\n"


def test_the_privileged_writer_refuses_a_remove_file_with_another_link(tmp_path):
    host = SimulatedHost(build_spec(["nvidia-pf"], gpus=1))
    host.create_mdev(GPU, TYPE, UUID)
    root = str(tmp_path / "sys")
    materialise(host, root)
    outside = tmp_path / "outside-file"
    outside.write_text("precious\n")
    remove = os.path.join(root, "bus/mdev/devices", UUID, "remove")
    replace(os.path.realpath(remove), lambda p: os.link(str(outside), p))
    with pytest.raises(exception.PrivilegedInputRejected, match="links"):
        privileged.write_remove(root, UUID, 5.0)
    assert outside.read_text() == "precious\n"


def test_the_privileged_writer_never_hangs_on_a_fifo(tmp_path):
    root = make_tree(tmp_path)
    fifo = attribute_path(root, f"{TYPES_DIR}/{TYPE}/create")
    replace(fifo, os.mkfifo)
    with pytest.raises(exception.AccelAgentException):
        bounded(lambda: privileged.write_create(root, GPU, TYPE, UUID), [fifo])


# --- aliases: more class/mdev_bus entries than devices ------------------------------------

ALIAS = "0000:85:00.0"  # a name the kernel could give, leading to GPU's device


def _inventory(root: str, snap) -> list[tuple[str, int]]:
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    inventory = inventory_mod.compute_inventory(
        snap, policy_mod.build_policy(conf), "h", frozenset()
    )
    return [(p.name, p.total) for p in inventory.providers]


def _every_scan_after(root: str, change: Callable[[], None]) -> list:
    """The tree after ``change`` seen by a full scan, a first rescan and a
    steady-state rescan whose cache predates the change."""
    steady = Rescanner(root)
    steady.full()
    change()
    return [scan(root), Rescanner(root).rescan(), steady.rescan()]


def test_a_second_link_to_a_gpu_is_an_alias_not_a_second_parent(tmp_path):
    root = make_tree(tmp_path)
    honest = _inventory(root, scan(root))
    bus = os.path.join(root, "class/mdev_bus")

    def alias() -> None:
        os.symlink(os.readlink(os.path.join(bus, GPU)), os.path.join(bus, ALIAS))

    for snap in _every_scan_after(root, alias):
        assert list(snap.parents) == [GPU]
        assert snap.parents[GPU].device_path.endswith("/" + GPU)
        assert [w for w in snap.warnings if ALIAS in w] == [
            f"parent {GPU}: class/mdev_bus {ALIAS} lead to its device too; aliases skipped"
        ]
        assert _inventory(root, snap) == honest == [(f"h_pci_{GPU_SUFFIX}", 16)]


GPU_SUFFIX = "0000_84_00_0"


def test_a_chain_of_links_to_a_gpu_is_one_parent(tmp_path):
    """link -> link -> ... -> the kernel's link -> device: one GPU, not 31."""
    root = make_tree(tmp_path)
    honest = _inventory(root, scan(root))
    bus = os.path.join(root, "class/mdev_bus")
    chain = [f"0000:9{i // 10}:{i % 10:02d}.0" for i in range(30)]

    def links() -> None:
        previous = GPU
        for name in chain:
            os.symlink(previous, os.path.join(bus, name))  # relative: a sibling entry
            previous = name

    for snap in _every_scan_after(root, links):
        assert list(snap.parents) == [GPU]
        (warning,) = [w for w in snap.warnings if "alias" in w]
        assert warning.startswith(f"parent {GPU}: class/mdev_bus {', '.join(chain[:8])} and 22")
        assert _inventory(root, snap) == honest


def test_a_gpu_linked_only_under_another_name_is_named_after_its_device(tmp_path):
    """No class/mdev_bus/<its address>, one alias: the parent, its provider
    and its mdevs keep the name the kernel gives (the device directory's)."""
    host = SimulatedHost(build_spec(["nvidia-pf"], gpus=1))
    host.create_mdev(GPU, TYPE, UUID)
    root = str(tmp_path / "sys")
    materialise(host, root)
    honest = _inventory(root, scan(root))
    bus = os.path.join(root, "class/mdev_bus")

    def rename() -> None:
        target = os.readlink(os.path.join(bus, GPU))
        os.unlink(os.path.join(bus, GPU))
        os.symlink(target, os.path.join(bus, ALIAS))

    for snap in _every_scan_after(root, rename):
        assert list(snap.parents) == [GPU]
        assert snap.mdevs[UUID].parent == GPU and snap.mdevs_on(GPU) == [snap.mdevs[UUID]]
        assert any(f"no class/mdev_bus/{GPU}" in w and ALIAS in w for w in snap.warnings)
        assert _inventory(root, snap) == honest


def test_two_device_directories_of_one_name_are_one_parent(tmp_path):
    """A copy of the GPU's directory elsewhere, linked under another name:
    the directory the GPU's own link leads to is the parent."""
    root = make_tree(tmp_path)
    honest = _inventory(root, scan(root))
    bus = os.path.join(root, "class/mdev_bus")
    device = os.path.realpath(os.path.join(bus, GPU))
    copy = os.path.join(root, "devices", "elsewhere", GPU)

    def duplicate() -> None:
        shutil.copytree(device, copy, symlinks=True)
        os.symlink(f"../../devices/elsewhere/{GPU}", os.path.join(bus, ALIAS))

    for snap in _every_scan_after(root, duplicate):
        assert list(snap.parents) == [GPU]
        assert snap.parents[GPU].device_path == os.path.relpath(device, root)
        assert any(
            f"lead to devices/elsewhere/{GPU}" in w and "second device directory" in w
            for w in snap.warnings
        ), snap.warnings
        assert _inventory(root, snap) == honest


def test_a_link_through_another_link_is_resolved_again_by_every_rescan(tmp_path):
    """class/mdev_bus/0000:85:00.0 -> hop -> 85's device: its own text never
    changes, so only resolving it again shows hop re-pointed at GPU."""
    root = make_tree(tmp_path, "nvidia-pf", gpus=2)
    bus = os.path.join(root, "class/mdev_bus")
    other = "0000:85:00.0"
    os.rename(os.path.join(bus, other), os.path.join(bus, "hop"))
    os.symlink("hop", os.path.join(bus, other))
    rescanner = Rescanner(root)
    assert list(rescanner.full().parents) == [GPU, other]
    os.unlink(os.path.join(bus, "hop"))
    os.symlink(GPU, os.path.join(bus, "hop"))  # 0000:85:00.0 -> hop -> GPU's device
    snap = rescanner.rescan()
    assert list(snap.parents) == list(scan(root).parents) == [GPU]
    assert any(f"{other}, hop lead to its device too" in w for w in snap.warnings)


# --- a type without create -------------------------------------------------------------------


def test_a_type_without_create_is_no_capacity(tmp_path):
    root = make_tree(tmp_path)
    os.unlink(attribute_path(root, f"{TYPES_DIR}/{TYPE}/create"))
    for snap in (scan(root), Rescanner(root).rescan(), scan(root, workers=2)):
        offered = snap.parents[GPU].types[TYPE]
        assert offered.available_instances == 0
        assert offered.has_create is False
        assert f"parent {GPU}: type {TYPE} has no create file; its available_instances " \
            "(16) count as 0" in snap.warnings
        assert snap.parents[GPU].types["nvidia-36"].available_instances > 0  # the others count
        assert _inventory(root, snap) == []


def test_a_rescan_keeps_a_type_without_create_at_zero(tmp_path):
    """Steady-state rescans re-read counters, not create: the counter of a
    type without one is never taken again, whatever it says."""
    root = make_tree(tmp_path)
    os.unlink(attribute_path(root, f"{TYPES_DIR}/{TYPE}/create"))
    rescanner = Rescanner(root)
    rescanner.full()
    with open(attribute_path(root, f"{TYPES_DIR}/{TYPE}/available_instances"), "w") as f:
        f.write("7\n")
    for snap in (
        rescanner.rescan(lambda parent: {TYPE}),
        rescanner.rescan(reread_mdevs=True),
        rescanner.listing(),
    ):
        assert snap.parents[GPU].types[TYPE].available_instances == 0
        assert _inventory(root, snap) == []


def test_a_type_without_create_is_not_allocated(tmp_path):
    root = make_tree(tmp_path)
    os.unlink(attribute_path(root, f"{TYPES_DIR}/{TYPE}/create"))
    conf = make_conf(f"[devices]\nenabled_mdev_types = {TYPE}\n", sysfs_root=root)
    manager = manager_mod.DeviceManager(
        sysfs_root=root,
        policy=policy_mod.build_policy(conf),
        host="testhost",
        ledger=ledger_mod.Ledger(str(tmp_path / "state")),
        writer=writers.DirectWriter(root),
    )
    try:
        # Before: planned on the counter, then the create write failed.
        with pytest.raises(exception.InsufficientCapacity):
            manager.allocate("vm-1", 1)
        assert manager.ledger.all() == []
    finally:
        manager.ledger.close()
    assert not os.path.exists(attribute_path(root, f"{TYPES_DIR}/{TYPE}/create"))


def test_check_config_names_a_type_without_create(tmp_path):
    from accel_agent.config import check

    root = make_tree(tmp_path)
    os.unlink(attribute_path(root, f"{TYPES_DIR}/{TYPE}/create"))
    ini = tmp_path / "agent.conf"
    ini.write_text(
        f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\nhost = h\n"
        f"[devices]\nenabled_mdev_types = {TYPE}\n"
    )
    conf = make_conf(ini.read_text())
    errors, warnings, _state = check.check(conf)
    assert errors == []
    assert f"sysfs: parent {GPU}: type {TYPE} has no create file; its available_instances " \
        "(16) count as 0" in warnings
