"""Read the kernel's mdev sysfs ABI into a :class:`HostSnapshot`.

(Why one module of ~650 lines: one pass over one kernel ABI, with the
hostile-tree rules each read needs beside the read itself; the steady-state
re-reads are apart, in accel_agent.sysfs.rescan.)

The layout (docs/design.md §4.1):

* ``class/mdev_bus/<parent>`` is a *link* to the parent's device directory;
* ``<device>/mdev_supported_types/<type>/`` holds ``device_api`` and
  ``available_instances`` (required), ``name``/``description`` (optional) and
  the write-only ``create`` (a type without one offers nothing: its counter
  is taken as 0, with a warning);
* ``bus/mdev/devices/<uuid>`` is a *link* to ``<parent device>/<uuid>/``
  whose ``mdev_type`` link names the type.

A sysfs tree is live: files vanish between listdir and open, drivers print
garbage, links dangle while a parent unregisters.  One bad item is skipped
with a warning; the scan itself never fails except for a missing root.
Reads are plain unprivileged reads; nothing here writes.

A parent is its device directory, not its ``class/mdev_bus`` entry: the
kernel makes one entry per parent, named after the device directory (the PCI
address), but a tree can hold more links to one device (a second name, a
chain of links).  Each entry is resolved once (the open that reads the
parent resolves it anyway), every device directory is read once, and the
parent is named after the directory as the kernel names it; the other
entries are reported as aliases (:meth:`_Scan.settle`).  Settling happens
after every entry is resolved, in one process, so a scan split between
forked workers finds what a serial one finds.
"""

from __future__ import annotations

import logging
import marshal
import os
import re
from collections.abc import Mapping
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

# What one class/mdev_bus entry gave a walk: (entry, device directory it
# leads to or None, the parent read there or None, the warnings it raised).
Entry = tuple[str, "str | None", "Parent | None", tuple[str, ...]]

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


def no_create_warning(parent: str, type_id: str, available: int) -> str:
    # The privileged writer writes to nothing else, so a counter without a
    # create file is room no request can take: Placement must not offer it.
    return (
        f"parent {parent}: type {type_id} has no create file; its available_instances "
        f"({available}) count as 0"
    )


