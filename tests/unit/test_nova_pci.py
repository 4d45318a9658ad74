"""reporting/nova_pci.py: the resource class rule and nova.conf parsing."""

from __future__ import annotations

import json

import pytest

from accel_agent.reporting import nova_pci


@pytest.mark.parametrize(
    ("mdev_type", "mdev_class", "expected"),
    [
        ("nvidia-1414", "VGPU", "CUSTOM_NVIDIA_1414"),  # never Nova's own mdev VGPU class
        ("nvidia-1414", "CUSTOM_H200", "CUSTOM_H200"),  # a configured custom class is kept
        ("nvidia-35", "VGPU", "CUSTOM_NVIDIA_35"),
    ],
)
def test_resource_class(mdev_type: str, mdev_class: str, expected: str) -> None:
    assert nova_pci.resource_class_for(mdev_type, mdev_class) == expected


def test_parse_reads_only_the_pci_section_in_every_form_nova_takes() -> None:
    text = "\n".join(
        [
            "[DEFAULT]",
            'device_spec = {"address": "0000:01:00.4"}',  # not [pci]: ignored
            "[ pci ]",
            "# a comment",
            'passthrough_whitelist = {"address": "0000:C1:00.4", "managed": "no"}',
            'device_spec = [{"address": "0000:c1:00.5"}, {"vendor_id": "10de"}]',
            'alias = {"name": "a", "resource_class": "CUSTOM_A"}',
            "device_spec = {broken",
            "device_spec = 7",
            "[libvirt]",
            'alias = {"name": "b"}',
        ]
    )
    parsed = nova_pci.parse_nova_conf(text, "n.conf")
    assert sorted(parsed.specs) == ["0000:c1:00.4", "0000:c1:00.5"]  # lower-cased
    assert list(parsed.aliases) == ["a"]
    assert [p.split(":", 2)[:2] for p in parsed.problems] == [["n.conf", "8"], ["n.conf", "9"]]


def test_no_drift_between_render_and_parse() -> None:
    specs = [
        nova_pci.VfSpec("0000:c1:00.4", "nvidia-1414", "CUSTOM_NVIDIA_1414", "0000:c1:00.0", True),
        nova_pci.VfSpec("0000:c1:00.5", "nvidia-1414", "CUSTOM_NVIDIA_1414", "0000:c1:00.0", False),
    ]
    text = nova_pci.render(specs, "h")
    assert text.count("alias =") == 1 and "# 0000:c1:00.5: not typed yet" in text
    found = nova_pci.parse_nova_conf(text)
    vfs = {vf: nova_pci.HostVf("0000:c1:00.0") for vf in ("0000:c1:00.4", "0000:c1:00.5")}
    assert nova_pci.drift(specs, found, vfs) == []
    wrong = nova_pci.parse_nova_conf(
        text.replace('"resource_class": "CUSTOM_NVIDIA_1414"', '"resource_class": "X"', 1)
    )
    assert nova_pci.drift(specs, wrong, {}) == [
        "0000:c1:00.4: resource_class is 'X', the host's type nvidia-1414 needs "
        "'CUSTOM_NVIDIA_1414'"
    ]


def test_nova_reads_the_rendered_lines(tmp_path) -> None:
    """Through oslo.config as Nova declares the options (MultiStrOpt in [pci]):
    every value is one JSON object, comments and all."""
    from oslo_config import cfg

    specs = [
        nova_pci.VfSpec("0000:c1:00.4", "nvidia-1414", "CUSTOM_NVIDIA_1414", "0000:c1:00.0", False),
        nova_pci.VfSpec("0000:c2:00.4", "nvidia-1415", "CUSTOM_NVIDIA_1415", "0000:c2:00.0", True),
    ]
    path = tmp_path / "nova.conf"
    path.write_text(nova_pci.render(specs, "h"))
    conf = cfg.ConfigOpts()
    conf.register_opts(
        [cfg.MultiStrOpt("device_spec", default=[]), cfg.MultiStrOpt("alias", default=[])],
        group="pci",
    )
    conf(["--config-file", str(path)], default_config_files=[], default_config_dirs=[])
    assert [json.loads(v)["address"] for v in conf.pci.device_spec] == [
        "0000:c1:00.4",
        "0000:c2:00.4",
    ]
    assert [json.loads(v)["name"] for v in conf.pci.alias] == ["nvidia-1414", "nvidia-1415"]


