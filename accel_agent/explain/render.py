"""The explain document as text: one block per device, a line per fact,
then the verdict and its next step (``accelctl explain`` without --json)."""

from __future__ import annotations

import textwrap
from typing import Any

from accel_agent.exception import printable
from accel_agent.explain.verdicts import driver_label

WIDTH = 13  # the labels' column
COLUMNS = 100  # long facts wrap under their value, not under the label


def _numa(device: dict[str, Any]) -> str:
    node = device["numa_node"]
    return "none (-1: the platform gives no NUMA affinity)" if node is None else str(node)


def _iommu(device: dict[str, Any], facts: dict[str, Any]) -> str:
    group = device["iommu_group"]
    if group is not None:
        return str(group)
    if not facts["iommu_groups"]:
        return "none: the IOMMU is off (no IOMMU groups); VFIO cannot work without one"
    return "none: VFIO cannot give this device to a VM"


def _sriov(device: dict[str, Any]) -> str:
    sriov = device["sriov"]
    if sriov is None:
        return "not visible (no sriov_totalvfs)"
    text = f"{sriov['num_vfs']} of {sriov['total_vfs']} VFs enabled"
    vfs = sriov["vfs"]
    if vfs:
        drivers = sorted({v["driver"] or "no driver" for v in vfs})
        typed = sum(1 for v in vfs if v["vgpu_type"])
        text += f" ({vfs[0]['address']}..{vfs[-1]['address']}, {', '.join(drivers)}"
        text += f", {typed} with a vGPU)" if typed else ")"
    return text


def _types(device: dict[str, Any]) -> str:
    types = device["mdev_types"]
    if not types:
        return "none"
    shown = [f"{t['type_id']}" + (f" ({t['name']})" if t["name"] else "")
             + f": {t['can_make_now']} can be made now, {t['devices']} existing"
             for t in types[:6]]
    more = len(types) - len(shown)
    return "; ".join(shown) + (f"; and {more} more (accelctl types)" if more > 0 else "")


def _nvidia(nvidia: dict[str, Any]) -> str:
    state = {"loaded": "vGPU manager loaded", "absent": "no vGPU manager",
             "unknown": "vGPU manager not visible"}[nvidia["vgpu_manager"]]
    text = f"{state} ({nvidia['evidence']})"
    if nvidia["vfs_with_vgpu_files"]:
        text += f"; {len(nvidia['typed_vfs'])} of them typed"
    return text


def _config(config: dict[str, Any], facts: dict[str, Any]) -> str:
    if facts.get("config_problem"):
        return f"not read ({facts['config_problem']})"
    parts = []
    if config["mdev_type"]:
        how = "its device_addresses" if config["source"] == "device_addresses" else \
            "the default type"
        layout = f", standing {config['standing']}" if config["standing"] else ""
        nova = ", reported by Nova" if config["reported_by"] == "nova" else ""
        parts.append(f"type {config['mdev_type']} ({how}{layout}{nova})")
    layout = config.get("gpu_layout")
    if layout:
        nova = ", reported by Nova" if layout["reported_by"] == "nova" else ""
        vgpus = ", ".join(f"{v['mdev_type']}:{v['count']}" for v in layout["vgpus"])
        parts.append(f"mixed-size layout [gpu_layout_{layout['name']}]: {vgpus}{nova}")
    if config["vf_pool"]:
        pool = config["vf_pool"]
        num = f", num_vfs {pool['num_vfs']}" if pool["num_vfs"] else ""
        parts.append(f"VF pool {pool['name']}{num}")
    return "; ".join(parts) or "nothing"


def _line(label: str, value: Any) -> str:
    return textwrap.fill(
        printable(str(value)), COLUMNS, initial_indent=f"  {label + ':':<{WIDTH}} ",
        subsequent_indent=" " * (WIDTH + 3), break_long_words=False, break_on_hyphens=False,
    )


def device_text(device: dict[str, Any], document: dict[str, Any]) -> list[str]:
    facts = document["facts"]
    kind = f" [{device['class_name']}]" if device.get("class_name") else ""
    lines = [printable(f"{device['address']}  {device['name']}{kind}")]
    if device["kind"] == "pci":
        ids = f"{device['vendor_id'] or '?'}:{device['device_id'] or '?'}"
        if device["subsystem_id"]:
            ids += f" (subsystem {device['subsystem_id']})"
        lines.append(_line("ids", f"{ids}, class {device['class']}"))
        if device["physfn"]:
            lines.append(_line("VF of", device["physfn"]))
    driver = device["driver"] or "none"
    if device["nvidia"] and facts["nvidia_driver"] and device["driver"] == "nvidia":
        driver += f" ({driver_label(facts['nvidia_driver'])})"
    lines.append(_line("driver", driver))
    if device["kind"] == "pci":
        lines.append(_line("NUMA node", _numa(device)))
        lines.append(_line("IOMMU group", _iommu(device, facts)))
        if not device["physfn"]:
            lines.append(_line("SR-IOV", _sriov(device)))
    lines.append(_line("mdev types", _types(device)))
    if device["nvidia"]:
        lines.append(_line("NVIDIA vGPU", _nvidia(device["nvidia"])))
    lines.append(_line("config", _config(device["config"], facts)))
    verdict = device["verdict"]
    lines.append(_line("verdict", verdict["summary"]))
    lines.append(_line("next step", verdict["next_step"]))
    for problem in device["problems"][1:]:
        lines.append(_line("also", f"{problem['summary']}; {problem['next_step']}"))
    return lines


def text(document: dict[str, Any]) -> str:
    """The whole document as text."""
    blocks = ["\n".join(device_text(d, document)) for d in document["devices"]]
    facts = document["facts"]
    if not blocks:
        blocks.append("no GPU or accelerator on this host (PCI class 03xx or 12xx) and no "
                      "mdev parent")
    notes = []
    if facts["pci_ids"] is None:
        notes.append("no pci.ids file (Debian package pci.ids): names are unknown")
    if facts["virtual_machine"]:
        notes.append(f"this host looks like a virtual machine: {facts['virtual_machine']}")
    return "\n\n".join(blocks + (["\n".join(f"note: {n}" for n in notes)] if notes else [])) + "\n"
