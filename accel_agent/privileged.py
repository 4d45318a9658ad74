"""The only code of accel-agent that runs with privileges: two sysfs writes.

One oslo.privsep context, ``sysfs_admin``, and two entrypoints: write a UUID
to ``.../mdev_supported_types/<type>/create`` and write ``1`` to
``bus/mdev/devices/<uuid>/remove``, the latter only after a read-only open of
the mdev's VFIO group node (``/dev/vfio/<group>``, root 0600) shows that no VM
holds it: the kernel's ``remove`` would block until the holder lets go, and
the probe belongs next to the write it guards.  Everything else (scans, policy, ledger)
runs unprivileged; reads are never privileged (os-vif's style, see
research/cyborg-osacc-placement.md §3.4 and §7).

Capabilities: **none** (``capabilities=[]``), the daemon keeps uid 0.
    sysfs ``create``/``remove`` are ``--w------- root root``.  kernfs checks
    them with ``generic_permission()`` at open(2) time, like any file: the
    owner-write bit is enough for a process whose fsuid is the owner, so uid 0
    needs no capability at all (CAP_DAC_OVERRIDE only matters for a file the
    caller does not own or whose owner bit is clear).  The mdev core's
    ``create_store()``/``remove_store()`` call no ``capable()``.  Checked on
    this host (kernel 6.18): under ``setpriv --bounding-set=-all`` a uid-0
    process with ``CapEff: 0000000000000000`` opens the root-owned 0200
    ``/sys/bus/pci/drivers_probe`` with O_WRONLY (nothing written), while
    uid 65534 gets EACCES.  End to end on a real mdev sysfs (Debian 6.1.0-56
    kernel with the mtty sample driver under QEMU, research/mtty-lab.md):
    this module's privsep daemon, ``CapEff``/``CapPrm`` 0, uid 0, created and
    removed mtty mdevs and got EEXIST/ENOSPC/ENOENT mapped as documented.
    tests/functional/test_privsep_daemon.py reads the running daemon's
    ``CapEff``/``CapPrm`` (all threads) and proves the other half: a
    root-owned ``create`` of mode 0000 gives EACCES in the daemon, i.e. it
    really holds no CAP_DAC_OVERRIDE.
    Why not "uid nobody + CAP_DAC_OVERRIDE" (a tempting alternative): that
    writes *any* file on the host; uid 0 without capabilities cannot load
    modules, mount, ptrace, chown, or bypass a permission bit.  What it can
    still do is write root-owned files that have the owner-write bit, which is
    why the entrypoints accept only validated names and confine the resolved
    path to ``sysfs_root``.  The daemon never exec()s: an exec as uid 0 would
    regain the full set under the kernel's root-exec rule.  A vendor driver
    whose create path calls ``capable()`` (none known) can be given a
    capability by the operator: ``[accel_agent_privileged] capabilities``.
    Leave ``[accel_agent_privileged] user`` unset: another uid cannot write
    the root-owned 0200 files without CAP_DAC_OVERRIDE.

Inputs are validated before any filesystem access (even ``realpath``), by
plain functions that unit tests call without the daemon.  ``sysfs_root``
comes with each call from the agent's running configuration (an absolute,
normalised path), never from the config files on disk: the helper may be
restarted (oslo.privsep respawns it when it died) after an operator edited
them, and the agent keeps acting on the tree it started with until it is
restarted itself (``sysfs_root`` needs a restart).  A caller choosing the
root gains nothing it could not do anyway: the agent runs as root, and the
checks below (names validated, the path confined to that root, one link
per written file) hold for any root.  The path is resolved with
``realpath`` and must stay inside ``realpath(sysfs_root)``; between that check
and the ``open`` only whoever can change the tree itself (root, for /sys)
could swap a component, which is outside what a caller of the entrypoints
controls (``O_NOFOLLOW`` still refuses a last component turned symlink).

Errors cross the privsep channel by class name and ``args`` only, which would
lose an ``AccelAgentException``'s ``kwargs``.  So the daemon side wraps them
in :class:`_WireError` (class name, message, kwargs) and the public functions
below rebuild the original class with its message and kwargs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import shlex
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from oslo_config import cfg

from accel_agent import conf as agent_conf
from accel_agent import exception, privsep_guard
from accel_agent.sysfs import address

# oslo.privsep's daemon module imports eventlet, which prints its own
# deprecation notice on import.  The agent never uses eventlet (threading
# everywhere) and an operator can do nothing about it: keep it out of
# accelctl's and the daemon's output.
warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated", category=Warning)

from oslo_privsep import priv_context  # noqa: E402 - after the filter above

LOG = logging.getLogger(__name__)

CFG_SECTION = "accel_agent_privileged"

sysfs_admin = priv_context.PrivContext(
    "accel_agent",
    cfg_section=CFG_SECTION,
    pypath=__name__ + ".sysfs_admin",
    # See the module docstring: uid 0 writing root-owned 0200 files needs none.
    capabilities=[],
)

# Canonical form only: the kernel names mdev directories "%pUl" (lower case),
# so anything else would make the ledger and sysfs disagree on the name.
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TYPE_RE = re.compile(r"[A-Za-z0-9_.-]+")
MAX_TYPE_LEN = 64
MAX_PARENT_LEN = 64
# A remove waits at most this long per call; the manager retries if needed.
MAX_REMOVE_TIMEOUT = 3600.0


# --- validation (no filesystem access) ---------------------------------------------


def _reject(reason: str) -> exception.PrivilegedInputRejected:
    return exception.PrivilegedInputRejected(reason=reason)


def validate_uuid(value: Any) -> str:
    """Return ``value`` if it is a canonical lowercase 8-4-4-4-12 UUID."""
    # fullmatch, not match + "$": "$" also matches before a trailing newline.
    if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
        raise _reject(f"mdev UUID {value!r} is not a canonical lowercase UUID")
    return value


def validate_mdev_type(value: Any) -> str:
    """Return ``value`` if it is a plausible single-component type id."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_TYPE_LEN
        or not _TYPE_RE.fullmatch(value)
        or value in (".", "..")
    ):
        raise _reject(
            f"mdev type {value!r} must match [A-Za-z0-9_.-]+, at most {MAX_TYPE_LEN} "
            "characters, and not be . or .."
        )
    return value


