"""A wedged libvirtd: a unix socket that accepts every connection and never
answers (issue 33 item 2).  libvirt-python's client blocks on it for ever, in
``open`` already (its handshake waits for an answer), exactly as it does on a
libvirtd stuck on a driver lock or stopped with SIGSTOP.

``with WedgedLibvirtd() as wedged: wedged.uri`` (``qemu+unix:///system?socket=...``);
``accepted`` counts the connections made to it (a call that fails at once
makes none); closing it drops every connection, and the calls blocked on
them return with libvirt's "Cannot recv data" error.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

GUARD = 60.0  # only a hang reaches it: a test fails instead of hanging


def guarded(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``call()`` on a thread: (its result, its exception); fails the test
    instead of hanging when it does not return."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"no return within {GUARD:g} s: the call hangs"
    return box.get("result"), box.get("error")


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


class WedgedLibvirtd:
    def __init__(self) -> None:
        # A short directory: a unix socket's path has at most 107 bytes.
        self._dir = Path(tempfile.mkdtemp(prefix="wedged-", dir="/tmp"))
        self.path = str(self._dir / "libvirt-sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(64)
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="wedged-libvirtd", daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.path}"

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._held.append(conn)  # kept open, never read, never answered

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._held = self._held, []
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for conn in held:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> WedgedLibvirtd:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
