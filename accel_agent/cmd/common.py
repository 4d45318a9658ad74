"""What both console scripts add to their command line."""

from __future__ import annotations

import argparse

from accel_agent.config_cache import DEFAULT_CONFIG_DIR, DEFAULT_CONFIG_FILE


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config-file``/``--config-dir``, the same for both console scripts."""
    parser.add_argument(
        "--config-file",
        action="append",
        default=[],
        metavar="FILE",
        help=f"oslo.config file (repeatable); default {DEFAULT_CONFIG_FILE}",
    )
    parser.add_argument(
        "--config-dir",
        action="append",
        default=[],
        metavar="DIR",
        help=f"directory of *.conf files read after the config files (repeatable); "
        f"default {DEFAULT_CONFIG_DIR} when it exists",
    )
