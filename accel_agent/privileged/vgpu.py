"""The vGPU writer: NVIDIA vGPU 17+ types an SR-IOV VF (vendor-specific VFIO),
in ``sysfs_admin``.

docs/design.md §10.3: writing a type id to a VF's
``nvidia/current_vgpu_type`` creates its vGPU, writing ``0`` destroys it.
The id is written without a newline and read back; a VF is typed only when
it is free and lists the id in ``creatable_vgpu_types`` right now (both
re-read here, just before the write), and untyped only when its VFIO group
is not held (inuse.py).

A vGPU of a GPU in mixed-size mode is then placed: ``vgpu-placement-id=<id>``
written to the VF's ``nvidia/vgpu_params`` (NVIDIA vGPU 17 User Guide §2.12
gives this line for an mdev's vGPU; docs/design.md §16), and ``nvidia/placement_id``
read back.  The driver accepts any id and a wrong one is found only when the
guest fails to boot, so the read-back is what the agent trusts, and which
placement is right is the planner's (devices/placements.py), never decided here.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat

from accel_agent import exception
from accel_agent.privileged.context import sysfs_admin
from accel_agent.privileged.inuse import probe_vf_group
from accel_agent.privileged.lifecycle import call
from accel_agent.privileged.validate import (
    confine,
    real_root,
    reject,
    validate_placement_id,
    validate_timeout,
    validate_vf,
    validate_vgpu_type_id,
)
from accel_agent.privileged.wire import daemon_side, daemon_sysfs_root, daemon_vfio_dir
from accel_agent.privileged.writes import (
    RemoveWriter,
    errno_text,
    pending_lock,
    pending_removes,
    write_once,
)

LOG = logging.getLogger(__name__)

_VGPU_READ_MAX = 65536  # creatable_vgpu_types of a card with many types


def resolve_vgpu_type_path(sysfs_root: str, vf: str) -> str:
    """Validate, then return the resolved ``current_vgpu_type`` of VF ``vf``:
    inside the root, in the ``nvidia`` directory of the device named ``vf``."""
    validate_vf(vf)
    root = real_root(sysfs_root)
    rel = ("bus", "pci", "devices", vf, "nvidia", "current_vgpu_type")
    path = confine(root, rel, "current_vgpu_type", "nvidia")
    if os.path.basename(os.path.dirname(os.path.dirname(path))) != vf:
        raise reject(f"{os.path.join(*rel)} resolves to {path}, not the device {vf}")
    return path


def resolve_vgpu_file(sysfs_root: str, vf: str, name: str) -> str:
    """Another file of the VF's ``nvidia`` directory (``vgpu_params``,
    ``placement_id``), resolved and confined like ``current_vgpu_type``."""
    validate_vf(vf)
    root = real_root(sysfs_root)
    rel = ("bus", "pci", "devices", vf, "nvidia", name)
    path = confine(root, rel, name, "nvidia")
    if os.path.basename(os.path.dirname(os.path.dirname(path))) != vf:
        raise reject(f"{os.path.join(*rel)} resolves to {path}, not the device {vf}")
    return path


def _read_small(path: str) -> str:
    """Read an attribute of the vendor's directory (a regular file, never
    followed, never blocking); OSError as the kernel answers."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise reject(f"{path} is not a regular file; not read")
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
            vf=vf, mdev_type=name, answer=f"reading its nvidia/ files: {errno_text(err)[1]}"
        ) from None
    if type_id not in creatable:
        raise exception.InsufficientCapacity(
            mdev_type=name, parents=vf,
            reason=f"VF {vf} does not list {type_id} in creatable_vgpu_types now",
        )
    LOG.debug("Writing %d to %s", type_id, path)
    try:
        write_once(path, str(type_id).encode("ascii"))  # no newline (docs/design.md §10.3)
    except OSError as err:
        raise exception.VgpuTypeWriteFailed(
            vf=vf, mdev_type=name, answer=errno_text(err)[1]
        ) from None
    try:
        found = _current_type(path, vf)
    except OSError as err:
        found, why = -1, errno_text(err)[1]
    else:
        why = f"it reads {found}"
    if found != type_id:
        with contextlib.suppress(OSError, exception.AccelAgentException):
            write_once(path, b"0")
        raise exception.VgpuTypeMismatch(vf=vf, mdev_type=name, found=why)
    LOG.info("Created vGPU %s on VF %s", name, vf)


def _placement_read(path: str) -> int | None:
    """``nvidia/placement_id`` as an int; None when it is not one."""
    text = _read_small(path).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        return None
    return int(text)


