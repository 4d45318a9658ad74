"""(d) Rewriting the mdev UUIDs of a 16-mdev domain XML."""

from __future__ import annotations

import uuid

from accel_agent.libvirt_xml import rewrite_mdev_uuids
from benchmarks import timing


def domain(uuids: list[str]) -> str:
    hostdevs = "".join(
        f"    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci'>\n"
        f"      <source>\n        <address uuid='{u}'/>\n      </source>\n"
        f"      <alias name='hostdev{i}'/>\n"
        f"      <address type='pci' domain='0x0000' bus='0x00' slot='0x{i + 5:02x}' "
        f"function='0x0'/>\n    </hostdev>\n"
        for i, u in enumerate(uuids)
    )
    return (
        "<domain type='kvm'>\n  <name>guest</name>\n  <memory unit='KiB'>4194304</memory>\n"
        "  <metadata><nova:instance xmlns:nova='http://openstack.org/xmlns/libvirt/nova/1.1'>"
        "<nova:name>vm</nova:name></nova:instance></metadata>\n"
        "  <os><type arch='x86_64' machine='q35'>hvm</type></os>\n"
        f"  <devices>\n{hostdevs}  </devices>\n</domain>\n"
    )


def measure(runs: int) -> dict[str, object]:
    sources = [str(uuid.uuid4()) for _ in range(16)]
    mapping = {s: str(uuid.uuid4()) for s in sources}
    xml = domain(sources)
    return {
        "rewrite 16 mdev UUIDs": timing.summary(
            timing.run_callable(lambda: rewrite_mdev_uuids(xml, mapping), runs)
        )
    }
