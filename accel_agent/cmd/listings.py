"""The read-only listings (``types``, ``mdevs``, ``inventory``) read directly
from sysfs and the ledger: what accelctl prints when no daemon runs.

Shared by accelctl's parser path (accel_agent.cmd.ctl_listings) and its plain path
(accel_agent.cmd.plain_listing), which must print the same bytes; this
module imports neither argparse nor the API client.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

from accel_agent import wiring
from accel_agent.cmd import output

# Beyond this the forks and the merge eat what another worker saves.
_MAX_WORKERS = 4


def _types(state: wiring.HostState) -> dict[str, Any]:
    from accel_agent.reporting import views

    return views.types_document(state.snapshot, state.policy, state.host)


def _mdevs(state: wiring.HostState) -> dict[str, Any]:
    from accel_agent.devices import nodedevs
    from accel_agent.reporting import views

    # Quiet: a listing without libvirt says null (and libvirt_error why), not
    # a warning.  An empty uri imports nothing of libvirt's.
    libvirt, libvirt_error = nodedevs.listing_definitions(
        nodedevs.for_uri(state.libvirt_uri), quiet=True
    )
    held = None
    if state.ledger.layout_members:
        from accel_agent.sysfs import vfio_holders

        held = vfio_holders.held_groups(vfio_holders.vfio_dev_dir(state.snapshot.root))
    return views.mdevs_document(
        state.snapshot, state.policy, state.host, state.ledger.owners, state.ledger.owned,
        libvirt, state.ledger.layout_members, held, libvirt_error=libvirt_error,
    )


def _inventory(state: wiring.HostState) -> dict[str, Any]:
    inventory = state.reported_inventory()
    for warning in inventory.warnings:
        output.warning(warning)
    return inventory.to_dict()


BUILDERS: dict[str, Callable[[wiring.HostState], dict[str, Any]]] = {
    "types": _types,
    "mdevs": _mdevs,
    "inventory": _inventory,
}


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A listing builds tens of thousands of small objects with no cycles;
    the cyclic collector would walk them again and again as they pile up
    (5 ms of a 256-GPU listing).  Everything is freed by reference count."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def scan_workers() -> int:
    """Processes for an offline scan: one per core this process may use that
    nobody else is using right now, at most 4.

    A scan is thousands of tiny syscalls; a forked worker halves the wall
    time when a core is idle, and only adds its fork, its page faults and its
    pickling when none is (then it waits for the same core: 1.7-2.2x
    mdevctl's time on a busy machine, BENCHMARKS.md (a)).  The kernel's count
    of runnable tasks (``/proc/loadavg``'s fourth field, this process
    included) says whether one is idle at this instant, where the load
    average would say what the last minute was like.
    """
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/proc/loadavg", "rb") as handle:
            running = int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        running = 1
    idle = cores - running
    return max(1, min(_MAX_WORKERS, 1 + idle))


def offline_document(
    name: str, listing: wiring.ListingConfig, errors: list[Any] | None = None
) -> dict[str, Any]:
    """Listing ``name`` from a fresh scan of ``listing.sysfs_root`` and the
    ledger; sysfs warnings go to stderr.  Raises ConfigErrors with
    ``errors`` (values oslo.config refused) and the policy's own."""
    state = wiring.host_state(listing, errors, scan_workers=scan_workers())
    for warning in state.snapshot.warnings:
        output.warning(f"sysfs: {warning}")
    return BUILDERS[name](state)
