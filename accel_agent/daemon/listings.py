"""The listings the API serves (``GET /v1/types``, ``/v1/mdevs``,
``/v1/inventory``) and accelctl's JSON.

Each listing is answered from a snapshot that re-read only what can have
changed (Rescanner.listing), and its encoded body is kept with the inputs it
was built from: when the snapshot object, the policy object and the ledger's
view are the same, so is the answer, and the bytes are sent again without
building or encoding anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accel_agent.daemon.shared_walk import SharedWalk
from accel_agent.reporting import views

if TYPE_CHECKING:
    from accel_agent.devices.manager import DeviceManager


def _same_inputs(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """Snapshot and policy (the first two) by identity, the rest by value."""
    return (
        len(old) == len(new)
        and all(a is b for a, b in zip(old[:2], new[:2], strict=True))
        and old[2:] == new[2:]
    )


class Listings:
    def __init__(self, devices: DeviceManager) -> None:
        self.devices = devices
        self._lock = threading.Lock()
        # listing name -> (the inputs it was built from, its JSON body)
        self._bodies: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        # libvirt's mdev definitions (and why they are not known), kept with
        # the snapshot they were read for: asked again only when a rescan
        # gives a new snapshot, an operation ran or libvirt's state changed
        # (stalled, answering again), never on every request.
        self._libvirt: tuple[Any, int, str, int, Any] | None = None
        # The VFIO groups held open: one /proc walk for the listings asking
        # at once, never an answer older than the request (shared_walk.py).
        self._held = SharedWalk()

    def types_json(self) -> bytes:
        devices = self.devices
        snapshot = devices.scan_all()
        policy = devices.policy
        return self._body(
            "types",
            (snapshot, policy),
            lambda: views.types_document(snapshot, policy, devices.host),
        )

    def mdevs_json(self) -> bytes:
        devices = self.devices
        # The ledger is read each time: accelctl --offline may write it
        # behind the daemon (serialised by the manager's file lock).
        from accel_agent.wiring import LedgerView

        ledger = LedgerView.of_records(devices.ledger.all())
        snapshot = devices.scan_all()
        policy = devices.policy
        owners = ledger.owners
        libvirt, libvirt_error = self._definitions(snapshot)
        held = None
        if ledger.layout_members:
            from accel_agent.daemon import layout_in_use

            held = self._held.held(layout_in_use.group_dir(devices))
        return self._body(
            "mdevs",
            (snapshot, policy, owners, libvirt, ledger.layout_members, held, libvirt_error),
            lambda: views.mdevs_document(
                snapshot, policy, devices.host, owners, owners, libvirt, ledger.layout_members,
                held, libvirt_error=libvirt_error,
            ),
        )

    def _definitions(
        self, snapshot: Any
    ) -> tuple[dict[str, tuple[bool, bool]] | None, str | None]:
        """libvirt's definitions for this snapshot, or why they are not known
        (read once per snapshot, per operation, per [libvirt] uri and per
        state of its libvirt).  A libvirt that does not answer costs one
        request at most its deadline ([libvirt] call_timeout), the ones after
        it nothing (devices/libvirt_calls.py)."""
        from accel_agent.devices import nodedevs

        devices = self.devices
        source = devices.nodedevs
        channel = getattr(source, "channel", None)
        generation = channel.generation if channel is not None else 0
        with self._lock:
            kept = self._libvirt
        if (
            kept is not None
            and kept[0] is snapshot
            and kept[1] == devices.operations
            and kept[2] == source.uri
            and kept[3] == generation
        ):
            return kept[4]
        found = nodedevs.listing_definitions(source)
        if channel is not None:
            generation = channel.generation  # what this answer found (a stall bumps it)
        with self._lock:
            self._libvirt = (snapshot, devices.operations, source.uri, generation, found)
        return found

    def inventory_json(self) -> bytes:
        devices = self.devices
        snapshot = devices.scan_all()
        policy = devices.policy
        free = devices.free_uuids()
        return self._body(
            "inventory",
            (snapshot, policy, free, devices.outside_state()),
            lambda: views.inventory_document(
                devices.reported_inventory(
                    snapshot, frozenset(u for u in free if u in snapshot.mdevs)
                )
            ),
        )

    def _body(
        self, name: str, inputs: tuple[Any, ...], build: Callable[[], dict[str, Any]]
    ) -> bytes:
        """The encoded listing for ``inputs``: snapshot and policy compared by
        identity (a new object is a new state), anything else by value."""
        with self._lock:
            cached = self._bodies.get(name)
        if cached is not None and _same_inputs(cached[0], inputs):
            return cached[1]
        body = views.encode(build())
        with self._lock:
            self._bodies[name] = (inputs, body)
        return body
