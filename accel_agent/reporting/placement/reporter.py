"""One Placement sync, driven: read what Placement holds, plan, apply, redrive on conflicts.

:class:`PlacementReporter` is what the daemon holds.  A sync finds the
host's root provider (creating it with ``[placement] create_root_provider``),
reads its children (:mod:`.subtree`), and provider by provider, in name
order, asks :mod:`.plan` for the writes and sends them (:mod:`.writer`):

* every write carries the provider generation; a 409 redrives that provider
  alone from fresh data, a bounded number of times, while the others
  converge as usual;
* a failure of one provider (refused, a request Placement rejects) fails
  that provider only; Placement unavailable, or an answer it could not have
  sent, fails the whole sync;
* Placement being down never raises into the caller's loop: the result is
  recorded (:mod:`.health`) and the next attempt backs off exponentially,
  jittered;
* a sync that would find Placement as the last one left it sends nothing
  (:mod:`.memory`): the inventory is the same, nothing waits on allocations,
  and ``refresh_interval`` has not passed;
* the root provider's UUID is kept: a sync reads the tree under it (one
  GET), and looks the root up by name only when that tree no longer shows it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.devices.inventory import Inventory, Provider
from accel_agent.reporting.placement import answers
from accel_agent.reporting.placement.client import PlacementClient, build_adapter
from accel_agent.reporting.placement.health import SyncHealth, iso, jittered
from accel_agent.reporting.placement.memory import Verified, signature
from accel_agent.reporting.placement.plan import (
    ProviderState,
    pending,
    plan_provider,
    provider_uuid,
)
from accel_agent.reporting.placement.result import SyncResult, SyncTally
from accel_agent.reporting.placement.subtree import SubtreeReader
from accel_agent.reporting.placement.writer import ActionWriter

if TYPE_CHECKING:
    from keystoneauth1.adapter import Adapter
    from oslo_config import cfg

# The package's name, not this module's: the reporter always logged as
# accel_agent.reporting.placement, and log filters name it.
LOG = logging.getLogger("accel_agent.reporting.placement")


class PlacementReporter:
    """Synchronises an :class:`Inventory` into Placement; thread-safe.

    ``adapter`` None means reporting is disabled: :meth:`sync` does nothing
    and :meth:`health` says ``disabled``.  ``max_retries``: redrives of one
    provider after generation conflicts within one sync (so at most
    ``max_retries + 1`` attempts).  ``refresh_interval``: at most this long
    (jittered) between two reads of an unchanged inventory's providers; 0
    reads at every sync.  ``rng``: the jitter's source (tests).
    """

    def __init__(
        self,
        adapter: Adapter | None,
        host: str,
        *,
        create_root: bool = False,
        take_over: bool = False,
        max_retries: int = 4,
        sync_interval: float = 60,
        max_backoff: float = 600,
        refresh_interval: float = 300,
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        settings: tuple[Any, ...] = (),
    ) -> None:
        self.host = host
        self.sync_interval = sync_interval
        self.refresh_interval = refresh_interval
        # What decides which Placement this reporter talks to and how (from_conf):
        # a reload's new reporter with the same carries this one's memory.
        self.settings = (host, *settings)
        self._rng = rng or random.Random()
        self._client = PlacementClient(adapter) if adapter is not None else None
        self._create_root = create_root
        self._take_over = take_over
        self._max_retries = max_retries
        self._log = logger or LOG
        self._clock = clock
        self._sync_lock = threading.Lock()  # one sync at a time
        self._health = SyncHealth(
            sync_interval=sync_interval, max_backoff=max_backoff, clock=clock, log=self._log,
            # A sync longer than one answer may take and than the interval is behind.
            stuck_after=getattr(getattr(adapter, "session", None), "timeout", None),
            rng=self._rng,
        )
        # Only ever used under _sync_lock.
        self._reader = SubtreeReader()
        self._writer = ActionWriter(self._log)
        # Replaced whole (one reference), so that carry_from may read them
        # without the lock.
        self._root_uuid: str | None = None
        self._verified: Verified | None = None

    @classmethod
    def from_conf(
        cls,
        conf: cfg.ConfigOpts,
        host: str | None = None,
        logger: logging.Logger | None = None,
    ) -> PlacementReporter:
        """Built from ``[placement]``; ``host`` defaults to ``[DEFAULT] host``."""
        group = conf.placement
        adapter = build_adapter(conf) if group.enabled else None
        return cls(
            adapter,
            host or conf.host,
            create_root=group.create_root_provider,
            take_over=group.take_over_providers,
            max_retries=group.max_conflict_retries,
            sync_interval=group.sync_interval,
            max_backoff=group.max_backoff,
            refresh_interval=group.refresh_interval,
            logger=logger,
            # After build_adapter: the auth plugin's options are registered then.
            settings=_settings(conf),
        )

    def carry_from(self, previous: PlacementReporter) -> bool:
        """Take over ``previous``'s knowledge (a reload replaces the reporter):
        the subtree cache, the root, what was verified, and the failures with
        their back-off, when both talk to the same Placement for the same host
        with the same settings.  Without it every reload would read the whole
        subtree again, and a fleet-wide reload during an outage would make
        every agent retry at the same instant.  Returns whether it did.

        Read without ``previous``'s lock (a sync of it may be running): each
        piece is replaced whole by a sync, and one that ends after this only
        made Placement more exact than what was taken."""
        if previous is self or previous.settings != self.settings or not self.enabled:
            return False
        self._reader.carry_from(previous._reader)
        self._root_uuid = previous._root_uuid
        verified = previous._verified
        if verified is not None:
            # Not later than this reporter's own refresh_interval says (a reload may shorten it).
            latest = self._clock() + self.refresh_interval
            self._verified = replace(verified, refresh_at=min(verified.refresh_at, latest))
        self._health.carry_from(previous._health)
        return True

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def next_attempt_at(self) -> float:
        return self._health.next_attempt_at

    def due(self) -> bool:
        """False while backing off after failures."""
        return self.enabled and self._clock() >= self.next_attempt_at

    def health(self) -> dict[str, Any]:
        return self._health.document(enabled=self.enabled)

    def sync(self, inventory: Inventory, *, force: bool = False) -> SyncResult:
        """Make Placement match ``inventory``.  Never raises.

        ``force``: ignore the back-off (an operator's "sync now").
        """
        if self._client is None:
            return SyncResult(ok=True, attempted=False, error="Placement reporting is disabled")
        with self._sync_lock:
            verified = self._verified if self.refresh_interval > 0 else None
            if not force and verified is not None and verified.covers(inventory, self._clock()):
                return SyncResult(ok=True, attempted=False, unchanged=True,
                                  providers=self._health.providers)
            if not force and not self.due():
                return SyncResult(
                    ok=False,
                    attempted=False,
                    error=f"backing off after {self._health.failures} failures until "
                    f"{iso(self.next_attempt_at)}",
                )
            self._client.writes = 0
            self._health.begin()
            try:
                result = self._sync(self._client, inventory)
            except exception.PlacementError as exc:
                result = SyncResult(ok=False, error=exc.message, writes=self._client.writes)
            except Exception as exc:
                # A bug or an unexpected answer must not kill the caller's loop.
                self._log.exception("Placement sync failed unexpectedly")
                result = SyncResult(ok=False, error=f"unexpected error: {exc!r}")
            self._remember(inventory, result)
            self._health.record(result)
            return result

    def _remember(self, inventory: Inventory, result: SyncResult) -> None:
        if not result.ok or result.pending or self.refresh_interval <= 0:
            self._verified = None
            return
        self._verified = Verified(
            signature(inventory),
            self._clock() + jittered(self.refresh_interval, self._rng),
        )

    # -- one sync --

    def _sync(self, client: PlacementClient, inventory: Inventory) -> SyncResult:
        if inventory.host != self.host:
            raise exception.PlacementError(
                reason=f"inventory is for host {inventory.host}, the reporter for {self.host}"
            )
        self._writer.start_sync()
        root_uuid, actual = self._read_subtree(client)
        wanted = {p.name: p for p in inventory.providers}
        tally = SyncTally()
        for name in sorted(wanted.keys() | actual.keys()):
            self._converge(client, name, wanted.get(name), actual.get(name), root_uuid, tally)
        self._reader.remember(tally.present.values())
        return tally.result(writes=client.writes)

    def _read_subtree(self, client: PlacementClient) -> tuple[str, dict[str, ProviderState]]:
        """The root's UUID and its children: through the kept root (one GET),
        or, when its tree no longer shows it, the root found by name."""
        if self._root_uuid is not None:
            actual = self._reader.tree(client, self._root_uuid, self.host)
            if actual is not None:
                return self._root_uuid, actual
            self._root_uuid = None
        root_uuid = self._find_root(client)
        actual = self._reader.tree(client, root_uuid, self.host)
        if actual is None:
            raise exception.PlacementError(
                reason=f"root provider {self.host} ({root_uuid}) left Placement while it was read"
            )
        self._root_uuid = root_uuid
        return root_uuid, actual

    def _find_root(self, client: PlacementClient) -> str:
        query = urllib.parse.urlencode({"name": self.host})
        providers = client.get(f"/resource_providers?{query}", answers.provider_list)
        if providers:
            return providers[0].uuid
        if not self._create_root:
            raise exception.PlacementRootProviderNotFound(host=self.host)
        root = client.post(
            "/resource_providers",
            {"name": self.host, "uuid": provider_uuid(self.host)},
            answers.provider,
        )
        self._log.info("created root provider %s (%s)", self.host, root.uuid)
        return root.uuid

    def _converge(
        self,
        client: PlacementClient,
        name: str,
        desired: Provider | None,
        state: ProviderState | None,
        root_uuid: str,
        tally: SyncTally,
    ) -> None:
        """Plan and apply one provider, redriving on generation conflicts."""
        attempts = self._max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                if attempt > 1:
                    uuid = state.uuid if state else provider_uuid(name)
                    state = self._reader.refetch(client, uuid)
                actions = plan_provider(name, desired, state, root_uuid, take_over=self._take_over)
                if (
                    state is not None
                    and not state.usages_fresh
                    and (actions or pending(desired, state))
                ):
                    # A write, or a provider waiting on its allocations: on usages as they are now.
                    state = self._reader.with_usages(client, state)
                    actions = plan_provider(
                        name, desired, state, root_uuid, take_over=self._take_over
                    )
                for action in actions:
                    state = self._writer.apply(client, action, state)
                    tally.note(action)
            except exception.PlacementGenerationConflict as exc:
                if attempt == attempts:
                    self._fail(
                        tally,
                        name,
                        f"gave up after {attempts} attempts, the provider kept changing: "
                        f"{exc.message}",
                    )
                    return
                tally.conflicts += 1
                self._log.info(
                    "%s changed in Placement while we wrote it (%s); refetching, attempt %d of %d",
                    name,
                    exc.kwargs.get("code"),
                    attempt + 1,
                    attempts,
                )
                continue
            except exception.PlacementUnavailable:
                raise  # nothing else will work either: fail the whole sync
            except exception.PlacementError as exc:
                self._fail(tally, name, exc.message)
                return
            if state is not None:
                tally.present[name] = state
                if pending(desired, state):
                    tally.pending.append(name)
            return

    def _fail(self, tally: SyncTally, name: str, reason: str) -> None:
        # Other providers still converge; this one is retried at the next sync.
        tally.failures[name] = reason
        self._log.error("could not synchronise provider %s: %s", name, reason)


# When to sync, not what Placement is or what goes into it: a reload that
# changes only these keeps what the reporter knows.
_SCHEDULE_OPTIONS = frozenset(
    {"sync_interval", "max_backoff", "refresh_interval", "max_conflict_retries"}
)


def _settings(conf: cfg.ConfigOpts) -> tuple[Any, ...]:
    """Every other ``[placement]`` value (the auth plugin's too), as comparable text."""
    from accel_agent.reporting.placement_opts import GROUP

    group = conf[GROUP]
    values = []
    for name in sorted(set(group.keys()) - _SCHEDULE_OPTIONS):
        try:
            values.append((name, repr(group[name])))
        except Exception:  # one that cannot be read (checked at start) differs from any
            values.append((name, "<unreadable>"))
    return tuple(values)
