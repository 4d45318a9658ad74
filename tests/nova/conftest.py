"""The Nova-code tier: Nova 34's own code on the agent's results.

Must-run logic as the real-kernel tier's: ``ACCEL_NOVA=0`` skips the tier;
otherwise a Nova venv that cannot be built fails it, and so does a host
without FUSE or root when ``ACCEL_NOVA=1`` or ``ACCEL_REALKERNEL=1`` (CI) says
the tier must run (unset: those two skip, with their reason)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accel_agent.simulator import testing as sim_testing
from tests.functional.simhost import SimHost, simulated_host
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


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHost]:
    """The FUSE-simulated host a module's real daemon runs on: the module's
    ``SIM_PROFILES``, one GPU each, ``SIM_VFS`` VFs per vGPU PF.  Missing root
    (the daemon's privsep helper) or FUSE follows the tier's must-run rule."""
    if os.geteuid() != 0:
        cannot_run("the agent's privsep daemon needs root")
    if not sim_testing.fuse_available():
        cannot_run(f"FUSE unavailable: {sim_testing.fuse_unavailable_reason()}")
    module = request.module
    base = tmp_path_factory.mktemp(module.__name__.rpartition(".")[2])
    with simulated_host(base, list(module.SIM_PROFILES), gpus=1, vfs=module.SIM_VFS) as host:
        yield host


def run_in_nova(python: Path, script: Path, payload: Any, timeout: float = 300) -> Any:
    """Run ``script`` with Nova's venv's ``python``: ``payload`` as JSON on
    its stdin, its stdout parsed as JSON (the way every test of this tier
    hands the agent's results to Nova's own code)."""
    done = subprocess.run(
        [str(python), str(script)],
        input=json.dumps(payload), capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)
