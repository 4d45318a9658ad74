"""The privileged half of every device model: the writes that need root,
through the privileged helpers (production) or in this process (an
unprivileged tree: the simulator as its owner, benchmarks).  Each backend
declares the writes it calls as a protocol of its own (MdevWriter,
VgpuWriter, PciWriter in accel_agent/backends/); both writers here implement
every one of them (tests/unit/test_backends_loading.py checks it).
Both go through accel_agent.privileged's facade, imported on the first write:
oslo.privsep is heavy, and read-only commands build a manager too.
"""

from __future__ import annotations

import os
from types import ModuleType


def _privileged() -> ModuleType:
    from accel_agent import privileged

    return privileged


class PrivsepWriter:
    """Writes through the privsep helper, started (and started again after a
    failure) by its guard on the first call, with the agent's own config
    files.  Every call names ``sysfs_root``: a helper that was restarted must
    not act on a root an operator has since written into those files."""

    def __init__(self, sysfs_root: str | None = None, vfio_dev_dir: str | None = None) -> None:
        # Normalised as the helper wants it ("/sys/" and "/sys" are one root).
        self.sysfs_root = os.path.normpath(sysfs_root) if sysfs_root else None
        self.vfio_dev_dir = os.path.normpath(vfio_dev_dir) if vfio_dev_dir else vfio_dev_dir

    def create(self, parent: str, mdev_type: str, uuid: str) -> None:
        _privileged().create_mdev(parent, mdev_type, uuid, sysfs_root=self.sysfs_root)

    def remove(self, uuid: str, timeout: float) -> None:
        _privileged().remove_mdev(
            uuid, timeout, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir
        )

    def set_vgpu_type(self, vf: str, type_id: int) -> None:
        _privileged().set_vgpu_type(vf, type_id, sysfs_root=self.sysfs_root)

    def set_vgpu_placement(self, vf: str, placement_id: int) -> None:
        _privileged().set_vgpu_placement(vf, placement_id, sysfs_root=self.sysfs_root)

    def clear_vgpu_type(self, vf: str, timeout: float) -> None:
        _privileged().clear_vgpu_type(
            vf, timeout, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir
        )

    # SR-IOV VFs (backend sriov_vf): the same helper.
    def set_num_vfs(self, pf: str, count: int) -> int:
        return _privileged().set_num_vfs(pf, count, sysfs_root=self.sysfs_root)

    def bind_vfio(self, vf: str) -> None:
        _privileged().bind_vfio(vf, sysfs_root=self.sysfs_root)

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None:
        return _privileged().unbind_vfio(
            vf, sysfs_root=self.sysfs_root, vfio_dir=self.vfio_dev_dir, give_back=give_back
        )


class DirectWriter:
    """Same validation and writes, in this process: for unprivileged trees
    (the simulator as its owner) and benchmarks.  Production uses privsep."""

    def __init__(self, sysfs_root: str, vfio_dev_dir: str = "") -> None:
        self._privileged = _privileged()
        self.sysfs_root = sysfs_root
        self.vfio_dev_dir = vfio_dev_dir

    def create(self, parent: str, mdev_type: str, uuid: str) -> None:
        self._privileged.write_create(self.sysfs_root, parent, mdev_type, uuid)

    def remove(self, uuid: str, timeout: float) -> None:
        self._privileged.write_remove(self.sysfs_root, uuid, timeout, self.vfio_dev_dir)

    def set_vgpu_type(self, vf: str, type_id: int) -> None:
        self._privileged.write_vgpu_type(self.sysfs_root, vf, type_id)

    def set_vgpu_placement(self, vf: str, placement_id: int) -> None:
        self._privileged.write_vgpu_placement(self.sysfs_root, vf, placement_id)

    def clear_vgpu_type(self, vf: str, timeout: float) -> None:
        self._privileged.write_vgpu_clear(self.sysfs_root, vf, timeout, self.vfio_dev_dir)

    def set_num_vfs(self, pf: str, count: int) -> int:
        return self._privileged.write_num_vfs(self.sysfs_root, pf, count)

    def bind_vfio(self, vf: str) -> None:
        self._privileged.write_bind_vfio(self.sysfs_root, vf)

    def unbind_vfio(self, vf: str, give_back: bool = True) -> str | None:
        return self._privileged.write_unbind_vfio(
            self.sysfs_root, vf, self.vfio_dev_dir, give_back
        )