def _listed(entries: list[str], limit: int = 8) -> str:
    """``a, b, c`` of at most ``limit`` entries, then how many more: a tree
    may hold thousands of links, the warning stays one short line."""
    shown = ", ".join(entries[:limit])
    return shown if len(entries) <= limit else f"{shown} and {len(entries) - limit} more"


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
        # class/mdev_bus entry -> the device directory it leads to (relative
        # to the root), for every entry that resolved: aliases included.
        self.links: dict[str, str] = {}
        # device directory -> its parent (None: not one), read once per walk.
        self.devices: dict[str, Parent | None] = {}

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
        """realpath of ``path`` when it exists inside the root, else None
        (also when a link on the way vanished while it was being resolved:
        realpath's readlink of a link its lstat saw raises then)."""
        try:
            real = os.path.realpath(path)
        except OSError:
            return None
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

    def parents(self, names: list[str]) -> list[Entry]:
        """Resolve and read ``names`` (class/mdev_bus entries) into
        :attr:`links` and :attr:`devices`; what each entry found and warned,
        in order (what a forked worker sends back)."""
        entries: list[Entry] = []
        for name in names:
            mark = len(self.warnings)
            parent = self.parent(name)
            device = self.links.get(name)
            entries.append((name, device, parent, tuple(self.warnings[mark:])))
        return entries

    def parent(self, name: str) -> Parent | None:
        """The parent that class/mdev_bus/``name`` leads to, its device
        directory read only the first time an entry leads there."""
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
            # Resolved by the kernel, chains of links included: the realpath.
            device = self.fd_path(device_fd) or self.resolve(link)
        if device is None or not self.inside_root(device):
            if device_fd is not None:
                os.close(device_fd)
            self.warn(f"parent {name}: class/mdev_bus link is dangling or leaves the root")
            return None
        try:
            relative = os.path.relpath(device, self.root)
            self.links[name] = relative
            if relative in self.devices:
                return self.devices[relative]  # an alias: read once is enough
            parent = self.read_device(relative, device_fd)
            self.devices[relative] = parent
            return parent
        finally:
            os.close(device_fd)

    def read_device(self, relative: str, device_fd: int) -> Parent | None:
        """The parent in the open device directory ``relative``, named as
        the kernel names it: after the directory."""
        name = os.path.basename(relative)
        if not address.is_canonical_parent_name(name):
            self.warn(
                f"device {relative!r}: its directory name is not a canonical PCI address "
                "or parent name; skipped"
            )
            return None
        return self._parent(name, relative, device_fd)

    def reread(self, parent: Parent) -> Parent | None:
        """``parent`` read again in full from its device directory (None when
        it is gone or no longer a directory inside the root)."""
        path = os.path.join(self.root, parent.device_path)
        device_fd = open_dir(path, follow=False)
        if device_fd is None:
            return None
        try:
            device = self.fd_path(device_fd) or self.resolve(path)
            if device is None or not self.inside_root(device):
                return None
            return self.read_device(parent.device_path, device_fd)
        finally:
            os.close(device_fd)

    def settle(self) -> dict[str, Parent]:
        """One parent per device directory, by name, from what the entries
        resolved to: an entry named otherwise than its device (a second
        link, a link to a link) is an alias, reported once per parent.  Two
        device directories of one name (only a made-up tree has them): the
        one class/mdev_bus/<name> leads to is the parent, else the first by
        path; the other is skipped with a warning."""
        found: dict[str, Parent] = {}
        for entry, device in self.links.items():
            parent = self.devices[device]
            if parent is None or parent.name != entry:
                break
            found[entry] = parent
        else:
            # The kernel's layout: each entry is its device's own link (so
            # one per device).  Nothing to settle; every rescan gets here.
            return dict(sorted(found.items()))
        named: dict[str, list[str]] = {}
        for device, parent in self.devices.items():
            if parent is not None:
                named.setdefault(parent.name, []).append(device)
        entries: dict[str, list[str]] = {}
        for entry, device in self.links.items():
            entries.setdefault(device, []).append(entry)
        found = {}
        for name in sorted(named):
            devices = named[name]
            kept = devices[0]
            if len(devices) > 1:
                own = self.links.get(name)
                kept = own if own in devices else min(devices)
                for other in sorted(set(devices) - {kept}):
                    self.warn(
                        f"parent {name}: class/mdev_bus {_listed(entries[other])} lead to "
                        f"{other}, not {kept}, a second device directory of that name; skipped"
                    )
            aliases = sorted(e for e in entries[kept] if e != name)
            if aliases and name in entries[kept]:
                self.warn(
                    f"parent {name}: class/mdev_bus {_listed(aliases)} lead to its device "
                    "too; aliases skipped"
                )
            elif aliases:
                self.warn(
                    f"parent {name}: no class/mdev_bus/{name}; named after its device "
                    f"{kept}, which class/mdev_bus {_listed(aliases)} lead to (aliases)"
                )
            parent = self.devices[kept]
            assert parent is not None
            found[name] = parent
        return found

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

    def _parent(self, name: str, device_path: str, device_fd: int) -> Parent:
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
            device_path=device_path,
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
        try:
            available = attributes.parse_int(raw_available, attributes.MAX_INSTANCES)
        except ValueError as exc:
            # Its message built only here: a scan reads thousands of counters.
            self.warn(f"parent {parent}: type {type_id} available_instances {exc}; skipped")
            return None
        # Whether a create entry is there (not followed if a link): one
        # faccessat, the one syscall per type the rule costs a full read (a
        # stat costs about three times as much in Python).  What the entry is
        # does not matter: the privileged writer refuses anything but a
        # regular file with one link.  Rescans keep the answer (rescan.py).
        has_create = os.access(prefix + "create", os.F_OK, dir_fd=types_fd, follow_symlinks=False)
        if not has_create:
            self.warn(no_create_warning(parent, type_id, available))
            available = 0
        return MdevType(type_id, device_api.strip(), available, name, description, None, has_create)

    def available_instances(self, owner: str, raw: str) -> int | None:
        """The counter, or None (with a warning) when it is no number or
        beyond :data:`attributes.MAX_INSTANCES`: its type is then skipped."""
        try:
            return attributes.parse_int(raw, attributes.MAX_INSTANCES)
        except ValueError as exc:
            self.warn(f"{owner} available_instances {exc}; skipped")
            return None

    # -- mediated devices ---------------------------------------------------------

    def mdevs(self, parents: Mapping[str, Parent]) -> dict[str, Mdev]:
        bus_dir = os.path.join(self.root, MDEV_DEVICES)
        if not os.path.isdir(bus_dir):
            # Trees copied without bus/: each mdev is a child directory of
            # its parent's device (see child_mdevs).
            found = {
                uuid: self.mdev_at(uuid, os.path.join(self.root, path, uuid))
                for path in {parent.device_path for parent in parents.values()}
                for uuid in self.child_mdevs(path)
            }
            return {uuid: mdev for uuid, mdev in sorted(found.items()) if mdev is not None}
        found: dict[str, Mdev] = {}
        for name in self.listdir(bus_dir):
            mdev = self.mdev(os.path.join(bus_dir, name))
            if mdev is not None:
                found[mdev.uuid] = mdev
        return found

    @staticmethod
    def vanished(path: str) -> bool:
        """Whether nothing is at ``path`` any more: an mdev removed (or a
        parent unregistered) while this scan read it, a normal event that
        the scan skips without a word (the next one does not list it)."""
        if os.path.lexists(path):
            return False
        LOG.debug("sysfs scan: %s vanished while it was read; skipped", path)
        return True

    def child_mdevs(self, device_path: str) -> list[str]:
        """The UUIDs of the mdevs under a parent's device directory
        (``device_path``, relative to the root), sorted.

        The kernel registers an mdev as a child device of its parent
        (drivers/vfio/mdev/mdev_core.c, ``mdev_device_create``: ``dev.parent``
        is the parent's device), so its directory sits in the parent's, and
        each type's ``devices/`` only links there.  One listing per parent
        finds them all where ``bus/mdev/devices`` is missing: a tree copied
        without ``bus/``; the per-type listings cost a directory per type (24
        times as many on a 24-type GPU).  A child counts when it is a real
        directory named as a canonical UUID holding an ``mdev_type`` entry,
        which no other child device of a GPU has."""
        found = []
        directory = os.path.join(self.root, device_path)
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if (
                        is_canonical_uuid(entry.name)
                        and entry.is_dir(follow_symlinks=False)
                        and os.path.lexists(os.path.join(entry.path, "mdev_type"))
                    ):
                        found.append(entry.name)
        except OSError:
            return []
        return sorted(found)

    def mdev(self, link: str) -> Mdev | None:
        name = os.path.basename(link)
        if not is_canonical_uuid(name):
            self.warn(f"mdev {name!r}: not a lowercase UUID; skipped")
            return None
        if not os.path.islink(link):
            if self.vanished(link):
                return None
            # The kernel lists mdevs as links to their device directories; a
            # file of that name is not one.
            self.warn(f"mdev {name}: not a link to a device directory; skipped")
            return None
        device = self.resolve(link)
        if device is None or not os.path.isdir(device):
            if self.vanished(link):
                return None
            self.warn(f"mdev {name}: link is dangling, leaves the root or is no directory; skipped")
            return None
        return self.mdev_at(name, device)

    def mdev_at(self, name: str, device: str) -> Mdev | None:
        """The mdev ``name`` whose device directory is ``device`` (a real
        path inside the root): its parent is the directory holding it; None
        when it vanished while it was read."""
        mdev_type = None
        type_dir = self.resolve(os.path.join(device, "mdev_type"))
        if type_dir is not None:
            mdev_type = os.path.basename(type_dir)
        elif self.vanished(device):
            return None
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
        (
            t.type_id,
            t.device_api,
            t.available_instances,
            t.name,
            t.description,
            t.per_gpu_limit,
            t.has_create,
        )
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


