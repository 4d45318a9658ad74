"""NVIDIA vGPU 17+ (vendor-specific VFIO), read side: typed SR-IOV VFs.

Since vGPU 17 (Ada, Hopper, Blackwell) the ``nvidia`` driver registers no mdev
parent.  A vGPU is an SR-IOV VF of the GPU that stays bound to ``nvidia`` and
is typed through files under ``/sys/bus/pci/devices/<VF>/nvidia/``
(docs/design.md §10.3):

* ``creatable_vgpu_types``: what can be created on this VF *now*, one
  ``<id> : <name>`` line per type, after an optional header line
  (``ID    : vGPU Name``); a typed VF, or a full card, lists nothing;
* ``current_vgpu_type``: the decimal type id, ``0`` when untyped;
* ``placement_id``: a typed VF's vGPU placement (read only for a typed VF:
  it fails with ENXIO, or is absent, while the VF is untyped);
* ``gpu_instance_id``: a typed VF's GPU instance, for a MIG-backed vGPU
  (``0`` for a time-sliced one; read only for a typed VF, like ``placement_id``).

The snapshot models this like the SR-IOV mdev parents of older drivers: each
VF is a parent (``backend="nvidia_vfio"``) offering the card's types, one
instance of a type while the VF is free and lists it, and a typed VF is a
device of its type on that parent.  A device has no name of its own in sysfs,
so it is known by a UUID derived from its VF's address (:func:`device_uuid`):
the same VF always gives the same UUID, which is what lets recovery re-type
the same VF for the same owner after a host reboot.

Capacity is per physical GPU (the VFs' PF), never the sum of the VFs: a VF
lists a type while *one more* fits on the card, so twelve free VFs listing
``L40S-24Q`` do not make room for twelve.  How many fit is no file of its
own; NVIDIA names time-sliced types ``<card>-<framebuffer GB><series>`` (and
MIG-backed ones ``<card>-<slices>-<GB><series>``), and the card's largest type
is the whole framebuffer, so ``per_gpu_limit = card GB // type GB`` (at most the
VFs the card has).  That needs the card's whole type table, which its VFs list
only while the card holds no vGPU (after a boot, typically): a card seen so is
*known*, and a :class:`VfioScanner` that may write state keeps the tables in
``<state_dir>/nvidia-vfio-types.json`` for the next process (a table that
misses a type the card lists now is stale and dropped).  A card never seen
empty gets the bound the live lists prove: the vGPUs it holds, plus one while
a free VF lists the type.  ``[mdev_<type>] max_instances`` caps it anyway.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from accel_agent.sysfs import address, attributes
from accel_agent.sysfs.model import Mdev, MdevType, Parent

LOG = logging.getLogger(__name__)

BACKEND = "nvidia_vfio"
TABLES_FILE = "nvidia-vfio-types.json"
TYPE_PREFIX = "nvidia-"
PCI_DEVICES = os.path.join("bus", "pci", "devices")
NVIDIA_DIR = "nvidia"
CREATABLE = "creatable_vgpu_types"
CURRENT = "current_vgpu_type"
PLACEMENT = "placement_id"
GPU_INSTANCE = "gpu_instance_id"
# NVML's GPU instance ids are small (a GPU holds at most 7 instances).
MAX_GPU_INSTANCE_ID = 4096
# A placement id is an offset in the GPU's placement units (a few dozen).
MAX_PLACEMENT_ID = 1 << 16
# NVIDIA's type ids are small integers (4-5 digits today).
MAX_TYPE_ID = 999_999
# Not a PCI bus limit: the most VFs any NVIDIA GPU offers is 64 (H100: 32).
MAX_VFS = 256
# A fixed namespace: device UUIDs must be the same in every process and release.
_DEVICE_NAMESPACE = "4d0a7f3e-7a52-5b1f-9a43-5f1c2d6e8a17"
_LINE = re.compile(r"\s*([0-9]+)\s*(?::\s*|\s+)(\S.*?)\s*")
_SIZE = re.compile(r"-([0-9]+)[A-Za-z]+\s*$")


def device_uuid(vf: str) -> str:
    """The UUID of the vGPU on VF ``vf`` (canonical PCI address)."""
    # Imported here: uuid brings platform (~4 ms) into every listing.
    import uuid

    return str(uuid.uuid5(uuid.UUID(_DEVICE_NAMESPACE), f"{BACKEND}:{vf}"))


def type_name(type_id: int) -> str:
    """``1414`` -> ``nvidia-1414``: the name config and listings use, like the
    type directories of the mdev drivers."""
    return f"{TYPE_PREFIX}{type_id}"


def type_id_of(name: str) -> int | None:
    """``nvidia-1414`` -> 1414; None for anything else."""
    if not name.startswith(TYPE_PREFIX):
        return None
    digits = name[len(TYPE_PREFIX) :]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 6 or digits[0] == "0":
        return None
    return int(digits)


def parse_creatable(text: str) -> dict[int, str]:
    """``creatable_vgpu_types`` as ``{id: name}``.

    Lenient about spacing (``1414 : NVIDIA H200X-1-18C``, ``1414  NVIDIA ...``),
    skips the header and anything that is not an id line; an id out of range
    is not an id."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line)
        if match is None:
            continue
        type_id = attributes.parse_int_or_none(match.group(1), MAX_TYPE_ID, 1)
        if type_id is not None:
            found[type_id] = match.group(2)
    return found


