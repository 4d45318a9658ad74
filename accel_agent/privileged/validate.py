"""What every privileged writer checks first: its inputs, then its paths.

Inputs are validated before any filesystem access (even ``realpath``), by
plain functions that unit tests call without the daemon; a refusal is
PrivilegedInputRejected with a one-line reason.  Then a path is resolved
with ``realpath`` and must stay inside ``realpath(sysfs_root)``, its last two
components the ones asked for (:func:`confine`; the package's docstring says
what that leaves to whoever owns the tree).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

from accel_agent import exception
from accel_agent.sysfs import address

# Canonical form only: the kernel names mdev directories "%pUl" (lower case),
# so anything else would make the ledger and sysfs disagree on the name.
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TYPE_RE = re.compile(r"[A-Za-z0-9_.-]+")
MAX_TYPE_LEN = 64
MAX_PARENT_LEN = 64
MAX_ROOT_LEN = 4096
# A remove waits at most this long per call; the manager retries if needed.
MAX_REMOVE_TIMEOUT = 3600.0
MAX_VGPU_TYPE_ID = 999_999
MAX_NUM_VFS = 0xFFFF
# NVML's GPU instance profile ids (nvmlGpuInstanceProfileInfo_v2_t.id) are
# below 64 today, a GPU has 8 memory slices, GPU instance ids are small: the
# bounds keep a bad value from reaching the library.
MAX_GPU_INSTANCE_PROFILE_ID = 255
MAX_GPU_SLICE = 255
MAX_GPU_INSTANCE_ID = 4096
# A vGPU placement id is an offset in the GPU's placement units (NVML's
# nvmlVgpuPlacementId_t; a few dozen on today's GPUs): bounded as nvml/types.py does.
MAX_VGPU_PLACEMENT_ID = 1 << 16


def reject(reason: str) -> exception.PrivilegedInputRejected:
    return exception.PrivilegedInputRejected(reason=reason)


# --- inputs (no filesystem access) -------------------------------------------------


def validate_uuid(value: Any) -> str:
    """Return ``value`` if it is a canonical lowercase 8-4-4-4-12 UUID."""
    # fullmatch, not match + "$": "$" also matches before a trailing newline.
    if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
        raise reject(f"mdev UUID {value!r} is not a canonical lowercase UUID")
    return value


def validate_mdev_type(value: Any) -> str:
    """Return ``value`` if it is a plausible single-component type id."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_TYPE_LEN
        or not _TYPE_RE.fullmatch(value)
        or value in (".", "..")
    ):
        raise reject(
            f"mdev type {value!r} must match [A-Za-z0-9_.-]+, at most {MAX_TYPE_LEN} "
            "characters, and not be . or .."
        )
    return value


def validate_parent(value: Any) -> str:
    """Return ``value`` if it is a canonical PCI address or a virtual parent name."""
    if not isinstance(value, str) or not value or len(value) > MAX_PARENT_LEN:
        raise reject(f"mdev parent {value!r} is empty, not a string or too long")
    # is_virtual_parent_name() uses re.match with "$", which tolerates a
    # trailing newline; refuse every non-printable or blank character first.
    if "/" in value or not value.isprintable() or any(c.isspace() for c in value):
        raise reject(f"mdev parent {value!r} contains '/', whitespace or control characters")
    if address.is_pci_address(value):
        canonical = address.parse_pci_address(value)
        if canonical != value:
            # The kernel names PCI parents in canonical form only; a
            # non-canonical spelling would silently miss the directory.
            raise reject(f"mdev parent {value!r} is not canonical (use {canonical!r})")
        return value
    if address.is_virtual_parent_name(value):
        return value
    raise reject(f"mdev parent {value!r} is neither a PCI address nor a parent name")


