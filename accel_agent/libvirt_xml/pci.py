"""PCI addresses as the agent names them and as libvirt reads and writes them.

Three spellings meet here:

* the agent's: the kernel's ``DDDD:BB:SS.F`` (``0000:c1:00.4``), the only form
  accepted for a VF given to a builder or a migration mapping (either case,
  returned lowercase, as :func:`canonical_uuid` does for mdev UUIDs);
* libvirt's output: ``domain='0x0000' bus='0xc1' slot='0x00' function='0x4'``
  (``0x%04x``/``0x%02x``/``0x%02x``/``0x%x``, checked on libvirt 9.0's test
  driver: whatever the input spelling, ``XMLDesc`` writes this);
* libvirt's input: each attribute is read with ``strtoul(value, base=0)`` and
  must be consumed whole (``virXMLPropUInt``), so ``0xc1``, ``0XC1``, ``193``,
  ``0301`` (octal), `` 0xc1`` and ``+193`` are all bus 193 while ``c1``,
  ``0xc1 `` and ``-1`` are refused; a missing attribute is 0.  Comparing the
  addresses of a domain XML must follow the same rules, or a rewrite could miss
  the device libvirt will open.

Only the standard library is imported: ``accelctl`` validates ``--map`` with it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from accel_agent import exception

__all__ = [
    "FIELDS",
    "PciAddress",
    "canonical_pci_address",
    "field_limit",
    "format_like",
    "is_canonical_pci_address",
    "libvirt_format",
    "parse_libvirt_uint",
]

# The attributes of a PCI <address>, in the order libvirt writes them.
FIELDS = ("domain", "bus", "slot", "function")

# Upper bounds libvirt enforces (virPCIDeviceAddressIsValid; domain is a uint32).
_LIMITS = {"domain": 0xFFFFFFFF, "bus": 0xFF, "slot": 0x1F, "function": 0x7}
# libvirt's own spelling of each attribute (virPCIDeviceAddressFormat).
_LIBVIRT_FORMAT = {
    "domain": "0x{:04x}",
    "bus": "0x{:02x}",
    "slot": "0x{:02x}",
    "function": "0x{:x}",
}

# Kernel spelling, either case; slot and function are range-checked after the match.
_CANONICAL_RE = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4}):(?P<bus>[0-9a-fA-F]{2}):(?P<slot>[0-9a-fA-F]{2})\.(?P<function>[0-7])"
)
# strtoul(s, NULL, 0) accepting the whole string: leading C white space, an optional
# '+', then hex after 0x/0X, octal after a leading 0, else decimal.  [0-9] is ASCII only.
_STRTOUL_RE = re.compile(
    r"[ \t\n\v\f\r]*\+?(?:0[xX](?P<hex>[0-9a-fA-F]+)|(?P<octal>0[0-7]*)|(?P<decimal>[1-9][0-9]*))"
)
# Spellings a rewrite keeps: hex with a prefix and one letter case, or plain decimal.
_HEX_RE = re.compile(r"(?P<prefix>0[xX])(?P<digits>[0-9a-fA-F]+)")
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*")


class PciAddress(NamedTuple):
    """A PCI address as four numbers; ``str()`` is the canonical kernel spelling."""

    domain: int
    bus: int
    slot: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    @classmethod
    def from_canonical(cls, text: str) -> PciAddress:
        """The numbers of an address already checked by :func:`canonical_pci_address`."""
        domain, bus, rest = text.split(":")
        slot, function = rest.split(".")
        return cls(int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16))


def canonical_pci_address(text: object, where: str = "") -> str:
    """Return ``text`` as the lowercase ``dddd:bb:ss.f`` the kernel uses.

    Only the full four-part form is accepted: no short ``bb:ss.f`` (which
    ``sysfs.address.parse_pci_address`` allows for operators' config), no white
    space, no ``0x``; slot at most 0x1f, function at most 7.  A VF named any
    other way is a caller's bug, reported rather than reinterpreted.
    """
    match = _CANONICAL_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise exception.InvalidPciDeviceAddress(
            address=text, where=where, reason="expected DDDD:BB:SS.F (hexadecimal, function 0-7)"
        )
    if int(match["slot"], 16) > _LIMITS["slot"]:
        raise exception.InvalidPciDeviceAddress(
            address=text, where=where, reason="slot must be at most 1f"
        )
    return str(text).lower()


def is_canonical_pci_address(text: object) -> bool:
    """True when :func:`canonical_pci_address` would accept ``text``."""
    try:
        canonical_pci_address(text)
    except exception.InvalidPciDeviceAddress:
        return False
    return True


def parse_libvirt_uint(value: str) -> int | None:
    """The number libvirt reads from an attribute value, or None where it refuses it.

    ``virStrToLong_uip(value, NULL, 0)``: strtoul with base 0, the whole string
    consumed, no minus sign, the result fitting an unsigned int.
    """
    match = _STRTOUL_RE.fullmatch(value)
    if match is None:
        return None
    if match["hex"] is not None:
        number = int(match["hex"], 16)
    elif match["octal"] is not None:
        number = int(match["octal"], 8)
    else:
        number = int(match["decimal"])
    return number if number <= 0xFFFFFFFF else None


def field_limit(field: str) -> int:
    """The largest value libvirt accepts for ``field`` of a PCI address."""
    return _LIMITS[field]


def libvirt_format(field: str, value: int) -> str:
    """``value`` spelled as libvirt writes ``field`` (``bus`` 193 -> ``0xc1``)."""
    return _LIBVIRT_FORMAT[field].format(value)


def format_like(old: str | None, field: str, value: int) -> str:
    """``value`` spelled the way the attribute's ``old`` value was.

    Hex with a ``0x``/``0X`` prefix keeps its prefix, its number of digits (more
    if ``value`` needs them) and its letter case (digits without letters count as
    lowercase, libvirt's); plain decimal stays decimal.  Anything else (absent,
    octal, mixed-case letters, white space or a ``+`` that libvirt tolerates) is
    written in libvirt's canonical form, which is also what libvirt itself will
    write back for the domain.
    """
    if old is not None:
        hex_match = _HEX_RE.fullmatch(old)
        if hex_match is not None:
            digits = hex_match["digits"]
            letters = "".join(c for c in digits if c.isalpha())
            if letters != letters.lower() and letters != letters.upper():
                return libvirt_format(field, value)
            spec = f"0{len(digits)}{'X' if letters and letters.isupper() else 'x'}"
            return hex_match["prefix"] + format(value, spec)
        if _DECIMAL_RE.fullmatch(old):
            return str(value)
    return libvirt_format(field, value)
