"""Version gates of mdev live migration (docs/design.md §7.3).

Both hosts need libvirt >= 8.6.0, QEMU >= 8.1.0 and kernel >= 5.18; an error
says which side is too old and which component, so the operator knows
which host to upgrade.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel_agent import exception

Version = tuple[int, int, int]

COMPONENTS = ("libvirt", "qemu", "kernel")
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


@dataclass(frozen=True, slots=True)
class HostVersions:
    libvirt: Version
    qemu: Version
    kernel: Version

    def to_dict(self) -> dict[str, str]:
        return {name: text(getattr(self, name)) for name in COMPONENTS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostVersions:
        if not isinstance(data, Mapping) or set(data) != set(COMPONENTS):
            raise exception.InvalidMigrationRequest(
                reason=f"versions must give exactly {', '.join(COMPONENTS)}"
            )
        return cls(**{name: parse_version(data[name]) for name in COMPONENTS})


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
