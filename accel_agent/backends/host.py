"""The whole host's snapshot: the mdev scan plus every other backend's.

The mdev backend's read side is the optimised scanner of ``accel_agent.sysfs``
(thousands of types on a large host: ``scanner.scan`` cold, ``Rescanner``
in the daemon, re-reading only what can have changed).  Every other backend
brings a discoverer of its own whose scan is small (one card's VFs), run in
full each time; its result is merged into the mdev snapshot.  When neither
changed, the previous snapshot object is returned, as ``Rescanner`` does, so
that callers can keep what they built from it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping

from accel_agent.backends.base import DeviceBackend, Discoverer
from accel_agent.sysfs import scanner
from accel_agent.sysfs.model import HostSnapshot
from accel_agent.sysfs.rescan import CounterFilter, Rescanner

LOG = logging.getLogger(__name__)


def _discoverers(
    sysfs_root: str,
    backends: Mapping[str, DeviceBackend],
    state_dir: str | None = None,
    persist: bool = False,
) -> list[Discoverer]:
    found = []
    for backend in backends.values():
        discoverer = backend.discoverer(sysfs_root, state_dir, persist)
        if discoverer is not None:
            found.append(discoverer)
    return found


# A discoverer's scan that met a device vanishing under it is run again, at
# most this many times in all: a device removed during a scan is a normal
# event (a VF disabled, an mdev released), not a failed scan.
_SCAN_TRIES = 3


def _scan(discoverer: Discoverer):
    """``discoverer.scan()``; a FileNotFoundError (a device that vanished
    between a listing and a read the discoverer did not guard) scans again."""
    for _ in range(_SCAN_TRIES - 1):
        try:
            return discoverer.scan()
        except FileNotFoundError as exc:
            LOG.debug("a device vanished during a scan (%s); scanning again", exc)
    return discoverer.scan()


def _merge(snapshot: HostSnapshot, results: list, notes: list[str] | None = None) -> HostSnapshot:
    for result in results:
        snapshot = snapshot.merged(result.parents, result.devices, result.warnings)
        if notes is not None:
            notes.extend(result.notes)
    return snapshot


# The last cold scan of this process, for the first HostRescanner of the same
# root: the daemon's start-up check scans the whole host seconds before its
# manager's first scan, which then starts from it instead of reading every
# attribute again (half of start-up on a host of thousands of parents).
SEED_MAX_AGE = 120.0
_seed_lock = threading.Lock()
_seed: tuple[str, float, HostSnapshot, dict[str, str] | None] | None = None


def _keep_seed(snapshot: HostSnapshot, mdev_targets: dict[str, str] | None) -> None:
    global _seed
    with _seed_lock:
        _seed = (snapshot.root, time.monotonic(), snapshot, mdev_targets)


def _take_seed(sysfs_root: str) -> tuple[HostSnapshot, dict[str, str] | None] | None:
    """The kept cold scan of ``sysfs_root`` when recent, once."""
    global _seed
    with _seed_lock:
        seed, _seed = _seed, None
    if seed is None:
        return None
    root, taken_at, snapshot, targets = seed
    if root != os.path.realpath(sysfs_root) or time.monotonic() - taken_at > SEED_MAX_AGE:
        return None
    return snapshot, targets


def scan_host(
    sysfs_root: str,
    backends: Mapping[str, DeviceBackend],
    workers: int = 1,
    notes: list[str] | None = None,
    state_dir: str | None = None,
) -> HostSnapshot:
    """A cold scan of every backend (``accelctl``'s offline listings: it reads
    what the agent learnt in ``state_dir``, never writes there); ``notes``
    gets what the backends say about host preparation."""
    # The mdev links before the scan: the basis of its counters for a seeded
    # Rescanner (one readlink per mdev).
    listed = Rescanner.mdev_targets(sysfs_root) if os.path.isdir(sysfs_root) else None
    base = scanner.scan(sysfs_root, workers=workers)
    _keep_seed(base, listed)
    found = [_scan(d) for d in _discoverers(sysfs_root, backends, state_dir)]
    return _merge(base, found, notes)


class HostRescanner:
    """``Rescanner``'s interface over every backend: ``rescan``, ``listing``
    and ``full`` re-read the mdev side as ``Rescanner`` does and the other
    backends in full."""

    def __init__(
        self,
        sysfs_root: str,
        backends: Mapping[str, DeviceBackend],
        state_dir: str | None = None,
        persist: bool = False,
    ) -> None:
        self.sysfs_root = sysfs_root
        self._mdevs = Rescanner(sysfs_root)
        seed = _take_seed(sysfs_root)
        if seed is not None:
            self._mdevs.seed(*seed)
        self._others = _discoverers(sysfs_root, backends, state_dir, persist)
        self._lock = threading.Lock()
        self._last: tuple[HostSnapshot, list, HostSnapshot] | None = None
        self.notes: tuple[str, ...] = ()

    def _with_others(self, base: HostSnapshot) -> HostSnapshot:
        if not self._others:
            return base
        with self._lock:
            results = [_scan(d) for d in self._others]
            last = self._last
            if last is not None and last[0] is base and last[1] == results:
                return last[2]
            notes: list[str] = []
            merged = _merge(base, results, notes)
            self.notes = tuple(notes)
            self._last = (base, results, merged)
            return merged

    def interrupt(self) -> None:
        """The agent is stopping: see :meth:`Rescanner.interrupt`."""
        self._mdevs.interrupt()

    def full(self) -> HostSnapshot:
        return self._with_others(self._mdevs.full())

    def rescan(
        self, counters: CounterFilter | None = None, *, reread_mdevs: bool = False
    ) -> HostSnapshot:
        return self._with_others(self._mdevs.rescan(counters, reread_mdevs=reread_mdevs))

    def listing(self) -> HostSnapshot:
        return self._with_others(self._mdevs.listing())
