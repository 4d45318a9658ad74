"""Build real oslo.config objects from INI text, as the agent reads them."""

from __future__ import annotations

import os
import tempfile
import textwrap

from oslo_config import cfg

from accel_agent.config import options as agent_conf


def make_conf(
    ini: str, sysfs_root: str | None = None, directory: str | None = None
) -> cfg.ConfigOpts:
    """A fresh ConfigOpts parsed from ``ini`` (a real file, like production)."""
    text = textwrap.dedent(ini)
    if sysfs_root is not None:
        text = f"[DEFAULT]\nsysfs_root = {sysfs_root}\nhost = testhost\n" + text
    fd, path = tempfile.mkstemp(suffix=".conf", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    conf(["--config-file", path], project="accel-agent", default_config_files=[])
    return conf


def write_conf(path: str, ini: str, sysfs_root: str) -> str:
    with open(path, "w") as handle:
        handle.write(f"[DEFAULT]\nsysfs_root = {sysfs_root}\nhost = testhost\n")
        handle.write(textwrap.dedent(ini))
    return path
