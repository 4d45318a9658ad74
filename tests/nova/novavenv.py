"""Nova's own venv for the Nova-code tier, outside the repo and cached.

``nova==NOVA_VERSION`` from PyPI with the few test packages its shipped
fixtures import (nova.tests.fixtures imports testtools and wsgi_intercept),
every version pinned by constraints.txt beside this file: Nova's
dependencies never enter the agent's venv.  The venv lives in
``$ACCEL_NOVA_CACHE`` (default /var/cache/accel-agent-nova) as
``venv-<nova version>-py<X.Y>`` and is built again when the pin or the
constraints change (a stamp holds their digest).  Builds are serialised by a
lock file, so parallel runs share one.

    python -m tests.nova.novavenv        # build if needed, print its python
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

NOVA_VERSION = "34.0.0"
HERE = Path(__file__).resolve().parent
CONSTRAINTS = HERE / "constraints.txt"
# Imported by nova.tests.fixtures (shipped in the wheel), not Nova's runtime deps.
TEST_PACKAGES = ("testtools", "wsgi-intercept")
CACHE_ENV = "ACCEL_NOVA_CACHE"
DEFAULT_CACHE = "/var/cache/accel-agent-nova"


class NovaVenvError(Exception):
    """The venv could not be built (the message says why)."""


def venv_dir() -> Path:
    cache = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    return cache / f"venv-{NOVA_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"


def digest() -> str:
    h = hashlib.sha256(f"nova=={NOVA_VERSION}\n{' '.join(TEST_PACKAGES)}\n".encode())
    h.update(CONSTRAINTS.read_bytes())
    return h.hexdigest()


def ensure(log: Callable[[str], object] = print) -> Path:
    """The venv's python, built first when missing or stale."""
    target = venv_dir()
    stamp = target / ".accel-nova-stamp"
    python = target / "bin" / "python"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == digest():
            return python
        started = time.monotonic()
        log(f"nova tier: building {target} (nova=={NOVA_VERSION}, pins {CONSTRAINTS.name})")
        shutil.rmtree(target, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(target)])
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "-c", str(CONSTRAINTS), f"nova=={NOVA_VERSION}", *TEST_PACKAGES])
        stamp.write_text(digest())
        log(f"nova tier: built {target} in {time.monotonic() - started:.0f} s")
    return python


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise NovaVenvError(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{tail}")


if __name__ == "__main__":
    try:
        print(ensure(log=lambda m: print(m, file=sys.stderr)))
    except NovaVenvError as e:
        print(f"nova tier: cannot build Nova's venv: {e}", file=sys.stderr)
        sys.exit(1)
