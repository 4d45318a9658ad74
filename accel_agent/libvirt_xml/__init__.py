"""libvirt domain XML for mdevs: build hostdevs, list and rewrite mdev UUIDs.

Public API (re-exported lazily, see below)::

    build_hostdev(uuid, model="vfio-pci", display=None, ramfb=None) -> lxml element
    hostdev_xml(uuid, ...) -> str
    domain_hostdevs_xml(uuids, ...) -> str
    qemu_commandline_xml(qemu_globals) -> str   (<qemu:commandline> of -global settings)
    instance_domain_xml(uuids, qemu_globals=()) -> str   (what `accelctl domain-xml` prints)
    canonical_uuid(text) -> str
    list_mdev_uuids(domain_xml) -> list[str]
    rewrite_mdev_uuids(domain_xml, mapping) -> RewriteResult(xml, replaced, unused_keys)
    parse_domain(domain_xml) -> ParsedDomain  (hardened: no DTD, no network, no entities)

The names are resolved on first use (PEP 562) so that importing
``accel_agent.libvirt_xml.cli`` for ``accelctl`` does not pull in lxml.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accel_agent.libvirt_xml.hostdev import (
        QEMU_NAMESPACE,
        build_hostdev,
        canonical_uuid,
        domain_hostdevs_xml,
        hostdev_xml,
        instance_domain_xml,
        qemu_commandline_xml,
    )
    from accel_agent.libvirt_xml.mdevs import list_mdev_uuids
    from accel_agent.libvirt_xml.parser import ParsedDomain, parse_domain
    from accel_agent.libvirt_xml.rewrite import RewriteResult, rewrite_mdev_uuids

_EXPORTS = {
    "QEMU_NAMESPACE": "hostdev",
    "build_hostdev": "hostdev",
    "canonical_uuid": "hostdev",
    "domain_hostdevs_xml": "hostdev",
    "hostdev_xml": "hostdev",
    "instance_domain_xml": "hostdev",
    "qemu_commandline_xml": "hostdev",
    "list_mdev_uuids": "mdevs",
    "ParsedDomain": "parser",
    "parse_domain": "parser",
    "RewriteResult": "rewrite",
    "rewrite_mdev_uuids": "rewrite",
}

__all__ = [
    "QEMU_NAMESPACE",
    "ParsedDomain",
    "RewriteResult",
    "build_hostdev",
    "canonical_uuid",
    "domain_hostdevs_xml",
    "hostdev_xml",
    "instance_domain_xml",
    "list_mdev_uuids",
    "parse_domain",
    "qemu_commandline_xml",
    "rewrite_mdev_uuids",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