def _absolute_path(value: Any, what: str) -> str:
    """``value`` if it is an absolute, normalised path of printable characters
    (no ``..``, no ``//``, no trailing ``/``), else refused naming ``what``."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ROOT_LEN
        or not value.isprintable()
        or not os.path.isabs(value)
        or os.path.normpath(value) != value
    ):
        raise reject(f"{what} {value!r} is not an absolute, normalised path")
    return value


def validate_sysfs_root(value: Any) -> str:
    """What the agent's configuration accepts as ``sysfs_root``: an absolute,
    normalised path.  Whether it is a directory is checked where it is used."""
    return _absolute_path(value, "sysfs root")


def validate_vfio_dev_dir(value: Any) -> str:
    """``""`` (derived from the root) or an absolute, normalised path, like
    :func:`validate_sysfs_root`: the in-use probe only opens ``<it>/<digits>``
    read-only, but never a path the caller could steer with ``..``."""
    if value == "":
        return value
    return _absolute_path(value, "vfio device directory")


def validate_timeout(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_REMOVE_TIMEOUT
    ):
        raise reject(f"remove timeout {value!r} must be a number in (0, {MAX_REMOVE_TIMEOUT}]")
    return float(value)


def validate_vf(value: Any) -> str:
    """A VF is named by its canonical PCI address only (``0000:c1:00.4``)."""
    if (
        not isinstance(value, str)
        or not address.is_pci_address(value)
        or address.parse_pci_address(value) != value
    ):
        raise reject(f"VF {value!r} is not a canonical PCI address (DDDD:BB:SS.F)")
    return value


def validate_pci(value: Any) -> str:
    """A PF or VF, named by its canonical PCI address only."""
    return validate_vf(value)


def validate_vgpu_type_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 < value <= MAX_VGPU_TYPE_ID
    ):
        raise reject(f"vGPU type id {value!r} must be an integer in 1..{MAX_VGPU_TYPE_ID}")
    return value


def validate_placement_id(value: Any) -> int:
    """A vGPU placement id: an integer in 0..MAX_VGPU_PLACEMENT_ID."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 <= value <= MAX_VGPU_PLACEMENT_ID
    ):
        raise reject(
            f"vGPU placement id {value!r} must be an integer in 0..{MAX_VGPU_PLACEMENT_ID}")
    return value


def validate_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NUM_VFS:
        raise reject(f"number of VFs {value!r} must be an integer in 0..{MAX_NUM_VFS}")
    return value


def validate_flag(value: Any, what: str) -> bool:
    """An on/off setting: a real boolean, never a truthy string or number."""
    if not isinstance(value, bool):
        raise reject(f"{what} {value!r} must be true or false")
    return value


def validate_profile_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 <= value <= MAX_GPU_INSTANCE_PROFILE_ID
    ):
        raise reject(f"GPU instance profile id {value!r} must be an integer in "
                     f"0..{MAX_GPU_INSTANCE_PROFILE_ID}")
    return value


def validate_slice(value: Any, what: str, low: int) -> int:
    """A GPU instance placement's start (``low`` 0) or size (``low`` 1), in slices."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_GPU_SLICE:
        raise reject(f"GPU instance {what} {value!r} must be an integer in {low}..{MAX_GPU_SLICE}")
    return value


def validate_gpu_instance_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 <= value <= MAX_GPU_INSTANCE_ID
    ):
        raise reject(f"GPU instance id {value!r} must be an integer in 0..{MAX_GPU_INSTANCE_ID}")
    return value


# --- paths (reads only) ------------------------------------------------------------


def real_root(sysfs_root: str) -> str:
    root = os.path.realpath(sysfs_root)
    if not os.path.isdir(root):
        raise exception.SysfsRootNotFound(root=sysfs_root)
    return root


def confine(root: str, relative: Sequence[str], basename: str, dirname: str) -> str:
    """Resolve ``root/relative`` and refuse it unless it stays under ``root``.

    The links under /sys/class/mdev_bus and /sys/bus/mdev/devices are
    legitimately symlinks (``../../devices/...``), so resolution is allowed,
    but only to a target inside the root whose last two components are the
    ones we asked for (``<type>/create`` or ``<uuid>/remove``).
    """
    target = os.path.realpath(os.path.join(root, *relative))
    if os.path.commonpath([root, target]) != root or target == root:
        raise reject(f"{os.path.join(*relative)} resolves to {target}, outside {root}")
    if os.path.basename(target) != basename or (
        os.path.basename(os.path.dirname(target)) != dirname
    ):
        raise reject(
            f"{os.path.join(*relative)} resolves to {target}, not .../{dirname}/{basename}"
        )
    return target