def validate_parent(value: Any) -> str:
    """Return ``value`` if it is a canonical PCI address or a virtual parent name."""
    if not isinstance(value, str) or not value or len(value) > MAX_PARENT_LEN:
        raise _reject(f"mdev parent {value!r} is empty, not a string or too long")
    # is_virtual_parent_name() uses re.match with "$", which tolerates a
    # trailing newline; refuse every non-printable or blank character first.
    if "/" in value or not value.isprintable() or any(c.isspace() for c in value):
        raise _reject(f"mdev parent {value!r} contains '/', whitespace or control characters")
    if address.is_pci_address(value):
        canonical = address.parse_pci_address(value)
        if canonical != value:
            # The kernel names PCI parents in canonical form only; a
            # non-canonical spelling would silently miss the directory.
            raise _reject(f"mdev parent {value!r} is not canonical (use {canonical!r})")
        return value
    if address.is_virtual_parent_name(value):
        return value
    raise _reject(f"mdev parent {value!r} is neither a PCI address nor a parent name")


MAX_ROOT_LEN = 4096


def validate_sysfs_root(value: Any) -> str:
    """Return ``value`` if it is an absolute, normalised path of printable
    characters (no ``..``, no ``//``, no trailing ``/``): what the agent's
    configuration accepts as ``sysfs_root``.  Whether it is a directory is
    checked where it is used."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ROOT_LEN
        or not value.isprintable()
        or not os.path.isabs(value)
        or os.path.normpath(value) != value
    ):
        raise _reject(f"sysfs root {value!r} is not an absolute, normalised path")
    return value


def validate_vfio_dev_dir(value: Any) -> str:
    """``""`` (derived from the root) or an absolute, normalised path, like
    :func:`validate_sysfs_root`: the in-use probe only opens ``<it>/<digits>``
    read-only, but never a path the caller could steer with ``..``."""
    if value == "":
        return value
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ROOT_LEN
        or not value.isprintable()
        or not os.path.isabs(value)
        or os.path.normpath(value) != value
    ):
        raise _reject(f"vfio device directory {value!r} is not an absolute, normalised path")
    return value


def validate_timeout(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_REMOVE_TIMEOUT
    ):
        raise _reject(f"remove timeout {value!r} must be a number in (0, {MAX_REMOVE_TIMEOUT}]")
    return float(value)


# --- path resolution (reads only) ------------------------------------------------


def _real_root(sysfs_root: str) -> str:
    root = os.path.realpath(sysfs_root)
    if not os.path.isdir(root):
        raise exception.SysfsRootNotFound(root=sysfs_root)
    return root


def _confine(root: str, relative: Sequence[str], basename: str, dirname: str) -> str:
    """Resolve ``root/relative`` and refuse it unless it stays under ``root``.

    The links under /sys/class/mdev_bus and /sys/bus/mdev/devices are
    legitimately symlinks (``../../devices/...``), so resolution is allowed,
    but only to a target inside the root whose last two components are the
    ones we asked for (``<type>/create`` or ``<uuid>/remove``).
    """
    target = os.path.realpath(os.path.join(root, *relative))
    if os.path.commonpath([root, target]) != root or target == root:
        raise _reject(f"{os.path.join(*relative)} resolves to {target}, outside {root}")
    if os.path.basename(target) != basename or (
        os.path.basename(os.path.dirname(target)) != dirname
    ):
        raise _reject(
            f"{os.path.join(*relative)} resolves to {target}, not .../{dirname}/{basename}"
        )
    return target


def resolve_create_path(sysfs_root: str, parent: str, mdev_type: str) -> str:
    """Validate, then return the resolved path of the type's ``create`` file."""
    validate_parent(parent)
    validate_mdev_type(mdev_type)
    root = _real_root(sysfs_root)
    rel = ("class", "mdev_bus", parent, "mdev_supported_types", mdev_type, "create")
    return _confine(root, rel, "create", mdev_type)


