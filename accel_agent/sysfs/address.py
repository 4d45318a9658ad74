"""PCI address parsing and normalising: the one place the agent does it.

The kernel names PCI parents ``DDDD:BB:SS.F`` in lower case.  Operators write
addresses by hand, so we accept upper case and the short ``BB:SS.F`` form and
normalise both before any match or duplicate check (Nova compares raw strings
and silently misses ``0000:AF:00.0`` vs ``0000:af:00.0``).
"""

from __future__ import annotations

import re

from accel_agent import exception

# domain (4 hex) optional, bus (2 hex), slot (2 hex, 0x00-0x1f), function 0-7.
# Always used with fullmatch: "$" would also match before a trailing newline.
_PCI_RE = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<slot>[0-9a-fA-F]{2})\.(?P<function>[0-7])"
)
# Names the kernel gives non-PCI mdev parents (mtty, matrix, 0.0.0123 for ccw).
_VIRTUAL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def parse_pci_address(text: str) -> str:
    """Return ``text`` as a canonical ``dddd:bb:ss.f`` address.

    Raises InvalidPciAddress when ``text`` is not a PCI address.
    """
    match = _PCI_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise exception.InvalidPciAddress(address=text)
    slot = int(match["slot"], 16)
    if slot > 0x1F:
        raise exception.InvalidPciAddress(address=text)
    domain = match["domain"] or "0000"
    return f"{domain.lower()}:{match['bus'].lower()}:{slot:02x}.{match['function']}"


def is_pci_address(text: str) -> bool:
    try:
        parse_pci_address(text)
    except exception.InvalidPciAddress:
        return False
    return True


def is_virtual_parent_name(text: str) -> bool:
    """True for a plausible non-PCI parent name such as ``mtty``.

    A name that is not a PCI address must still be a single path component
    of sane characters: it becomes part of a sysfs path.
    """
    return (
        isinstance(text, str)
        and bool(_VIRTUAL_NAME_RE.fullmatch(text))
        and text not in (".", "..")
    )


def is_canonical_parent_name(text: str) -> bool:
    """True for a name the kernel could give an mdev parent: a PCI address
    exactly as the kernel spells it (``0000:84:00.0``), or a virtual name that
    does not look like a PCI address at all.  ``0000:84:00.0\\n``, `` 0000:84:00.0``
    and ``0000:84:00.A`` are none of these: taken as parents, they would be
    normalised into the real GPU's name by policy and inventory."""
    if not isinstance(text, str):
        return False
    if _PCI_RE.fullmatch(text.strip()):
        return is_pci_address(text) and parse_pci_address(text) == text
    return is_virtual_parent_name(text)


def normalise_parent(text: str) -> str:
    """Canonical form of a configured parent: PCI addresses normalised,
    virtual names (``mtty``) kept as the kernel spells them (they are
    case-sensitive in sysfs)."""
    stripped = text.strip()
    if is_pci_address(stripped):
        return parse_pci_address(stripped)
    return stripped


def provider_suffix(parent: str) -> str:
    """libvirt's node-device style name, used in provider names:
    ``0000:84:00.0`` -> ``pci_0000_84_00_0``; ``mtty`` -> ``mtty``."""
    if is_pci_address(parent):
        return "pci_" + re.sub(r"[:.]", "_", parse_pci_address(parent))
    return re.sub(r"[^A-Za-z0-9_-]", "_", parent)
