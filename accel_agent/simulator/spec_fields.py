"""The field checks of a simulated host's spec (:mod:`.spec`, :mod:`.spec_sriov`).

Each check returns the value as the kernel would spell it, or raises
:class:`~accel_agent.exception.SimulatorSpecInvalid` naming the field, so a bad
spec fails where it is written, not later inside the model.  Values are
rejected, never fixed: a spec never silently differs from the tree it
produces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from accel_agent import exception
from accel_agent.sysfs import address

# A single sysfs path component made of tame characters.
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9_.:+-]{1,128}$")
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def invalid(reason: str) -> exception.SimulatorSpecInvalid:
    return exception.SimulatorSpecInvalid(reason=reason)


def sysfs_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _COMPONENT_RE.match(value) or value in (".", ".."):
        raise invalid(f"{what} {value!r} is not a valid sysfs name")
    return value


def integer(value: Any, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise invalid(f"{what} must be >= {minimum}, got {value}")
    return value


def hex_id(value: Any, what: str) -> int:
    """PCI ids are written ``0x10de`` in JSON (as sysfs shows them); ints are accepted."""
    if isinstance(value, str):
        try:
            value = int(value, 16)
        except ValueError:
            raise invalid(f"{what} {value!r} is not a hexadecimal id") from None
    value = integer(value, what, 0)
    if value > 0xFFFFFF:
        raise invalid(f"{what} {value:#x} is out of range")
    return value


def canonical_pci(value: Any, what: str) -> str:
    """The kernel's spelling of a PCI address; anything else is rejected, not fixed,
    so that a spec never silently differs from the tree it produces."""
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string, got {value!r}")
    try:
        canon = address.parse_pci_address(value)
    except exception.InvalidPciAddress:
        raise invalid(f"{what} {value!r} is not a PCI address (dddd:bb:ss.f)") from None
    if canon != value:
        raise invalid(f"{what} {value!r} must be written as the kernel does: {canon!r}")
    return canon


def canonical_uuid(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _UUID_RE.match(value):
        raise invalid(f"{what} {value!r} is not a UUID")
    return value.lower()


def json_fields(data: Any, where: str, required: Iterable[str], optional: Iterable[str]) -> dict:
    """Check a JSON object's keys: every required key present, nothing unknown."""
    if not isinstance(data, Mapping):
        raise invalid(f"{where} must be an object, got {type(data).__name__}")
    required = tuple(required)
    allowed = set(required) | set(optional)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise invalid(f"{where}: unknown field(s) {', '.join(unknown)} "
                      f"(allowed: {', '.join(sorted(allowed))})")
    missing = [k for k in required if k not in data]
    if missing:
        raise invalid(f"{where}: missing field(s) {', '.join(missing)}")
    return dict(data)
