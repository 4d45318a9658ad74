"""``accelctl explain``: why a GPU or accelerator offers what it offers, and
what to do next.

For every GPU and accelerator function of the host (PCI class 03xx and 12xx,
VFs folded into their PF) and every mdev parent, or for one address: its name
(the system's ``pci.ids``), driver, NUMA node, IOMMU group, SR-IOV and VFs,
mdev types, NVIDIA's vGPU state, what the configuration asks of it, and a
verdict with the next step.  Reads only (sysfs, ``/proc``: see
:mod:`.facts` for where ``/proc`` is read under another sysfs root), never
privileged; the same document offline and through the daemon
(``GET /v1/explain``).

The rooms: :mod:`.pciids` (names), :mod:`.facts` (what the host shows),
:mod:`.asks` (what the configuration asks), :mod:`.verdicts` (the verdict),
:mod:`.render` (text).  check-config's warning about a configured address
that is no mdev parent carries :func:`diagnose`'s line.
"""

from __future__ import annotations

from typing import Any

from accel_agent import exception
from accel_agent.explain import facts as facts_mod
from accel_agent.explain import pciids
from accel_agent.explain.asks import Asks
from accel_agent.explain.verdicts import Problem, Subject, Verdict, judge
from accel_agent.sysfs import address as address_mod
from accel_agent.sysfs.model import HostSnapshot, Parent

__all__ = ["Asks", "Problem", "diagnose", "explain", "from_manager", "normalise_address"]

EXPLAINED_CLASSES = (0x03, 0x12)


def normalise_address(text: str) -> str:
    """A PCI address (any case, short form) in canonical form, or a virtual
    parent's name; InvalidPciAddress for anything else."""
    stripped = text.strip() if isinstance(text, str) else ""
    if address_mod.is_pci_address(stripped):
        return address_mod.parse_pci_address(stripped)
    if stripped and address_mod.is_virtual_parent_name(stripped) and ":" not in stripped:
        return stripped
    raise exception.InvalidPciAddress(address=text)


def _parents_by_device(snapshot: HostSnapshot) -> dict[str, list[Parent]]:
    """Device -> the scan's parents on it: a PF's are its own and its VFs'."""
    found: dict[str, list[Parent]] = {}
    for parent in snapshot.parents.values():
        found.setdefault(parent.physical_gpu, []).append(parent)
        if parent.physical_gpu != parent.name:
            found.setdefault(parent.name, []).append(parent)
    return found


def _subjects(snapshot: HostSnapshot, host: facts_mod.HostFacts,
              address: str | None) -> list[tuple[str, facts_mod.FunctionFacts | None]]:
    """The devices to explain: ``address`` alone, or every GPU and
    accelerator PF, every PF with an mdev parent, every virtual parent."""
    root = host.sysfs_root
    if address is not None:
        found = facts_mod.read_function(root, address) if ":" in address else None
        if found is None and address not in snapshot.parents:
            raise exception.DeviceNotOnHost(address=address, root=snapshot.root)
        return [(address, found)]
    with_parents = {p.physical_gpu for p in snapshot.parents.values()}
    chosen: list[tuple[str, facts_mod.FunctionFacts | None]] = []
    for name in host.functions:
        function = facts_mod.read_function(root, name)
        if function is None or function.physfn is not None:
            continue
        if function.base_class in EXPLAINED_CLASSES or name in with_parents:
            chosen.append((name, function))
    listed = {name for name, _ in chosen}
    for parent in sorted(snapshot.parents.values(), key=lambda p: p.name):
        if parent.pci_address is None and parent.name not in listed:
            chosen.append((parent.name, None))
            listed.add(parent.name)
    return chosen


def _names(chosen: list[tuple[str, facts_mod.FunctionFacts | None]],
           pci_ids: str | None) -> tuple[dict, dict[int, str]]:
    if pci_ids is None:
        return {}, {}
    wanted = [
        (f.vendor_id, f.device_id or "", f.subsystem_vendor, f.subsystem_device)
        for _, f in chosen
        if f is not None and f.vendor_id
    ]
    classes = [f.class_code for _, f in chosen if f is not None and f.class_code is not None]
    return pciids.PciIds(pci_ids).lookup(wanted, classes)


