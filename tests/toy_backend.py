"""Install a device backend from a distribution other than accel-agent: the
toy_vf backend of tests/fixtures/toy_backend/toyvf/ (its docstring says
what it is), as pip would lay it out, into a directory a test puts on a
process's ``PYTHONPATH``: the package, and a ``toyvf-1.0.dist-info`` with its
``METADATA`` and an ``entry_points.txt`` registering it under
``accel_agent.backends``.  Nothing is built or downloaded (a real ``pip
install`` of a wheel would write the same files and cost seconds).
"""

from __future__ import annotations

import shutil
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fixtures" / "toy_backend" / "toyvf"
NAME = "toy_vf"  # its entry point name, Parent.backend
TYPE = "toy-vf"  # the device type it offers
ENTRY_POINT = f"{NAME} = toyvf:ToyVfBackend"


def install(site: Path, entry_points: str = ENTRY_POINT) -> Path:
    """The toy backend's distribution in ``site`` (created); returns ``site``.
    ``entry_points``: the lines of its ``[accel_agent.backends]`` section."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(SOURCE, site / "toyvf", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "toyvf-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyvf\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[accel_agent.backends]\n{entry_points}\n")
    return site
