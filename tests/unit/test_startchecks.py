"""accel_agent/config/startchecks.py's rules about who runs the check: the running
agent is the process serving the socket, and a check run by another user
than root says nothing of what only root can try (never a false refusal)."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from accel_agent.config import startchecks


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory whose socket path fits AF_UNIX's 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="aa-", dir="/tmp") as directory:
        yield Path(directory)


def conf(socket_path: str, listen: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        api=SimpleNamespace(socket_path=socket_path, socket_group=""),
        metrics=SimpleNamespace(listen=listen),
    )


def test_the_running_agent_is_the_process_serving_the_socket():
    with short_dir() as directory:
        path = str(directory / "api.sock")
        assert startchecks.serving_pid(path) is None
        served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            served.bind(path)
            served.listen()
            assert startchecks.serving_pid(path) == os.getpid()
            # Before a start (running None) another agent is in the way; beside it, not.
            (error,) = startchecks._api_socket(conf(path), None)
            assert error == f"another accel-agent already serves the API on {path}"
            assert startchecks._api_socket(conf(path), os.getpid()) == []
        finally:
            served.close()


def test_a_check_by_another_user_leaves_out_what_only_root_can_try(monkeypatch):
    with short_dir() as directory:
        path = str(directory / "api.sock")
        served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            served.bind(path)
            served.listen()
            monkeypatch.setattr(startchecks, "_root", lambda: False)
            monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
            # A socket this user may not connect to: nothing said (the agent, root, may).
            assert startchecks._api_socket(conf(path), None) == []
            # A privileged port: only root can tell by binding it.
            assert startchecks._metrics_address(conf(path, "127.0.0.1:80"), None) == []
        finally:
            served.close()