def test_every_line_asks_for_live_migration_and_says_what_nova_then_needs() -> None:
    """Nova 34 reads live_migratable in a device_spec (the provider's
    HW_PCI_LIVE_MIGRATABLE trait) and in an alias (the conductor live-migrates
    only instances whose requests say so): both carry it.  Nova's reading is
    proven in tests/nova/test_nova_pci_passthrough.py."""
    spec = nova_pci.VfSpec("0000:c1:00.4", "nvidia-1414", "CUSTOM_NVIDIA_1414", "0000:c1:00.0",
                           True)
    text = nova_pci.render([spec], "h")
    [line] = [v for v in text.splitlines() if v.startswith("device_spec =")]
    [alias] = [v for v in text.splitlines() if v.startswith("alias =")]
    assert json.loads(line.split("=", 1)[1])["live_migratable"] == "yes"
    assert json.loads(alias.split("=", 1)[1])["live_migratable"] == "yes"
    assert "libvirt >= 10.0.0 and QEMU >= 8.2.2" in text
    assert "[filter_scheduler] pci_in_placement = True" in text


def test_the_tag_is_left_out_where_nova_would_refuse_it(monkeypatch) -> None:
    """Below libvirt 10.0.0 / QEMU 8.2.2 nova-compute refuses to start with
    live_migratable in a device_spec (Debian bookworm has libvirt 9.0): the
    agent then leaves it out and says why; without a uri it cannot know."""
    from accel_agent.migration import versions

    assert nova_pci.live_migratable_here("")[0] is False
    found = {"v": versions.HostVersions(libvirt=(9, 0, 0), qemu=(7, 2, 0), kernel=(6, 1, 0))}
    monkeypatch.setattr(versions, "probe_uri", lambda uri: found["v"])
    tag, why = nova_pci.live_migratable_here("qemu:///system")
    assert tag is False and "libvirt 9.0.0" in why
    found["v"] = versions.HostVersions(libvirt=(10, 0, 0), qemu=(8, 2, 2), kernel=(6, 1, 0))
    assert nova_pci.live_migratable_here("qemu:///system") == (True, "")
    spec = nova_pci.VfSpec("0000:c1:00.4", "nvidia-1414", "CUSTOM_NVIDIA_1414", "0000:c1:00.0",
                           True)
    text = nova_pci.render([spec], "h", False, "why not")
    assert "live_migratable" not in "".join(
        v for v in text.splitlines() if not v.startswith("#"))
    assert "# No live_migratable tag: why not." in text


def test_a_pf_address_or_glob_line_lists_the_gpus_vfs() -> None:
    """Nova matches a VF by its PF's full address or a glob (PciDeviceSpec):
    so does the drift check; VFs such a line names that the agent did not
    type are said once, by the line."""
    gpu = "0000:c1:00.0"
    specs = [
        nova_pci.VfSpec(f"0000:c1:00.{fn}", "nvidia-1414", "CUSTOM_NVIDIA_1414", gpu, True)
        for fn in (4, 5)
    ]
    vfs = {f"0000:c1:00.{fn}": nova_pci.HostVf(gpu, "10de", "2236") for fn in range(4, 8)}
    alias = ('alias = {"name": "a", "device_type": "type-VF", '
             '"resource_class": "CUSTOM_NVIDIA_1414"}\n')
    # (A short form without the domain is a glob for Nova: it names the PF's
    # own address only; test_nova_counted_twice.py checks that against Nova.)
    for address in ("0000:c1:00.0", "0000:C1:00.0", "0000:c1:00.*", "*:c1:*.*"):
        text = ('[pci]\ndevice_spec = {"address": "' + address + '", "managed": "no", '
                '"resource_class": "CUSTOM_NVIDIA_1414"}\n') + alias
        found = nova_pci.parse_nova_conf(text, "n.conf")
        assert nova_pci.drift(specs, found, {k: vfs[k] for k in ("0000:c1:00.4",
                                                                  "0000:c1:00.5")}) == []
        assert nova_pci.drift(specs, found, vfs) == [
            "n.conf:2: [pci] device_spec gives Nova VF(s) 0000:c1:00.6, 0000:c1:00.7, which "
            "are not vGPUs the agent typed"
        ]
    # Another vendor's ids: the line names none of these VFs.
    other = nova_pci.parse_nova_conf(
        '[pci]\ndevice_spec = {"address": "0000:c1:00.0", "vendor_id": "8086"}\n' + alias, "n.conf"
    )
    assert nova_pci.drift(specs, other, vfs) == [
        "0000:c1:00.4 (nvidia-1414) is not in [pci] device_spec",
        "0000:c1:00.5 (nvidia-1414) is not in [pci] device_spec",
        "0000:c1:00.0 is in [pci] device_spec but is no vGPU VF of this host",
    ]
