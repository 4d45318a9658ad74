"""Run the REAL privsep-helper daemon of accel_agent.privileged in a test.

Usage (the daemon is a process-wide singleton, so one at a time)::

    with privsep_daemon(tmp_path, sysfs_root=tree) as daemon:
        privileged.create_mdev(...)
        daemon.status()["CapEff"]

The daemon is started the production way (``start_privsep`` with a config
file, ROOTWRAP method, no sudo because tests run as root) and reads
``sysfs_root`` from that config file, like it does in production.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from accel_agent import privileged

REPO_ROOT = Path(__file__).resolve().parents[2]


def skip_unless_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the privsep daemon is started without sudo, so it needs root")


@dataclass(frozen=True)
class PrivsepDaemon:
    config_file: Path
    pid: int

    def status(self, tid: int | None = None) -> dict[str, str]:
        """/proc/<pid>/status (or of one of its threads) as a dict."""
        path = f"/proc/{self.pid}/status" if tid is None else f"/proc/{self.pid}/task/{tid}/status"
        fields: dict[str, str] = {}
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return fields

    def thread_ids(self) -> list[int]:
        return sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))


def _find_daemon_pid(config_file: Path) -> int:
    """The forked daemon outlives the helper process that started it; find it
    by its argv, which names our (unique, temporary) config file."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--privsep_context" in argv and os.fsencode(config_file) in argv:
            found.append(int(entry))
    if len(found) != 1:
        raise RuntimeError(f"expected one privsep daemon for {config_file}, found {found}")
    return found[0]


@contextlib.contextmanager
def privsep_daemon(
    work_dir: Path, sysfs_root: Path, extra_config: str = ""
) -> Iterator[PrivsepDaemon]:
    skip_unless_root()
    if privileged.sysfs_admin.channel is not None:
        raise RuntimeError("a privsep daemon of accel_agent is already running in this process")
    config_file = work_dir / "accel-agent-privsep.conf"
    config_file.write_text(f"[DEFAULT]\nsysfs_root = {sysfs_root}\n{extra_config}")
    # privsep-helper is a fresh interpreter: it must import accel_agent from
    # this checkout even when the package is not installed into the venv.
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old_path) if p)
    try:
        privileged.start_privsep([str(config_file)], [])
    finally:
        if old_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old_path
    try:
        yield PrivsepDaemon(config_file, _find_daemon_pid(config_file))
    finally:
        privileged.stop_privsep()
