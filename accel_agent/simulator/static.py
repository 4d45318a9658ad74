"""Write a simulated host's current state as a real directory tree.

For read-only consumers (scanner tests, benchmarks, ``mdevctl`` in a chroot):
directories, regular files with exactly the bytes a read would return, real
relative symlinks, ``create``/``remove`` as empty 0200 files.  Nothing reacts to
writes here; use the FUSE front for that.

Speed matters (the 1024 parents x 24 types benchmark tree has ~200k entries),
so this uses raw ``os`` calls and fixes modes only when the umask would have
changed them.
"""

from __future__ import annotations

import os

from accel_agent import exception
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.spec import HostSpec


def _umask() -> int:
    # Reading it from /proc avoids os.umask()'s set-and-restore race with other threads.
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def materialise(spec_or_host: HostSpec | SimulatedHost, directory: str | os.PathLike[str]) -> str:
    """Write the tree under ``directory`` (created if missing, must be empty) and
    return its absolute path, to be used as the agent's ``sysfs_root``."""
    host = spec_or_host if isinstance(spec_or_host, SimulatedHost) else SimulatedHost(spec_or_host)
    root = os.path.abspath(os.fspath(directory))
    try:
        os.makedirs(root, exist_ok=True)
        if os.listdir(root):
            raise exception.SimulatorError(reason=f"{root} is not empty")
    except OSError as exc:
        raise exception.SimulatorError(reason=f"cannot use {root}: {exc.strerror}") from None
    umask = _umask()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for entry in host.export_tree():
        if not entry.path:
            continue  # the root itself
        path = f"{root}/{entry.path}"
        if entry.kind == "dir":
            os.mkdir(path, entry.mode)
        elif entry.kind == "link":
            os.symlink(entry.target or "", path)
        else:
            fd = os.open(path, flags, entry.mode)
            try:
                if entry.data:
                    os.write(fd, entry.data)
                if entry.mode & umask:
                    os.fchmod(fd, entry.mode)
            finally:
                os.close(fd)
            continue
        if entry.kind == "dir" and entry.mode & umask:
            os.chmod(path, entry.mode)
    return root
