"""``[nvml]`` options: how long the agent waits for NVIDIA's management library.

Declared here, registered by config/registry.py (the one table of every
room's options).  Nothing here imports NVML.
"""

from __future__ import annotations

from oslo_config import cfg

from accel_agent.config.types import FiniteFloatOpt
from accel_agent.nvml.types import DEFAULT_CALL_TIMEOUT

GROUP = "nvml"

nvml_opts = [
    FiniteFloatOpt(
        "call_timeout",
        min=1.0,
        max=600.0,
        default=DEFAULT_CALL_TIMEOUT,
        help="Seconds one NVML read (a GPU's modes, vGPU types and placements, MIG "
        "profiles and instances) may take before the agent gives up on it. A driver that "
        "does not answer blocks only that call: it fails, and later reads fail at once "
        "until the stuck one returns. NVML's writes (mixed-size mode, MIG mode, GPU "
        "instances) run in the privileged helper under [DEFAULT] privileged_call_timeout.",
    ),
]


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, nvml_opts)]