def resolve_remove_path(sysfs_root: str, uuid: str) -> str:
    """Validate, then return the resolved path of the mdev's ``remove`` file."""
    validate_uuid(uuid)
    root = _real_root(sysfs_root)
    return _confine(root, ("bus", "mdev", "devices", uuid, "remove"), "remove", uuid)


# --- the writes ------------------------------------------------------------------


def _refuse_hard_link(fd: int, path: str) -> None:
    """A ``create``/``remove`` has one link, like every sysfs attribute.  A
    second one means the name under the root is a hard link to some other
    file (resolving the path cannot see that: there is no link to resolve),
    and writing a UUID there would write it outside the tree."""
    links = os.fstat(fd).st_nlink
    if links > 1:
        raise _reject(f"{path} has {links} links (a sysfs file has one); not written")


def _write_once(path: str, data: bytes) -> None:
    """Open an existing file (never create one), write once, close.

    A ``create`` is opened with O_NONBLOCK: a FIFO in its place fails (ENXIO)
    instead of blocking a call that has no timeout (kernfs ignores the flag).
    A ``remove`` may block anyway (the kernel holds it while a VM uses the
    device), so it runs under a timeout in its own thread (_RemoveWriter).
    """
    # No O_CREAT: a missing file must fail, never appear.  O_NOFOLLOW: the
    # path was resolved already, so a symlink here means it changed under us.
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if os.path.basename(path) != "remove":
        flags |= os.O_NONBLOCK
    fd = os.open(path, flags)
    try:
        _refuse_hard_link(fd, path)
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        # sysfs stores consume the whole buffer or fail; anything else is not
        # the kernel ABI we know, so do not pretend it worked.
        raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")


def _errno_text(err: OSError) -> tuple[str, str]:
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    return name, f"{name} ({os.strerror(err.errno)})" if err.errno else str(err)


def _map_create_error(
    err: OSError, root: str, path: str, parent: str, mdev_type: str, uuid: str
) -> exception.AccelAgentException:
    code = err.errno
    name, text = _errno_text(err)
    if code == errno.EEXIST:
        return exception.MdevAlreadyExists(uuid=uuid)
    if code == errno.EINVAL:
        return exception.MdevCreateInvalid(uuid=uuid, mdev_type=mdev_type, parent=parent)
    if code in (errno.ENOSPC, errno.EUSERS, errno.EDQUOT):
        # mtty/i915 say ENOSPC, the mdev core EUSERS; EDQUOT for vendors that do.
        return exception.InsufficientCapacity(mdev_type=mdev_type, parents=parent, reason=text)
    if code == errno.ENODEV:
        return exception.ParentGone(parent=parent)
    if code == errno.ENOENT:
        # Tell the two missing levels apart (a stat, no write); a dangling
        # parent link is a parent that went away.
        if not os.path.isdir(os.path.join(root, "class", "mdev_bus", parent)):
            return exception.ParentNotFound(parent=parent, root=root)
        return exception.MdevTypeNotSupported(parent=parent, mdev_type=mdev_type)
    if code == errno.ELOOP:
        return _reject(f"{path} became a symlink after it was resolved")
    return exception.SysfsWriteFailed(path=path, error=text, errno=name)


def write_create(sysfs_root: str, parent: str, mdev_type: str, uuid: str) -> None:
    """Create mdev ``uuid`` of ``mdev_type`` on ``parent`` (undecorated)."""
    validate_uuid(uuid)
    path = resolve_create_path(sysfs_root, parent, mdev_type)
    LOG.debug("Writing %s to %s", uuid, path)
    try:
        _write_once(path, uuid.encode("ascii"))
    except OSError as err:
        raise _map_create_error(
            err, _real_root(sysfs_root), path, parent, mdev_type, uuid
        ) from None
    LOG.info("Created mediated device %s of type %s on %s", uuid, mdev_type, parent)


