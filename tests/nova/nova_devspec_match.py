"""Which devices Nova 34's own ``[pci] device_spec`` matching takes; run with
the Python of Nova's venv (tests/nova/novavenv.py), never the agent's.

stdin: {"pfs": [the PF addresses of the host], "devices": [{"address",
"parent_addr", "vendor_id", "product_id"}], "specs": [device_spec values]}.
stdout: per spec, the addresses of the devices ``PciDeviceSpec.match`` takes
(the call nova.pci.whitelist makes for every device the libvirt driver
reports), or {"refused": the exception's name} when Nova refuses the value.

Nova asks sysfs whether a single address is a PF (nova.pci.utils,
is_physical_function, reading sriov_totalvfs): answered from "pfs" here, the
host being described, not this machine's /sys.
"""

from __future__ import annotations

import json
import sys
from unittest import mock

from nova.pci import devspec, utils


def main() -> None:
    payload = json.load(sys.stdin)
    pfs = set(payload["pfs"])

    def is_pf(domain: str, bus: str, slot: str, function: str) -> bool:
        return f"{domain}:{bus}:{slot}.{function}" in pfs

    answers: list[object] = []
    with mock.patch.object(utils, "is_physical_function", is_pf):
        for value in payload["specs"]:
            try:
                spec = devspec.PciDeviceSpec(dict(value))
            except Exception as exc:  # what Nova raises for a value it refuses
                answers.append({"refused": type(exc).__name__})
                continue
            answers.append([d["address"] for d in payload["devices"] if spec.match(d)])
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
