"""The mdev writer: a UUID to ``create``, ``1`` to ``remove``, in ``sysfs_admin``.

Write a UUID to ``.../mdev_supported_types/<type>/create`` and write ``1``
to ``bus/mdev/devices/<uuid>/remove``, the latter only after a read-only
open of the mdev's VFIO group node (``/dev/vfio/<group>``, root 0600) shows
that no VM holds it (inuse.py): the kernel's ``remove`` would block until
the holder lets go, and the probe belongs next to the write it guards.  The
kernel's errno becomes the agent's exception, as the public functions say.
"""

from __future__ import annotations

import errno
import logging
import os

from accel_agent import exception
from accel_agent.privileged.context import sysfs_admin
from accel_agent.privileged.inuse import probe_group
from accel_agent.privileged.lifecycle import call
from accel_agent.privileged.validate import (
    confine,
    real_root,
    reject,
    validate_mdev_type,
    validate_parent,
    validate_timeout,
    validate_uuid,
)
from accel_agent.privileged.wire import (
    daemon_side,
    daemon_sysfs_root,
    daemon_vfio_dir,
)
from accel_agent.privileged.writes import (
    RemoveWriter,
    errno_text,
    pending_lock,
    pending_removes,
    write_once,
)

LOG = logging.getLogger(__name__)


def resolve_create_path(sysfs_root: str, parent: str, mdev_type: str) -> str:
    """Validate, then return the resolved path of the type's ``create`` file."""
    validate_parent(parent)
    validate_mdev_type(mdev_type)
    root = real_root(sysfs_root)
    rel = ("class", "mdev_bus", parent, "mdev_supported_types", mdev_type, "create")
    return confine(root, rel, "create", mdev_type)


def resolve_remove_path(sysfs_root: str, uuid: str) -> str:
    """Validate, then return the resolved path of the mdev's ``remove`` file."""
    validate_uuid(uuid)
    root = real_root(sysfs_root)
    return confine(root, ("bus", "mdev", "devices", uuid, "remove"), "remove", uuid)


# --- create ------------------------------------------------------------------------


def _map_create_error(
    err: OSError, root: str, path: str, parent: str, mdev_type: str, uuid: str
) -> exception.AccelAgentException:
    code = err.errno
    name, text = errno_text(err)
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
        return reject(f"{path} became a symlink after it was resolved")
    return exception.SysfsWriteFailed(path=path, error=text, errno=name)


def write_create(sysfs_root: str, parent: str, mdev_type: str, uuid: str) -> None:
    """Create mdev ``uuid`` of ``mdev_type`` on ``parent`` (undecorated)."""
    validate_uuid(uuid)
    path = resolve_create_path(sysfs_root, parent, mdev_type)
    LOG.debug("Writing %s to %s", uuid, path)
    try:
        write_once(path, uuid.encode("ascii"))
    except OSError as err:
        raise _map_create_error(
            err, real_root(sysfs_root), path, parent, mdev_type, uuid
        ) from None
    LOG.info("Created mediated device %s of type %s on %s", uuid, mdev_type, parent)


# --- remove ------------------------------------------------------------------------


def _map_remove_error(err: OSError, path: str, uuid: str) -> exception.AccelAgentException:
    name, text = errno_text(err)
    if err.errno == errno.ENOENT:
        return exception.MdevNotFound(uuid=uuid)
    if err.errno == errno.ENODEV:
        # Not on the mdev list any more, or its parent is unregistering.
        return exception.ParentGone(parent=os.path.basename(os.path.dirname(os.path.dirname(path))))
    if err.errno == errno.ELOOP:
        return reject(f"{path} became a symlink after it was resolved")
    return exception.SysfsWriteFailed(path=path, error=text, errno=name)


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
    probe_group(
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
    with pending_lock:
        writer = pending_removes.get(uuid)
        if writer is None:
            # Under the lock: no second writer can start between probe and write.
            check_not_in_use(sysfs_root, uuid, vfio_dir)
            writer = RemoveWriter(uuid, path, b"1", lambda err: _map_remove_error(err, path, uuid))
            pending_removes[uuid] = writer
            LOG.debug("Writing 1 to %s", path)
            writer.thread.start()
        else:
            LOG.warning("A remove of %s is still blocked in the kernel; waiting on it", uuid)
    if not writer.done.wait(timeout):
        raise exception.MdevRemoveTimeout(uuid=uuid, timeout=timeout)
    if writer.error is not None:
        raise writer.error
    LOG.info("Removed mediated device %s", uuid)


# --- through the helper ------------------------------------------------------------


@sysfs_admin.entrypoint
def _priv_create_mdev(
    parent: str, mdev_type: str, uuid: str, sysfs_root: str | None = None
) -> None:
    daemon_side(lambda: write_create(daemon_sysfs_root(sysfs_root), parent, mdev_type, uuid))


@sysfs_admin.entrypoint
def _priv_remove_mdev(
    uuid: str, timeout: float, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    daemon_side(
        lambda: write_remove(
            daemon_sysfs_root(sysfs_root), uuid, timeout, daemon_vfio_dir(vfio_dir)
        )
    )


def create_mdev(parent: str, mdev_type: str, uuid: str, *, sysfs_root: str | None = None) -> None:
    """Create mdev ``uuid`` of ``mdev_type`` on ``parent`` in the privsep daemon,
    under ``sysfs_root`` (the agent passes its own; None: the daemon's).

    Raises PrivilegedInputRejected, MdevAlreadyExists (EEXIST), MdevCreateInvalid
    (EINVAL), InsufficientCapacity (ENOSPC/EUSERS/EDQUOT), ParentGone (ENODEV),
    ParentNotFound / MdevTypeNotSupported (ENOENT), SysfsWriteFailed (other).
    """
    call(_priv_create_mdev, parent, mdev_type, uuid, sysfs_root=sysfs_root)


def remove_mdev(
    uuid: str, timeout: float, *, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    """Remove mdev ``uuid`` in the privsep daemon, waiting at most ``timeout`` s,
    under ``sysfs_root`` (the agent passes its own; None: the daemon's).

    Raises PrivilegedInputRejected, MdevInUse (its VFIO group is held: nothing
    written), MdevNotFound (ENOENT), ParentGone (ENODEV), MdevRemoveTimeout (the
    write is still blocked: a VM holds the device), SysfsWriteFailed (other).
    """
    call(_priv_remove_mdev, uuid, timeout, sysfs_root=sysfs_root, vfio_dir=vfio_dir,
         wait=validate_timeout(timeout))
