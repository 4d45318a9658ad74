"""Helpers for tests that run inside the lab guest against the REAL mdev sysfs.

The guest (tests/realkernel/lab.sh) runs Debian's kernel with the mtty sample
driver: one virtual parent ``mtty`` with ``mtty-1`` (1 port) and ``mtty-2``
(2 ports) sharing a pool of 24 ports, so ``available_instances`` is 24 and 12
when nothing exists.  Raw writes here are plain ``os.write`` calls, so a test
sees exactly the errno the kernel returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid as uuid_mod
from pathlib import Path
from typing import Any

SYSFS = "/sys"
PARENT = "mtty"
PARENT_DIR = f"{SYSFS}/class/mdev_bus/{PARENT}"
TYPES_DIR = f"{PARENT_DIR}/mdev_supported_types"
DEVICES_DIR = f"{SYSFS}/bus/mdev/devices"
# mtty's MAX_MTTYS: one shared pool of ports; mtty-1 takes 1 port, mtty-2 takes 2.
PORTS = 24
IDLE_AVAILABLE = {"mtty-1": 24, "mtty-2": 12}

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def new_uuid() -> str:
    return str(uuid_mod.uuid4())


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read().rstrip("\n")


def raw_write(path: str, data: str | bytes) -> None:
    """One open + one write(2), like the agent's privileged writer; OSError
    carries the kernel's errno."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode() if isinstance(data, str) else data)
    finally:
        os.close(fd)


def create(mdev_type: str, uuid: str) -> None:
    raw_write(f"{TYPES_DIR}/{mdev_type}/create", uuid)


def remove(uuid: str) -> None:
    raw_write(f"{DEVICES_DIR}/{uuid}/remove", "1")


def available() -> dict[str, int]:
    """``available_instances`` of both mtty types."""
    return {t: int(read(f"{TYPES_DIR}/{t}/available_instances")) for t in IDLE_AVAILABLE}


def expected_available(ports_used: int) -> dict[str, int]:
    free = PORTS - ports_used
    return {"mtty-1": free, "mtty-2": free // 2}


def mdevs() -> dict[str, str]:
    """uuid -> type of every mdev in the kernel, read from sysfs directly."""
    found = {}
    for name in sorted(os.listdir(DEVICES_DIR)):
        found[name] = os.path.basename(os.readlink(f"{DEVICES_DIR}/{name}/mdev_type"))
    return found


def remove_all() -> None:
    for name in os.listdir(DEVICES_DIR):
        with contextlib.suppress(FileNotFoundError):
            remove(name)


def uuids_in(document: Any) -> set[str]:
    """Every canonical UUID anywhere in a JSON document (keys and values)."""
    found: set[str] = set()
    if isinstance(document, dict):
        for key, value in document.items():
            found |= uuids_in(key) | uuids_in(value)
    elif isinstance(document, list):
        for value in document:
            found |= uuids_in(value)
    elif isinstance(document, str):
        found |= set(_UUID_RE.findall(document.lower()))
    return found


# --- the agent's CLI -----------------------------------------------------------------


def write_config(
    path: Path,
    state_dir: Path,
    device_addresses: str = PARENT,
    enabled_types: str = "mtty-2",
) -> Path:
    """An accel-agent config for the guest: real /sys, ledger under the guest's tmpfs."""
    path.write_text(
        textwrap.dedent(
            f"""\
            [DEFAULT]
            sysfs_root = {SYSFS}
            host = realkernel
            state_dir = {state_dir}

            [devices]
            enabled_mdev_types = {enabled_types}

            [mdev_{enabled_types.split(",")[0].strip()}]
            device_addresses = {device_addresses}

            [libvirt]
            # no libvirtd in the guest: no domain can reference an mdev
            uri =
            """
        )
    )
    return path


def _accelctl_argv() -> list[str]:
    script = Path(sys.executable).with_name("accelctl")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "accel_agent.cmd.ctl"]


# A command takes 3-8 s in the TCG guest (Python is ~25x slower there than on
# the host), and 30-65 s when the host is loaded (load 5.5: a check-config took
# 64 s, an offline recover with its helper's start more than 90 s); a hung one
# must still fail its test before the lab's own timeout (900 s).
ACCELCTL_TIMEOUT = 240


def accelctl(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``accelctl`` console script of this environment (a fresh process,
    as an operator would)."""
    argv = _accelctl_argv()
    if config is not None:
        argv += ["--config-file", str(config)]
    argv += list(args)
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=ACCELCTL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"`{' '.join(argv)}` did not finish within {ACCELCTL_TIMEOUT}s\n"
            f"--- stdout\n{_text(exc.stdout)}--- stderr\n{_text(exc.stderr)}"
        ) from None


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"`{' '.join(result.args)}` exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, describe(result)
    return result


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    ok(result)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON ({exc})\n{describe(result)}") from None