def _map_remove_error(err: OSError, path: str, uuid: str) -> exception.AccelAgentException:
    name, text = _errno_text(err)
    if err.errno == errno.ENOENT:
        return exception.MdevNotFound(uuid=uuid)
    if err.errno == errno.ENODEV:
        # Not on the mdev list any more, or its parent is unregistering.
        return exception.ParentGone(parent=os.path.basename(os.path.dirname(os.path.dirname(path))))
    if err.errno == errno.ELOOP:
        return _reject(f"{path} became a symlink after it was resolved")
    return exception.SysfsWriteFailed(path=path, error=text, errno=name)


class _RemoveWriter:
    """One blocking write that unmakes a device, run in its own thread.

    A write to ``remove`` of an mdev that a VM holds blocks in the kernel
    (vfio_unregister_group_dev) until QEMU lets go, uninterruptibly after the
    first signal (a vendor driver's ``current_vgpu_type`` ``0`` may do the
    same).  The thread cannot be cancelled, so the caller waits with a
    timeout and the thread is left to finish whenever the kernel allows; at
    most one such thread exists per device (a retry waits on the same writer
    rather than piling up threads and writes).
    """

    def __init__(
        self,
        key: str,
        path: str,
        data: bytes = b"1",
        map_error: Callable[[OSError], exception.AccelAgentException] | None = None,
    ) -> None:
        self.key = key
        self.path = path
        self.data = data
        self._map_error = map_error or (lambda err: _map_remove_error(err, path, key))
        self.done = threading.Event()
        self.error: exception.AccelAgentException | None = None
        self.thread = threading.Thread(target=self._run, name=f"remove-{key}", daemon=True)

    def _run(self) -> None:
        try:
            _write_once(self.path, self.data)
        except OSError as err:
            self.error = self._map_error(err)
        except exception.AccelAgentException as err:  # refused (_refuse_hard_link)
            self.error = err
        except Exception as err:  # a bug must still release the waiters
            self.error = exception.SysfsWriteFailed(path=self.path, error=repr(err), errno="")
        finally:
            with _pending_lock:
                if _pending_removes.get(self.key) is self:
                    del _pending_removes[self.key]
            self.done.set()


_pending_lock = threading.Lock()
_pending_removes: dict[str, _RemoveWriter] = {}


def vfio_dev_dir(sysfs_root: str, configured: str = "") -> str:
    """Where the VFIO group nodes of ``sysfs_root``'s devices live:
    ``configured`` when set, ``/dev/vfio`` for the real /sys, else
    ``<sysfs_root>/vfio`` (the simulator serves its group nodes there)."""
    if configured:
        return configured
    if os.path.realpath(sysfs_root) == "/sys":
        return "/dev/vfio"
    return os.path.join(sysfs_root, "vfio")


def _iommu_group(root: str, device: Sequence[str], what: str) -> str | None:
    """The IOMMU group number of the device at ``root/device``, or None when
    it has none (no VFIO driver bound: nothing can hold it through VFIO)."""
    link = os.path.join(root, *device, "iommu_group")
    try:
        target = os.path.realpath(link, strict=True)
    except OSError:
        return None
    group = os.path.basename(target)
    if os.path.commonpath([root, target]) != root or not group.isdigit():
        raise _reject(f"the iommu_group of {what} resolves to {target}, not a group")
    return group


