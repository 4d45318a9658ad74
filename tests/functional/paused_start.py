"""Run ``accel-agent`` as its console script does, paused at one known
point of its start: the import of ``accel_agent.service``, which ``main``
makes after the configuration's check and before any signal handler exists.

    python tests/functional/paused_start.py GATE_DIR --config-file F ...

At the pause it writes ``GATE_DIR/paused`` and waits until the test writes a
line into the FIFO ``GATE_DIR/go``.  A test can then read the process's
signal mask and send it a signal at a moment that is the same on every run,
however busy the machine (no race with the interpreter's own start).
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

PAUSE_AT = "accel_agent.service"


class _Gate(importlib.abc.MetaPathFinder):
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.done = False

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == PAUSE_AT and not self.done:
            self.done = True
            with open(os.path.join(self.directory, "paused"), "w") as marker:
                marker.write(f"{os.getpid()}\n")
            with open(os.path.join(self.directory, "go")) as gate:  # blocks until opened
                gate.readline()
        return None  # the ordinary finders import it


def main() -> None:
    directory = sys.argv.pop(1)
    sys.meta_path.insert(0, _Gate(directory))
    # As the console script: the module runs as __main__, argv[0] its name.
    sys.argv[0] = "accel-agent"
    runpy.run_module("accel_agent.cmd.agent", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