def _encode_entry(entry: Entry) -> tuple:
    name, device, parent, warnings = entry
    return (name, device, None if parent is None else _encode_parent(parent), warnings)


def _decode_entry(data: tuple) -> Entry:
    name, device, parent, warnings = data
    return (name, device, None if parent is None else _decode_parent(parent), tuple(warnings))


def _fork_worker(walker: _Scan, names: list[str]) -> tuple[int, int]:
    """Scan ``names`` in a forked child that sends its entries (parents and
    warnings) back marshalled through a pipe: (pid, read end)."""
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
            data = marshal.dumps([_encode_entry(e) for e in child.parents(names)])
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def _collect_worker(pid: int, read_end: int) -> list[Entry] | None:
    """The worker's entries, or None when it failed.  Decoded before the
    worker is reaped: its address space takes milliseconds to tear down and a
    complete message already says it succeeded (a crash truncates it)."""
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    try:
        result: list[Entry] | None = [_decode_entry(e) for e in marshal.loads(data)]
    except (EOFError, ValueError, TypeError):
        result = None
    os.waitpid(pid, 0)
    return result


def _adopt(walker: _Scan, entries: list[Entry]) -> None:
    """A worker's entries into ``walker`` as if it had walked them itself:
    a device it read already (an alias met earlier, in another chunk) keeps
    the first reading, and the second reading's warnings are dropped, as a
    serial walk never makes them."""
    for name, device, parent, warnings in entries:
        if device is not None:
            walker.links[name] = device
            if device in walker.devices:
                continue
            walker.devices[device] = parent
        for warning in warnings:
            walker.warn(warning)