def _probe_group(
    sysfs_root: str,
    device: Sequence[str],
    what: str,
    vfio_dir: str,
    in_use: Callable[[str], exception.AccelAgentException],
) -> None:
    """Raise ``in_use(reason)`` unless the VFIO group of the device at
    ``device`` (relative to the root) can be opened now (check_not_in_use)."""
    root = _real_root(sysfs_root)
    group = _iommu_group(root, device, what)
    if group is None:
        return
    directory = vfio_dev_dir(sysfs_root, vfio_dir)
    node = os.path.join(directory, group)
    try:
        fd = os.open(node, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.EBUSY:
            raise in_use(
                f"its VFIO group {node} is open (a VM or another process holds it); "
                "kept, not removed"
            ) from None
        if err.errno == errno.ENOENT and os.path.isdir(directory):
            return  # no group node: VFIO does not offer the device to anyone
        _, text = _errno_text(err)
        raise in_use(
            f"cannot check whether it is in use: opening {node} failed with {text}; "
            "kept, not removed"
        ) from None
    os.close(fd)


def check_not_in_use(sysfs_root: str, uuid: str, vfio_dir: str = "") -> None:
    """Raise MdevInUse unless the mdev's VFIO group can be opened now.

    libvirt's own test (virNodeDeviceDestroy, virHostdevIsPCINodeDeviceUsed):
    the kernel lets one process at a time open ``/dev/vfio/<group>``, so an
    open that fails with EBUSY means a VM (or anything else) holds the
    device, and a ``remove`` write would block until it lets go.  The probe
    holds the group for the instant of one open/close.  A group node that
    cannot be checked at all (directory hidden by a sandbox, EACCES) counts
    as in use: keeping a free mdev is harmless, a blocked remove is not.
    A holder that arrives after the probe is caught by the remove timeout.
    """
    validate_uuid(uuid)
    _probe_group(
        sysfs_root,
        ("bus", "mdev", "devices", uuid),
        f"mdev {uuid}",
        vfio_dir,
        lambda reason: exception.MdevInUse(uuid=uuid, reason=reason),
    )


def write_remove(sysfs_root: str, uuid: str, timeout: float, vfio_dir: str = "") -> None:
    """Remove mdev ``uuid`` unless it is in use; raise MdevRemoveTimeout
    after ``timeout`` s (undecorated).

    MdevInUse when :func:`check_not_in_use` finds its VFIO group held: no
    write at all.  On timeout the writer thread stays blocked in the kernel
    until the device is released (then the removal completes on its own);
    this call returns.
    """
    timeout = validate_timeout(timeout)
    path = resolve_remove_path(sysfs_root, uuid)
    with _pending_lock:
        writer = _pending_removes.get(uuid)
        if writer is None:
            # Under the lock: no second writer can start between probe and write.
            check_not_in_use(sysfs_root, uuid, vfio_dir)
            writer = _RemoveWriter(uuid, path)
            _pending_removes[uuid] = writer
            LOG.debug("Writing 1 to %s", path)
            writer.thread.start()
        else:
            LOG.warning("A remove of %s is still blocked in the kernel; waiting on it", uuid)
    if not writer.done.wait(timeout):
        raise exception.MdevRemoveTimeout(uuid=uuid, timeout=timeout)
    if writer.error is not None:
        raise writer.error
    LOG.info("Removed mediated device %s", uuid)


# --- NVIDIA vGPU 17+: typing an SR-IOV VF (vendor-specific VFIO) ------------------
#
# research vendor-vfio-and-sriov.md §3-5: writing a type id to a VF's
# ``nvidia/current_vgpu_type`` creates its vGPU, writing ``0`` destroys it.
# The id is written without a newline and read back; a VF is typed only when
# it is free and lists the id in ``creatable_vgpu_types`` right now (both
# re-read here, just before the write), and untyped only when its VFIO group
# is not held.

MAX_VGPU_TYPE_ID = 999_999
_VGPU_READ_MAX = 65536  # creatable_vgpu_types of a card with many types


def validate_vf(value: Any) -> str:
    """A VF is named by its canonical PCI address only (``0000:c1:00.4``)."""
    if (
        not isinstance(value, str)
        or not address.is_pci_address(value)
        or address.parse_pci_address(value) != value
    ):
        raise _reject(f"VF {value!r} is not a canonical PCI address (DDDD:BB:SS.F)")
    return value


def validate_vgpu_type_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 < value <= MAX_VGPU_TYPE_ID
    ):
        raise _reject(f"vGPU type id {value!r} must be an integer in 1..{MAX_VGPU_TYPE_ID}")
    return value


def resolve_vgpu_type_path(sysfs_root: str, vf: str) -> str:
    """Validate, then return the resolved ``current_vgpu_type`` of VF ``vf``:
    inside the root, in the ``nvidia`` directory of the device named ``vf``."""
    validate_vf(vf)
    root = _real_root(sysfs_root)
    rel = ("bus", "pci", "devices", vf, "nvidia", "current_vgpu_type")
    path = _confine(root, rel, "current_vgpu_type", "nvidia")
    if os.path.basename(os.path.dirname(os.path.dirname(path))) != vf:
        raise _reject(f"{os.path.join(*rel)} resolves to {path}, not the device {vf}")
    return path


