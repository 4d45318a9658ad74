"""Every deliberate fault of tests/faults/ still applies to the tree: a patch
that no longer applies proves nothing (``make prove-faults`` would stop at it),
and the code it was written against moves on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES = sorted((REPO / "tests" / "faults").glob("*.patch"))


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_the_fault_applies_and_names_its_test(patch: Path) -> None:
    text = patch.read_text()
    assert "\n# expect: " in "\n" + text, f"{patch.name}: no '# expect:' line"
    assert "# caught-by" in text, f"{patch.name}: no '# caught-by:' line"
    check = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True
    )
    assert check.returncode == 0, f"{patch.name} no longer applies: {check.stderr}"
