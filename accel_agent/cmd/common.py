"""What both console scripts add to their command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from accel_agent.config import files
from accel_agent.config.files import DEFAULT_CONFIG_DIR, DEFAULT_CONFIG_FILE

# The distribution whose version ``--version`` prints (pyproject.toml's name).
DISTRIBUTION = "accel-agent"


def add_config_arguments(parser: Any, dest_suffix: str = "") -> None:
    """``--config-file``/``--config-dir``, the same for both console scripts.

    ``parser`` may be an argument group.  With ``dest_suffix`` (accelctl's
    copies after a command) they are stored under that suffix and have no
    default, so that only what was given is recorded."""
    default: Any = argparse.SUPPRESS if dest_suffix else None
    parser.add_argument(
        "--config-file",
        dest="config_file" + dest_suffix,
        action="append",
        default=[] if default is None else default,
        metavar="FILE",
        help=f"oslo.config file (repeatable); default {DEFAULT_CONFIG_FILE}",
    )
    parser.add_argument(
        "--config-dir",
        dest="config_dir" + dest_suffix,
        action="append",
        default=[] if default is None else default,
        metavar="DIR",
        help=f"directory of *.conf files read after the config files (repeatable); "
        f"default {DEFAULT_CONFIG_DIR} when it exists",
    )


def package_version() -> str:
    """The installed distribution's version; the source tree's when it is not
    installed (run from a checkout)."""
    # Imported here: only ``--version`` pays for reading the metadata.
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from accel_agent import __version__

        return __version__


class _Version(argparse.Action):
    """``--version``: "PROG VERSION" on stdout, exit 0.  argparse's own
    version action wants the string when the parser is built, which would
    make every command read the package metadata."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(f"{parser.prog} {package_version()}\n")
        parser.exit(0)


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version", action=_Version, help="print the program's name and version, and exit"
    )


def missing_config(config_files: Sequence[str], config_dirs: Sequence[str]) -> str | None:
    """Why there is no configuration to read, or None when there is one:
    neither ``--config-file``/``--config-dir`` nor the packaged locations.
    A command run without any would otherwise answer from the defaults (an
    empty listing, exit 0) as if the host had nothing to manage."""
    if config_files or config_dirs:
        return None
    found_files, found_dirs = files.config_sources([], [])
    if found_files or found_dirs:
        return None
    return (
        f"no configuration: neither {files.DEFAULT_CONFIG_FILE} nor "
        f"{files.DEFAULT_CONFIG_DIR} exists; give one with --config-file FILE "
        "(or --config-dir DIR)"
    )