def _read_small(path: str) -> str:
    """Read an attribute of the vendor's directory (a regular file, never
    followed, never blocking); OSError as the kernel answers."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _reject(f"{path} is not a regular file; not read")
        return os.pread(fd, _VGPU_READ_MAX, 0).decode("ascii", "replace")
    finally:
        os.close(fd)


def _current_type(path: str, vf: str) -> int:
    text = _read_small(path).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise exception.VgpuTypeWriteFailed(
            vf=vf, mdev_type="", answer=f"current_vgpu_type reads {text!r}, not a type id"
        )
    return int(text)


def _creatable_ids(path: str) -> set[int]:
    ids = set()
    for line in _read_small(path).splitlines():
        head = line.split(":", 1)[0].strip() if ":" in line else line.strip().split(" ")[0]
        if head.isascii() and head.isdigit() and len(head) <= 6:
            ids.add(int(head))
    return ids


def write_vgpu_type(sysfs_root: str, vf: str, type_id: int) -> None:
    """Type VF ``vf`` with vGPU type ``type_id`` (undecorated).

    Refused, nothing written: the VF already typed (VfAlreadyTyped), or the
    type not creatable on it now (InsufficientCapacity naming the VF).  The
    kernel's refusal is VgpuTypeWriteFailed with its errno; a read-back that
    differs writes ``0`` again and is VgpuTypeMismatch.
    """
    validate_vgpu_type_id(type_id)
    path = resolve_vgpu_type_path(sysfs_root, vf)
    name = f"nvidia-{type_id}"
    try:
        current = _current_type(path, vf)
        if current:
            raise exception.VfAlreadyTyped(vf=vf, found=f"nvidia-{current}")
        creatable = _creatable_ids(os.path.join(os.path.dirname(path), "creatable_vgpu_types"))
    except OSError as err:
        raise exception.VgpuTypeWriteFailed(
            vf=vf, mdev_type=name, answer=f"reading its nvidia/ files: {_errno_text(err)[1]}"
        ) from None
    if type_id not in creatable:
        raise exception.InsufficientCapacity(
            mdev_type=name, parents=vf,
            reason=f"VF {vf} does not list {type_id} in creatable_vgpu_types now",
        )
    LOG.debug("Writing %d to %s", type_id, path)
    try:
        _write_once(path, str(type_id).encode("ascii"))  # no newline (research §3)
    except OSError as err:
        raise exception.VgpuTypeWriteFailed(
            vf=vf, mdev_type=name, answer=_errno_text(err)[1]
        ) from None
    try:
        found = _current_type(path, vf)
    except OSError as err:
        found, why = -1, _errno_text(err)[1]
    else:
        why = f"it reads {found}"
    if found != type_id:
        with contextlib.suppress(OSError, exception.AccelAgentException):
            _write_once(path, b"0")
        raise exception.VgpuTypeMismatch(vf=vf, mdev_type=name, found=why)
    LOG.info("Created vGPU %s on VF %s", name, vf)


def _map_clear_error(err: OSError, path: str, vf: str) -> exception.AccelAgentException:
    if err.errno == errno.ENOENT:
        return exception.MdevNotFound(uuid=f"vGPU on VF {vf}")
    if err.errno == errno.EBUSY:
        return exception.VfInUse(vf=vf, reason="the driver answered EBUSY; kept")
    if err.errno == errno.ELOOP:
        return _reject(f"{path} became a symlink after it was resolved")
    return exception.VgpuTypeWriteFailed(vf=vf, mdev_type="0", answer=_errno_text(err)[1])


def write_vgpu_clear(sysfs_root: str, vf: str, timeout: float, vfio_dir: str = "") -> None:
    """Destroy the vGPU of VF ``vf`` (write ``0``) unless its VFIO group is
    held (VfInUse, nothing written); an untyped VF is done already.  Raises
    MdevRemoveTimeout when the write is still blocked after ``timeout``."""
    timeout = validate_timeout(timeout)
    path = resolve_vgpu_type_path(sysfs_root, vf)
    try:
        if _current_type(path, vf) == 0:
            return
    except OSError as err:
        raise _map_clear_error(err, path, vf) from None
    key = f"vf:{vf}"
    with _pending_lock:
        writer = _pending_removes.get(key)
        if writer is None:
            _probe_group(
                sysfs_root,
                ("bus", "pci", "devices", vf),
                f"VF {vf}",
                vfio_dir,
                lambda reason: exception.VfInUse(vf=vf, reason=reason),
            )
            writer = _RemoveWriter(key, path, b"0", lambda err: _map_clear_error(err, path, vf))
            _pending_removes[key] = writer
            writer.thread.start()
    if not writer.done.wait(timeout):
        raise exception.MdevRemoveTimeout(uuid=f"vGPU on VF {vf}", timeout=timeout)
    if writer.error is not None:
        raise writer.error
    try:
        found = _current_type(path, vf)
    except OSError as err:
        raise _map_clear_error(err, path, vf) from None
    if found:
        raise exception.VgpuTypeMismatch(vf=vf, mdev_type="0", found=f"it reads {found}")
    LOG.info("Destroyed the vGPU of VF %s", vf)


# --- crossing the privsep channel ------------------------------------------------


class _WireError(Exception):
    """Carries an AccelAgentException over privsep: (class name, message, kwargs).

    oslo.privsep rebuilds a remote exception as ``cls(*exc.args)``; ours keep
    only the message in ``args``, so the kwargs would be lost.  Never escapes
    this module's public functions.
    """


def _primitive(value: Any) -> Any:
    # msgpack carries these natively; anything else travels as its str().
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _to_wire(exc: exception.AccelAgentException) -> _WireError:
    kwargs = {str(k): _primitive(v) for k, v in exc.kwargs.items()}
    return _WireError(type(exc).__name__, exc.message, kwargs)


def _from_wire(wire: _WireError) -> exception.AccelAgentException:
    name, message, kwargs = wire.args
    cls = getattr(exception, name, None)
    if not (isinstance(cls, type) and issubclass(cls, exception.AccelAgentException)):
        return exception.AccelAgentException(f"{name}: {message}")
    return cls(message, **kwargs)


_R = TypeVar("_R")


def _daemon_side(func: Callable[[], _R]) -> _R:
    try:
        return func()
    except exception.AccelAgentException as exc:
        raise _to_wire(exc) from None


def _daemon_sysfs_root(given: str | None) -> str:
    """The root this call acts on: the agent's, validated (see the module
    docstring), else the daemon's own CONF, parsed from the --config-file it
    was started with (a caller with no configuration of its own)."""
    if given is not None:
        return validate_sysfs_root(given)
    return str(agent_conf.CONF.sysfs_root)


@sysfs_admin.entrypoint
def _priv_create_mdev(
    parent: str, mdev_type: str, uuid: str, sysfs_root: str | None = None
) -> None:
    _daemon_side(
        lambda: write_create(_daemon_sysfs_root(sysfs_root), parent, mdev_type, uuid)
    )


@sysfs_admin.entrypoint
def _priv_remove_mdev(
    uuid: str, timeout: float, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    # Like sysfs_root: the agent's value, validated; the helper's own config
    # only for a caller that has none.
    _daemon_side(
        lambda: write_remove(
            _daemon_sysfs_root(sysfs_root),
            uuid,
            timeout,
            validate_vfio_dev_dir(vfio_dir)
            if vfio_dir is not None
            else str(agent_conf.CONF.vfio_dev_dir),
        )
    )


@sysfs_admin.entrypoint
def _priv_set_vgpu_type(vf: str, type_id: int, sysfs_root: str | None = None) -> None:
    _daemon_side(lambda: write_vgpu_type(_daemon_sysfs_root(sysfs_root), vf, type_id))


@sysfs_admin.entrypoint
def _priv_clear_vgpu_type(
    vf: str, timeout: float, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    _daemon_side(
        lambda: write_vgpu_clear(
            _daemon_sysfs_root(sysfs_root),
            vf,
            timeout,
            validate_vfio_dev_dir(vfio_dir)
            if vfio_dir is not None
            else str(agent_conf.CONF.vfio_dev_dir),
        )
    )


@sysfs_admin.entrypoint
def _priv_pid() -> int:
    """The helper's own pid: the guard kills a helper that misses a deadline."""
    return os.getpid()


