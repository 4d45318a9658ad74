"""reporting/nova_pci.py: which GPUs Nova's device_spec and the agent would
both report (issue 23), with Nova's address forms (nova/pci/devspec.py:
PciAddressGlobSpec, WhitelistPciAddress.match)."""

from __future__ import annotations

import pytest

from accel_agent.reporting import nova_pci


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0000:c1:00.4", ("0000", "c1", "00", "4")),
        ("0000:C1:00.4", ("0000", "c1", "00", "4")),  # Nova formats every part: case
        ("0:c1:0.4", ("0000", "c1", "00", "4")),  # and width
        ("c1:00.4", ("*", "c1", "00", "4")),  # the domain left out: any
        (":00.", ("*", "*", "00", "*")),
        ("0000:c1:00.*", ("0000", "c1", "00", "*")),
        ("", ("*", "*", "*", "*")),
        ("0000:c1:00.8", None),  # a function is 0-7
        ("0000:c1:20.0", None),  # a slot 0-1f
        ("1:2:3:4.5", None),
        ("0000:zz:00.0", None),
    ],
)
def test_address_pattern_reads_an_address_as_nova_does(text, expected):
    assert nova_pci.address_pattern(text) == expected


def lines(*values: dict) -> list[nova_pci.SpecLine]:
    return [nova_pci.SpecLine(value, "nova.conf", number)
            for number, value in enumerate(values, start=1)]


REPORTED = {
    "0000:c1:00.4": nova_pci.ReportedVf("0000:c1:00.0", "nvidia-1150", "10de", "26b9"),
    "0000:c1:00.5": nova_pci.ReportedVf("0000:c1:00.0", "nvidia-1150", "10de", "26b9"),
    "0000:c2:00.4": nova_pci.ReportedVf("0000:c2:00.0", "nvidia-1150", "10de", "26b9"),
}


def test_a_vf_a_glob_or_the_pf_names_the_gpu_once_with_every_line():
    found = nova_pci.counted_twice(
        lines({"address": "0000:C1:00.5"}, {"address": "*:c1:00.*"},
              {"address": "0000:c2:00.0"}, {"address": "0000:c3:00.4"}),
        REPORTED,
    )
    assert [(t.gpu, t.mdev_type, t.vfs, [e.line for e in t.lines]) for t in found] == [
        ("0000:c1:00.0", "nvidia-1150", ("0000:c1:00.4", "0000:c1:00.5"), [1, 2]),
        ("0000:c2:00.0", "nvidia-1150", ("0000:c2:00.4",), [3]),  # the PF's own line
    ]
    assert "[mdev_nvidia-1150] reported_by = nova" in found[0].message()


def test_only_a_full_pf_address_names_its_vfs_not_a_glob_of_it():
    # Nova asks whether a spec's address is a PF only when it is one single
    # address (devspec.py, _check_physical_function): a glob matches by the
    # device's own address alone.
    assert nova_pci.counted_twice(lines({"address": "*:c2:00.0"}), REPORTED) == []


def test_vendor_and_product_ids_narrow_the_match_as_in_nova():
    def gpus(*values: dict) -> list[tuple[str, tuple[str, ...]]]:
        return [(t.gpu, t.vfs) for t in nova_pci.counted_twice(lines(*values), REPORTED)]

    every = [("0000:c1:00.0", ("0000:c1:00.4", "0000:c1:00.5")),
             ("0000:c2:00.0", ("0000:c2:00.4",))]
    # No address is any address (Nova: "*:*:*.*"); ids as Nova formats them.
    assert gpus({"vendor_id": "10DE", "product_id": "26b9"}) == every
    assert gpus({"vendor_id": "0x10de"}) == every
    assert gpus({"address": "", "product_id": "*"}) == every
    assert gpus({"vendor_id": "10de", "product_id": "2236"}) == []  # another card
    assert gpus({"vendor_id": "8086"}, {"address": "0000:c1:00.4", "vendor_id": "8086"}) == []
    # Unknown ids (a VF whose ids sysfs did not give): a spec that asks for
    # ids does not match it.
    unknown = {"0000:c1:00.4": nova_pci.ReportedVf("0000:c1:00.0", "nvidia-1150")}
    assert nova_pci.counted_twice(lines({"vendor_id": "10de"}), unknown) == []


def test_nothing_the_agent_reports_nothing_counted_twice():
    assert nova_pci.counted_twice(lines({"address": "0000:c1:00.4"}), {}) == []
    assert nova_pci.counted_twice(
        lines({"address": {"bus": "c1"}}, {"devname": "eth0"}), REPORTED
    ) == []
    assert [e.line for e in nova_pci.not_by_address(
        lines({"vendor_id": "10de"}, {"address": "0000:c1:00.4"}, {"address": {"bus": "c1"}},
              {"devname": "eth0"})
    )] == [3, 4]
