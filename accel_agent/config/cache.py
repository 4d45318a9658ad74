"""What the read-only listings need from the configuration, remembered
between runs so that ``accelctl types`` need not import oslo.config.

Importing oslo.config costs ~70 ms (netaddr, rfc3986 and stevedore come with
it), more than half of what ``mdevctl types`` takes for a whole 256-GPU host
(BENCHMARKS.md (a)).  oslo.config stays the only thing that *parses* the
configuration: on a miss accelctl loads it as always and stores the handful of
resolved values the listings use (wiring.ListingConfig); on a hit those
values are used as they are.

A hit needs every input of oslo.config's answer to be unchanged, compared
field by field (not by a hash): the config files and ``*.conf`` in the config
directories that will be read (path, inode, size, mtime and ctime in ns), the
``OS_*`` environment variables (oslo.config's environment source), the host
name (the default of ``[DEFAULT] host``) and the code that declares the
options and reads them.  Nothing is stored when oslo.config reported an
error, when the values came from a ``config_source`` (remote, unversioned)
or when a file changed while it was being read.  ``check-config``, the
mutating commands and the daemon never use the cache.

This module imports nothing but the standard library's smallest parts: a
listing that goes to the running daemon (accel_agent.cmd.plain_listing)
reads the socket path from here before anything else is imported.  What is
cached is wiring.ListingConfig, kept there because it is made of the
policy's inputs (the devices room), which this path must not import.

The cache lives in ``/var/cache/accel-agent`` for root, else in
``$XDG_CACHE_HOME/accel-agent``; ``ACCEL_AGENT_CACHE_DIR`` moves it and an
empty value turns it off.  Files are 0600 in a 0700 directory and are only
trusted when owned by the caller and writable by nobody else.
"""

from __future__ import annotations

import binascii
import json
import os
import stat
from typing import Any

from accel_agent import __version__

CACHE_DIR_ENV = "ACCEL_AGENT_CACHE_DIR"
# Bump when the cached value's shape or meaning changes.
FORMAT = 1
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The code whose behaviour the cached values depend on: option declarations
# (defaults) and how the type options are read.  Each must exist (a test
# checks): the stat of a path that is not there never changes, so a moved
# module would silently stop invalidating the cache.
_CODE_FILES = (
    os.path.join(_PACKAGE_DIR, "config", "options.py"),
    os.path.join(_PACKAGE_DIR, "devices", "policy.py"),
    os.path.join(_PACKAGE_DIR, "wiring.py"),
    os.path.abspath(__file__),
)


def _debug(message: str, *args: object) -> None:
    # logging is imported only when there is something to say (~3 ms).
    import logging

    logging.getLogger(__name__).debug(message, *args)


def cache_dir() -> str | None:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured is not None:
        return configured or None
    if os.geteuid() == 0:
        return "/var/cache/accel-agent"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "accel-agent")


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _dir_key(path: str) -> dict[str, Any] | None:
    """A config directory: itself and the ``*.conf`` files oslo.config reads
    from it (its glob skips dot files)."""
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".conf") and n[0] != ".")
    except OSError:
        return None
    return {
        "self": _stat_key(path),
        "files": {n: _stat_key(os.path.join(path, n)) for n in names},
    }


def _oslo_config_files() -> tuple[str, ...]:
    """oslo.config's own parser and types (an upgrade may parse differently),
    found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("oslo_config")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return tuple(os.path.join(d, name) for d in locations for name in ("cfg.py", "types.py"))


def inputs_key(files: list[str], dirs: list[str]) -> dict[str, Any]:
    """Everything oslo.config's answer depends on, for config ``files`` and
    ``dirs`` (what config.files.config_sources says will be read)."""
    return {
        "format": FORMAT,
        "version": __version__,
        "code": {path: _stat_key(path) for path in _CODE_FILES + _oslo_config_files()},
        "files": [[path, _stat_key(path)] for path in files],
        "dirs": [[path, _dir_key(path)] for path in dirs],
        "env": sorted([k, v] for k, v in os.environ.items() if k.startswith("OS_")),
        "hostname": os.uname().nodename,
    }


def _cache_path(directory: str, files: list[str], dirs: list[str]) -> str:
    # One file per set of sources, so that edits replace it instead of
    # piling up.  The full key is inside and compared on every read, so a
    # checksum will do for the name (hashlib would cost 2 ms of OpenSSL).
    names = json.dumps([os.geteuid(), files, dirs]).encode()
    return os.path.join(directory, f"listing-{binascii.crc32(names):08x}.json")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load(files: list[str], dirs: list[str]) -> dict[str, Any] | None:
    """The cached value (ListingConfig.to_dict()) when every input is
    unchanged, else None."""
    directory = cache_dir()
    if directory is None:
        return None
    path = _cache_path(directory, files, dirs)
    try:
        if not _trusted(os.stat(directory)):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            if not _trusted(os.fstat(handle.fileno())):
                return None
            entry = json.loads(handle.read())
        if entry.get("key") != inputs_key(files, dirs):
            return None
        value = entry["value"]
        if not isinstance(value, dict) or not isinstance(value.get("api_socket_path"), str):
            raise ValueError("no api_socket_path")
        return value
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _debug("config cache %s unusable: %s", path, exc)
        return None


def store(files: list[str], dirs: list[str], key: dict[str, Any], value: dict[str, Any]) -> None:
    """Remember ``value`` for ``key`` (computed before the load); silently
    skipped when the cache directory cannot be written."""
    import tempfile  # only on a miss: 3 ms of imports

    directory = cache_dir()
    if directory is None or key != inputs_key(files, dirs):
        return  # turned off, or a file changed while oslo.config read it
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted(os.stat(directory)):
            return
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".listing-")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"key": key, "value": value}, handle)
            os.replace(tmp, _cache_path(directory, files, dirs))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        _debug("config cache not written in %s: %s", directory, exc)