# One guard per privsep context (accel_agent.privsep_guard): every call has a
# deadline, a helper that misses one or dies is killed and started again.
_guards: dict[int, privsep_guard.Guard] = {}
# [DEFAULT] privileged_call_timeout, as the agent runs with it (set_call_timeout).
_call_timeout = [privsep_guard.DEFAULT_CALL_TIMEOUT]


def set_call_timeout(seconds: float) -> None:
    """The deadline of every privileged call from now on (start and reload)."""
    _call_timeout[0] = float(seconds)


def register_guard(
    context: priv_context.PrivContext, name: str, section: str, pid_entrypoint: Callable[..., int]
) -> privsep_guard.Guard:
    guard = privsep_guard.Guard(
        context,
        name,
        start=lambda: _start_raw(context, section),
        pid_entrypoint=pid_entrypoint,
        call_timeout=lambda: _call_timeout[0],
    )
    _guards[id(context)] = guard
    return guard


def guard_of(context: priv_context.PrivContext) -> privsep_guard.Guard:
    return _guards[id(context)]


def guards() -> list[privsep_guard.Guard]:
    return list(_guards.values())


def _call(entrypoint: Callable[..., Any], *args: Any, wait: float = 0.0, **kwargs: Any) -> Any:
    """``entrypoint`` through its context's guard (a deadline of the call
    timeout plus ``wait``, what the call itself may wait for in the helper)."""
    context = getattr(entrypoint, priv_context._ENTRYPOINT_ATTR)
    try:
        return guard_of(context).call(entrypoint, *args, wait=wait, **kwargs)
    except _WireError as wire:
        raise _from_wire(wire) from None


def create_mdev(parent: str, mdev_type: str, uuid: str, *, sysfs_root: str | None = None) -> None:
    """Create mdev ``uuid`` of ``mdev_type`` on ``parent`` in the privsep daemon,
    under ``sysfs_root`` (the agent passes its own; None: the daemon's).

    Raises PrivilegedInputRejected, MdevAlreadyExists (EEXIST), MdevCreateInvalid
    (EINVAL), InsufficientCapacity (ENOSPC/EUSERS/EDQUOT), ParentGone (ENODEV),
    ParentNotFound / MdevTypeNotSupported (ENOENT), SysfsWriteFailed (other).
    """
    _call(_priv_create_mdev, parent, mdev_type, uuid, sysfs_root=sysfs_root)


