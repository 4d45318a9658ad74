"""The allocation-candidates queries of tests/functional/test_owner_nova.py,
which that module writes out by hand, are the ones Nova 34.0.0's own request
filters (``compute_status_filter``, ``owner_nova_filter``) and
``ResourceRequest.to_querystring`` build (nova_owner_query.py, run by Nova's
venv).  Here, not in the functional tier: this tier must run in CI, so the
comparison can never be skipped for want of Nova's venv."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
from pathlib import Path

from tests.functional import test_owner_nova as queries


def test_the_queries_are_the_ones_nova_34_builds(nova_python: Path) -> None:
    done = subprocess.run(
        [str(nova_python), str(Path(__file__).with_name("nova_owner_query.py"))],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = {}
    for filtered, root_required in (
        (False, queries.ROOT_UNFILTERED), (True, queries.ROOT_FILTERED),
    ):
        ours[f"vgpu {filtered}"] = queries.vgpu_flavor(root_required)
        ours[f"two-gpus {filtered}"] = queries.two_gpus_flavor(root_required, "CUSTOM_L40S_4Q")
        ours[f"pci-alias {filtered}"] = queries.pci_alias_flavor(
            root_required, "OWNER_NOVA" if filtered else None
        )
    assert json.loads(done.stdout) == {
        case: urllib.parse.urlencode(query) for case, query in ours.items()
    }
