"""The documents of docs/ stay true: the generated references match their
sources, the Grafana dashboard names only metrics the agent exports, and no
link of README.md or docs/ leaves the repository or points at nothing."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from accel_agent.reporting.metrics import AgentMetrics, exported_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
# Metrics of NVIDIA's dcgm-exporter the dashboard joins with (docs/metrics.md).
DCGM = re.compile(r"^DCGM_FI_[A-Z0-9_]+$")
# PromQL words that look like metric names but are not.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}


def gendocs():
    spec = importlib.util.spec_from_file_location("gendocs", REPO / "tools" / "gendocs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_references_are_up_to_date():
    assert gendocs().stale() == [], "run make docs and commit the result"


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once
    strings, label matchers, grouping lists, ranges, numbers and function
    calls are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        after = text[match.end():].lstrip()
        if after.startswith("(") or word.lower() in KEYWORDS:
            continue  # a function or a keyword
        names.add(word)
    return names


def queries(dashboard: dict) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        match = re.match(r"label_values\((\w+)", query or "")
        if match:
            found.append(match.group(1))
    return found


def test_metric_names_are_read_out_of_promql():
    expr = ('sum by (le, route) (rate(accel_agent_x_bucket{route="/v1/{a}",b=~"c"}[5m])) '
            '* on (Hostname) group_left (modelName) DCGM_FI_DEV_GPU_UTIL > bool 0.5')
    assert metric_names(expr) == {"accel_agent_x_bucket", "DCGM_FI_DEV_GPU_UTIL"}
    assert metric_names("time() - max(accel_agent_last_seconds)") == {"accel_agent_last_seconds"}


def test_every_dashboard_query_names_metrics_the_agent_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names(AgentMetrics())
    found = queries(dashboard)
    assert len(found) >= 10
    used = set()
    for expr in found:
        names = metric_names(expr)
        ours = {n for n in names if not DCGM.match(n)}
        assert ours, f"{expr!r} names no metric of the agent"
        unknown = ours - exported
        assert not unknown, f"{expr!r} names {sorted(unknown)}, which the agent does not export"
        used |= ours
    # The dashboard shows the join the docs promise.
    assert any("accel_agent_mdev_info" in q and "DCGM_FI_" in q for q in found)
    assert {"accel_agent_mdev_info", "accel_agent_provider_capacity"} <= used


def test_the_queries_of_the_metrics_page_name_exported_metrics():
    text = (REPO / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    exported = exported_names(AgentMetrics())
    for block in blocks:
        ours = {n for n in metric_names(block) if not DCGM.match(n)}
        assert ours and ours <= exported, block


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


DOCUMENTS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in REPO.glob("docs/*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_links_stay_inside_the_repository_and_resolve(document):
    path = REPO / document
    for target in links(path):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{document}: {target} leaves the repository"
        assert resolved.exists(), f"{document}: {target} does not exist"


# Directories of the machines the project is developed and measured on: a
# committed file never names one (a reader's machine has none of them).  The
# patterns are assembled so that this file does not match itself.
_SLASH = "/"
MACHINE_PATHS = re.compile(
    "|".join([
        _SLASH + r"work" + _SLASH,
        _SLASH + r"root" + _SLASH,
        _SLASH + r"home" + _SLASH + r"[a-z]",
        # a run's own temporary directory (tempfile's 8 random characters)
        _SLASH + r"tmp" + _SLASH + r"(?:pytest-of-|tmp[a-z0-9_]{8}|accel-[a-z-]*-[a-z0-9_]{8}\b)",
    ])
)


def test_no_committed_file_names_a_machine_path():
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    found = []
    for name in filter(None, files):
        path = REPO / name
        if not path.is_file() or path.suffix in (".patch",):
            continue  # a fault patch quotes code, hunks and all
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{name}:{n}: {m.group(0)}" for n, line in enumerate(text.splitlines(), 1)
                  for m in [MACHINE_PATHS.search(line)] if m]
    assert found == []


# Citations of documents that are not in the repository (issue 35): the plan
# the project started from (its file's name in upper case, then "§N") and the
# research notes it was written with (their file names; "research note §N",
# "research §N", "research/..."): a reader of a clone cannot follow them.
# docs/design.md and its Sources carry those facts, and a citation points
# there.  (`git grep` for the plan's name finds nothing: not even here.)
RESEARCH_NOTES = (
    "sysfs-mdevctl-kubevirt", "nova", "mtty-lab", "live-migration-lab",
    "cyborg-osacc-placement", "vendor-vfio-and-sriov", "nova-34-and-standing-layouts",
    r"mixed-size-mig[\w-]*",
)
OUTSIDE_CITATION = re.compile(
    "|".join([
        r"(?-i:DESIGN\.md)",  # the plan's name, upper case: docs/design.md is ours
        r"\bresearch\b\s*(?:notes?\s*)?(?:/|§)",
        r"\bresearch\s+(?:[\w-]+\.md\b|nova-34)",
        r"\b(?:" + "|".join(RESEARCH_NOTES) + r")\.md\b",
        r"\b(?:mtty-lab|live-migration-lab)\b",
    ]),
    re.IGNORECASE,
)
# Not checked (a visible list: each entry says why):
CITATIONS_NOT_CHECKED = (
    # Captures of real hosts and tools, byte for byte: their text is theirs.
    "tests/fixtures/",
    # This test: it quotes every form it refuses.
    "tests/unit/test_docs.py",
    # The deliberate faults quote code, and one of them brings a citation
    # back on purpose (tests/faults/docs-citation-outside.patch); what a
    # patch's context quotes is the code's, checked here.
    "tests/faults/",
)


def outside_citations(names: list[str], read) -> list[str]:
    """``file:line: text`` of every citation of a document outside the
    repository in ``names`` (``read(name)`` gives a file's text, None for
    one that is not text), those under CITATIONS_NOT_CHECKED aside."""
    found = []
    for name in names:
        if name.startswith(CITATIONS_NOT_CHECKED) or (text := read(name)) is None:
            continue
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if OUTSIDE_CITATION.search(line)]
    return found


def _committed_text(name: str) -> str | None:
    path = REPO / name
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def test_every_citation_points_into_the_repository():
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    assert "docs/design.md" in files  # where they point now
    assert outside_citations(list(filter(None, files)), _committed_text) == []


@pytest.mark.parametrize(
    "line",
    [
        "Targets (DESIGN" ".md §9):",
        "Nova (research/nova.md §3, §11) walks",
        "cycled (research note §4-5).",
        "# no newline (research §3)",
        "Facts tried on igb (research vendor-vfio-and-sriov.md §6):",
        'Refused in use (research nova-34 "vGPU 17+ facts")',
        "Values from Research vendor-vfio-and-sriov.md §6",
        "exactly as measured in mtty-lab.md: 24 ports",
        "# 38 bytes (mtty-lab: EINVAL)",
        "`research/live-migration-lab.md` (shared notes)",
    ],
)
def test_the_citation_rule_sees_each_form_the_notes_were_cited_in(line):
    assert outside_citations(["a.py"], lambda name: line) == [f"a.py:1: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        "(docs/design.md §10.4)",
        "the lock of the mdev ledger",
        "Nova's nova/virt/libvirt/driver.py",
        "see tests/realkernel/README.md",
    ],
)
def test_the_citation_rule_passes_citations_into_the_repository(line):
    assert outside_citations(["a.py"], lambda name: line) == []


def test_the_citation_rule_leaves_out_the_listed_directories_only():
    line = "(research §3)"
    assert outside_citations(
        ["accel_agent/simulator/x.py", "tests/fixtures/a.txt", "tests/faults/b.patch"],
        lambda name: line,
    ) == [f"accel_agent/simulator/x.py:1: {line}"]