def remove_mdev(
    uuid: str, timeout: float, *, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    """Remove mdev ``uuid`` in the privsep daemon, waiting at most ``timeout`` s,
    under ``sysfs_root`` (the agent passes its own; None: the daemon's).

    Raises PrivilegedInputRejected, MdevInUse (its VFIO group is held: nothing
    written), MdevNotFound (ENOENT), ParentGone (ENODEV), MdevRemoveTimeout (the
    write is still blocked: a VM holds the device), SysfsWriteFailed (other).
    """
    _call(_priv_remove_mdev, uuid, timeout, sysfs_root=sysfs_root, vfio_dir=vfio_dir,
          wait=validate_timeout(timeout))


def set_vgpu_type(vf: str, type_id: int, *, sysfs_root: str | None = None) -> None:
    """Type VF ``vf`` with vGPU type ``type_id`` in the privsep daemon
    (:func:`write_vgpu_type`)."""
    _call(_priv_set_vgpu_type, vf, type_id, sysfs_root=sysfs_root)


def clear_vgpu_type(
    vf: str, timeout: float, *, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    """Destroy the vGPU of VF ``vf`` in the privsep daemon (:func:`write_vgpu_clear`)."""
    _call(_priv_clear_vgpu_type, vf, timeout, sysfs_root=sysfs_root, vfio_dir=vfio_dir,
          wait=validate_timeout(timeout))


# --- starting the daemon ---------------------------------------------------------


def helper_command(
    config_files: Sequence[str], config_dirs: Sequence[str] = (), as_root: bool | None = None
) -> str:
    """The command that starts privsep-helper with the agent's configuration.

    oslo.privsep appends ``--privsep_context`` and ``--privsep_sock_path``.
    The helper runs in this interpreter (not whatever ``privsep-helper`` is
    first on PATH) through accel_agent.privsep_helper, oslo.privsep's
    helper_main without eventlet's deprecation notice; ``sudo`` only when
    we are not root.
    """
    cmd = [sys.executable, "-m", "accel_agent.privsep_helper"]
    if as_root is None:
        as_root = os.geteuid() == 0
    if not as_root:
        cmd.insert(0, "sudo")
    for path in config_files:
        cmd += ["--config-file", os.path.abspath(path)]
    for path in config_dirs:
        cmd += ["--config-dir", os.path.abspath(path)]
    return shlex.join(cmd)


def start_context(
    context: priv_context.PrivContext,
    section: str,
    config_files: Sequence[str] | None = None,
    config_dirs: Sequence[str] | None = None,
) -> None:
    """Start one of the agent's privsep daemons now (ROOTWRAP method: exec
    privsep-helper), the same way for each context.

    Without arguments, the files CONF was parsed from are passed on.  An
    operator's ``[<section>] helper_command`` wins over ours.
    """
    _set_helper_command(section, config_files, config_dirs)
    guard_of(context).start()


def _set_helper_command(
    section: str, config_files: Sequence[str] | None, config_dirs: Sequence[str] | None
) -> None:
    if config_files is None:
        config_files = _conf_list("config_file")
    if config_dirs is None:
        config_dirs = _conf_list("config_dir")
    cfg.CONF.set_default("helper_command", helper_command(config_files, config_dirs), group=section)
    _commands_set.add(section)


# The sections whose helper command start_context set (else a first start by
# a call sets it from the files CONF was parsed from).
_commands_set: set[str] = set()


def _start_raw(context: priv_context.PrivContext, section: str) -> None:
    """What a guard runs to start its helper: oslo.privsep's start, with the
    command :func:`start_context` set (or, for a first start by a call, the
    files CONF was parsed from)."""
    if section not in _commands_set:
        _set_helper_command(section, None, None)
    context.start(priv_context.Method.ROOTWRAP)


def start_privsep(
    config_files: Sequence[str] | None = None, config_dirs: Sequence[str] | None = None
) -> None:
    """Start the sysfs writer's daemon (no capability): :func:`start_context`."""
    start_context(sysfs_admin, CFG_SECTION, config_files, config_dirs)


def stop_privsep() -> None:
    """Tell the daemon to exit (EOF on its channel); killed if it lingers."""
    guard_of(sysfs_admin).stop()


register_guard(sysfs_admin, "sysfs", CFG_SECTION, _priv_pid)


def _conf_list(name: str) -> list[str]:
    try:
        return list(getattr(cfg.CONF, name) or [])
    except cfg.NoSuchOptError:
        return []


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """oslo.privsep's options under our section, for oslo-config-generator."""
    return [(CFG_SECTION, list(priv_context.OPTS))]
