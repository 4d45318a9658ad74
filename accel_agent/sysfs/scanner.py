"""Read the kernel's mdev sysfs ABI into a :class:`HostSnapshot`.

The layout (DESIGN.md §4, research/sysfs-mdevctl-kubevirt.md §1.1):

* ``class/mdev_bus/<parent>`` is a *link* to the parent's device directory;
* ``<device>/mdev_supported_types/<type>/`` holds ``device_api`` and
  ``available_instances`` (required) and ``name``/``description`` (optional);
* ``bus/mdev/devices/<uuid>`` is a *link* to ``<parent device>/<uuid>/``
  whose ``mdev_type`` link names the type.

A sysfs tree is live: files vanish between listdir and open, drivers print
garbage, links dangle while a parent unregisters.  One bad item is skipped
with a warning; the scan itself never fails except for a missing root.
Reads are plain unprivileged reads; nothing here writes.
"""

from __future__ import annotations

import logging
import marshal
import os
import re
from types import MappingProxyType

from accel_agent import exception
from accel_agent.sysfs import address, attributes
from accel_agent.sysfs.model import HostSnapshot, Mdev, MdevType, Parent

LOG = logging.getLogger(__name__)

MDEV_BUS = os.path.join("class", "mdev_bus")
MDEV_DEVICES = os.path.join("bus", "mdev", "devices")
SUPPORTED_TYPES = "mdev_supported_types"

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# NVIDIA: "num_heads=4, frl_config=60, framebuffer=2048M, max_instance=4";
# i915: "low_gm_size: 128MB\nhigh_gm_size: 512MB\n...".
_DESCRIPTION_ITEM_RE = re.compile(r"^\s*([A-Za-z0-9_ .-]+?)\s*(?:=|:)\s*(.*?)\s*$")


def is_canonical_uuid(text: str) -> bool:
    # fullmatch: "$" would also accept a trailing newline.
    return isinstance(text, str) and bool(_UUID_RE.fullmatch(text))


def parse_description(description: str | None) -> dict[str, str]:
    """Split a type description into key/value pairs; unparseable parts are
    ignored (the raw text is always kept alongside)."""
    fields: dict[str, str] = {}
    if not description:
        return fields
    for item in re.split(r"[,\n]", description):
        match = _DESCRIPTION_ITEM_RE.match(item)
        if match and match.group(1).strip():
            fields[match.group(1).strip()] = match.group(2)
    return fields


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

# The attribute reader lives in attributes.py; re-exported for rescan.py.
read_at = attributes.read_at


def open_dir(name: str, dir_fd: int | None = None, follow: bool = True) -> int | None:
    flags = _DIR_FLAGS if follow else _DIR_FLAGS | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None


def link_name_at(dir_fd: int | None, name: str) -> str | None:
    """basename of a link's target, the way mdevctl and KubeVirt name
    drivers, types and groups; None when the link is absent.  ``name`` is
    relative to ``dir_fd``, or a plain path when it is None."""
    try:
        return os.path.basename(os.readlink(name, dir_fd=dir_fd).rstrip("/")) or None
    except OSError:
        return None


