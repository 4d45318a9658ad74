"""Run a command beside a stand-in for journald's socket, in a private mount namespace.

    unshare --mount --propagation private -- python journal_sink.py OUT -- COMMAND...

Mounts a tmpfs on /run/systemd (seen only in this namespace: the host's
journald, if any, is untouched), binds a datagram socket at
/run/systemd/journal/socket, where libsystemd's ``sd_journal_send`` (and so
oslo.log's journal handler) writes, and appends each datagram it receives to
OUT as one JSON line of its fields (journald's native protocol: ``KEY=value``
lines, or ``KEY``, a little-endian 64-bit length and the bytes for a value
with a newline).  Runs COMMAND meanwhile with this checkout first on
PYTHONPATH, passes it SIGTERM, SIGINT and SIGHUP, and exits with its status.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SOCKET = "/run/systemd/journal/socket"


def parse(datagram: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, _sep, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode("utf-8", "replace")
            rest = after
            continue
        (length,) = struct.unpack("<Q", after[:8])
        fields[line.decode()] = after[8:8 + length].decode("utf-8", "replace")
        rest = after[8 + length + 1:]
    return fields


def receive(sock: socket.socket, out: Path) -> None:
    while True:
        datagram = sock.recv(1 << 20)
        with out.open("a") as handle:
            handle.write(json.dumps(parse(datagram)) + "\n")


def main(argv: list[str]) -> int:
    out, separator, command = Path(argv[0]), argv[1], argv[2:]
    assert separator == "--" and command, "usage: journal_sink.py OUT -- COMMAND..."
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run/systemd"],
                   check=True)
    os.makedirs(os.path.dirname(SOCKET))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(SOCKET)
    threading.Thread(target=receive, args=(sock, out), daemon=True).start()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    child = subprocess.Popen(command, env=env, cwd=str(REPO_ROOT))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
