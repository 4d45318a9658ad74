"""/sys-shaped trees that vary what real hosts vary, written with plain ``os``
calls: independent of ``accel_agent.simulator`` on purpose, so a benchmark on
them cannot share a blind spot with the simulator's own tree (issue 26).

The shapes follow the kernel (docs/design.md §4.1, §10.3):

* ``devices/pci<dddd>:00/`` root buses, each GPU under ``depth`` PCI bridges
  (root port, switch ports: class 0x060400, bound to ``pcieport``);
* per GPU ``vendor``, ``device``, ``class``, ``numa_node``, links ``driver``
  (``bus/pci/drivers/nvidia``), ``iommu_group`` (``kernel/iommu_groups/N``)
  and ``subsystem``, and ``mdev_supported_types/<type>/{name, description,
  device_api, available_instances, create, devices/}``;
* ``class/mdev_bus/<addr>`` and ``bus/pci/devices/<addr>``: relative links
  like the kernel's (``../../devices/...``), ``bus/mdev/devices/`` unless the
  shape leaves ``bus/mdev`` (or ``bus/`` altogether) out;
* an existing mdev: ``<parent dir>/<uuid>/`` with ``mdev_type`` and
  ``iommu_group`` links, linked from ``<type>/devices/<uuid>`` and
  ``bus/mdev/devices/<uuid>``; the GPU's counters lowered like NVIDIA's
  (homogeneous: once a GPU holds a vGPU, only its type is creatable);
* vendor-VFIO (vGPU 17+): PFs with ``sriov_totalvfs``/``sriov_numvfs`` and
  ``virtfnN`` links, each VF with ``physfn``, bound to ``nvidia``, with
  ``nvidia/{creatable_vgpu_types, current_vgpu_type}``; no mdev parent.

A tree is built once under ``ACCEL_BENCH_CACHE`` as ``host-<name>-<hash>``,
the hash over its :class:`Shape` and :data:`VERSION`: changing a parameter
(or the generator) builds a new tree and drops the stale one.  Beside the
tree, ``<tree>.json`` lists the mdevs it holds and which are "owned" (the
benchmark records those in the agent's ledger: a tree has no owner).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid as uuid_mod
from collections.abc import Iterator
from dataclasses import dataclass

CACHE = os.environ.get("ACCEL_BENCH_CACHE", "/var/tmp/accel-agent-bench")
# Bump when the generator writes something different for the same Shape.
VERSION = 3
GPUS_PER_DOMAIN = 32
NVIDIA = "0x10de"
MDEV_GPU = "0x2236"  # A10: an mdev-era (pre-vGPU 17) card
VFIO_GPU = "0x26b9"  # L40S: a vendor-VFIO card
FIRST_MDEV_TYPE = 256
FIRST_VFIO_TYPE = 1150
VF_OFFSET = 4  # first VF's devfn after its PF's, like ARI-capable GPUs
# NVIDIA's vGPU sizes in GB; a card's largest type is its whole framebuffer.
SIZES = (1, 2, 3, 4, 6, 8, 12, 24)
VFIO_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 48)
SERIES = ("Q", "B", "A", "C")
_NAMESPACE = uuid_mod.UUID("0b1d3c55-2f64-4a8e-9d8c-61c0ffee2626")


@dataclass(frozen=True)
class Shape:
    """One host: what the tree varies.  ``mdevs_per_gpu`` existing mdevs of
    the GPU's configured type, the first ``owned_per_gpu`` of them owned (in
    the agent's ledger), the rest foreign; ``enabled`` mdev types in the
    config, the GPUs shared out among them (:meth:`devices_config`)."""

    name: str
    gpus: int = 256
    types: int = 24
    depth: int = 0
    long_descriptions: bool = False
    numa_nodes: int = 1
    mdevs_per_gpu: int = 0
    owned_per_gpu: int = 0
    enabled: int = 1
    bus: str = "all"  # "all", "no-mdev" (no bus/mdev), "none" (no bus/ at all)
    vfio_pfs: int = 0  # of the gpus, this many are vendor-VFIO PFs instead
    vfs_per_pf: int = 16

    def __post_init__(self) -> None:
        if self.bus not in ("all", "no-mdev", "none"):
            raise ValueError(f"bus must be all, no-mdev or none, not {self.bus!r}")
        if not 0 <= self.depth <= 3:
            raise ValueError("depth is 0 to 3 bridges")
        if not 0 <= self.owned_per_gpu <= self.mdevs_per_gpu:
            raise ValueError("owned_per_gpu must be between 0 and mdevs_per_gpu")
        if not 1 <= self.enabled <= self.types:
            raise ValueError("enabled must be between 1 and types")
        if self.vfio_pfs and self.bus == "none":
            raise ValueError("vendor-VFIO VFs are found through bus/pci/devices")
        if self.vfio_pfs and not self.depth:
            # A PF's VFs take the device numbers after it: it needs a bus of its own.
            raise ValueError("vendor-VFIO PFs sit behind a bridge (depth >= 1)")
        if not 0 <= self.vfio_pfs <= self.gpus or not 0 < self.vfs_per_pf <= 256 - VF_OFFSET:
            raise ValueError(f"vfio_pfs must be <= gpus, vfs_per_pf 1 to {256 - VF_OFFSET}")

    @property
    def mdev_parents(self) -> int:
        return self.gpus - self.vfio_pfs

    def params(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "version": VERSION}

    def digest(self) -> str:
        text = json.dumps(self.params(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def mdev_type(self, index: int) -> str:
        return f"nvidia-{FIRST_MDEV_TYPE + index}"

    def type_of(self, ordinal: int) -> int:
        """The type the config gives the ``ordinal``-th mdev GPU: the enabled
        types take turns (and its mdevs, if any, are of that type)."""
        return ordinal % self.enabled

    def devices_config(self, manifest: dict[str, object]) -> str:
        """The ``[devices]`` and ``[mdev_<type>]`` sections of the agent's
        config for this tree, as an operator writes them (Nova's rule): the
        first enabled type is the default, every other one names its GPUs;
        with vendor-VFIO PFs, their first type on them."""
        gpus: dict[str, list[str]] = manifest["gpus"]  # type: ignore[assignment]
        types = [self.mdev_type(t) for t in range(self.enabled)]
        sections = [f"[mdev_{types[0]}]"]
        sections += [f"[mdev_{t}]\ndevice_addresses = {', '.join(gpus[t])}"
                     for t in types[1:] if gpus.get(t)]
        pfs: list[str] = manifest["vfio_pfs"]  # type: ignore[assignment]
        if pfs:
            vf_type = f"nvidia-{FIRST_VFIO_TYPE}"
            types.append(vf_type)
            sections.append(f"[mdev_{vf_type}]\ndevice_addresses = {', '.join(pfs)}")
        return (f"[devices]\nenabled_mdev_types = {', '.join(types)}\n"
                + "\n".join(sections) + "\n")

    def label(self) -> str:
        """What the tree varies, for a report's table."""
        parts = [f"{self.mdev_parents} GPUs x {self.types} types"]
        if self.vfio_pfs:
            parts.append(f"+ {self.vfio_pfs} vendor-VFIO PFs x {self.vfs_per_pf} VFs")
        parts.append(f"{self.depth} bridge(s)" if self.depth else "flat (no bridge)")
        parts.append("NVIDIA-style descriptions" if self.long_descriptions
                     else "short descriptions")
        parts.append(f"{self.numa_nodes} NUMA node(s)")
        if self.mdevs_per_gpu:
            foreign = self.mdevs_per_gpu - self.owned_per_gpu
            parts.append(f"{self.mdevs_per_gpu} mdevs/GPU ({self.owned_per_gpu} owned, "
                         f"{foreign} foreign)")
        else:
            parts.append("no mdevs")
        parts.append(f"{self.enabled} type(s) enabled"
                     + (f" (+ nvidia-{FIRST_VFIO_TYPE} on the PFs)" if self.vfio_pfs else ""))
        parts.append({"all": "bus/mdev", "no-mdev": "no bus/mdev", "none": "no bus/"}[self.bus])
        return ", ".join(parts)


def tree(shape: Shape) -> str:
    """The tree of ``shape``, built once and cached (see the module)."""
    path = os.path.join(CACHE, f"host-{shape.name}-{shape.digest()}")
    if os.path.isfile(path + ".json") and os.path.isdir(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    _drop_stale(shape)
    for leftover in (path + ".partial", path):  # a build cut short, before its manifest
        if os.path.isdir(leftover) and not os.path.islink(leftover):
            shutil.rmtree(leftover)
    tmp = path + ".partial"
    writer = build(shape, tmp)
    os.rename(tmp, path)
    manifest = {"params": shape.params(), "mdevs": writer.mdevs, "gpus": writer.gpus,
                "vfio_pfs": writer.pfs}
    with open(path + ".json.tmp", "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
    os.rename(path + ".json.tmp", path + ".json")  # last: marks the tree complete
    return path


def manifest(root: str) -> dict[str, object]:
    with open(root.rstrip("/") + ".json") as handle:
        return json.load(handle)


def _drop_stale(shape: Shape) -> None:
    """Trees of the same name from other parameters: never used again."""
    prefix = f"host-{shape.name}-"
    for entry in os.listdir(CACHE):
        rest = entry[len(prefix) :] if entry.startswith(prefix) else ""
        digest = rest.split(".", 1)[0]
        if len(digest) == 10 and digest != shape.digest():
            full = os.path.join(CACHE, entry)
            if any(os.path.ismount(os.path.join(full, sub)) for sub in ("sys", "usr")):
                continue  # a chroot of (a) still mounted: never delete through it
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)


# --- writing ---------------------------------------------------------------


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _link(target: str, link: str) -> None:
    """A relative link, as the kernel makes them."""
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


class _Writer:
    def __init__(self, shape: Shape, root: str) -> None:
        self.shape = shape
        self.root = root
        self.bus = shape.bus
        self.next_group = 0
        self.next_vfio = 0
        self.next_bus: dict[int, int] = {}
        self.mdevs: list[dict[str, object]] = []
        self.gpus: dict[str, list[str]] = {}  # mdev type -> the GPUs configured for it
        self.pfs: list[str] = []

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def skeleton(self) -> None:
        os.makedirs(self.path("class", "mdev_bus"))
        os.makedirs(self.path("kernel", "iommu_groups"))
        if self.bus == "none":
            return
        for driver in ("nvidia", "pcieport"):
            os.makedirs(self.path("bus", "pci", "drivers", driver))
        os.makedirs(self.path("bus", "pci", "devices"))
        if self.bus == "all":
            os.makedirs(self.path("bus", "mdev", "devices"))
            os.makedirs(self.path("bus", "mdev", "drivers", "vfio_mdev"))

    def iommu_group(self, device: str) -> None:
        group = self.path("kernel", "iommu_groups", str(self.next_group))
        self.next_group += 1
        os.makedirs(os.path.join(group, "devices"))
        _link(device, os.path.join(group, "devices", os.path.basename(device)))
        _link(group, os.path.join(device, "iommu_group"))

    def pci_function(
        self, parent_dir: str, addr: str, device_id: str, cls: str, driver: str | None, numa: int
    ) -> str:
        device = os.path.join(parent_dir, addr)
        os.makedirs(device)
        for name, value in (
            ("vendor", NVIDIA if cls != "0x060400" else "0x1000"),
            ("device", device_id),
            ("class", cls),
            ("numa_node", str(numa)),
        ):
            _write(os.path.join(device, name), value + "\n")
        self.pci_attributes(device, addr, device_id, cls, driver, numa)
        if self.bus != "none":
            _link(self.path("bus", "pci"), os.path.join(device, "subsystem"))
            _link(device, self.path("bus", "pci", "devices", addr))
            if driver is not None:
                drv = self.path("bus", "pci", "drivers", driver)
                _link(drv, os.path.join(device, "driver"))
                _link(device, os.path.join(drv, addr))
        return device

    def pci_attributes(
        self, device: str, addr: str, device_id: str, cls: str, driver: str | None, numa: int
    ) -> None:
        """The rest of what the PCI core puts in every function's directory
        (a listing of it costs what it costs on a host: ~30 entries)."""
        vendor = NVIDIA if cls != "0x060400" else "0x1000"
        cpus = f"{numa * 16}-{numa * 16 + 15}"
        modalias = (f"pci:v0000{vendor[2:].upper()}d0000{device_id[2:].upper()}"
                    f"sv0000{vendor[2:].upper()}sd00001111bc{cls[2:4].upper()}"
                    f"sc{cls[4:6].upper()}i00")
        uevent = f"PCI_CLASS={cls[2:].upper()}\nPCI_SLOT_NAME={addr}\nMODALIAS={modalias}\n"
        if driver is not None:
            uevent = f"DRIVER={driver}\n" + uevent
        for name, value in (
            ("ari_enabled", "0"), ("broken_parity_status", "0"),
            ("consistent_dma_mask_bits", "64"), ("d3cold_allowed", "1"),
            ("dma_mask_bits", "64"), ("driver_override", "(null)"), ("enable", "1"),
            ("irq", "0"), ("local_cpulist", cpus), ("local_cpus", "ffff"),
            ("modalias", modalias), ("msi_bus", "1"), ("power_state", "D0"),
            ("resource", "0x00000000fa000000 0x00000000faffffff 0x0000000000040200"),
            ("revision", "0xa1"), ("subsystem_vendor", vendor), ("subsystem_device", "0x1111"),
            ("current_link_speed", "16.0 GT/s PCIe"), ("current_link_width", "16"),
            ("max_link_speed", "16.0 GT/s PCIe"), ("max_link_width", "16"),
        ):
            _write(os.path.join(device, name), value + "\n")
        _write(os.path.join(device, "uevent"), uevent)
        for name in ("remove", "rescan", "reset"):
            _write(os.path.join(device, name), "")
        with open(os.path.join(device, "config"), "wb") as handle:
            handle.write(bytes(256))
        for sub in ("power", "msi_irqs", "link"):
            os.makedirs(os.path.join(device, sub))
        _write(os.path.join(device, "power", "runtime_status"), "active\n")

    def slot_of(self, index: int) -> tuple[int, str]:
        """Where GPU ``index`` sits: its domain and the directory it goes in,
        under ``depth`` bridges (each a new bus of the domain)."""
        domain, slot = divmod(index, GPUS_PER_DOMAIN)
        parent = self.path("devices", f"pci{domain:04x}:00")
        os.makedirs(parent, exist_ok=True)
        numa = self.numa(index)
        bus, device = 0, slot
        for _ in range(self.shape.depth):
            addr = f"{domain:04x}:{bus:02x}:{device:02x}.0"
            parent = self.pci_function(parent, addr, "0x1ad0", "0x060400", "pcieport", numa)
            bus = self.next_bus.get(domain, 1)
            self.next_bus[domain] = bus + 1
            device = 0
            _write(os.path.join(parent, "secondary_bus_number"), f"{bus}\n")
        return domain, os.path.join(parent, f"{domain:04x}:{bus:02x}:{device:02x}.0")

    def numa(self, index: int) -> int:
        return index * self.shape.numa_nodes // self.shape.gpus

    def mdev_gpu(self, index: int) -> None:
        shape = self.shape
        ordinal = sum(len(v) for v in self.gpus.values())
        configured = shape.type_of(ordinal)
        _, where = self.slot_of(index)
        parent_dir, addr = os.path.split(where)
        device = self.pci_function(parent_dir, addr, MDEV_GPU, "0x030200", "nvidia",
                                   self.numa(index))
        self.iommu_group(device)
        _link(device, self.path("class", "mdev_bus", addr))
        self.gpus.setdefault(shape.mdev_type(configured), []).append(addr)
        types_dir = os.path.join(device, "mdev_supported_types")
        existing = shape.mdevs_per_gpu
        for t in range(shape.types):
            size = SIZES[t % len(SIZES)]
            series = SERIES[t // len(SIZES) % len(SERIES)]
            most = SIZES[-1] // size
            if existing == 0:
                available = most
            elif t == configured:
                available = max(0, most - existing)
            else:
                available = 0  # homogeneous: the GPU already holds its configured type
            type_dir = os.path.join(types_dir, shape.mdev_type(t))
            os.makedirs(os.path.join(type_dir, "devices"))
            if shape.long_descriptions:
                description = (f"num_heads=4, frl_config=60, framebuffer={size * 1024}M, "
                               f"max_resolution=7680x4320, max_instance={most}")
            else:
                description = f"{size}G"
            for name, value in (
                ("name", f"GRID A10-{size}{series}"),
                ("description", description),
                ("device_api", "vfio-pci"),
                ("available_instances", str(available)),
            ):
                _write(os.path.join(type_dir, name), value + "\n")
            _write(os.path.join(type_dir, "create"), "")
        for k in range(existing):
            self.mdev(device, addr, shape.mdev_type(configured), k,
                      owned=k < shape.owned_per_gpu)

    def mdev(self, device: str, addr: str, mdev_type: str, k: int, owned: bool) -> None:
        uuid = str(uuid_mod.uuid5(_NAMESPACE, f"{addr}/{k}"))
        mdev_dir = os.path.join(device, uuid)
        os.makedirs(mdev_dir)
        type_dir = os.path.join(device, "mdev_supported_types", mdev_type)
        _link(type_dir, os.path.join(mdev_dir, "mdev_type"))
        _link(mdev_dir, os.path.join(type_dir, "devices", uuid))
        self.iommu_group(mdev_dir)
        _write(os.path.join(mdev_dir, "remove"), "")
        if self.bus == "all":
            _link(self.path("bus", "mdev"), os.path.join(mdev_dir, "subsystem"))
            _link(self.path("bus", "mdev", "drivers", "vfio_mdev"),
                  os.path.join(mdev_dir, "driver"))
            _link(mdev_dir, self.path("bus", "mdev", "devices", uuid))
        self.mdevs.append({"uuid": uuid, "parent": addr, "mdev_type": mdev_type, "owned": owned})

    def vfio_pf(self, index: int) -> None:
        shape = self.shape
        domain, where = self.slot_of(index)
        parent_dir, addr = os.path.split(where)
        numa = self.numa(index)
        pf = self.pci_function(parent_dir, addr, VFIO_GPU, "0x030200", "nvidia", numa)
        self.pfs.append(addr)
        self.iommu_group(pf)
        _write(os.path.join(pf, "sriov_totalvfs"), f"{shape.vfs_per_pf}\n")
        _write(os.path.join(pf, "sriov_numvfs"), f"{shape.vfs_per_pf}\n")
        _write(os.path.join(pf, "sriov_offset"), f"{VF_OFFSET}\n")
        _write(os.path.join(pf, "sriov_stride"), "1\n")
        bus = addr.split(":")[1]
        lines = [f"{FIRST_VFIO_TYPE + k} : NVIDIA L40S-{size}{series}"
                 for k, (series, size) in enumerate(
                     (s, z) for s in SERIES[:3] for z in VFIO_SIZES)][: shape.types]
        creatable = "ID    : vGPU Name\n" + "".join(line + "\n" for line in lines)
        for n in range(shape.vfs_per_pf):
            slot, fn = divmod(VF_OFFSET + n, 8)
            vf_addr = f"{domain:04x}:{bus}:{slot:02x}.{fn}"
            vf = self.pci_function(parent_dir, vf_addr, VFIO_GPU, "0x030200", "nvidia", numa)
            self.iommu_group(vf)
            _link(pf, os.path.join(vf, "physfn"))
            _link(vf, os.path.join(pf, f"virtfn{n}"))
            os.makedirs(os.path.join(vf, "vfio-dev", f"vfio{self.next_vfio}"))
            self.next_vfio += 1
            os.makedirs(os.path.join(vf, "nvidia"))
            _write(os.path.join(vf, "nvidia", "creatable_vgpu_types"), creatable)
            _write(os.path.join(vf, "nvidia", "current_vgpu_type"), "0\n")


def build(shape: Shape, root: str) -> _Writer:
    """Write the tree of ``shape`` at ``root`` (which must not exist); the
    writer says what it wrote (mdevs, GPUs per configured type, PFs)."""
    writer = _Writer(shape, root)
    writer.skeleton()
    for index in range(shape.gpus):
        # The vendor-VFIO PFs are spread among the mdev GPUs, not all at the end.
        if shape.vfio_pfs and index % (shape.gpus // shape.vfio_pfs) == 0 and \
                index // (shape.gpus // shape.vfio_pfs) < shape.vfio_pfs:
            writer.vfio_pf(index)
        else:
            writer.mdev_gpu(index)
    return writer


# --- the variants ------------------------------------------------------------

BASE = Shape("flat")
VARIANTS: tuple[Shape, ...] = (
    BASE,
    dataclasses.replace(BASE, name="bridged1", depth=1),
    dataclasses.replace(BASE, name="bridged3", depth=3),
    dataclasses.replace(BASE, name="long-desc", long_descriptions=True),
    dataclasses.replace(BASE, name="numa4", numa_nodes=4),
    dataclasses.replace(BASE, name="mdevs", mdevs_per_gpu=2, owned_per_gpu=1),
    dataclasses.replace(BASE, name="enabled6", enabled=6),
    dataclasses.replace(BASE, name="enabled24", enabled=24),
    dataclasses.replace(BASE, name="no-bus-mdev", bus="no-mdev", mdevs_per_gpu=2,
                        owned_per_gpu=1),
    dataclasses.replace(BASE, name="vfio", depth=1, vfio_pfs=32, vfs_per_pf=16),
    # The issue reviewer's tree: bridged, long descriptions, no bus/mdev, one type.
    dataclasses.replace(BASE, name="reviewer", depth=1, long_descriptions=True, bus="no-mdev"),
    dataclasses.replace(BASE, name="worst", depth=3, long_descriptions=True, numa_nodes=4,
                        mdevs_per_gpu=2, owned_per_gpu=1, enabled=24, bus="no-mdev"),
)


def variants(names: str | None = None) -> Iterator[Shape]:
    """The variants, or those named (comma-separated); unknown names are an error."""
    if not names:
        yield from VARIANTS
        return
    known = {v.name: v for v in VARIANTS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown tree(s) {', '.join(unknown)}; known: {', '.join(known)}")
    for name in wanted:
        yield known[name]
