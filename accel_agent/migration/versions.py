"""Version gates of mdev live migration (docs/design.md §7.3).

Both hosts need libvirt >= 8.6.0, QEMU >= 8.1.0 and kernel >= 5.18; an error
says which side is too old and which component, so the operator knows
which host to upgrade.

An instance with NVIDIA vGPUs also needs the same NVIDIA vGPU manager
(driver) version on both hosts: Red Hat's documentation of vGPU live
migration says it "fails if the vGPU driver version differs on the source
and destination hosts", and neither Nova nor libvirt checks it
(docs/design.md §16.5).  The version
is NVML's (``nvmlSystemGetDriverVersion``), or, where NVML cannot be loaded
on the host's own ``/sys``, the ``Kernel Module`` line of
``/proc/driver/nvidia/version`` (accel_agent/nvml/real.py, whose
``proc_version`` parameter is that file's path).  It is compared as text,
for equality only: there is no floor, and no order between two branches
says which would work.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel_agent import exception

if TYPE_CHECKING:
    from accel_agent.nvml import Nvml

Version = tuple[int, int, int]

COMPONENTS = ("libvirt", "qemu", "kernel")
# Sent only by a host that has one (add-only beside COMPONENTS).
NVIDIA_VGPU_MANAGER = "nvidia_vgpu_manager"
# NVIDIA's driver versions: 550.54.16, 535.104.05, 580.159.04.
_NVIDIA_VERSION_RE = re.compile(r"^[0-9]{1,6}(?:\.[0-9]{1,6}){1,3}$")
_LABELS = {"libvirt": "libvirt", "qemu": "QEMU", "kernel": "Linux kernel"}


def parse_version(text: str) -> Version:
    """``8.6.0`` -> (8, 6, 0); ``6.1.0-56-amd64`` -> (6, 1, 0); ``5.18`` -> (5, 18, 0)."""
    match = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if not match:
        raise exception.InvalidMigrationRequest(reason=f"unparseable version {text!r}")
    major, minor, micro = (int(g) if g else 0 for g in match.groups())
    return (major, minor, micro)


def from_libvirt_int(value: int) -> Version:
    """libvirt encodes versions as major * 1,000,000 + minor * 1,000 + micro."""
    return (value // 1_000_000, value // 1_000 % 1_000, value % 1_000)


def text(version: Version) -> str:
    return ".".join(str(part) for part in version)


def parse_nvidia_version(value: Any) -> str:
    """An NVIDIA driver version as a host sends it (``550.54.16``), kept as
    text: ``535.104.05`` is not ``535.104.5`` to NVIDIA's packages."""
    if not isinstance(value, str) or not _NVIDIA_VERSION_RE.match(value.strip()):
        raise exception.InvalidMigrationRequest(
            reason=f"{NVIDIA_VGPU_MANAGER} {value!r} is not an NVIDIA driver version "
            "(digits and dots, e.g. 550.54.16)"
        )
    return value.strip()


@dataclass(frozen=True, slots=True)
class HostVersions:
    libvirt: Version
    qemu: Version
    kernel: Version
    # The NVIDIA vGPU manager's version; None where the host has none or it
    # cannot be read (vgpu_manager_version).
    nvidia_vgpu_manager: str | None = None

    def to_dict(self) -> dict[str, str]:
        found = {name: text(getattr(self, name)) for name in COMPONENTS}
        if self.nvidia_vgpu_manager is not None:
            found[NVIDIA_VGPU_MANAGER] = self.nvidia_vgpu_manager
        return found

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostVersions:
        if (
            not isinstance(data, Mapping)
            or not set(COMPONENTS) <= set(data)
            or set(data) - {*COMPONENTS, NVIDIA_VGPU_MANAGER}
        ):
            raise exception.InvalidMigrationRequest(
                reason=f"versions must give exactly {', '.join(COMPONENTS)}, and "
                f"{NVIDIA_VGPU_MANAGER} on a host with NVIDIA vGPUs"
            )
        nvidia = data.get(NVIDIA_VGPU_MANAGER)
        if NVIDIA_VGPU_MANAGER in data:
            nvidia = parse_nvidia_version(nvidia)  # sent: a version, never null
        return cls(
            **{name: parse_version(data[name]) for name in COMPONENTS},
            nvidia_vgpu_manager=nvidia,
        )

    def with_vgpu_manager(self, version: str | None) -> HostVersions:
        return dataclasses.replace(self, nvidia_vgpu_manager=version)


