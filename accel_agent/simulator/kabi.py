"""Small pieces of kernel behaviour the model reproduces byte for byte.

``uuid_is_valid`` and ``kstrtoul`` follow lib/uuid.c and lib/kstrtox.c, the
parsers behind ``create`` and ``remove``; ``sysfs_streq`` is lib/string.c's
comparison behind every "write a device name" attribute (``bind``,
``unbind``, ``drivers_probe``); ``pci_path`` places a PCI function in the
``devices/`` hierarchy and ``virtfn_address`` numbers SR-IOV VFs.
"""

from __future__ import annotations

import errno

from accel_agent.simulator.tree import Path, oserror

UUID_LEN = 36
_HEX = frozenset(b"0123456789abcdefABCDEF")


def uuid_is_valid(text: bytes) -> bool:
    """The kernel's ``uuid_is_valid()``: 36 chars, dashes at 8/13/18/23, hex elsewhere."""
    if len(text) < UUID_LEN:
        return False
    for i in range(UUID_LEN):
        c = text[i]
        if i in (8, 13, 18, 23):
            if c != ord("-"):
                return False
        elif c not in _HEX:
            return False
    return True


def kstrtoul(data: bytes) -> int:
    """The kernel's ``kstrtoul(buf, 0, &val)``: optional ``+``, base prefix (``0x``,
    leading ``0`` for octal), one optional trailing newline, nothing else."""
    s = data
    if s.startswith(b"+"):
        s = s[1:]
    if s.endswith(b"\n"):
        s = s[:-1]
    base = 10
    if s[:2].lower() == b"0x" and len(s) > 2:
        base, s = 16, s[2:]
    elif s.startswith(b"0") and len(s) > 1:
        base, s = 8, s[1:]
    if not s:
        raise oserror(errno.EINVAL, "not a number")
    try:
        text = s.decode("ascii")
        if not text.isalnum():
            raise ValueError(text)
        value = int(text, base)
    except (UnicodeDecodeError, ValueError):
        raise oserror(errno.EINVAL, "not a number") from None
    if value >= 1 << 64:
        raise oserror(errno.ERANGE, "out of range")
    return value


def sysfs_streq(data: bytes, name: str) -> bool:
    """lib/string.c ``sysfs_streq()``: equal, except that one trailing newline
    on either side is ignored (so ``echo 0000:05:10.0 > bind`` matches)."""
    text = data[:-1] if data.endswith(b"\n") else data
    return text == name.encode()


def virtfn_address(pf: str, offset: int, stride: int, index: int) -> str:
    """The address of VF ``index`` of ``pf``: drivers/pci/iov.c
    ``pci_iov_virtfn_bus()``/``pci_iov_virtfn_devfn()`` add the SR-IOV
    capability's First VF Offset and VF Stride to the PF's routing id
    (bus << 8 | devfn), carrying into the bus number."""
    dom, bus, slot_fn = pf.split(":")
    slot, fn = slot_fn.split(".")
    rid = (int(bus, 16) << 8 | int(slot, 16) << 3 | int(fn)) + offset + stride * index
    if rid >> 8 > 0xFF:
        raise ValueError(f"VF {index} of {pf} would be beyond bus ff")
    devfn = rid & 0xFF
    return f"{dom}:{rid >> 8:02x}:{devfn >> 3:02x}.{devfn & 7}"


def pci_path(addr: str) -> Path:
    """The device directory of a PCI function that is not a VF (rules: model module doc)."""
    dom, bus, _ = addr.split(":")
    b = int(bus, 16)
    root = b & 0xC0
    root_dir = f"pci{dom}:{root:02x}"
    if b == root:
        return ("devices", root_dir, addr)
    n = b - root
    if root == 0:
        # Root bus 0 holds the chipset's own functions (the iGPU at 00:02.0 ...):
        # use the PCH-style root ports 00:1c.0-00:1f.7 there.
        port = f"{dom}:00:{0x1C + ((n - 1) // 8) % 4:02x}.{(n - 1) % 8}"
    else:
        port = f"{dom}:{root:02x}:{(n + 3) // 4:02x}.0"
    return ("devices", root_dir, port, addr)
