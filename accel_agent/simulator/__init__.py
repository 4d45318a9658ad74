"""A kernel-faithful simulated mdev host (docs/design.md §8.1).

* :mod:`.spec` - ``HostSpec`` and friends: a JSON-serialisable host description
  (its field checks in :mod:`.spec_fields`, the SR-IOV specs in :mod:`.spec_sriov`);
* :mod:`.profiles` - ready-made hosts (``PROFILES``, ``build_spec``);
* :mod:`.model` - ``SimulatedHost``: the reactive sysfs model (in-process, unit speed),
  the wiring of its parts:
* :mod:`.kernfs` - its file side: the tree under one lock, open handles, slow reads;
* :mod:`.mdev` - its mdev side: parents, types, counters, ``create``/``remove``;
* :mod:`.pci` - its PCI side: driver binding, ``driver_override``, group nodes;
* :mod:`.pci_sriov` - SR-IOV VFs that come and go with ``sriov_numvfs``;
* :mod:`.nvidia_vfio` - the ``nvidia/`` files of NVIDIA vGPU 17+ VFs;
* :mod:`.static` - ``materialise``: a real directory tree of the current state;
* :mod:`.fusefs` / :mod:`.control` / :mod:`.daemon` - the FUSE front, its control
  socket and process management;
* :mod:`.cli` - ``accelctl simulate``; :mod:`.testing` - helpers for tests.

Only the light modules are imported here: loading libfuse happens only when
something is mounted.
"""

from accel_agent.simulator.kernfs import Handle, TreeEntry
from accel_agent.simulator.mdev import BlockedRemove, MdevInfo
from accel_agent.simulator.model import Event, SimulatedHost
from accel_agent.simulator.profiles import PROFILES, build_spec
from accel_agent.simulator.spec import (
    POLICIES,
    HostSpec,
    MdevSpec,
    ParentSpec,
    PciDeviceSpec,
    SriovPfSpec,
    TypeSpec,
    VgpuTypeSpec,
)
from accel_agent.simulator.static import materialise

__all__ = [
    "POLICIES",
    "PROFILES",
    "BlockedRemove",
    "Event",
    "Handle",
    "HostSpec",
    "MdevInfo",
    "MdevSpec",
    "ParentSpec",
    "PciDeviceSpec",
    "SimulatedHost",
    "SriovPfSpec",
    "TreeEntry",
    "TypeSpec",
    "VgpuTypeSpec",
    "build_spec",
    "materialise",
]