def _device(name: str, function: facts_mod.FunctionFacts | None, snapshot: HostSnapshot,
            parents: list[Parent], asks: Asks, names: dict, classes: dict[int, str],
            host: facts_mod.HostFacts) -> dict[str, Any]:
    config = asks.for_device(name, function.physfn if function else None)
    verdict: Verdict = judge(Subject(name, function, tuple(parents), config), host)
    types: dict[str, dict[str, Any]] = {}
    for parent in parents:
        for type_id, mdev_type in sorted(parent.types.items()):
            entry = types.setdefault(type_id, {"type_id": type_id, "name": mdev_type.name,
                                               "can_make_now": 0, "devices": 0})
            entry["can_make_now"] += mdev_type.available_instances > 0
            entry["devices"] += len(snapshot.mdevs_on(parent.name, type_id))
    document: dict[str, Any] = {"address": name, "kind": "virtual" if function is None else "pci"}
    if function is None:
        parent = snapshot.parents.get(name)
        document.update({
            "name": name, "vendor_name": None, "device_name": None, "subsystem_name": None,
            "vendor_id": None, "device_id": None, "subsystem_id": None, "class": None,
            "class_name": None, "driver": parent.driver if parent else None, "numa_node": None,
            "iommu_group": None, "physfn": None, "sriov": None,
        })
    else:
        key = (function.vendor_id, function.device_id or "", function.subsystem_vendor,
               function.subsystem_device)
        pci_names = names.get(key, pciids.Names())
        document.update({
            "name": pciids.display_name(function.vendor_id, function.device_id, pci_names),
            "vendor_name": pci_names.vendor,
            "device_name": pci_names.device,
            "subsystem_name": pci_names.subsystem,
            "vendor_id": function.vendor_id,
            "device_id": function.device_id,
            "subsystem_id": f"{function.subsystem_vendor}:{function.subsystem_device}"
            if function.subsystem_vendor and function.subsystem_device else None,
            "class": None if function.class_code is None else f"0x{function.class_code:06x}",
            "class_name": classes.get(function.class_code or -1),
            "driver": function.driver,
            "numa_node": function.numa_node,
            "iommu_group": function.iommu_group,
            "physfn": function.physfn,
            "sriov": None if function.sriov_total is None else {
                "total_vfs": function.sriov_total,
                "num_vfs": function.sriov_num or 0,
                "vfs": [{"address": v.address, "driver": v.driver, "iommu_group": v.iommu_group,
                         "vgpu_type": f"nvidia-{v.current_vgpu_type}"
                         if v.current_vgpu_type else None} for v in function.vfs],
            },
        })
    document.update({
        "mdev_types": list(types.values()),
        "nvidia": verdict.nvidia,
        "config": config,
        "verdict": verdict.verdict.to_dict(),
        "problems": [p.to_dict() for p in verdict.problems],
    })
    return document


def explain(snapshot: HostSnapshot, asks: Asks | None = None, address: str | None = None,
            host_name: str = "", pci_ids: str | None = "") -> dict[str, Any]:
    """The explain document (``accelctl explain --json``, ``GET /v1/explain``).

    ``snapshot``: the host's scan (its root is the sysfs root read);
    ``address``: one device (canonical, :func:`normalise_address`), else all;
    ``pci_ids``: the names file, "" to look in the usual places, None for
    none.  DeviceNotOnHost when ``address`` is neither a PCI function nor an
    mdev parent of the host."""
    asks = asks or Asks()
    host = facts_mod.read_host(snapshot.root)
    chosen = _subjects(snapshot, host, address)
    ids_path = pciids.find() if pci_ids == "" else pci_ids
    names, classes = _names(chosen, ids_path)
    by_device = _parents_by_device(snapshot)
    return {
        "host": host_name,
        "sysfs_root": host.sysfs_root,
        "proc_root": host.proc_root,
        "facts": {
            "iommu_groups": host.iommu_groups,
            "modules_visible": host.modules is not None,
            "vgpu_vfio_module": host.vgpu_vfio_loaded,
            "nvidia_driver": host.nvidia_version,
            "virtual_machine": host.guest_hint,
            "pci_ids": ids_path,
            "config_problem": asks.problem,
        },
        "devices": [
            _device(name, function, snapshot, by_device.get(name, []), asks, names, classes, host)
            for name, function in chosen
        ],
    }


def from_manager(manager: Any, address: str | None = None) -> dict[str, Any]:
    """The document for the daemon (``GET /v1/explain``): the manager's
    listing scan (every counter true), policy, VF pools and host name."""
    vf_pools = next((b.pools for b in manager.backends.values()
                     if getattr(b, "pools", None) is not None), None)
    asks = Asks.of(manager.policy, vf_pools.pools if vf_pools is not None else None)
    return explain(manager.scan_all(), asks, address, host_name=manager.host)


def diagnose(snapshot: HostSnapshot, address: str, asks: Asks | None = None) -> str:
    """The verdict on ``address`` as one line (check-config's warnings)."""
    try:
        document = explain(snapshot, asks, address, pci_ids=None)
    except exception.DeviceNotOnHost:
        if ":" not in address:
            return f"there is no mdev parent {address} under {snapshot.root}; is its driver loaded?"
        return (f"there is no PCI device {address} under {snapshot.root}; check the address "
                "(lspci -D lists the host's)")
    verdict = document["devices"][0]["verdict"]
    return f"{verdict['summary']}; {verdict['next_step']}"
