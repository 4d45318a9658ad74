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
        # Ours, and the process collector's (the client library's names).
        assert name.startswith(("accel_agent_", "process_")), name
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
        "instance_id": "vm-1",
        "parent": "0000:85:00.4",
        "physical_gpu": GPU,
        "pci_bus_id": "00000000:84:00.0",
        "mdev_type": "nvidia-35",
        "state": "assigned",
        "Hostname": "gpu-node-1",
    }
    assert rows["u-2"]["pci_bus_id"] == "" and rows["u-2"]["instance_id"] == ""
    # The next rescan replaces the whole set: a removed mdev's series is gone.
    metrics.set_mdevs([MdevInfo("u-1", "", "0000:85:00.4", GPU, "nvidia-35", "free")])
    rows = samples(metrics, "accel_agent_mdev_info")
    assert [(r["uuid"], r["state"], r["instance_id"]) for r in rows] == [("u-1", "free", "")]


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


def test_no_label_clashes_with_the_labels_prometheus_gives_a_target():
    """Prometheus adds ``instance`` and ``job`` to every scraped series: a
    label of ours by that name would arrive renamed ``exported_instance``."""
    metrics = AgentMetrics()
    metrics.set_mdevs([MdevInfo("u-1", "vm-1", "0000:85:00.4", GPU, "nvidia-35", "assigned")])
    metrics.set_providers([ProviderSample("p", GPU, "nvidia-35", "VGPU", 16, 2)])
    for family in families(metrics).values():
        for sample in family.samples:
            assert not {"instance", "job"} & set(sample.labels), (family.name, sample.labels)


def test_every_counter_has_its_label_sets_at_zero_before_any_event():
    """rate() and increase() need a sample before the first event: every
    counter family of a fresh registry has samples, one per label value it
    can take."""
    metrics = AgentMetrics()
    found = families(metrics)
    counters = [f for f in found.values() if f.type == "counter"]
    assert len(counters) >= 10
    for family in counters:
        assert family.samples, f"{family.name} has no sample before its first event"
        if not family.name.startswith("process_"):
            assert all(s.value == 0 for s in family.samples), family.name

    def labels(name: str, key: str) -> set[str]:
        return {s.labels[key] for s in found[name].samples}

    assert labels("accel_agent_rescans", "reason") == {
        "startup", "periodic", "udev", "api", "reload", "helper"
    }
    assert labels("accel_agent_releases", "remove") == {"true", "false"}
    assert labels("accel_agent_config_reloads", "result") == {"applied", "refused"}
    assert labels("accel_agent_placement_syncs", "result") == {"ok", "failed"}
    assert labels("accel_agent_privileged_helper_restarts", "helper") == {"sysfs", "net", "nvml"}
    codes = labels("accel_agent_errors", "code")
    # Every error code the API answers (class names), and those that are not classes.
    assert {"InsufficientCapacity", "LedgerError", "PrivilegedHelperUnavailable",
            "InternalError", "PlacementSyncFailed", "ApiNotFound"} <= codes


def test_the_error_codes_are_every_exception_class_of_the_agent():
    from accel_agent import exception
    from accel_agent.reporting.metrics import error_codes

    classes = {
        name for name, value in vars(exception).items()
        if isinstance(value, type) and issubclass(value, exception.AccelAgentException)
    }
    assert classes and classes <= set(error_codes())


def test_the_process_collector_reports_this_process():
    import resource

    metrics = AgentMetrics()
    assert metrics.value("process_start_time_seconds") > 0
    assert metrics.value("process_resident_memory_bytes") > 0
    assert metrics.value("process_open_fds") > 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert metrics.value("process_max_fds") == soft


def test_health_series_follow_the_health_document_at_each_scrape():
    from accel_agent.reporting.health_kinds import PROBLEM_KINDS

    metrics = AgentMetrics()
    # Before the daemon's core exists: no healthy sample, every kind at 0.
    assert metrics.value("accel_agent_healthy") is None
    problems = samples(metrics, "accel_agent_health_problem")
    assert sorted(p["problem"] for p in problems) == sorted(PROBLEM_KINDS)
    document = {"status": "ok", "problem_kinds": []}
    metrics.watch_health(lambda: document)
    assert metrics.value("accel_agent_healthy") == 1
    document = {"status": "degraded", "problem_kinds": ["ledger_no_space", "mdevs_missing",
                                                        "mdevs_missing"]}
    assert metrics.value("accel_agent_healthy") == 0
    on = {k for k in PROBLEM_KINDS
          if metrics.value("accel_agent_health_problem", {"problem": k}) == 1}
    assert on == {"ledger_no_space", "mdevs_missing"}
    # A kind outside the fixed set never becomes a label value.
    document = {"status": "degraded", "problem_kinds": ["free text: /var/lib/x"]}
    assert {p["problem"] for p in samples(metrics, "accel_agent_health_problem")} == set(
        PROBLEM_KINDS
    )


def test_a_health_source_that_fails_is_unhealthy_and_the_scrape_still_answers(caplog):
    metrics = AgentMetrics()

    def broken():
        raise RuntimeError("boom")

    metrics.watch_health(broken)
    assert metrics.value("accel_agent_healthy") == 0
    assert "accel_agent_build_info" in metrics.render()[0].decode()
    assert "cannot compute the health" in caplog.text
