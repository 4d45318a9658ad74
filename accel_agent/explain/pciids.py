"""Names of PCI vendors, devices and classes from the system's ``pci.ids``.

The file is the PCI ID Repository's list as distributions ship it (Debian and
Ubuntu: package ``pci.ids``, ``/usr/share/misc/pci.ids``; Fedora and RHEL:
``hwdata``, ``/usr/share/hwdata/pci.ids``), the one ``lspci`` reads.  Its
format (the file's own header): a vendor line ``vvvv  name``, its devices
``<TAB>dddd  name``, their subsystems ``<TAB><TAB>ssss ssss  name``; after the
vendors, classes ``C cc  name`` with subclasses ``<TAB>ss  name``; ``#``
starts a comment.

A host's list may be older than its GPUs (Debian's 2023 list has no H200,
``10de:2335``): a known vendor with an unknown device reads as lspci prints
it, ``NVIDIA Corporation device 2335``; without the file, or for an unknown
vendor, the name is ``unknown (10de:2335)``.  The file is read in one pass
for the ids asked, never kept whole (1.3 MB).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
# Ids are 4 lower-case hex digits (sysfs's "0x10de" without the prefix).
Ids = tuple[str, str, "str | None", "str | None"]  # vendor, device, subvendor, subdevice


@dataclass(frozen=True, slots=True)
class Names:
    vendor: str | None = None
    device: str | None = None
    subsystem: str | None = None


def find(paths: Iterable[str] = PATHS) -> str | None:
    """The first ``pci.ids`` of ``paths`` that exists."""
    return next((p for p in paths if os.path.isfile(p)), None)


def display_name(vendor_id: str | None, device_id: str | None, names: Names) -> str:
    """``NVIDIA Corporation GA100 [A100 PCIe 40GB]``, ``NVIDIA Corporation
    device 2335`` (a device the list does not know), ``unknown (10de:2335)``."""
    if names.vendor and names.device:
        return f"{names.vendor} {names.device}"
    if names.vendor:
        return f"{names.vendor} device {device_id or '?'}"
    return f"unknown ({vendor_id or '?'}:{device_id or '?'})"


def _split(text: str, width: int) -> tuple[str, str] | None:
    """``"10de  NVIDIA Corporation"`` -> ("10de", "NVIDIA Corporation")."""
    key, name = text[:width].lower(), text[width:].strip()
    return (key, name) if name else None


class PciIds:
    """The names of the ids asked, read from one ``pci.ids`` file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def lookup(
        self, wanted: Iterable[Ids], classes: Iterable[int] = ()
    ) -> tuple[dict[Ids, Names], dict[int, str]]:
        """Names for each (vendor, device, subvendor, subdevice) of ``wanted``
        and for each 24-bit class code of ``classes`` (its subclass's name,
        else its class's); what the file lacks is left out or None.  An
        unreadable file gives nothing: the caller says "unknown"."""
        wanted = set(wanted)
        vendors = {w[0] for w in wanted}
        devices = {(w[0], w[1]) for w in wanted}
        found: dict[tuple[str, ...], str] = {}
        class_names: dict[str, str] = {}
        vendor = device = None
        in_classes = False
        current_class = None
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    line = line.rstrip("\n")
                    if not line or line.startswith("#"):
                        continue
                    if line.startswith("C "):
                        in_classes, vendor, device = True, None, None
                        split = _split(line[2:], 2)
                        current_class = split[0] if split else None
                        if split:
                            class_names[split[0]] = split[1]
                        continue
                    if in_classes:
                        if current_class and line.startswith("\t") and not line.startswith("\t\t"):
                            split = _split(line[1:], 2)
                            if split:
                                class_names[current_class + split[0]] = split[1]
                        continue
                    if not line.startswith("\t"):
                        split = _split(line, 4)
                        vendor, device = (split[0], None) if split else (None, None)
                        if split and vendor in vendors:
                            found[(vendor,)] = split[1]
                        continue
                    if vendor not in vendors:
                        continue
                    if line.startswith("\t\t"):
                        split = _split(line[2:], 9)
                        if split and device is not None and (vendor, device) in devices:
                            sub_vendor, _, sub_device = split[0].partition(" ")
                            found[(vendor, device, sub_vendor, sub_device)] = split[1]
                        continue
                    split = _split(line[1:], 4)
                    device = split[0] if split else None
                    if split and (vendor, device) in devices:
                        found[(vendor, device)] = split[1]
        except OSError:
            return {}, {}
        names = {
            w: Names(
                found.get((w[0],)),
                found.get((w[0], w[1])),
                found.get((w[0], w[1], w[2] or "", w[3] or "")) if w[2] and w[3] else None,
            )
            for w in wanted
        }
        by_code = {}
        for code in classes:
            text = f"{code:06x}"
            name = class_names.get(text[:4]) or class_names.get(text[:2])
            if name:
                by_code[code] = name
        return names, by_code
