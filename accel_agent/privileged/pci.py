"""The PCI writer: SR-IOV PFs and VFs, in ``sysfs_admin``.

``accel_agent.privileged.sysfs_admin`` (no capability, uid 0) writes these
too: ``sriov_numvfs`` and ``driver_override`` are root-owned 0644,
``bind``/``unbind``/``drivers_probe`` root-owned 0200, so the owner-write bit
is all a uid-0 process needs (the package's docstring has the proof).  The
same rules hold: inputs validated before any filesystem access (canonical
PCI addresses only, driver names of one component), every path resolved and
confined to ``sysfs_root`` with its last two components checked, files opened
without O_CREAT and with O_NOFOLLOW, one link each.

* :func:`write_num_vfs` -- ``sriov_numvfs``: N after 0 (the kernel answers
  EBUSY to M after N), never 0 while a VF is handed to ``vfio-pci`` (a VM
  may hold it: the kernel would block in ``vfio_unregister_group_dev``);
* :func:`write_bind_vfio` -- a VF to ``vfio-pci``: ``driver_override``, unbind
  from its driver, bind to ``vfio-pci``; undone on any failure;
* :func:`write_unbind_vfio` -- back: unless its VFIO group is held (the
  libvirt test, as for mdevs), unbind from ``vfio-pci``, clear the override,
  ``drivers_probe`` so its own driver takes it again.

Each is idempotent: a VF already where it is asked to go is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re

from accel_agent import exception
from accel_agent.privileged.context import sysfs_admin
from accel_agent.privileged.inuse import probe_vf_group
from accel_agent.privileged.lifecycle import call
from accel_agent.privileged.validate import (
    confine,
    real_root,
    reject,
    validate_count,
    validate_pci,
)
from accel_agent.privileged.wire import daemon_side, daemon_sysfs_root, daemon_vfio_dir
from accel_agent.privileged.writes import errno_text, write_once

VFIO_PCI = "vfio-pci"
_DRIVER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _device_file(root: str, address: str, name: str) -> str:
    return confine(root, ("bus", "pci", "devices", address, name), name, address)


def _device_dir(root: str, address: str) -> str:
    path = os.path.realpath(os.path.join(root, "bus", "pci", "devices", address))
    if os.path.commonpath([root, path]) != root or os.path.basename(path) != address:
        raise reject(f"bus/pci/devices/{address} resolves to {path}, outside {root}")
    if not os.path.isdir(path):
        raise exception.PciDeviceNotFound(address=address, root=root)
    return path


def _driver_file(root: str, driver: str, name: str) -> str:
    if not _DRIVER_RE.fullmatch(driver) or driver in (".", ".."):
        raise reject(f"driver name {driver!r} is not one path component")
    directory = os.path.join(root, "bus", "pci", "drivers", driver)
    if not os.path.isdir(directory):
        raise exception.PciDriverNotLoaded(driver=driver, path=directory)
    return confine(root, ("bus", "pci", "drivers", driver, name), name, driver)


def _probe_file(root: str) -> str:
    return confine(root, ("bus", "pci", "drivers_probe"), "drivers_probe", "pci")


def current_driver(root: str, address: str) -> str | None:
    """The driver bound to the device now (its ``driver`` link), or None."""
    link = os.path.join(_device_dir(root, address), "driver")
    try:
        return os.path.basename(os.readlink(link))
    except FileNotFoundError:
        return None


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read(4096).strip()


def _vfs_of(root: str, pf: str) -> list[str]:
    device = _device_dir(root, pf)
    found = []
    for name in os.listdir(device):
        if name.startswith("virtfn") and name[6:].isdigit():
            found.append(os.path.basename(os.readlink(os.path.join(device, name))))
    return sorted(found)


# --- sriov_numvfs ------------------------------------------------------------------


def _numvfs_error(pf: str, count: int, err: OSError) -> exception.SriovNumVfsRefused:
    name, text = errno_text(err)
    return exception.SriovNumVfsRefused(pf=pf, count=count, errno=name, error=text)


def write_num_vfs(sysfs_root: str, pf: str, count: int) -> int:
    """Make PF ``pf`` have ``count`` VFs; returns how many it had."""
    validate_pci(pf)
    validate_count(count)
    root = real_root(sysfs_root)
    path = _device_file(root, pf, "sriov_numvfs")
    try:
        current = int(_read(path) or "0")
    except (OSError, ValueError):
        raise exception.NotSriovPf(address=pf, reason="sriov_numvfs is not readable") from None
    if current == count:
        return current
    if current:
        handed = [vf for vf in _vfs_of(root, pf) if current_driver(root, vf) == VFIO_PCI]
        if handed:
            raise exception.VfsHandedOver(pf=pf, vfs=", ".join(handed))
        try:
            write_once(path, b"0")
        except OSError as err:
            raise _numvfs_error(pf, count, err) from None
    if count:
        try:
            write_once(path, str(count).encode("ascii"))
        except OSError as err:
            raise _numvfs_error(pf, count, err) from None
    found = int(_read(path) or "0")
    if found != count:
        raise exception.SriovNumVfsRefused(
            pf=pf, count=count, errno="", error=f"sriov_numvfs reads {found} after the write"
        )
    return current


# --- the hand-over to vfio-pci and back ----------------------------------------------


def _step(action: str, vf: str, step: str, err: OSError) -> exception.PciRebindFailed:
    name, text = errno_text(err)
    return exception.PciRebindFailed(action=action, address=vf, step=step, errno=name, error=text)


def _is_vf(root: str, vf: str) -> None:
    if not os.path.islink(os.path.join(_device_dir(root, vf), "physfn")):
        raise exception.NotSriovVf(address=vf)


def write_bind_vfio(sysfs_root: str, vf: str) -> None:
    """Hand VF ``vf`` to ``vfio-pci`` (idempotent); on failure its own driver
    gets it back and PciRebindFailed names the step and the errno."""
    validate_pci(vf)
    root = real_root(sysfs_root)
    _is_vf(root, vf)
    override = _device_file(root, vf, "driver_override")
    bind = _driver_file(root, VFIO_PCI, "bind")
    driver = current_driver(root, vf)
    if driver == VFIO_PCI:
        return
    action = f"hand-over to {VFIO_PCI}"
    try:
        # driver_override first: once unbound, nothing but vfio-pci may take it
        # (a udev rule or drivers_autoprobe would give it back to igbvf).
        write_once(override, VFIO_PCI.encode())
    except OSError as err:
        raise _step(action, vf, "driver_override", err) from None
    step = "unbind"
    try:
        if driver is not None:
            write_once(_driver_file(root, driver, "unbind"), vf.encode())
        step = "bind"
        write_once(bind, vf.encode())
    except OSError as err:
        _give_back(root, vf)
        raise _step(action, vf, f"{step} ({driver or 'no driver'})", err) from None
    if current_driver(root, vf) != VFIO_PCI:
        _give_back(root, vf)
        raise exception.PciRebindFailed(
            action=action,
            address=vf,
            step="read-back",
            errno="",
            error=f"bound to {current_driver(root, vf)}",
        )


def _give_back(root: str, vf: str) -> None:
    """Best effort: clear the override and let the kernel probe the VF."""
    with contextlib.suppress(OSError, exception.AccelAgentException):
        write_once(_device_file(root, vf, "driver_override"), b"\n")
    with contextlib.suppress(OSError, exception.AccelAgentException):
        if current_driver(root, vf) is None:
            write_once(_probe_file(root), vf.encode())


def write_unbind_vfio(
    sysfs_root: str, vf: str, vfio_dir: str = "", give_back: bool = True
) -> str | None:
    """Give VF ``vf`` back to its own driver (idempotent); VfInUse when its
    VFIO group is held (nothing written).  ``give_back=False``: only take it
    off vfio-pci.  Returns the driver it ends on."""
    if not isinstance(give_back, bool):
        raise reject(f"give_back={give_back!r} is not a boolean")
    validate_pci(vf)
    root = real_root(sysfs_root)
    _is_vf(root, vf)
    override = _device_file(root, vf, "driver_override")
    action = "return from vfio-pci"
    if current_driver(root, vf) == VFIO_PCI:
        probe_vf_group(sysfs_root, vf, vfio_dir)
        try:
            write_once(_driver_file(root, VFIO_PCI, "unbind"), vf.encode())
        except OSError as err:
            raise _step(action, vf, "unbind", err) from None
    if not give_back:
        # Left unbound, its override still vfio-pci: nothing else can take it
        # while the caller resets what the tenant had (then calls again).
        return current_driver(root, vf)
    try:
        if _read(override) not in ("", "(null)"):
            write_once(override, b"\n")
        if current_driver(root, vf) is None:
            write_once(_probe_file(root), vf.encode())
    except OSError as err:
        raise _step(action, vf, "driver_override/drivers_probe", err) from None
    return current_driver(root, vf)


# --- through the helper -------------------------------------------------------------------


@sysfs_admin.entrypoint
def _priv_set_num_vfs(pf: str, count: int, sysfs_root: str | None = None) -> int:
    return daemon_side(lambda: write_num_vfs(daemon_sysfs_root(sysfs_root), pf, count))


@sysfs_admin.entrypoint
def _priv_bind_vfio(vf: str, sysfs_root: str | None = None) -> None:
    daemon_side(lambda: write_bind_vfio(daemon_sysfs_root(sysfs_root), vf))


@sysfs_admin.entrypoint
def _priv_unbind_vfio(
    vf: str, sysfs_root: str | None = None, vfio_dir: str | None = None, give_back: bool = True
) -> str | None:
    # Outside daemon_side, as it always was: a refused directory crosses as
    # PrivilegedInputRejected's message alone (oslo.privsep's own wire).
    directory = daemon_vfio_dir(vfio_dir)
    return daemon_side(
        lambda: write_unbind_vfio(daemon_sysfs_root(sysfs_root), vf, directory, give_back)
    )


def set_num_vfs(pf: str, count: int, *, sysfs_root: str | None = None) -> int:
    """:func:`write_num_vfs` in the privsep daemon."""
    return call(_priv_set_num_vfs, pf, count, sysfs_root=sysfs_root)


def bind_vfio(vf: str, *, sysfs_root: str | None = None) -> None:
    """:func:`write_bind_vfio` in the privsep daemon."""
    call(_priv_bind_vfio, vf, sysfs_root=sysfs_root)


def unbind_vfio(
    vf: str,
    *,
    sysfs_root: str | None = None,
    vfio_dir: str | None = None,
    give_back: bool = True,
) -> str | None:
    """:func:`write_unbind_vfio` in the privsep daemon."""
    return call(
        _priv_unbind_vfio, vf, sysfs_root=sysfs_root, vfio_dir=vfio_dir, give_back=give_back
    )
