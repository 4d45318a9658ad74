"""The Nova-code tier: Nova 34's own code on the agent's results.

Must-run logic as the real-kernel tier's: ``ACCEL_NOVA=0`` skips the tier;
otherwise a Nova venv that cannot be built fails it, and so does a host
without FUSE or root when ``ACCEL_NOVA=1`` or ``ACCEL_REALKERNEL=1`` (CI) says
the tier must run (unset: those two skip, with their reason)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.nova import novavenv


def must_run() -> bool:
    return "1" in (os.environ.get("ACCEL_NOVA"), os.environ.get("ACCEL_REALKERNEL"))


def cannot_run(reason: str) -> None:
    if must_run():
        pytest.fail(f"nova tier cannot run and must (ACCEL_NOVA/ACCEL_REALKERNEL=1): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def nova_python() -> Path:
    """The python of Nova's cached venv (built on first use)."""
    if os.environ.get("ACCEL_NOVA") == "0":
        pytest.skip("ACCEL_NOVA=0")
    try:
        return novavenv.ensure()
    except novavenv.NovaVenvError as e:
        pytest.fail(f"cannot build Nova's venv: {e}")
