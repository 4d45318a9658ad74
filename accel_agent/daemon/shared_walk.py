"""One /proc walk for the ``GET /v1/mdevs`` listings that ask at once.

The listing's ``in_use`` reads which VFIO groups processes hold
(sysfs/vfio_holders.py): a walk over every process's descriptors, about
15 ms with 300 processes on a small host (most of it the kernel listing
each ``/proc/<pid>/fd``).  The API serves up to 16 requests at once, so a
burst of listings would walk /proc once each, one after the other.

The answer must stay current, so it is never kept: not with the listing's
snapshot (that object is the same for every listing until sysfs changes,
and a VM opening its group changes nothing in sysfs, so a kept answer would
say "not in use" of a running VM until the next rescan), nor for a while.
Instead every request gets the answer of a walk that *began after it
asked*, and one walk serves every request waiting for it: requests that
arrive while a walk runs wait for the next one, which they share.  A burst
of any size costs two walks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from accel_agent.sysfs import vfio_holders

Held = frozenset[str] | None


class SharedWalk:
    def __init__(self, walk: Callable[[str], Held] | None = None) -> None:
        self._walk = walk
        self._cond = threading.Condition()
        self._started = 0  # walks begun
        self._finished = 0  # the last walk that finished (its number)
        self._running = False
        self._answer: tuple[str, Held] = ("", None)
        # Requests waiting for a walk (tests watch it).
        self.waiting = 0

    def held(self, directory: str) -> Held:
        """The groups of ``directory`` held open, from a walk that began
        after this call."""
        with self._cond:
            wanted = self._started + 1
            while True:
                if self._finished >= wanted:
                    if self._answer[0] == directory:
                        return self._answer[1]
                    wanted = self._started + 1  # that walk was of another directory
                if not self._running:
                    self._running = True
                    self._started += 1
                    number = self._started
                    break
                self.waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self.waiting -= 1
        walk = self._walk or vfio_holders.held_groups
        try:
            answer = walk(directory)
        except BaseException:
            with self._cond:  # a waiter walks again
                self._running = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._running = False
            self._finished = number
            self._answer = (directory, answer)
            self._cond.notify_all()
        return answer
