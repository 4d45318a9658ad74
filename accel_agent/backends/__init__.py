"""Device backends: one per device model, behind one interface (``base``).

* ``mdev``: the kernel's mediated devices (``class/mdev_bus``);
* ``nvidia_vfio``: NVIDIA vGPU 17+ SR-IOV VFs typed through sysfs;
* ``sriov_vf``: plain SR-IOV VFs of configured pools, handed over on vfio-pci.

They are loaded by name through stevedore from the ``accel_agent.backends``
entry points (os-vif's plugin pattern), so a backend can live in another
package.  The daemon and the mutating commands load every registered one;
accelctl's offline listings use the built-in ones directly
(:func:`builtin`), because importing stevedore costs more than the whole
listing may (BENCHMARKS.md (a)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_agent.backends.base import DeviceBackend

NAMESPACE = "accel_agent.backends"
MDEV = "mdev"


def builtin() -> Mapping[str, DeviceBackend]:
    """The backends this package ships, by name, without stevedore."""
    from accel_agent.backends.mdev import MdevBackend
    from accel_agent.backends.nvidia_vfio import NvidiaVfioBackend
    from accel_agent.backends.sriov_vf import SriovVfBackend

    return MappingProxyType(
        {b.name: b for b in (MdevBackend(), NvidiaVfioBackend(), SriovVfBackend())}
    )


def load(names: Iterable[str] | None = None) -> Mapping[str, DeviceBackend]:
    """The backends registered under :data:`NAMESPACE` (``names`` only, when
    given), instantiated; the ``mdev`` backend is always among them."""
    from stevedore import ExtensionManager, NamedExtensionManager

    if names is None:
        manager = ExtensionManager(NAMESPACE, invoke_on_load=True)
    else:
        manager = NamedExtensionManager(
            NAMESPACE, names=list(names), invoke_on_load=True, name_order=True
        )
    found = {ext.name: ext.obj for ext in manager}
    if MDEV not in found:
        found = {**builtin(), **found}
    return MappingProxyType(found)
