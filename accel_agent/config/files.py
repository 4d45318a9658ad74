"""Which files the configuration is, and how the agent reads local files
safely: nothing at their paths may stall it or hand it someone else's code.

* :func:`config_sources`: the config files and directories oslo.config
  reads for ``--config-file``/``--config-dir`` (the packaged ones by
  default), and :func:`source_files`: the files of those, in the order
  oslo.config reads them.

The agent runs as root and reads files that a mistake or a local user can
make into something else: a FIFO in the config directory blocks ``open()``
until someone writes to it (a reload, and every signal behind it, hangs); a
link to ``/dev/zero`` is read until memory runs out; a FIFO at the ledger's
path hangs the start.  And a file that someone other than root can write is
theirs to fill: a logging configuration (``log_config_append``) runs code,
a config file decides which devices go to whom.

* :func:`read_regular`: a file read only when it is a regular file (a link
  to one is fine: operators link config files), up to a size bound.  It is
  ``stat``-ed first, so that nothing else is ever opened (opening some device
  nodes has effects, e.g. a watchdog), then opened non-blocking and checked
  again with ``fstat`` on the descriptor (what was opened is what is read).
* :func:`require_regular`: the same check by ``stat`` alone, for files that
  another library opens (SQLite's ledger, whose descriptors this process
  must never close behind it: closing any descriptor of a file drops the
  process's POSIX locks on it).
* :func:`trust_problem`: sshd's ``StrictModes`` rule.  A file, and every
  directory on the way to it (every link followed, the directories on the
  way to the link's target too), must be owned by root (or by this process's
  user, for an unprivileged ``accelctl``) and writable by no one else: no
  group or other write bit.  One exception, for the directories on the way:
  a directory with the sticky bit (``/tmp``) keeps anyone who does not own an
  entry from renaming or deleting it, so an entry owned by root in it is
  not anyone else's to replace.  The file itself, or a directory the agent
  reads files *from* (``--config-dir``), gets no such exception: anyone
  could add a file to a sticky directory.

Used by the configuration's loading and lint (config files, the files
their options name), the ledger's open and the daemon's logging.  The
standard library's smallest parts only: accelctl's plain listings
(cmd/plain_listing.py) read which files are the configuration from here
before anything else is imported.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

DEFAULT_CONFIG_FILE = "/etc/accel-agent/accel-agent.conf"
# Read after the default file (with it only: config_sources), *.conf in name
# order (oslo.config's --config-dir).
# Named here rather than left to oslo.config's search (which also looks in
# ~/.accel-agent and under the program's name) so that the daemon and
# accelctl always read the same files.
DEFAULT_CONFIG_DIR = "/etc/accel-agent/accel-agent.conf.d"


def config_sources(config_files: list[str], config_dirs: list[str]) -> tuple[list[str], list[str]]:
    """The files and directories oslo.config reads for these arguments.

    The default directory belongs to the default file: it is read after
    ``accel-agent.conf`` (no ``--config-file``, or ``--config-file
    /etc/accel-agent/accel-agent.conf`` as the systemd unit gives it), never
    merged over another file an operator named (``check-config
    --config-file candidate.conf`` checks that file, not that file with the
    host's drop-ins over it); ``--config-dir`` replaces it."""
    files = list(config_files)
    if not files and not config_dirs and os.path.exists(DEFAULT_CONFIG_FILE):
        files = [DEFAULT_CONFIG_FILE]
    dirs = list(config_dirs)
    if not dirs and _default_file_read(files) and os.path.isdir(DEFAULT_CONFIG_DIR):
        dirs = [DEFAULT_CONFIG_DIR]
    return files, dirs


def _default_file_read(files: list[str]) -> bool:
    """Whether ``files`` (the files read) are none, or name the default file."""
    default = os.path.normpath(DEFAULT_CONFIG_FILE)
    return not files or any(os.path.normpath(os.path.abspath(f)) == default for f in files)


def source_files(files: Sequence[str], dirs: Sequence[str]) -> list[str]:
    """The files oslo.config reads for these arguments: the files, then each
    directory's ``*.conf`` in name order (its glob skips names that start
    with a dot)."""
    found = list(files)
    for directory in dirs:
        try:
            names = sorted(
                n for n in os.listdir(directory) if n.endswith(".conf") and not n.startswith(".")
            )
        except OSError:
            continue
        found += [os.path.join(directory, n) for n in names]
    return found


# --- reading a file safely -------------------------------------------------------------

# A config file is a few KiB (the shipped sample with every option is ~26
# KiB): what is larger is a mistake, and reading it whole would be another.
MAX_CONFIG_BYTES = 1024 * 1024
# The most symbolic links one path may pass through (Linux's MAXSYMLINKS).
_MAX_LINKS = 40
_WRITE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH

_KINDS = {
    stat.S_IFREG: "regular file",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symbolic link",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


class Refused(Exception):
    """A file the agent does not read: the message names it and says why."""


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("FIFO", "character device")."""
    return _KINDS.get(stat.S_IFMT(mode), "special file")


def _not_regular(path: str, what: str, mode: int) -> Refused:
    via = ""
    if os.path.islink(path):
        via = f" (a link to {os.path.realpath(path)})"
    return Refused(
        f"{what} {path}{via} is a {kind(mode)}, not a regular file; the agent reads only "
        "regular files (a link to one is fine)"
    )


def require_regular(path: str, what: str) -> os.stat_result | None:
    """``stat`` of ``path`` (links followed) when it is a regular file; None
    when nothing is there; Refused when something else is.  Opens nothing."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(found.st_mode):
        raise _not_regular(path, what, found.st_mode)
    return found


def read_regular(
    path: str, what: str, limit: int = MAX_CONFIG_BYTES
) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` and its ``fstat``.
    FileNotFoundError when nothing is there, another OSError when it cannot
    be read, Refused when it is no regular file or larger than ``limit``."""
    found = require_regular(path, what)
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", path)
    too_large = Refused(
        f"{what} {path} is larger than {limit} bytes; the agent does not read it"
    )
    if found.st_size > limit:
        raise too_large
    # O_NONBLOCK: had a FIFO taken the file's place since the stat, open()
    # returns at once instead of waiting for a writer, and fstat says so.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _not_regular(path, what, opened.st_mode)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise too_large  # it grew since the stat
    finally:
        os.close(fd)
    return b"".join(chunks), opened


# --- who can change a file -----------------------------------------------------------------


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _describe(path: str, found: os.stat_result) -> str:
    mode = stat.S_IMODE(found.st_mode)
    return f"{path} ({kind(found.st_mode)}, mode {mode:04o}, owner {_owner(found.st_uid)})"


def _trusted_uids() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _problem(
    path: str, found: os.stat_result, entry: tuple[str, os.stat_result] | None = None
) -> str | None:
    """Why someone else could change ``path``: the file itself (``entry``
    None), or a directory on the way holding ``entry`` (its path and
    lstat); None when no one can."""
    trusted = _trusted_uids()
    if found.st_uid not in trusted:
        return f"{_describe(path, found)} is owned by another user, who can change it"
    if not found.st_mode & _WRITE_BY_OTHERS:
        return None
    if entry is None or not found.st_mode & stat.S_ISVTX:
        return f"{_describe(path, found)} is writable by others"
    name, held = entry
    if held.st_uid in trusted:
        return None  # sticky: only the entry's owner may rename or delete it
    return (
        f"{_describe(path, found)} is writable by others and its entry {name} is owned by "
        f"{_owner(held.st_uid)}, whom the sticky bit lets replace it"
    )


def trust_problem(path: str) -> str | None:
    """Why someone other than root (or this process's user) could change what
    ``path`` holds, naming the file or directory and its mode; None when no
    one else can, or when ``path`` does not exist (other checks say so).
    ``path`` itself gets no sticky exception: a config directory of mode
    1777 lets anyone add a file to it."""
    pending = [part for part in reversed(os.path.abspath(path).split("/")) if part]
    current = "/"
    try:
        current_stat = os.lstat(current)
        links = 0
        while pending:
            name = pending.pop()
            if name == ".":
                continue
            if name == "..":
                current = os.path.dirname(current)
                current_stat = os.lstat(current)
                continue
            candidate = os.path.join(current, name)
            entry = os.lstat(candidate)
            problem = _problem(current, current_stat, (candidate, entry))
            if problem is not None:
                return problem
            if stat.S_ISLNK(entry.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return f"{path} passes through more than {_MAX_LINKS} symbolic links"
                target = os.readlink(candidate)
                if target.startswith("/"):
                    current, current_stat = "/", os.lstat("/")
                pending += [part for part in reversed(target.split("/")) if part]
                continue
            current, current_stat = candidate, entry
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"{path} cannot be checked: {exc.strerror}"
    return _problem(current, current_stat)


def refusal(what: str, path: str, problem: str) -> str:
    """The one line that refuses ``path`` for ``problem`` (trust_problem's)."""
    return (
        f"{what} {path} could be changed by another user than root: {problem}; the agent "
        "runs as root and trusts only what root alone can change (as sshd's StrictModes): "
        "chmod go-w, chown root"
    )


def readable_by_others(found: os.stat_result) -> bool:
    return bool(found.st_mode & (stat.S_IRWXG | stat.S_IRWXO))