def probe(conn: Any) -> HostVersions:
    """Versions of the host behind a libvirt connection (this host's kernel)."""
    return HostVersions(
        libvirt=from_libvirt_int(conn.getLibVersion()),
        qemu=from_libvirt_int(conn.getVersion()),
        kernel=parse_version(os.uname().release),
    )


def probe_uri(uri: str, timeout: float | None = None) -> HostVersions:
    """:func:`probe` on a connection to ``uri``, within ``[libvirt]
    call_timeout`` (devices/libvirt_calls.py: LibvirtStalled when libvirt
    does not answer, LibvirtUnavailable when it cannot be reached)."""
    from accel_agent.devices import libvirt_calls  # only migration needs it

    try:
        return libvirt_calls.channel_for(uri, timeout).call(
            "asking its libvirt and QEMU versions", lambda _libvirt, conn: probe(conn)
        )
    except libvirt_calls.Unreachable as exc:
        failure = exc
    # libvirt's own words (they name the socket): the callers say what was asked.
    raise exception.LibvirtUnavailable(str(failure), uri=uri, reason=str(failure))


def vgpu_manager_version(gpus: Nvml) -> str | None:
    """The NVIDIA vGPU manager's version that ``gpus`` (this host's NVML,
    ``accel_agent.nvml.for_sysfs_root``) reports: NVML's, or the
    ``/proc/driver/nvidia/version`` fallback of the real implementation
    (``RealNvml(proc_version=...)`` names another file, for tests).  None
    when neither has one: no NVIDIA driver, or a tree without NVML."""
    return gpus.status().driver_version


def host_vgpu_manager_version(sysfs_root: str | None = None, conf: Any = None) -> str | None:
    """:func:`vgpu_manager_version` of the host whose sysfs is ``sysfs_root``
    (the simulator's NVML on a simulated host; this host's own by default)."""
    from accel_agent import nvml  # only a migration of vGPUs pays for it

    # [nvml] call_timeout where the process registered [nvml] (the daemon and
    # accelctl do; a test's bare core options do not): else its default.
    with_nvml = conf if getattr(conf, "nvml", None) is not None else None
    gpus = nvml.for_sysfs_root(sysfs_root or nvml.HOST_SYSFS, with_nvml)
    try:
        return vgpu_manager_version(gpus)
    finally:
        gpus.close()


def check_vgpu_manager(source: str | None, destination: str | None, types: str) -> None:
    """Refuse a migration of NVIDIA vGPUs (``types``, the instance's) between
    hosts whose vGPU manager versions differ, or where either is unknown: an
    unknown version cannot be shown equal, and a migration between two
    versions fails only once it has started (module docstring)."""
    unknown = [side for side, found in (("source", source), ("destination", destination))
               if found is None]
    if unknown:
        raise exception.MigrationVgpuManagerUnknown(
            sides=" and ".join(unknown),
            types=types,
            source=source or "unknown",
            destination=destination or "unknown",
        )
    if source != destination:
        raise exception.MigrationVgpuManagerMismatch(
            source=source, destination=destination, types=types
        )


@dataclass(frozen=True, slots=True)
class Minimums:
    libvirt: Version = (8, 6, 0)
    qemu: Version = (8, 1, 0)
    kernel: Version = (5, 18, 0)

    @classmethod
    def from_conf(cls, conf: Any) -> Minimums:
        group = conf.migration
        return cls(
            libvirt=parse_version(group.min_libvirt_version),
            qemu=parse_version(group.min_qemu_version),
            kernel=parse_version(group.min_kernel_version),
        )


def check(versions: HostVersions, side: str, minimums: Minimums | None = None) -> None:
    """Raise MigrationVersionTooOld naming ``side`` ("source"/"destination")."""
    minimums = minimums or Minimums()
    for name in COMPONENTS:
        found, required = getattr(versions, name), getattr(minimums, name)
        if found < required:
            raise exception.MigrationVersionTooOld(
                side=side.capitalize(),
                component=_LABELS[name],
                found=text(found),
                required=text(required),
            )
