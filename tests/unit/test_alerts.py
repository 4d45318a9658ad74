"""docs/prometheus-alerts.yml stays true: promtool accepts the rules and
passes their unit tests (docs/prometheus-alerts.test.yml), every alert has a
case that fires and one that does not, and the rules name only metrics,
label values and problem kinds the agent really exports.

promtool is Debian's (package ``prometheus``): ``make test`` extracts it
from the package into .venv/bin and passes its path as ``PROMTOOL``, so
there the promtool tests always run; elsewhere they run when promtool is on
the PATH and are skipped otherwise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from accel_agent.reporting.health_kinds import PROBLEM_KINDS
from accel_agent.reporting.metrics import MDEV_STATES, AgentMetrics, exported_names
from tests.unit.test_docs import metric_names

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "prometheus-alerts.yml"
CASES = REPO / "docs" / "prometheus-alerts.test.yml"
# Series Prometheus makes itself for every target.
PROMETHEUS_OWN = {"up"}


def promtool() -> str:
    given = os.environ.get("PROMTOOL")
    if given:  # make test: it must be there
        assert os.access(given, os.X_OK), f"PROMTOOL={given} is not an executable"
        return given
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (make test provides it)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def test_promtool_accepts_the_rules():
    proc = run("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_the_rules_pass_their_promtool_unit_tests():
    proc = run("test", "rules", str(CASES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    cases = yaml.safe_load(CASES.read_text())
    assert cases["rule_files"] == [RULES.name]
    fires, quiet = set(), set()
    for test in cases["tests"]:
        for check in test["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in rules()}
    assert len(alerts) >= 8
    assert fires == alerts, "an alert without a case where it fires"
    assert quiet == alerts, "an alert without a case where it stays quiet"


def test_the_rules_name_only_what_the_agent_exports():
    exported = exported_names(AgentMetrics())
    values = {"problem": set(PROBLEM_KINDS), "state": set(MDEV_STATES)}
    for rule in rules():
        expr = rule["expr"]
        names = metric_names(expr)
        assert names, f"{rule['alert']}: {expr!r} names no metric"
        unknown = names - exported - PROMETHEUS_OWN
        assert not unknown, f"{rule['alert']} names {sorted(unknown)}, not exported"
        # Label values matched on: the fixed words the agent uses.
        for label, op, value in re.findall(r'(\w+)\s*(=~|=)\s*"([^"]*)"', expr):
            if label in values:
                words = value.split("|") if op == "=~" else [value]
                assert set(words) <= values[label], f"{rule['alert']}: {label}={value!r}"
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]


def test_the_ledger_alert_covers_every_kind_that_stops_the_ledger():
    from accel_agent.reporting.health_kinds import LEDGER_UNWRITABLE

    (rule,) = [r for r in rules() if r["alert"] == "AccelAgentLedgerNotWritable"]
    matched = re.search(r'problem=~"([^"]*)"', rule["expr"]).group(1).split("|")
    assert sorted(matched) == sorted(LEDGER_UNWRITABLE)


def test_no_rule_or_dashboard_query_expects_the_renamed_instance_label():
    """accel_agent_mdev_info's instance_id was ``instance``, which Prometheus
    renamed exported_instance on ingestion: nothing may still use that."""
    for path in (RULES, REPO / "docs" / "grafana-dashboard.json"):
        assert "exported_instance" not in path.read_text(), path.name
    page = (REPO / "docs" / "metrics.md").read_text()
    for block in re.findall(r"```promql\n(.*?)```", page, re.S):
        assert "exported_instance" not in block, block
    assert "instance_id" in page


def test_promtool_parses_every_query_of_the_dashboard_and_the_metrics_page(tmp_path):
    """A query Prometheus cannot parse shows an empty panel, not an error:
    each one, as a recording rule, must pass promtool's check (Grafana's
    ``$node`` variable replaced by a regex that matches anything)."""
    import json

    from tests.unit.test_docs import queries

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    found = [q for q in queries(dashboard) if not re.fullmatch(r"\w+", q)]
    page = (REPO / "docs" / "metrics.md").read_text()
    found += re.findall(r"```promql\n(.*?)```", page, re.S)
    assert len(found) >= 20
    recorded = [{"record": f"check:query_{i}", "expr": q.replace("$node", ".*")}
                for i, q in enumerate(found)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": recorded}]}))
    proc = run("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
