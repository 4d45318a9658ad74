"""Reading one sysfs attribute, and the numbers in it, without trusting the tree.

A tree under ``sysfs_root`` is whatever is there: the kernel's /sys, a copy
of it, a simulator, or a tree someone prepared.  What the kernel makes is
narrow (an attribute is a regular file of at most a page, ending in a
newline; a counter is ASCII decimal digits), so anything else is refused
rather than interpreted:

* an attribute is opened ``O_NONBLOCK | O_NOFOLLOW`` and read only when it
  is a regular file: a FIFO in its place cannot block the open or the read
  (an unprivileged user can make one), a device node's data is not used, and
  a symlink (sysfs attributes never are one) is not followed out of the tree;
* a number is ASCII digits (``int()`` alone also takes ``1_000``, ``+5``,
  `` ٣``) and at most a documented maximum: a 4,000-digit counter would
  otherwise overflow the float of a Prometheus gauge, and a plausible-looking
  ``50000000`` would have an allocation plan build a list of that size.
"""

from __future__ import annotations

import errno
import os
import re
import stat

# A sysfs attribute is at most a page (the kernel's show() buffer).
ATTRIBUTE_MAX_BYTES = 4096
# No known driver offers more than a few dozen instances of a type per parent
# (NVIDIA vGPU: <= 48; mtty: 24; GVT-g: 8; SR-IOV VFs: 0 or 1; s390 AP: 256).
# A counter above this is not believed: its type is skipped with a warning.
MAX_INSTANCES = 4096
# The kernel's MAX_NUMNODES is at most 1 << 10; -1 means "no node".
MAX_NUMA_NODE = 1023
# IOMMU group numbers are ida-allocated ints.
MAX_IOMMU_GROUP = 2**31 - 1

_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
_DIGITS = re.compile(r"-?[0-9]+")
_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symlink",
}


class NotAnAttribute(Exception):
    """Something other than a regular file is where an attribute should be."""

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(f"{name} is a {kind}, not a regular file; not read")
        self.name = name
        self.kind = kind


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8").rstrip("\n")
    except UnicodeDecodeError:
        return data.decode("latin-1").rstrip("\n")


def read_at(dir_fd: int | None, name: str) -> str | None:
    """One attribute, opened relative to an open directory (no path walk per
    file, which is most of a scan's cost on a tree of thousands of types).

    None when it is missing or unreadable; raises NotAnAttribute when
    something other than a regular file is there.
    """
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotAnAttribute(name, "symlink") from None
        if exc.errno == errno.ENXIO:  # what opening a socket gives
            raise NotAnAttribute(name, "socket") from None
        return None
    try:
        try:
            # pread, not read: a FIFO (with a writer or not) cannot be read
            # at an offset (ESPIPE), at no cost for a regular file.
            data = os.pread(fd, ATTRIBUTE_MAX_BYTES, 0)
        except OSError as exc:
            if exc.errno in (errno.ESPIPE, errno.EAGAIN, errno.EISDIR):
                _refuse_unless_regular(fd, name)
            return None
        if not data.endswith(b"\n"):
            # Never what the kernel writes (an attribute ends in a newline):
            # worth the fstat that every attribute would otherwise cost
            # (a third of a scan's time).  A device node ends up here.
            _refuse_unless_regular(fd, name)
        return _decode(data)
    finally:
        os.close(fd)


def _refuse_unless_regular(fd: int, name: str) -> None:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise NotAnAttribute(name, _KINDS.get(stat.S_IFMT(mode), "special file"))


def parse_int(text: str, maximum: int, minimum: int = 0) -> int:
    """``text`` (surrounding blanks and the kernel's newline allowed) as an
    integer of ASCII digits in [minimum, maximum]; ValueError saying why not."""
    stripped = text.strip(" \t\n")
    if stripped.isascii() and stripped.isdigit() and len(stripped) <= 19:
        value = int(stripped)  # the common case, without the regex
        if minimum <= value <= maximum:
            return value
    if not _DIGITS.fullmatch(stripped):
        raise ValueError(f"{text!r} is not a number")
    if len(stripped) > 19:  # no int of thousands of digits just to compare it
        raise ValueError(
            f"{stripped[:20]}... ({len(stripped)} digits) exceeds the maximum of {maximum}"
        )
    value = int(stripped)
    if value < minimum:
        raise ValueError(f"{value} is below {minimum}")
    if value > maximum:
        raise ValueError(f"{value} exceeds the maximum of {maximum}")
    return value


def parse_int_or_none(text: str | None, maximum: int, minimum: int = 0) -> int | None:
    if text is None:
        return None
    try:
        return parse_int(text, maximum, minimum)
    except ValueError:
        return None
