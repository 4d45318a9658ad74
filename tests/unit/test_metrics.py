"""The metrics' names and the labels an operator joins with DCGM's."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from accel_agent.reporting.metrics import (
    AgentMetrics,
    MdevInfo,
    ProviderSample,
    dcgm_pci_bus_id,
    exported_names,
)

GPU = "0000:84:00.0"


def families(metrics: AgentMetrics) -> dict[str, object]:
    text = metrics.render()[0].decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(metrics: AgentMetrics, name: str) -> list[dict[str, str]]:
    text = metrics.render()[0].decode()
    return [
        dict(s.labels)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


def test_pci_bus_id_is_written_as_nvml_and_dcgm_write_it():
    assert dcgm_pci_bus_id("0000:84:00.0") == "00000000:84:00.0"
    assert dcgm_pci_bus_id("0000:af:1f.7") == "00000000:AF:1F.7"
    assert dcgm_pci_bus_id("10de:3b:00.1") == "000010DE:3B:00.1"
    assert dcgm_pci_bus_id("mtty") == ""


def test_names_follow_prometheus_conventions():
    metrics = AgentMetrics()
    metrics.rescans.labels(reason="periodic").inc()
    text = metrics.render()[0].decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types, text
    for name, kind in types.items():
        assert name.startswith("accel_agent_"), name
        if kind == "counter":
            assert name.endswith("_total"), name
        if "duration" in name or "timestamp" in name:
            assert name.endswith("_seconds"), name
    # No per-process creation times beside the counters.
    assert "_created" not in text
    assert samples(metrics, "accel_agent_build_info")[0]["version"]


def test_mdev_info_carries_instance_gpu_and_dcgm_join_labels():
    metrics = AgentMetrics(hostname="gpu-node-1")
    metrics.set_mdevs(
        [
            MdevInfo("u-1", "vm-1", "0000:85:00.4", GPU, "nvidia-35", "assigned"),
            MdevInfo("u-2", "", "mtty", "mtty", "mtty-1", "foreign"),
        ]
    )
    rows = {r["uuid"]: r for r in samples(metrics, "accel_agent_mdev_info")}
    assert rows["u-1"] == {
        "uuid": "u-1",
        "instance": "vm-1",
        "parent": "0000:85:00.4",
        "physical_gpu": GPU,
        "pci_bus_id": "00000000:84:00.0",
        "mdev_type": "nvidia-35",
        "state": "assigned",
        "Hostname": "gpu-node-1",
    }
    assert rows["u-2"]["pci_bus_id"] == "" and rows["u-2"]["instance"] == ""
    # The next rescan replaces the whole set: a removed mdev's series is gone.
    metrics.set_mdevs([MdevInfo("u-1", "", "0000:85:00.4", GPU, "nvidia-35", "free")])
    rows = samples(metrics, "accel_agent_mdev_info")
    assert [(r["uuid"], r["state"], r["instance"]) for r in rows] == [("u-1", "free", "")]


def test_provider_gauges_split_capacity_and_used_and_drop_providers_that_left():
    metrics = AgentMetrics()
    first = ProviderSample("h_pci_0000_84_00_0", GPU, "nvidia-35", "VGPU", 16, 2)
    second = ProviderSample("h_mtty_mtty", "mtty", "mtty-1", "CUSTOM_MTTY", 4, 0)
    metrics.set_providers([first, second])
    capacity = {r["provider"]: r for r in samples(metrics, "accel_agent_provider_capacity")}
    assert capacity[first.name]["pci_bus_id"] == "00000000:84:00.0"
    assert metrics.value("accel_agent_provider_capacity", capacity[first.name]) == 16
    assert metrics.value("accel_agent_provider_used", capacity[first.name]) == 2
    assert metrics.value("accel_agent_providers") == 2
    metrics.set_providers([first])
    assert [r["provider"] for r in samples(metrics, "accel_agent_provider_used")] == [first.name]
    assert metrics.value("accel_agent_providers") == 1


def test_exported_names_include_metrics_without_samples_yet():
    names = exported_names(AgentMetrics())
    # Labelled counters nobody incremented have no sample, but may be queried.
    assert {"accel_agent_errors_total", "accel_agent_rescans_total"} <= names
    assert {"accel_agent_mdev_info", "accel_agent_build_info"} <= names
    assert "accel_agent_api_request_duration_seconds_bucket" in names
    assert "accel_agent_errors" not in names