def write_vgpu_placement(sysfs_root: str, vf: str, placement_id: int) -> None:
    """Place the vGPU of VF ``vf`` at ``placement_id`` (module docstring):
    ``vgpu-placement-id=<id>`` to ``nvidia/vgpu_params``, then
    ``nvidia/placement_id`` read back.

    Refused, nothing written: an untyped VF (VgpuPlacementWriteFailed).  The
    kernel's refusal is VgpuPlacementWriteFailed with its errno; a read-back
    that differs is VgpuPlacementMismatch (the vGPU is left as it is: the
    caller removes it, it holds no guest yet)."""
    placement_id = validate_placement_id(placement_id)
    current = resolve_vgpu_type_path(sysfs_root, vf)
    params = resolve_vgpu_file(sysfs_root, vf, "vgpu_params")
    readback = resolve_vgpu_file(sysfs_root, vf, "placement_id")
    try:
        typed = _current_type(current, vf)
    except OSError as err:
        raise exception.VgpuPlacementWriteFailed(
            vf=vf, placement_id=placement_id,
            answer=f"reading current_vgpu_type: {errno_text(err)[1]}") from None
    if not typed:
        raise exception.VgpuPlacementWriteFailed(
            vf=vf, placement_id=placement_id, answer="the VF holds no vGPU; nothing written")
    LOG.debug("Writing vgpu-placement-id=%d to %s", placement_id, params)
    try:
        write_once(params, f"vgpu-placement-id={placement_id}".encode("ascii"))
    except OSError as err:
        raise exception.VgpuPlacementWriteFailed(
            vf=vf, placement_id=placement_id, answer=errno_text(err)[1]) from None
    try:
        found = _placement_read(readback)
    except OSError as err:
        raise exception.VgpuPlacementMismatch(
            vf=vf, placement_id=placement_id,
            found=f"placement_id unreadable: {errno_text(err)[1]}") from None
    if found != placement_id:
        raise exception.VgpuPlacementMismatch(vf=vf, placement_id=placement_id,
                                              found=f"it reads {found}")
    LOG.info("Placed the vGPU of VF %s at placement %d", vf, placement_id)


def _map_clear_error(err: OSError, path: str, vf: str) -> exception.AccelAgentException:
    if err.errno == errno.ENOENT:
        return exception.MdevNotFound(uuid=f"vGPU on VF {vf}")
    if err.errno == errno.EBUSY:
        return exception.VfInUse(vf=vf, reason="the driver answered EBUSY; kept")
    if err.errno == errno.ELOOP:
        return reject(f"{path} became a symlink after it was resolved")
    return exception.VgpuTypeWriteFailed(vf=vf, mdev_type="0", answer=errno_text(err)[1])


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
    with pending_lock:
        writer = pending_removes.get(key)
        if writer is None:
            probe_vf_group(sysfs_root, vf, vfio_dir)
            writer = RemoveWriter(key, path, b"0", lambda err: _map_clear_error(err, path, vf))
            pending_removes[key] = writer
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


# --- through the helper ------------------------------------------------------------


@sysfs_admin.entrypoint
def _priv_set_vgpu_type(vf: str, type_id: int, sysfs_root: str | None = None) -> None:
    daemon_side(lambda: write_vgpu_type(daemon_sysfs_root(sysfs_root), vf, type_id))


@sysfs_admin.entrypoint
def _priv_set_vgpu_placement(vf: str, placement_id: int, sysfs_root: str | None = None) -> None:
    daemon_side(lambda: write_vgpu_placement(daemon_sysfs_root(sysfs_root), vf, placement_id))


@sysfs_admin.entrypoint
def _priv_clear_vgpu_type(
    vf: str, timeout: float, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    daemon_side(
        lambda: write_vgpu_clear(
            daemon_sysfs_root(sysfs_root), vf, timeout, daemon_vfio_dir(vfio_dir)
        )
    )


def set_vgpu_type(vf: str, type_id: int, *, sysfs_root: str | None = None) -> None:
    """Type VF ``vf`` with vGPU type ``type_id`` in the privsep daemon
    (:func:`write_vgpu_type`)."""
    call(_priv_set_vgpu_type, vf, type_id, sysfs_root=sysfs_root)


def set_vgpu_placement(vf: str, placement_id: int, *, sysfs_root: str | None = None) -> None:
    """Place the vGPU of VF ``vf`` in the privsep daemon (:func:`write_vgpu_placement`)."""
    call(_priv_set_vgpu_placement, vf, placement_id, sysfs_root=sysfs_root)


def clear_vgpu_type(
    vf: str, timeout: float, *, sysfs_root: str | None = None, vfio_dir: str | None = None
) -> None:
    """Destroy the vGPU of VF ``vf`` in the privsep daemon (:func:`write_vgpu_clear`)."""
    call(_priv_clear_vgpu_type, vf, timeout, sysfs_root=sysfs_root, vfio_dir=vfio_dir,
         wait=validate_timeout(timeout))
