"""Parse the configuration files into a ConfigOpts: the first of the checks
(config/check.py), and what every command that reads the configuration does.

* :func:`check_files` (before parsing): a directory given as a file, a
  config file that is no regular file (a FIFO, a link to ``/dev/zero``) or
  too large, a config file or directory someone other than root could
  change (config/files.py), a file that is not UTF-8 -> InvalidConfig; and
  the same of the files options name that the agent runs or trusts
  (``log_config_append``: config.lint.named_file_errors) -> ConfigErrors;
* :func:`load_config`: oslo.config parses the files (config.files.config_sources
  says which);
* :func:`check_unchanged` (after parsing): oslo.config read the files that
  were checked;
* :func:`check_paths` (after parsing): the values every command reads that
  oslo.config cannot convert (config/values.py), ``sysfs_root`` and
  ``state_dir`` empty or relative -> ConfigErrors.

oslo.config (and difflib, for the lint) are imported where a command loads
the configuration: accelctl's read-only listings usually get by without
them (config/cache.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel_agent import exception
from accel_agent.config import files

if TYPE_CHECKING:
    from oslo_config import cfg


def load_config(
    config_files: list[str],
    config_dirs: list[str],
    prog: str,
    conf: cfg.ConfigOpts | None = None,
) -> cfg.ConfigOpts:
    """Parse the oslo.config files into ``conf`` (the global CONF by default).

    Without ``--config-file`` the packaged location is read when present, so
    an operator on a configured host can just run ``accelctl types``
    (config.files.config_sources says which files and directories).

    The files are checked before oslo.config is given them
    (:func:`check_files`: regular files of a bounded size that no one but
    root can change, UTF-8; the files their options name, such as
    ``log_config_append``, likewise), and are still the same files after it
    parsed them (:func:`check_unchanged`): oslo.config opens them again by
    path, which only root can have changed in between.
    """
    from oslo_config import cfg

    from accel_agent.config import lint, options

    conf = conf or options.CONF
    found_files, dirs = files.config_sources(config_files, config_dirs)
    argv: list[str] = []
    for path in config_files:
        argv += ["--config-file", path]
    # Every directory as --config-dir, after the files: oslo.config parses
    # its default_config_dirs before the --config-file arguments, so the
    # packaged directory given that way came first and the unit's explicit
    # accel-agent.conf overrode its drop-ins (while accelctl, with no
    # --config-file, read them last): the files, then the directories.
    for path in dirs:
        argv += ["--config-dir", path]
    checked = check_files(config_files or found_files, dirs)
    named = lint.named_file_errors(
        [entry for source in checked for entry in lint.scan_text(source.path, source.text)[0]]
    )
    if named:
        raise exception.ConfigErrors([exception.InvalidConfig(message=m) for m in named])
    try:
        conf(
            argv,
            project="accel-agent",
            prog=prog,
            default_config_files=[] if config_files else found_files,
            default_config_dirs=[],
        )
    except cfg.ConfigFilesNotFoundError as exc:
        raise exception.InvalidConfig(reason=f"config file not found: {exc.config_files}") from exc
    except (cfg.ConfigFileParseError, cfg.Error) as exc:
        raise exception.InvalidConfig(reason=str(exc)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        # check_files ran first; a file changed in between.
        raise exception.InvalidConfig(reason=f"cannot read the config files: {exc}") from exc
    check_unchanged(checked)
    check_paths(conf)
    return conf


# --- before parsing ------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """A config file as :func:`check_files` read and checked it."""

    path: str
    text: str
    # (device, inode, size, mtime in ns) of what was read.
    identity: tuple[int, int, int, int]


def _identity(found: os.stat_result) -> tuple[int, int, int, int]:
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


def check_files(config_files: Sequence[str], dirs: Sequence[str]) -> list[SourceFile]:
    """Refuse, with one clear line naming the path, what oslo.config must not
    be given: a directory given as a file; a config file that is no regular
    file (a FIFO would block the open for ever, a link to ``/dev/zero`` be
    read until memory runs out) or larger than
    :data:`~accel_agent.config.files.MAX_CONFIG_BYTES`; a config file or
    directory that someone other than root could change
    (config.files.trust_problem); a file that is not UTF-8.  Returns what
    was read, for :func:`check_unchanged` and the files its options name."""
    for path in config_files:
        if os.path.isdir(path):
            raise exception.InvalidConfig(
                reason=f"--config-file {path} is a directory; give a directory of *.conf "
                "files with --config-dir"
            )
    for directory in dirs:
        problem = files.trust_problem(directory)
        if problem is not None:
            raise exception.InvalidConfig(
                reason=files.refusal("config directory", directory, problem)
            )
    read: list[SourceFile] = []
    for path in files.source_files(config_files, dirs):
        try:
            data, found = files.read_regular(path, "config file")
        except FileNotFoundError:
            continue  # oslo.config names the missing ones itself
        except files.Refused as exc:
            raise exception.InvalidConfig(reason=str(exc)) from None
        except OSError as exc:
            raise exception.InvalidConfig(
                reason=f"cannot read config file {path}: {exc.strerror}"
            ) from None
        problem = files.trust_problem(path)
        if problem is not None:
            raise exception.InvalidConfig(reason=files.refusal("config file", path, problem))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise exception.InvalidConfig(
                reason=f"config file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                f"on line {line})"
            ) from None
        read.append(SourceFile(path, text, _identity(found)))
    return read


def check_unchanged(read: Sequence[SourceFile]) -> None:
    """After oslo.config parsed the files (it opens them again, by path):
    each is still the file :func:`check_files` read.  Only root can have
    changed one in between (check_files refused what anyone else can
    change): an edit saved during a reload is refused, not half-checked."""
    for source in read:
        try:
            now = _identity(os.stat(source.path))
        except OSError:
            now = None
        if now != source.identity:
            raise exception.InvalidConfig(
                reason=f"config file {source.path} changed while it was being read; nothing "
                "was applied: try again"
            )


# --- after parsing -------------------------------------------------------------------


# What every command reads right after loading the configuration (the
# paths below, the listings' host and API socket).
READ_BY_EVERY_COMMAND = (
    ("DEFAULT", "sysfs_root"),
    ("DEFAULT", "state_dir"),
    ("DEFAULT", "host"),
    ("api", "socket_path"),
)


def check_paths(conf: cfg.ConfigOpts) -> None:
    """``sysfs_root`` and ``state_dir`` are absolute: a relative one resolves
    against each process's working directory (the agent's, its privileged
    helper's, accelctl's), so they would act on different trees."""
    from accel_agent.config import values

    # Read first with their own error messages: a value oslo.config cannot
    # convert (a "$" naming no option) must not end every command in a traceback.
    unreadable = values.named_option_errors(conf, READ_BY_EVERY_COMMAND)
    if unreadable:
        raise exception.ConfigErrors([exception.InvalidConfig(message=m) for m in unreadable])
    errors: list[exception.AccelAgentException] = []
    for name in ("sysfs_root", "state_dir"):
        value = getattr(conf, name)
        if not value or not os.path.isabs(value):
            errors.append(
                exception.InvalidConfig(
                    reason=f"[DEFAULT] {name} {value!r} must be an absolute path"
                )
            )
    if errors:
        raise exception.ConfigErrors(errors)
