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
import os
import re
from types import MappingProxyType

from accel_agent import exception
from accel_agent.sysfs import address
from accel_agent.sysfs.model import HostSnapshot, Mdev, MdevType, Parent

LOG = logging.getLogger(__name__)

MDEV_BUS = os.path.join("class", "mdev_bus")
MDEV_DEVICES = os.path.join("bus", "mdev", "devices")
SUPPORTED_TYPES = "mdev_supported_types"

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# NVIDIA: "num_heads=4, frl_config=60, framebuffer=2048M, max_instance=4";
# i915: "low_gm_size: 128MB\nhigh_gm_size: 512MB\n...".
_DESCRIPTION_ITEM_RE = re.compile(r"^\s*([A-Za-z0-9_ .-]+?)\s*(?:=|:)\s*(.*?)\s*$")


def is_canonical_uuid(text: str) -> bool:
    return bool(_UUID_RE.match(text))


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
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8").rstrip("\n")
    except UnicodeDecodeError:
        return data.decode("latin-1").rstrip("\n")


def read_at(dir_fd: int, name: str) -> str | None:
    """One sysfs attribute, opened relative to an open directory: no path walk
    per file, which is most of a scan's cost on a tree of thousands of types."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return _decode(os.read(fd, 65536))
    except OSError:
        return None
    finally:
        os.close(fd)


def open_dir(name: str, dir_fd: int | None = None, follow: bool = True) -> int | None:
    flags = _DIR_FLAGS if follow else _DIR_FLAGS | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None


def link_name_at(dir_fd: int, name: str) -> str | None:
    """basename of a link's target, the way mdevctl and KubeVirt name
    drivers, types and groups; None when the link is absent."""
    try:
        return os.path.basename(os.readlink(name, dir_fd=dir_fd).rstrip("/")) or None
    except OSError:
        return None


class _Scan:
    """One pass over a tree; collects warnings instead of raising."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        LOG.warning("sysfs scan: %s", message)
        self.warnings.append(message)

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

    def parents(self) -> dict[str, Parent]:
        found: dict[str, Parent] = {}
        for name in self.listdir(os.path.join(self.root, MDEV_BUS)):
            parent = self.parent(name)
            if parent is not None:
                found[name] = parent
        return found

    def parent(self, name: str) -> Parent | None:
        device = self.resolve(os.path.join(self.root, MDEV_BUS, name))
        device_fd = open_dir(device) if device is not None else None
        if device is None or device_fd is None:
            self.warn(f"parent {name}: class/mdev_bus link is dangling or leaves the root")
            return None
        try:
            return self._parent(name, device, device_fd)
        finally:
            os.close(device_fd)

    def _parent(self, name: str, device: str, device_fd: int) -> Parent:
        pci_address = (
            address.parse_pci_address(name) if address.is_pci_address(name) else None
        )
        physfn = None
        physfn_dir = self.resolve(os.path.join(device, "physfn"))
        if physfn_dir is not None:
            physfn_name = os.path.basename(physfn_dir)
            if address.is_pci_address(physfn_name):
                physfn = address.parse_pci_address(physfn_name)
        types: dict[str, MdevType] = {}
        types_fd = open_dir(SUPPORTED_TYPES, device_fd)
        if types_fd is not None:
            try:
                for type_id in self.listdir(types_fd):
                    mdev_type = self.mdev_type(name, type_id, types_fd)
                    if mdev_type is not None:
                        types[type_id] = mdev_type
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
            vendor_id=read_at(device_fd, "vendor"),
            device_id=read_at(device_fd, "device"),
            types=MappingProxyType(types),
        )

    def numa_node(self, parent: str, device_fd: int) -> int | None:
        raw = read_at(device_fd, "numa_node")
        if raw is None:
            return None
        try:
            node = int(raw.strip())
        except ValueError:
            self.warn(f"parent {parent}: numa_node {raw!r} is not a number")
            return None
        return node if node >= 0 else None

    def mdev_type(self, parent: str, type_id: str, types_fd: int) -> MdevType | None:
        # Type directories are never links in the kernel's layout: do not follow one.
        type_fd = open_dir(type_id, types_fd, follow=False)
        if type_fd is None:
            self.warn(f"parent {parent}: type {type_id} is not a directory")
            return None
        try:
            device_api = read_at(type_fd, "device_api")
            raw_available = read_at(type_fd, "available_instances")
            if device_api is None or raw_available is None:
                missing = "device_api" if device_api is None else "available_instances"
                self.warn(f"parent {parent}: type {type_id} has no readable {missing}; skipped")
                return None
            try:
                available = int(raw_available.strip())
            except ValueError:
                self.warn(
                    f"parent {parent}: type {type_id} available_instances {raw_available!r} "
                    "is not a number; skipped"
                )
                return None
            if available < 0:
                self.warn(f"parent {parent}: type {type_id} available_instances {available} < 0")
                return None
            return MdevType(
                type_id=type_id,
                device_api=device_api.strip(),
                available_instances=available,
                name=read_at(type_fd, "name"),
                description=read_at(type_fd, "description"),
            )
        finally:
            os.close(type_fd)

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
        device = self.resolve(link)
        if device is None:
            self.warn(f"mdev {name}: link is dangling or leaves the root; skipped")
            return None
        mdev_type = None
        type_dir = self.resolve(os.path.join(device, "mdev_type"))
        if type_dir is not None:
            mdev_type = os.path.basename(type_dir)
        else:
            self.warn(f"mdev {name}: mdev_type link is missing or dangling")
        group_name = self.link_name(os.path.join(device, "iommu_group"))
        iommu_group = int(group_name) if group_name and group_name.isdigit() else None
        return Mdev(
            uuid=name,
            parent=os.path.basename(os.path.dirname(device)),
            mdev_type=mdev_type,
            iommu_group=iommu_group,
        )

    @staticmethod
    def link_name(path: str) -> str | None:
        try:
            return os.path.basename(os.readlink(path).rstrip("/")) or None
        except OSError:
            return None


def scan(sysfs_root: str) -> HostSnapshot:
    """Scan ``sysfs_root`` (``/sys`` or any tree shaped like it)."""
    if not os.path.isdir(sysfs_root):
        raise exception.SysfsRootNotFound(root=sysfs_root)
    walker = _Scan(sysfs_root)
    parents = walker.parents()
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