_CREATABLE_SEEN: dict[str, dict[int, str]] = {}


def _parse_creatable_memo(text: str) -> dict[int, str]:
    """:func:`parse_creatable`, once per distinct text: the VFs of a card
    list the same lines (a scan reads hundreds of them); kept small, the
    texts a host shows are few.  Callers never change the result."""
    found = _CREATABLE_SEEN.get(text)
    if found is None:
        if len(_CREATABLE_SEEN) >= 256:
            _CREATABLE_SEEN.clear()
        found = _CREATABLE_SEEN[text] = parse_creatable(text)
    return found


def framebuffer_gb(name: str) -> int | None:
    """The framebuffer of a type from its name: ``NVIDIA L40S-4Q`` -> 4,
    ``NVIDIA H200X-1-18C`` -> 18; None when the name does not say."""
    match = _SIZE.search(name)
    if match is None:
        return None
    return attributes.parse_int_or_none(match.group(1), 100_000, 1)


def per_gpu_limits(types: Mapping[int, str], vfs: int) -> dict[int, int | None]:
    """How many of each type one card holds: the largest type's framebuffer
    is the card's (module docstring), at most one per VF."""
    sizes = {type_id: framebuffer_gb(name) for type_id, name in types.items()}
    known = [s for s in sizes.values() if s is not None]
    card = max(known) if known else None
    return {
        type_id: (min(card // size, vfs) if card is not None and size is not None else None)
        for type_id, size in sizes.items()
    }


@dataclass(frozen=True)
class _VfStatic:
    """What a VF's bus link, unchanged, vouches for."""

    pf: str
    device_path: str
    numa_node: int | None
    vendor_id: str | None
    device_id: str | None


@dataclass
class _Vf:
    address: str
    pf: str
    device_path: str
    current: int
    creatable: dict[int, str]
    iommu_group: int | None
    placement_id: int | None
    numa_node: int | None
    vendor_id: str | None
    device_id: str | None
    gpu_instance_id: int | None = None

    @property
    def static(self) -> _VfStatic:
        return _VfStatic(self.pf, self.device_path, self.numa_node, self.vendor_id,
                         self.device_id)


@dataclass(frozen=True)
class Discovery:
    """What one scan found: VF parents, typed VFs, and what to tell an operator."""

    parents: Mapping[str, Parent] = field(default_factory=lambda: MappingProxyType({}))
    devices: Mapping[str, Mdev] = field(default_factory=lambda: MappingProxyType({}))
    warnings: tuple[str, ...] = ()
    # Host preparation the agent does not own but explains (check-config).
    notes: tuple[str, ...] = ()


class VfioScanner:
    """Scans ``<root>/bus/pci/devices`` for NVIDIA vendor-VFIO VFs, with the
    type tables of the cards it knows (module docstring): read from
    ``state_dir`` when given, written there too when ``persist``."""

    def __init__(
        self, sysfs_root: str, state_dir: str | None = None, persist: bool = False
    ) -> None:
        self.sysfs_root = sysfs_root
        self._path = os.path.join(state_dir, TABLES_FILE) if state_dir else None
        self._persist = persist and self._path is not None
        self._tables: dict[str, dict[int, str]] = self._load()
        # PCI functions that are neither a VF nor an SR-IOV PF -> their bus
        # link when the last scan saw them (skipped while it is the same).
        self._unrelated: dict[str, str] = {}
        # VF -> (its bus link, what the last scan read of it that never
        # changes while the link is the same: PF, device path, NUMA node,
        # vendor and device ids).  A rescan reads only the rest: its driver,
        # IOMMU group (a VF enabled again may get another) and vGPU files.
        self._static: dict[str, tuple[str, _VfStatic]] = {}

    def _load(self) -> dict[str, dict[int, str]]:
        if self._path is None:
            return {}
        try:
            with open(self._path, encoding="utf-8") as handle:
                data = json.load(handle)
            return {
                str(pf): {int(k): str(v) for k, v in table.items()}
                for pf, table in data.items()
                if address.is_pci_address(str(pf))
            }
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # none yet, or unreadable: cards are learnt again

    def _save(self) -> None:
        if not self._persist or self._path is None:
            return
        data = {pf: {str(k): v for k, v in sorted(t.items())} for pf, t in self._tables.items()}
        try:
            import tempfile  # only the daemon persists: not in every listing's imports

            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self._path), prefix=".vfio-types-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, sort_keys=True)
            os.replace(tmp, self._path)
        except OSError as exc:
            failure: OSError | None = exc
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
        else:
            failure = None
        if failure is not None:  # outside the except clause: oslo.log would repeat it
            LOG.warning("cannot keep the vGPU type tables in %s: %s", self._path, failure)

    def scan(self) -> Discovery:
        root = os.path.realpath(self.sysfs_root)
        warnings: list[str] = []
        notes: list[str] = []
        vfs: list[_Vf] = []
        devices_dir = os.path.join(root, PCI_DEVICES)
        try:
            bus_fd = os.open(devices_dir, _DIR_FLAGS)
        except OSError:
            return Discovery()
        try:
            names = sorted(os.listdir(bus_fd))
        except OSError:
            os.close(bus_fd)
            return Discovery()
        # Every PCI function of the host is looked at on every rescan, so the
        # walk is cheap: a function that is neither a VF nor an SR-IOV PF is
        # skipped after one readlink while its bus link is the same (neither
        # property changes in a device's life); the others are opened through
        # their link (the kernel resolves it: no realpath, an lstat per path
        # component) and asked their driver.
        unrelated: dict[str, str] = {}
        static: dict[str, tuple[str, _VfStatic]] = {}
        try:
            for name in names:
                if not address.is_canonical_parent_name(name) or not address.is_pci_address(name):
                    continue
                try:
                    link = os.readlink(name, dir_fd=bus_fd)
                except OSError:
                    continue
                if self._unrelated.get(name) == link:
                    unrelated[name] = link
                    continue
                try:
                    device_fd = os.open(name, _DIR_FLAGS, dir_fd=bus_fd)
                except OSError:
                    continue
                known = self._static.get(name)
                if known is not None and known[0] == link:
                    try:
                        if _link_name_at(device_fd, "driver") == "nvidia":
                            vf = _read_vgpu(name, known[1], device_fd, warnings.append)
                            if vf is not None:
                                vfs.append(vf)
                                static[name] = known
                    finally:
                        os.close(device_fd)
                    continue
                try:
                    physfn = _link_name_at(device_fd, "physfn")
                    if physfn is not None and not address.is_pci_address(physfn):
                        physfn = None
                    if physfn is None and not _sriov_total(device_fd):
                        unrelated[name] = link
                        continue
                    if _link_name_at(device_fd, "driver") != "nvidia":
                        continue
                    device = _device_path(root, device_fd, os.path.join(devices_dir, name))
                    if device is None:
                        continue
                    if physfn is not None:
                        vf = self._read_vf(root, name, device, device_fd, physfn, warnings.append)
                        if vf is not None:
                            vfs.append(vf)
                            static[name] = (link, vf.static)
                    elif _no_vfs_enabled(device_fd):
                        notes.append(
                            f"GPU {name} (nvidia) has SR-IOV but no VFs enabled: its vGPUs "
                            f"(vGPU 17 and later) live on VFs; enable them with NVIDIA's "
                            f"sriov-manage (/usr/lib/nvidia/sriov-manage -e {name})"
                        )
                finally:
                    os.close(device_fd)
        finally:
            os.close(bus_fd)
        self._unrelated = unrelated
        self._static = static
        return self._build(vfs, warnings, notes)

    @staticmethod
    def _read_vf(
        root: str,
        name: str,
        device: str,
        device_fd: int,
        physfn: str,
        warn: Callable[[str], None],
    ) -> _Vf | None:
        numa = attributes.parse_int_or_none(
            _attribute(device_fd, "numa_node", f"VF {name}", warn), attributes.MAX_NUMA_NODE
        )
        static = _VfStatic(
            pf=address.parse_pci_address(physfn),
            device_path=os.path.relpath(device, root),
            numa_node=numa,
            vendor_id=_attribute(device_fd, "vendor", f"VF {name}", warn),
            device_id=_attribute(device_fd, "device", f"VF {name}", warn),
        )
        return _read_vgpu(name, static, device_fd, warn)

    def _build(self, vfs: list[_Vf], warnings: list[str], notes: list[str]) -> Discovery:
        by_card: dict[str, list[_Vf]] = {}
        for vf in vfs:
            by_card.setdefault(vf.pf, []).append(vf)
        parents: dict[str, Parent] = {}
        devices: dict[str, Mdev] = {}
        learnt = False
        for pf, members in sorted(by_card.items()):
            listed: dict[int, str] = {}
            for vf in members:
                listed.update(vf.creatable)
            typed = [vf.current for vf in members if vf.current]
            table = self._tables.get(pf)
            if not typed and listed and listed != table:
                # An empty card lists every type it has: its whole table.
                self._tables[pf] = table = dict(listed)
                learnt = True
            elif table is not None and not (set(listed) | set(typed)) <= table.keys():
                # The card lists a type the table lacks (a new driver): stale.
                del self._tables[pf]
                table, learnt = None, True
            known = dict(table or listed)
            for type_id in sorted(set(typed) - known.keys()):
                # Typed by someone before we saw it listed: no name to show.
                known[type_id] = type_name(type_id)
            if table is not None:
                limits = per_gpu_limits(known, len(members))
            else:
                # Unknown card size: what the live lists prove (module docstring).
                limits = {
                    type_id: typed.count(type_id)
                    + (1 if any(not vf.current and type_id in vf.creatable for vf in members)
                       else 0)
                    for type_id in known
                }
            # The VFs of a card differ only in whether they are free and what
            # they list: one type table per such pair (not one per VF: a card
            # has up to 64 VFs, each listing the card's ~20 types).
            tables: dict[tuple[bool, frozenset[int]], Mapping[str, MdevType]] = {}
            for vf in members:
                key = (vf.current == 0, frozenset(vf.creatable))
                types = tables.get(key)
                if types is None:
                    types = tables[key] = MappingProxyType({
                        type_name(type_id): MdevType(
                            type_name(type_id),
                            "vfio-pci",
                            1 if key[0] and type_id in key[1] else 0,
                            name,
                            None,
                            limits[type_id],
                        )
                        for type_id, name in sorted(known.items())
                    })
                parents[vf.address] = Parent(
                    name=vf.address,
                    device_path=vf.device_path,
                    pci_address=vf.address,
                    physical_gpu=pf,
                    physfn=pf,
                    numa_node=vf.numa_node,
                    driver="nvidia",
                    vendor_id=vf.vendor_id,
                    device_id=vf.device_id,
                    types=types,
                    backend=BACKEND,
                )
                if vf.current:
                    uuid = device_uuid(vf.address)
                    devices[uuid] = Mdev(
                        uuid=uuid,
                        parent=vf.address,
                        mdev_type=type_name(vf.current),
                        iommu_group=vf.iommu_group,
                        backend=BACKEND,
                        address=vf.address,
                        placement_id=vf.placement_id,
                        gpu_instance_id=vf.gpu_instance_id,
                    )
        if learnt:
            self._save()
        return Discovery(
            MappingProxyType(parents), MappingProxyType(devices), tuple(warnings), tuple(notes)
        )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _read_vgpu(
    name: str, static: _VfStatic, device_fd: int, warn: Callable[[str], None]
) -> _Vf | None:
    """What changes of a VF: its vGPU files and its IOMMU group."""
    try:
        # Not followed: a link named nvidia is no vendor directory.
        dir_fd = os.open(NVIDIA_DIR, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=device_fd)
    except OSError:
        return None
    try:
        raw_current = _attribute(dir_fd, CURRENT, f"VF {name}", warn)
        raw_creatable = _attribute(dir_fd, CREATABLE, f"VF {name}", warn)
        current = (attributes.parse_int_or_none(raw_current, MAX_TYPE_ID)
                   if raw_current is not None else None)
        # Only a typed VF has a placement: untyped, the file fails (ENXIO)
        # or is absent, which is no warning.
        placement = _placement_at(dir_fd) if current else None
        instance = _gpu_instance_at(dir_fd) if current else None
    finally:
        os.close(dir_fd)
    if raw_current is None or raw_creatable is None:
        warn(f"VF {name}: nvidia/{CURRENT} or {CREATABLE} is unreadable; skipped")
        return None
    if current is None:
        warn(f"VF {name}: {CURRENT} {raw_current!r} is not a type id; skipped")
        return None
    group = attributes.parse_int_or_none(
        _link_name_at(device_fd, "iommu_group"), attributes.MAX_IOMMU_GROUP
    )
    return _Vf(
        address=name,
        pf=static.pf,
        device_path=static.device_path,
        current=current,
        creatable=_parse_creatable_memo(raw_creatable),
        iommu_group=group,
        placement_id=placement,
        numa_node=static.numa_node,
        vendor_id=static.vendor_id,
        device_id=static.device_id,
        gpu_instance_id=instance,
    )


def _placement_at(dir_fd: int) -> int | None:
    """``placement_id`` of a typed VF; None when unreadable (ENXIO, absent:
    a driver without placements) or not a number."""
    try:
        raw = attributes.read_at(dir_fd, PLACEMENT)
    except (attributes.NotAnAttribute, OSError):
        return None
    return attributes.parse_int_or_none(raw, MAX_PLACEMENT_ID)


def _gpu_instance_at(dir_fd: int) -> int | None:
    """``gpu_instance_id`` of a typed VF; None for ``0`` (a time-sliced
    vGPU), when unreadable or absent (a driver without MIG), or not a number."""
    try:
        raw = attributes.read_at(dir_fd, GPU_INSTANCE)
    except (attributes.NotAnAttribute, OSError):
        return None
    return attributes.parse_int_or_none(raw, MAX_GPU_INSTANCE_ID) or None


def _resolve(root: str, path: str) -> str | None:
    real = os.path.realpath(path)
    if not (real == root or real.startswith(root + os.sep)) or not os.path.isdir(real):
        return None
    return real


def _device_path(root: str, device_fd: int, link: str) -> str | None:
    """Where an opened device directory is, when inside ``root``: the kernel
    says it in /proc/self/fd (one readlink); realpath of ``link`` without /proc."""
    try:
        real = os.readlink(f"/proc/self/fd/{device_fd}")
    except OSError:
        return _resolve(root, link)
    if real.endswith(" (deleted)") or not (real == root or real.startswith(root + os.sep)):
        return None
    return real


def _link_name_at(dir_fd: int, name: str) -> str | None:
    try:
        return os.path.basename(os.readlink(name, dir_fd=dir_fd).rstrip("/")) or None
    except OSError:
        return None


def _attribute(dir_fd: int, name: str, owner: str, warn: Callable[[str], None]) -> str | None:
    try:
        return attributes.read_at(dir_fd, name)
    except attributes.NotAnAttribute as exc:
        warn(f"{owner}: {exc}")
        return None


def _sriov_total(device_fd: int) -> int:
    """``sriov_totalvfs`` of a PCI function: 0 when it has no SR-IOV."""
    try:
        total = attributes.parse_int_or_none(
            attributes.read_at(device_fd, "sriov_totalvfs"), MAX_VFS
        )
    except attributes.NotAnAttribute:
        total = None
    return total or 0


def _no_vfs_enabled(device_fd: int) -> bool:
    """An SR-IOV PF with no ``virtfn*`` link (no VF enabled)."""
    try:
        with os.scandir(device_fd) as entries:
            return not any(entry.name.startswith("virtfn") for entry in entries)
    except OSError:
        return False
