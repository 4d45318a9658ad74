"""``check-config --nova-conf`` and ``nova-pci-config --check`` say a GPU is
counted twice when Nova's ``[pci] device_spec`` names one of its VFs
(reporting/nova_pci.py, counted_twice).  Which VFs a value names is Nova's
rule: here each form an operator may write goes through Nova 34's own
PciDeviceSpec.match and through counted_twice, and both must take the same
VFs (issue 23)."""

from __future__ import annotations

from pathlib import Path

from accel_agent.reporting import nova_pci
from tests.nova.conftest import run_in_nova

HERE = Path(__file__).resolve().parent
PFS = ["0000:c1:00.0", "0000:c2:00.0"]
VENDOR, PRODUCT = "10de", "26b9"  # the simulator's L40S: VFs share the PF's ids
VFS = {f"0000:{pf[5:7]}:00.{fn}": pf for pf in PFS for fn in range(4, 8)}
SPECS = [
    *({"address": a} for a in (
        "0000:c1:00.4", "0000:C1:00.5", "c1:00.6", "0:c1:0.7", "*:c1:00.*", ":00.4", ".5",
        "c2:", "0000:c2:00.0", "0000:C2:00.0", "c2:00.0", "*:c2:00.0", "0000:c1:01.*",
        "0000:c1:00", "", "*:*:*.*", "0000:c1:00.8", "0000:c1:20.0", "1:2:3:4.5",
    )),
    {}, {"address": None}, {"vendor_id": "10de"}, {"vendor_id": "10DE", "product_id": "26b9"},
    {"product_id": "2236"}, {"vendor_id": "8086"}, {"address": "", "vendor_id": "10de"},
    {"address": "0000:c2:00.0", "product_id": "26b9"},
    {"address": "0000:c2:00.0", "product_id": "2236"},
    {"address": "c1:00.5", "vendor_id": "0x10de", "managed": "no"},
]


def test_counted_twice_takes_the_vfs_nova_takes_for_every_form(nova_python):
    devices = [{"address": vf, "parent_addr": pf, "vendor_id": VENDOR, "product_id": PRODUCT}
               for vf, pf in VFS.items()]
    nova = run_in_nova(nova_python, HERE / "nova_devspec_match.py",
                       {"pfs": PFS, "devices": devices, "specs": SPECS})
    reported = {vf: nova_pci.ReportedVf(pf, "nvidia-1150", VENDOR, PRODUCT)
                for vf, pf in VFS.items()}
    differ = {}
    for value, taken in zip(SPECS, nova, strict=True):
        ours = sorted(vf for item in nova_pci.counted_twice(
            [nova_pci.SpecLine(value, "nova.conf", 1)], reported) for vf in item.vfs)
        theirs = [] if isinstance(taken, dict) else sorted(taken)  # refused: names none
        if ours != theirs:
            differ[str(value)] = (theirs, ours)
    assert differ == {}
    assert sum(isinstance(t, dict) for t in nova) == 3  # the three Nova refuses
    assert sum(bool(t) and not isinstance(t, dict) for t in nova) >= 15  # most name VFs
