"""Whether accelctl reaches the running daemon, and asking it.

One writer (docs/design.md §6.2) and one connection to the ledger per process
(docs/design.md §5.2): while the daemon runs, accelctl asks it through its API instead of
acting itself, unless ``--offline``.  No socket, or nobody listening on it,
means no daemon; a daemon that is there but cannot be reached (permission
denied, no answer) is an error, never a reason to act behind its back.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from accel_agent import exception

LOG = logging.getLogger("accelctl")

# What via_api returns when the command must act directly.
OFFLINE = object()


def via_api(args: argparse.Namespace, socket_path: str, call: Callable[[Any], Any]) -> Any:
    """``call(client)`` against the running daemon, or OFFLINE when there is
    none (or --offline).  API errors raise ApiError; an unreachable daemon
    raises AgentUnreachable."""
    if args.offline:
        return OFFLINE
    if not os.path.lexists(socket_path):
        # No daemon here: skip even importing the client (http.client).
        LOG.debug("no API socket at %s; acting directly", socket_path)
        return OFFLINE
    from accel_agent.api.client import ApiClient

    try:
        return call(ApiClient(socket_path))
    except exception.AgentNotRunning as exc:
        LOG.debug("%s; acting directly", exc.message)
        return OFFLINE


def runs(socket_path: str) -> bool:
    """Whether a daemon serves ``socket_path`` (asked with GET /v1/health,
    whatever --offline says).  One that is there but cannot be reached counts
    as running: its ledger is not accelctl's to open."""
    online = argparse.Namespace(offline=False)
    try:
        return via_api(online, socket_path, lambda api: api.health()) is not OFFLINE
    except exception.AgentUnreachable as exc:
        LOG.debug("%s; taking the daemon as running", exc.message)
        return True