def _split(names: list[str], workers: int) -> list[list[str]]:
    """Contiguous chunks of equal size, the first for this process."""
    size = -(-len(names) // workers)
    return [names[i : i + size] for i in range(0, len(names), size)]


def _parents_in_parallel(walker: _Scan, names: list[str], workers: int) -> None:
    """Split the parents between this process and ``workers - 1`` forked
    children: a scan is thousands of tiny syscalls, so processes (not
    threads, which contend for the GIL after every one) use the other
    cores.  A worker that fails, or cannot be forked (RLIMIT_NPROC, memory),
    is redone here.  Fills ``walker`` as a serial walk of ``names`` would."""
    chunks = _split(names, workers)
    children = []
    here = list(chunks[0])
    for chunk in chunks[1:]:
        try:
            children.append((chunk, *_fork_worker(walker, chunk)))
        except OSError as exc:
            LOG.debug("cannot fork a sysfs scan worker (%s); scanning here", exc)
            here += chunk
    walker.parents(here)
    for chunk, pid, read_end in children:
        entries = _collect_worker(pid, read_end)
        if entries is None:
            LOG.debug("sysfs scan worker %d failed; scanning its %d parents here", pid, len(chunk))
            walker.parents(chunk)
            continue
        _adopt(walker, entries)


def read_mdev(sysfs_root: str, uuid: str) -> Mdev | None:
    """One mdev as the scan would see it (its parent and type), or None:
    for a create that met EEXIST (is the mdev there the one asked for?)."""
    return _Scan(sysfs_root, log=False).mdev(os.path.join(sysfs_root, MDEV_DEVICES, uuid))


def scan(sysfs_root: str, workers: int = 1) -> HostSnapshot:
    """Scan ``sysfs_root`` (``/sys`` or any tree shaped like it).

    ``workers`` > 1 forks that many processes in all for a large host: only
    for single-threaded callers (accelctl), never in the daemon.
    """
    return scan_with_links(sysfs_root, workers)[0]


def scan_with_links(sysfs_root: str, workers: int = 1) -> tuple[HostSnapshot, dict[str, str]]:
    """:func:`scan`, and where each class/mdev_bus entry led (entry ->
    device directory relative to the root), for the rescanner's cache."""
    if not os.path.isdir(sysfs_root):
        raise exception.SysfsRootNotFound(root=sysfs_root)
    walker = _Scan(sysfs_root)
    names = walker.parent_names()
    if workers > 1 and len(names) >= PARALLEL_MIN_PARENTS:
        _parents_in_parallel(walker, names, workers)
    else:
        walker.parents(names)
    parents = walker.settle()
    mdevs = walker.mdevs(parents)
    by_parent: dict[str, list[Mdev]] = {}
    for mdev in sorted(mdevs.values(), key=lambda m: m.uuid):
        by_parent.setdefault(mdev.parent, []).append(mdev)
    snapshot = HostSnapshot(
        root=walker.root,
        parents=MappingProxyType(parents),
        mdevs=MappingProxyType(mdevs),
        warnings=tuple(walker.warnings),
        by_parent=MappingProxyType({k: tuple(v) for k, v in by_parent.items()}),
    )
    return snapshot, walker.links
