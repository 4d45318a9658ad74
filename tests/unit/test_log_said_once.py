"""A warning logged while an exception is being handled is said once.

oslo.log's formatter appends the exception being handled to any WARNING or
ERROR line (its "error summary"); a line that already names the error then
says it twice.  The agent logs such lines after the except clause; this
checks one of them through oslo.log's own formatter."""

from __future__ import annotations

import io
import logging

from oslo_config import cfg
from oslo_log import formatters
from oslo_log import log as oslo_logging

from accel_agent.sysfs import nvidia_vfio


def test_a_failed_type_table_write_is_said_once(tmp_path):
    conf = cfg.ConfigOpts()
    oslo_logging.register_options(conf)
    conf([], project="accel-agent-test")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatters.ContextFormatter(config=conf))
    logger = logging.getLogger(nvidia_vfio.__name__)
    logger.addHandler(handler)
    try:
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        scanner = nvidia_vfio.VfioScanner(str(tmp_path), str(state_dir), persist=True)
        scanner._tables = {"0000:c1:00.0": {1: "nvidia-1150"}}
        state_dir.rmdir()
        (tmp_path / "state").write_text("")  # a file where the directory was: ENOTDIR
        scanner._save()
    finally:
        logger.removeHandler(handler)
    lines = [line for line in stream.getvalue().splitlines() if "vGPU type tables" in line]
    assert len(lines) == 1
    assert lines[0].count("Not a directory") == 1, lines[0]
