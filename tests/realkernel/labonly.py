"""The collection hook shared by the lab-only test directories (migration,
libvirtdefs, sriov): outside the guest of their lab, their tests are skipped
with the reason and how to run them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def skip_outside(lab: str, directory: Path, items: list[pytest.Item], how: str = "") -> None:
    """Mark every collected test under ``directory`` skipped unless this is
    lab ``lab``'s guest (ACCEL_REALKERNEL_LAB)."""
    current = os.environ.get("ACCEL_REALKERNEL_LAB")
    if current == lab:
        return
    how = how or f"tests/realkernel/lab.sh --lab {lab}"
    reason = pytest.mark.skip(
        reason=f"runs in the guest of lab {lab} ({how}); ACCEL_REALKERNEL_LAB is {current!r}"
    )
    for item in items:
        if directory in Path(item.path).resolve().parents:
            item.add_marker(reason)