# What a type directory holds that a scan reads, in this order.
_TYPE_ATTRIBUTES = ("device_api", "available_instances", "name", "description")


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def type_dirs(types_fd: int) -> tuple[list[str], list[str]]:
    """(type directories sorted, other entries) of an open
    ``mdev_supported_types``: what is no real directory (a link, a file)
    is no type."""
    names: list[str] = []
    others: list[str] = []
    try:
        with os.scandir(types_fd) as entries:
            for entry in entries:
                (names if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
    except OSError:
        return [], []
    return sorted(names), sorted(others)


class _Scan:
    """One pass over a tree; collects warnings instead of raising."""

    def __init__(self, root: str, log: bool = True) -> None:
        self.root = os.path.realpath(root)
        self.warnings: list[str] = []
        # A forked worker only collects: the parent logs what it reports.
        self.log = log

    def warn(self, message: str) -> None:
        if self.log:
            LOG.warning("sysfs scan: %s", message)
        self.warnings.append(message)

    def attribute(self, dir_fd: int, name: str, owner: str) -> str | None:
        """:func:`attributes.read_at`, warning about what is not an attribute."""
        try:
            return attributes.read_at(dir_fd, name)
        except attributes.NotAnAttribute as exc:
            self.warn(f"{owner}: {exc}")
            return None

    def inside_root(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def resolve(self, path: str) -> str | None:
        """realpath of ``path`` when it exists inside the root, else None."""
        real = os.path.realpath(path)
        if not self.inside_root(real) or not os.path.exists(real):
            return None
        return real

    @staticmethod
    def listdir(path: str | int) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    # -- parents and types ------------------------------------------------------------

    def parent_names(self) -> list[str]:
        return self.listdir(os.path.join(self.root, MDEV_BUS))

    def parents(self, names: list[str]) -> dict[str, Parent]:
        found: dict[str, Parent] = {}
        for name in names:
            parent = self.parent(name)
            if parent is not None:
                found[name] = parent
        return found

    def parent(self, name: str) -> Parent | None:
        if not address.is_canonical_parent_name(name):
            # "0000:84:00.0\n", " 0000:84:00.0" or "0000:84:00.A" would become a
            # second parent that policy and inventory normalise into the real
            # GPU's name; the kernel never spells a parent that way.
            self.warn(
                f"parent {name!r}: not a canonical PCI address or parent name; skipped"
            )
            return None
        link = os.path.join(self.root, MDEV_BUS, name)
        device_fd = open_dir(link)
        device = None
        if device_fd is not None:
            device = self.fd_path(device_fd) or self.resolve(link)
        if device is None or not self.inside_root(device):
            if device_fd is not None:
                os.close(device_fd)
            self.warn(f"parent {name}: class/mdev_bus link is dangling or leaves the root")
            return None
        try:
            return self._parent(name, device, device_fd)
        finally:
            os.close(device_fd)

    @staticmethod
    def fd_path(fd: int) -> str | None:
        """Where an open directory is, resolved by the kernel: one readlink
        instead of posixpath.realpath's lstat of every component."""
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: resolve it the long way
            return None
        # Unregistered since it was opened: the kernel says so in the path.
        return None if path.endswith(" (deleted)") else path

    def physfn(self, device_fd: int) -> str | None:
        """The PF of an SR-IOV VF: the name of an existing ``physfn`` link's
        target (only the name is used; nothing is read through it)."""
        name = link_name_at(device_fd, "physfn")
        if name is None or not address.is_pci_address(name):
            return None
        try:
            os.stat("physfn", dir_fd=device_fd)
        except OSError:
            return None
        return address.parse_pci_address(name)

    def _parent(self, name: str, device: str, device_fd: int) -> Parent:
        pci_address = address.parse_pci_address(name) if address.is_pci_address(name) else None
        physfn = self.physfn(device_fd)
        types: dict[str, MdevType] = {}
        # Not followed: mdev_supported_types is a directory in the kernel's
        # layout, and a link could lead the reads out of the root.
        types_fd = open_dir(SUPPORTED_TYPES, device_fd, follow=False)
        if types_fd is None and _exists_at(device_fd, SUPPORTED_TYPES):
            self.warn(f"parent {name}: {SUPPORTED_TYPES} is not a directory; no type read")
        if types_fd is not None:
            try:
                for entry in self.type_entries(name, types_fd):
                    mdev_type = self.mdev_type(name, entry, types_fd)
                    if mdev_type is not None:
                        types[entry] = mdev_type
            finally:
                os.close(types_fd)
        return Parent(
            name=name,
            device_path=os.path.relpath(device, self.root),
            pci_address=pci_address,
            physical_gpu=physfn or pci_address or name,
            physfn=physfn,
            numa_node=self.numa_node(name, device_fd),
            driver=link_name_at(device_fd, "driver"),
            vendor_id=self.attribute(device_fd, "vendor", f"parent {name}"),
            device_id=self.attribute(device_fd, "device", f"parent {name}"),
            types=MappingProxyType(types),
        )

    def type_entries(self, parent: str, types_fd: int) -> list[str]:
        """The type directories of a parent, sorted.  Type directories are
        never links in the kernel's layout: one that is, is skipped (the
        directory entry's type says so, no stat needed)."""
        names, others = type_dirs(types_fd)
        for other in others:
            self.warn(f"parent {parent}: type {other} is not a directory; skipped")
        return names

    def numa_node(self, parent: str, device_fd: int) -> int | None:
        raw = self.attribute(device_fd, "numa_node", f"parent {parent}")
        if raw is None:
            return None
        try:
            node = attributes.parse_int(raw, attributes.MAX_NUMA_NODE, minimum=-1)
        except ValueError as exc:
            self.warn(f"parent {parent}: numa_node {exc}; ignored")
            return None
        return node if node >= 0 else None

    def mdev_type(self, parent: str, type_id: str, types_fd: int) -> MdevType | None:
        # Opened relative to mdev_supported_types ("<type>/<attribute>"): no
        # directory open and close per type, a sixth of a scan's syscalls.
        prefix = type_id + "/"
        read = attributes.read_at
        try:
            device_api = read(types_fd, prefix + "device_api")
            raw_available = read(types_fd, prefix + "available_instances")
            name = read(types_fd, prefix + "name")
            description = read(types_fd, prefix + "description")
        except attributes.NotAnAttribute:
            # Rare, so the common path pays no per-attribute handler.
            owner = f"parent {parent}: type {type_id}"
            device_api, raw_available, name, description = (
                self.attribute(types_fd, prefix + a, owner) for a in _TYPE_ATTRIBUTES
            )
        if device_api is None or raw_available is None:
            missing = "device_api" if device_api is None else "available_instances"
            self.warn(f"parent {parent}: type {type_id} has no readable {missing}; skipped")
            return None
        available = self.available_instances(f"parent {parent}: type {type_id}", raw_available)
        if available is None:
            return None
        return MdevType(type_id, device_api.strip(), available, name, description)

    def available_instances(self, owner: str, raw: str) -> int | None:
        """The counter, or None (with a warning) when it is no number or
        beyond :data:`attributes.MAX_INSTANCES`: its type is then skipped."""
        try:
            return attributes.parse_int(raw, attributes.MAX_INSTANCES)
        except ValueError as exc:
            self.warn(f"{owner} available_instances {exc}; skipped")
            return None

    # -- mediated devices ---------------------------------------------------------

    def mdevs(self, parents: dict[str, Parent]) -> dict[str, Mdev]:
        bus_dir = os.path.join(self.root, MDEV_DEVICES)
        if os.path.isdir(bus_dir):
            candidates = [os.path.join(bus_dir, n) for n in self.listdir(bus_dir)]
        else:
            # Trees copied without bus/ (or very old layouts): each type's
            # devices/ directory links the same device directories.
            candidates = [
                os.path.join(self.root, parent.device_path, SUPPORTED_TYPES, type_id, "devices", n)
                for parent in parents.values()
                for type_id in parent.types
                for n in self.listdir(
                    os.path.join(self.root, parent.device_path, SUPPORTED_TYPES, type_id, "devices")
                )
            ]
        found: dict[str, Mdev] = {}
        for link in candidates:
            mdev = self.mdev(link)
            if mdev is not None:
                found[mdev.uuid] = mdev
        return found

    def mdev(self, link: str) -> Mdev | None:
        name = os.path.basename(link)
        if not is_canonical_uuid(name):
            self.warn(f"mdev {name!r}: not a lowercase UUID; skipped")
            return None
        if not os.path.islink(link):
            # The kernel lists mdevs as links to their device directories; a
            # file of that name is not one.
            self.warn(f"mdev {name}: not a link to a device directory; skipped")
            return None
        device = self.resolve(link)
        if device is None or not os.path.isdir(device):
            self.warn(f"mdev {name}: link is dangling, leaves the root or is no directory; skipped")
            return None
        mdev_type = None
        type_dir = self.resolve(os.path.join(device, "mdev_type"))
        if type_dir is not None:
            mdev_type = os.path.basename(type_dir)
        else:
            self.warn(f"mdev {name}: mdev_type link is missing or dangling")
        group_name = link_name_at(None, os.path.join(device, "iommu_group"))
        iommu_group = attributes.parse_int_or_none(group_name, attributes.MAX_IOMMU_GROUP)
        return Mdev(
            uuid=name,
            parent=os.path.basename(os.path.dirname(device)),
            mdev_type=mdev_type,
            iommu_group=iommu_group,
        )


# Below this many parents a forked worker costs more than it saves.
PARALLEL_MIN_PARENTS = 32


def _encode_parent(parent: Parent) -> tuple:
    types = tuple(
        (t.type_id, t.device_api, t.available_instances, t.name, t.description)
        for t in parent.types.values()
    )
    return (
        parent.name,
        parent.device_path,
        parent.pci_address,
        parent.physical_gpu,
        parent.physfn,
        parent.numa_node,
        parent.driver,
        parent.vendor_id,
        parent.device_id,
        types,
    )


def _decode_parent(data: tuple) -> Parent:
    *fields, types = data
    return Parent(*fields, types=MappingProxyType({t[0]: MdevType(*t) for t in types}))


def _fork_worker(walker: _Scan, names: list[str]) -> tuple[int, int]:
    """Scan ``names`` in a forked child that sends its parents and warnings
    back marshalled through a pipe: (pid, read end)."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # the child: no logging, no exit handlers, no stdio flush
        status = 1
        try:
            os.close(read_end)
            child = _Scan(walker.root, log=False)
            found = child.parents(names)
            data = marshal.dumps(([_encode_parent(p) for p in found.values()], child.warnings))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def _collect_worker(pid: int, read_end: int) -> tuple[list[Parent], list[str]] | None:
    """The worker's parents, or None when it failed.  Decoded before the
    worker is reaped: its address space takes milliseconds to tear down and a
    complete message already says it succeeded (a crash truncates it)."""
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    try:
        encoded, warnings = marshal.loads(data)
        result = [_decode_parent(p) for p in encoded], list(warnings)
    except (EOFError, ValueError, TypeError):
        result = None
    os.waitpid(pid, 0)
    return result


def _split(names: list[str], workers: int) -> list[list[str]]:
    """Contiguous chunks of equal size, the first for this process."""
    size = -(-len(names) // workers)
    return [names[i : i + size] for i in range(0, len(names), size)]


def _parents_in_parallel(walker: _Scan, names: list[str], workers: int) -> dict[str, Parent]:
    """Split the parents between this process and ``workers - 1`` forked
    children: a scan is thousands of tiny syscalls, so processes (not
    threads, which contend for the GIL after every one) use the other
    cores.  A worker that fails, or cannot be forked (RLIMIT_NPROC, memory),
    is redone here."""
    chunks = _split(names, workers)
    children = []
    here = list(chunks[0])
    for chunk in chunks[1:]:
        try:
            children.append((chunk, *_fork_worker(walker, chunk)))
        except OSError as exc:
            LOG.debug("cannot fork a sysfs scan worker (%s); scanning here", exc)
            here += chunk
    found = walker.parents(here)
    for chunk, pid, read_end in children:
        result = _collect_worker(pid, read_end)
        if result is None:
            LOG.debug("sysfs scan worker %d failed; scanning its %d parents here", pid, len(chunk))
            found.update(walker.parents(chunk))
            continue
        parents, warnings = result
        for warning in warnings:
            walker.warn(warning)
        found.update((p.name, p) for p in parents)
    return found


def scan(sysfs_root: str, workers: int = 1) -> HostSnapshot:
    """Scan ``sysfs_root`` (``/sys`` or any tree shaped like it).

    ``workers`` > 1 forks that many processes in all for a large host: only
    for single-threaded callers (accelctl), never in the daemon.
    """
    if not os.path.isdir(sysfs_root):
        raise exception.SysfsRootNotFound(root=sysfs_root)
    walker = _Scan(sysfs_root)
    names = walker.parent_names()
    if workers > 1 and len(names) >= PARALLEL_MIN_PARENTS:
        parents = _parents_in_parallel(walker, names, workers)
    else:
        parents = walker.parents(names)
    parents = dict(sorted(parents.items()))
    mdevs = walker.mdevs(parents)
    by_parent: dict[str, list[Mdev]] = {}
    for mdev in sorted(mdevs.values(), key=lambda m: m.uuid):
        by_parent.setdefault(mdev.parent, []).append(mdev)
    return HostSnapshot(
        root=walker.root,
        parents=MappingProxyType(parents),
        mdevs=MappingProxyType(mdevs),
        warnings=tuple(walker.warnings),
        by_parent=MappingProxyType({k: tuple(v) for k, v in by_parent.items()}),
    )
