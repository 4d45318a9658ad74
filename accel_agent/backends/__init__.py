"""Device backends: one per device model, behind one interface (``base``).

* ``mdev``: the kernel's mediated devices (``class/mdev_bus``);
* ``nvidia_vfio``: NVIDIA vGPU 17+ SR-IOV VFs typed through sysfs;
* ``sriov_vf``: plain SR-IOV VFs of configured pools, handed over on vfio-pci.

They are loaded by name through stevedore from the ``accel_agent.backends``
entry points (os-vif's plugin pattern), so a backend can live in another
package (docs/development.md, "Write a backend"):

* :func:`classes`: every registered one, for the daemon and the mutating
  commands, which build each from the configuration
  (``wiring.build_backends``: its options registered, then
  ``DeviceBackend.from_conf``);
* :func:`for_reading`: the backends a read-only command scans with
  (listings, ``check-config``, ``explain``): the built-in ones without
  stevedore (:func:`builtin`), because importing stevedore costs more than a
  whole listing may (BENCHMARKS.md (a)), unless another distribution
  registers a backend (:func:`registered_elsewhere`, a read of the
  installed distributions' ``entry_points.txt`` that costs ~1 ms): then
  every registered one, through stevedore, as the daemon sees them.

A registered backend that cannot be loaded refuses the command (and the
daemon's start), naming it: its devices would otherwise be left to nobody.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from accel_agent.backends.base import NAMESPACE

if TYPE_CHECKING:
    from accel_agent.backends.base import DeviceBackend

__all__ = ["MDEV", "NAMESPACE", "builtin", "classes", "for_reading", "load"]

MDEV = "mdev"

# What this package registers (pyproject.toml's accel_agent.backends entry
# points): a registration of anything else is another distribution's.
BUILTIN = MappingProxyType({
    "mdev": "accel_agent.backends.mdev:MdevBackend",
    "nvidia_vfio": "accel_agent.backends.nvidia_vfio:NvidiaVfioBackend",
    "sriov_vf": "accel_agent.backends.sriov_vf:SriovVfBackend",
})


def builtin() -> Mapping[str, DeviceBackend[Any]]:
    """The backends this package ships, by name, without stevedore."""
    from accel_agent.backends.mdev import MdevBackend
    from accel_agent.backends.nvidia_vfio import NvidiaVfioBackend
    from accel_agent.backends.sriov_vf import SriovVfBackend

    return MappingProxyType(
        {b.name: b for b in (MdevBackend(), NvidiaVfioBackend(), SriovVfBackend())}
    )


def classes(names: Iterable[str] | None = None) -> Mapping[str, type[DeviceBackend[Any]]]:
    """The backend classes registered under :data:`NAMESPACE` (``names``
    only, when given), through stevedore, by name; the ``mdev`` backend is
    always among them.  BackendNotLoaded names a registered one that cannot
    be loaded."""
    from stevedore import ExtensionManager, NamedExtensionManager

    from accel_agent import exception

    def refuse(_manager: Any, point: Any, err: BaseException) -> None:
        raise exception.BackendNotLoaded(
            name=point.name, target=point.value, reason=f"{type(err).__name__}: {err}"
        ) from err

    if names is None:
        manager = ExtensionManager(NAMESPACE, on_load_failure_callback=refuse)
    else:
        manager = NamedExtensionManager(
            NAMESPACE, names=list(names), name_order=True, on_load_failure_callback=refuse
        )
    found = {ext.name: ext.plugin for ext in manager}
    if MDEV not in found:
        found = {name: type(b) for name, b in builtin().items()} | found
    return MappingProxyType(found)


def load(names: Iterable[str] | None = None) -> Mapping[str, DeviceBackend[Any]]:
    """The backends registered under :data:`NAMESPACE` (``names`` only, when
    given), each built for reading (no configuration), through stevedore."""
    return MappingProxyType({name: cls() for name, cls in classes(names).items()})


def for_reading() -> Mapping[str, DeviceBackend[Any]]:
    """The backends a read-only command scans with: :func:`builtin`, unless
    another distribution registers a backend, then :func:`load` (module
    docstring)."""
    if registered_elsewhere():
        return load()
    return builtin()


def registered_elsewhere(path: Iterable[str] | None = None) -> list[str]:
    """The backends registered under :data:`NAMESPACE` other than this
    package's own (:data:`BUILTIN`), as ``name = target`` lines, from the
    ``entry_points.txt`` of every ``*.dist-info`` and ``*.egg-info``
    directory on ``path`` (``sys.path``).

    importlib.metadata finds distributions the same way (a directory on the
    path holding their metadata), but importing it costs ~25 ms, which a
    listing cannot afford (BENCHMARKS.md (a)); this reads a few small files.
    What it does not see (a distribution inside a zip file on the path, as
    setuptools' zipped eggs were) is still loaded by the daemon and the
    mutating commands, through stevedore."""
    found: list[str] = []
    for entry in sys.path if path is None else path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for item in listing:
                if item.name.endswith((".dist-info", ".egg-info")):
                    found += _foreign(os.path.join(item.path, "entry_points.txt"))
    return found


def _foreign(path: str) -> list[str]:
    """The registrations in ``path``'s :data:`NAMESPACE` section that are
    not this package's own."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return []
    header = f"[{NAMESPACE}]"
    if header not in text:
        return []
    found: list[str] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == header
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, target = (part.strip() for part in line.partition("="))
            if BUILTIN.get(name) != target:
                found.append(f"{name} = {target}")
    return found
