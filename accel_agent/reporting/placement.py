"""Keep this host's per-GPU resource providers in OpenStack Placement.

The agent owns a subtree: one child provider per physical GPU (``Provider``
from :mod:`accel_agent.mdev.inventory`) under the host's root provider, which
nova-compute normally creates.  A sync reads what Placement holds, plans the
difference with the pure :func:`plan_provider` and writes only that, so a
steady state costs two GETs (plus one per provider holding allocations) and no
writes.

Rules (research/cyborg-osacc-placement.md §4, §6):

* never touch a provider the agent did not create: ours carry
  ``CUSTOM_OWNER_ACCEL_AGENT``, or the deterministic UUID the agent gives
  every provider (uuid5 of its name, which also makes restarts idempotent);
* never write ``total: 0`` (Placement rejects it): no capacity means no
  provider;
* never delete a provider, nor drop a resource class, that holds
  allocations: drain it (``reserved = total``) and delete it once freed;
* every write carries the provider generation; a 409 redrives that provider
  alone from fresh data, a bounded number of times;
* Placement being down never raises into the caller's loop: the reporter
  records the failure and backs off exponentially;
* an answer is input: read with a bound, parsed and checked for the fields
  the reporter uses before any is used (:mod:`placement_answers`); one that
  is too big, too slow, not JSON or of the wrong shape fails the sync as an
  outage does, with one line naming the request and what was wrong.

Generations make a cache safe: Placement bumps a provider's generation on
every change of its inventory or traits and on every allocation written
against it, so when the tree listing shows the generation we last saw, our
copy of inventories and traits is still exact and is not fetched again.
Usages are the exception: ``DELETE /allocations/{consumer}`` frees usage
*without* bumping the generation (verified on Placement 16.0.0), so usage
that was non-zero is always read again; usage that was zero cannot grow
without a generation bump.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import threading
import time
import urllib.parse
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from accel_agent import exception
from accel_agent.mdev.inventory import OWNER_TRAIT, Inventory, Provider
from accel_agent.reporting import placement_answers as answers
from accel_agent.reporting.placement_answers import INVENTORY_FIELDS

if TYPE_CHECKING:
    from keystoneauth1.adapter import Adapter
    from oslo_config import cfg

T = TypeVar("T")

LOG = logging.getLogger(__name__)

# The lowest microversion that has everything the reporter uses: nested
# providers and ``in_tree`` (1.14), POST returning the provider (1.20), error
# codes in 409 bodies (1.23) and ``reserved == total`` for draining (1.26).
# Pinning the floor rather than the newest (1.39 in Placement 16) keeps the
# agent working against every Placement since Rocky; a server too old for it
# answers 406, reported as such.
MICROVERSION = "1.26"

# Fixed forever: provider UUIDs are uuid5(PROVIDER_NAMESPACE, name).
PROVIDER_NAMESPACE = uuidlib.UUID("6b0d1c1e-3f5a-5d8e-9c47-acce1a9e0001")

# 409 codes meaning "the provider changed since we read it": refetch, replan.
_REDRIVE_CODES = frozenset(
    {
        "placement.concurrent_update",
        "placement.inventory.inuse",
        "placement.resource_provider.inuse",
    }
)


def provider_uuid(name: str) -> str:
    """The deterministic UUID of the provider called ``name``."""
    return str(uuidlib.uuid5(PROVIDER_NAMESPACE, name))


# --- what Placement holds -------------------------------------------------------------


@dataclass(frozen=True)
class ProviderState:
    """One provider as Placement holds it (at ``generation``)."""

    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    inventories: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    usages: Mapping[str, int] = field(default_factory=dict)

    @property
    def owned(self) -> bool:
        # The UUID test covers a provider created just before a crash, before
        # its traits (and so the owner trait) were written.
        return OWNER_TRAIT in self.traits or self.uuid == provider_uuid(self.name)

    @property
    def in_use(self) -> int:
        return sum(self.usages.values())


# --- the plan: pure, unit-tested ------------------------------------------------------


@dataclass(frozen=True)
class CreateProvider:
    name: str
    uuid: str
    parent_uuid: str

    def describe(self) -> str:
        return f"created provider {self.name} ({self.uuid})"


@dataclass(frozen=True)
class SetTraits:
    name: str
    uuid: str
    traits: tuple[str, ...]
    previous: frozenset[str]

    def describe(self) -> str:
        if not self.previous:
            return f"set traits of {self.name}: {', '.join(self.traits)}"
        added = sorted(set(self.traits) - self.previous)
        removed = sorted(self.previous - set(self.traits))
        parts = [f"+{t}" for t in added] + [f"-{t}" for t in removed]
        return f"updated traits of {self.name}: {' '.join(parts)}"


@dataclass(frozen=True)
class SetInventory:
    name: str
    uuid: str
    inventories: Mapping[str, Mapping[str, Any]]
    previous: Mapping[str, Mapping[str, Any]]
    in_use: int = 0
    # True: the provider left the inventory but holds allocations.
    drain: bool = False
    # Something an operator should know (over capacity, a class kept for
    # its allocations); logged as a warning.
    note: str | None = None

    def describe(self) -> str:
        if self.drain:
            return (
                f"drained {self.name}: {self.in_use} allocated, reserved = total until "
                "the allocations are gone, then it is deleted"
            )
        verb = "updated" if self.previous else "set"
        change = describe_inventory_change(self.previous, self.inventories)
        text = f"{verb} inventory of {self.name}: {change}"
        return f"{text} ({self.note})" if self.note else text

    @property
    def warns(self) -> bool:
        return self.drain or self.note is not None


@dataclass(frozen=True)
class DeleteProvider:
    name: str
    uuid: str

    def describe(self) -> str:
        return f"deleted provider {self.name} ({self.uuid})"


@dataclass(frozen=True)
class Refuse:
    """A provider the agent wants but must not write: reported as a failure."""

    name: str
    reason: str

    def describe(self) -> str:
        return self.reason


Action = CreateProvider | SetTraits | SetInventory | DeleteProvider | Refuse


def _normal(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(
        float(record.get(f, 0)) if f == "allocation_ratio" else int(record.get(f, 0))
        for f in INVENTORY_FIELDS
    )


def same_inventories(
    a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]
) -> bool:
    return a.keys() == b.keys() and all(_normal(a[rc]) == _normal(b[rc]) for rc in a)


def _drained(record: Mapping[str, Any]) -> dict[str, Any]:
    return {**record, "reserved": record["total"]}


def describe_inventory_change(
    old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
) -> str:
    """``VGPU total 16 -> 8, max_unit 16 -> 8``; new and removed classes named."""
    parts = []
    for rc in sorted(old.keys() | new.keys()):
        if rc not in old:
            parts.append(f"{rc} total {new[rc]['total']}" + (" (new class)" if old else ""))
        elif rc not in new:
            parts.append(f"{rc} removed")
        else:
            changes = [
                f"{f} {old[rc].get(f)} -> {new[rc][f]}"
                for f in INVENTORY_FIELDS
                if _normal({f: old[rc].get(f, 0)}) != _normal({f: new[rc][f]})
            ]
            if changes:
                parts.append(f"{rc} {', '.join(changes)}")
    return "; ".join(parts)


def desired_inventories(desired: Provider, actual: ProviderState | None) -> dict[str, Any]:
    """``{resource_class: record}`` to PUT for ``desired``.

    A class the provider used to have (the configured class changed, e.g.
    VGPU -> CUSTOM_X) is dropped, unless it still holds allocations: a
    full-replace PUT without it would fail with placement.inventory.inuse, so
    it stays, drained, until those allocations are released.
    """
    inventories: dict[str, Any] = {desired.resource_class: desired.inventory_record()}
    if actual is not None:
        for rc, record in actual.inventories.items():
            if rc not in inventories and actual.usages.get(rc, 0) > 0:
                inventories[rc] = _drained(record)
    return inventories


def plan_provider(
    name: str,
    desired: Provider | None,
    actual: ProviderState | None,
    root_uuid: str,
    take_over: bool = False,
) -> list[Action]:
    """The writes that make Placement's ``actual`` match ``desired``, in order.

    ``desired`` None: the provider should not exist (GPU gone or unconfigured).
    ``actual`` None: Placement has no provider of that name under the root.
    ``take_over`` (``[placement] take_over_providers``): a provider of the name
    the agent wants that someone else created (Nova, on a host taken over with
    ``accelctl adopt --from-libvirt``) becomes the agent's: its UUID is kept, so
    the allocations against it stay valid, and it gets the owner trait.
    """
    if desired is not None and desired.total <= 0:
        desired = None  # Placement rejects total 0: no capacity, no provider.
    if actual is not None and not actual.owned:
        if desired is None:
            return []  # someone else's provider (Nova's, an operator's)
        if take_over:
            return _plan_present(desired, actual, root_uuid)
        return [
            Refuse(
                name,
                f"provider {name} ({actual.uuid}) exists but was not created by accel-agent "
                f"(no {OWNER_TRAIT} trait); not touching it",
            )
        ]
    if desired is None:
        return [] if actual is None else _plan_removal(actual)
    return _plan_present(desired, actual, root_uuid)


def _plan_present(desired: Provider, actual: ProviderState | None, root_uuid: str) -> list[Action]:
    actions: list[Action] = []
    if actual is None:
        new_uuid = provider_uuid(desired.name)
        actions.append(CreateProvider(desired.name, new_uuid, root_uuid))
        actual = ProviderState(new_uuid, desired.name, 0, root_uuid)
    # Traits before inventory, so that capacity never appears on a provider
    # the scheduler cannot yet filter by type or owner.
    traits = tuple(sorted({*desired.traits, OWNER_TRAIT}))
    if frozenset(traits) != actual.traits:
        actions.append(SetTraits(desired.name, actual.uuid, traits, actual.traits))
    inventories = desired_inventories(desired, actual)
    if not same_inventories(inventories, actual.inventories):
        actions.append(
            SetInventory(
                desired.name,
                actual.uuid,
                inventories,
                actual.inventories,
                in_use=actual.in_use,
                note=_inventory_note(desired, actual, inventories),
            )
        )
    return actions


def _inventory_note(
    desired: Provider, actual: ProviderState, inventories: Mapping[str, Any]
) -> str | None:
    notes = []
    allocated = actual.usages.get(desired.resource_class, 0)
    if allocated > desired.total:
        # Placement accepts it and only warns; the scheduler places nothing more.
        notes.append(f"total below the {allocated} allocated: over capacity until released")
    notes += [
        f"{rc} kept, drained, while {actual.usages[rc]} allocated"
        for rc in sorted(inventories)
        if rc != desired.resource_class
    ]
    return "; ".join(notes) or None


def _plan_removal(actual: ProviderState) -> list[Action]:
    if actual.in_use == 0:
        return [DeleteProvider(actual.name, actual.uuid)]
    drained = {rc: _drained(record) for rc, record in actual.inventories.items()}
    if same_inventories(drained, actual.inventories):
        return []  # already drained; waiting for the allocations to go
    return [
        SetInventory(
            actual.name, actual.uuid, drained, actual.inventories, in_use=actual.in_use, drain=True
        )
    ]


def plan(
    desired: Iterable[Provider],
    actual: Mapping[str, ProviderState],
    root_uuid: str,
    take_over: bool = False,
) -> list[Action]:
    """Every action for the whole subtree, provider by provider in name order."""
    wanted = {p.name: p for p in desired}
    actions: list[Action] = []
    for name in sorted(wanted.keys() | actual.keys()):
        actions += plan_provider(
            name, wanted.get(name), actual.get(name), root_uuid, take_over=take_over
        )
    return actions


# --- HTTP -----------------------------------------------------------------------------


# What of an error body goes into a message: the gist, not megabytes.
_DETAIL_CHARS = 200


def _error_details(body: bytes | bytearray, reason: str) -> tuple[str, str]:
    """(code, detail) of a Placement error body (1.23+), tolerant of anything else."""
    try:
        error = json.loads(body)["errors"][0]
        code, detail = str(error.get("code") or "-"), str(error.get("detail") or error.get("title"))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        code = "-"
        detail = bytes(body[:_DETAIL_CHARS]).decode("utf-8", "replace").strip() or reason or ""
    if len(detail) > _DETAIL_CHARS:
        detail = detail[:_DETAIL_CHARS] + "..."
    return code[:_DETAIL_CHARS], detail


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytearray
    request_id: str


class _Client:
    """Placement requests at :data:`MICROVERSION`, HTTP failures as exceptions,
    answers read and checked by :mod:`placement_answers` before anyone uses them."""

    def __init__(self, adapter: Adapter) -> None:
        self._adapter = adapter
        self.writes = 0
        # keystoneauth's timeout bounds each socket read; the whole of an
        # answer gets as long, so that one trickling in cannot hold a sync.
        self._answer_seconds: float | None = getattr(
            getattr(adapter, "session", None), "timeout", None
        )

    def get(self, url: str, shape: Callable[[Any], T]) -> T:
        return self._parse("GET", url, self._request("GET", url, ok=(200,)), shape)

    def get_if_present(self, url: str, shape: Callable[[Any], T]) -> T | None:
        answer = self._request("GET", url, ok=(200, 404))
        return None if answer.status == 404 else self._parse("GET", url, answer, shape)

    def put(self, url: str, body: Mapping[str, Any], shape: Callable[[Any], T]) -> T:
        answer = self._request("PUT", url, body, ok=(200, 201, 204))
        return self._parse("PUT", url, answer, shape)

    def put_name(self, url: str) -> None:
        """``PUT /traits/{name}``, ``/resource_classes/{name}``: 201 or 204, no body."""
        self._request("PUT", url, ok=(200, 201, 204))

    def post(self, url: str, body: Mapping[str, Any], shape: Callable[[Any], T]) -> T:
        return self._parse("POST", url, self._request("POST", url, body, ok=(200, 201)), shape)

    def delete(self, url: str) -> None:
        self._request("DELETE", url, ok=(204, 404))  # 404: already gone, fine

    @staticmethod
    def _parse(method: str, url: str, answer: _Answer, shape: Callable[[Any], T]) -> T:
        try:
            if not answer.body:
                raise answers.AnswerRejected(f"status {answer.status} without a body")
            return shape(answers.decode_json(answer.body))
        except answers.AnswerRejected as exc:
            raise exception.PlacementAnswerRejected(
                method=method, url=url, reason=str(exc), request_id=answer.request_id
            ) from None

    def _request(
        self,
        method: str,
        url: str,
        body: Mapping[str, Any] | None = None,
        *,
        ok: tuple[int, ...],
    ) -> _Answer:
        import http.client

        import requests
        import urllib3
        from keystoneauth1 import exceptions as ks_exc

        kwargs: dict[str, Any] = {
            "microversion": MICROVERSION,
            "raise_exc": False,
            # The body is read here, bounded (placement_answers), not by requests.
            "stream": True,
            # keystoneauth's debug log of a response reads its body whole.
            "log": False,
            "headers": {"Accept-Encoding": "identity"},
        }
        if body is not None:
            kwargs["json"] = body
        if method != "GET":
            self.writes += 1
        try:
            resp = self._adapter.request(url, method, **kwargs)
        except ks_exc.ClientException as exc:
            # Connection refused/timeout, TLS, endpoint or token lookup.
            raise exception.PlacementUnavailable(reason=f"{method} {url}: {exc}") from exc
        request_id = resp.headers.get("x-openstack-request-id", "-")
        complete = False
        try:
            data = answers.read_body(resp.raw, resp.headers, seconds=self._answer_seconds)
            complete = True
        except answers.AnswerRejected as exc:
            if resp.status_code in ok:
                raise exception.PlacementAnswerRejected(
                    method=method, url=url, reason=str(exc), request_id=request_id
                ) from None
            data = bytearray()  # a failure: its status says enough
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
                requests.RequestException) as exc:
            raise exception.PlacementUnavailable(
                reason=f"{method} {url}: the answer broke off: {exc}"
            ) from exc
        finally:
            if complete:
                # Read to its end: the connection can serve the next request.
                resp.raw.release_conn()
            else:
                resp.close()  # unread bytes may follow: drop the connection
        LOG.debug(
            "%s %s: %s, %d bytes (request %s)", method, url, resp.status_code, len(data), request_id
        )
        if resp.status_code in ok:
            return _Answer(resp.status_code, data, request_id)
        raise self._failure(method, url, resp.status_code, resp.reason, data, request_id)

    @staticmethod
    def _failure(
        method: str, url: str, status: int, reason: str, body: bytearray, request_id: str
    ) -> exception.PlacementError:
        code, detail = _error_details(body, reason)
        details = {
            "method": method,
            "url": url,
            "status": status,
            "code": code,
            "detail": detail,
            "request_id": request_id,
        }
        if status >= 500 or status in (401, 403, 406):
            # Nothing this sync does can succeed: server down, bad credentials,
            # or a Placement older than MICROVERSION (406).
            hint = f" (microversion {MICROVERSION} required)" if status == 406 else ""
            return exception.PlacementUnavailable(
                reason=f"{method} {url} returned {status} {code}: {detail}{hint} "
                f"(request {details['request_id']})"
            )
        if (status == 409 and code in _REDRIVE_CODES) or (status == 404 and method == "PUT"):
            # The provider changed (or vanished) since we read it.
            return exception.PlacementGenerationConflict(**details)
        return exception.PlacementRequestFailed(**details)


# --- adapters -------------------------------------------------------------------------


def build_adapter(conf: cfg.ConfigOpts) -> Adapter:
    """A keystoneauth1 adapter from ``[placement]`` (registered by placement_opts).

    Raises InvalidConfig for options keystoneauth cannot use, so that the
    daemon refuses to start with a clear message instead of failing each sync.
    """
    from keystoneauth1 import exceptions as ks_exc
    from keystoneauth1 import loading as ks_loading

    from accel_agent.reporting.placement_opts import GROUP

    try:
        auth = ks_loading.load_auth_from_conf_options(conf, GROUP)
        if auth is None and not conf[GROUP].endpoint_override:
            raise exception.InvalidConfig(
                reason="[placement] enabled = true needs auth_type (password for Keystone, "
                "admin_token with endpoint and token for a noauth2 Placement)"
            )
        session = ks_loading.load_session_from_conf_options(conf, GROUP, auth=auth)
        return ks_loading.load_adapter_from_conf_options(
            conf, GROUP, session=session, auth=auth, default_microversion=MICROVERSION
        )
    except (ks_exc.ClientException, TypeError, ValueError) as exc:
        # MissingRequiredOptions, NoMatchingPlugin, process_conf_options' TypeError.
        raise exception.InvalidConfig(reason=f"[placement]: {exc}") from exc


def adapter_for_endpoint(endpoint: str, token: str = "admin", timeout: float = 30) -> Adapter:
    """An adapter for a known endpoint and token, no catalog (noauth2, tests).

    The same as ``auth_type = admin_token`` with ``endpoint`` and ``token``.
    """
    from keystoneauth1 import adapter, session, token_endpoint

    sess = session.Session(auth=token_endpoint.Token(endpoint, token), timeout=timeout)
    return adapter.Adapter(sess, service_type="placement", default_microversion=MICROVERSION)


# --- the reporter ---------------------------------------------------------------------


@dataclass(frozen=True)
class SyncResult:
    """What one :meth:`PlacementReporter.sync` did.

    ``attempted`` False: nothing was sent (disabled, or backing off).
    ``ok``: every provider converged.  ``failures``: provider name -> why.
    """

    ok: bool
    attempted: bool = True
    error: str | None = None
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    failures: Mapping[str, str] = field(default_factory=dict)
    writes: int = 0
    conflicts: int = 0
    providers: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.drained or self.deleted)


@dataclass
class _Tally:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    conflicts: int = 0
    present: dict[str, ProviderState] = field(default_factory=dict)

    def note(self, action: Action) -> None:
        name = action.name
        if isinstance(action, CreateProvider):
            self.created.append(name)
        elif isinstance(action, DeleteProvider):
            self.deleted.append(name)
        elif isinstance(action, SetInventory) and action.drain:
            self.drained.append(name)
        elif name not in self.created and name not in self.updated:
            self.updated.append(name)


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC).isoformat()


class PlacementReporter:
    """Synchronises an :class:`Inventory` into Placement; thread-safe.

    ``adapter`` None means reporting is disabled: :meth:`sync` does nothing
    and :meth:`health` says ``disabled``.  ``max_retries``: redrives of one
    provider after generation conflicts within one sync (so at most
    ``max_retries + 1`` attempts).
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
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.sync_interval = sync_interval
        self._client = _Client(adapter) if adapter is not None else None
        self._create_root = create_root
        self._take_over = take_over
        self._max_retries = max_retries
        self._max_backoff = max_backoff
        self._log = logger or LOG
        self._clock = clock
        self._sync_lock = threading.Lock()  # one sync at a time
        self._state_lock = threading.Lock()  # health() readers vs the syncing thread
        self._cache: dict[str, ProviderState] = {}
        self._ensured: set[str] = set()
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._next_attempt_at = 0.0
        self._providers = 0

    @classmethod
    def from_conf(
        cls,
        conf: cfg.ConfigOpts,
        host: str | None = None,
        logger: logging.Logger | None = None,
    ) -> PlacementReporter:
        """Built from ``[placement]``; ``host`` defaults to ``[DEFAULT] host``."""
        group = conf.placement
        return cls(
            build_adapter(conf) if group.enabled else None,
            host or conf.host,
            create_root=group.create_root_provider,
            take_over=group.take_over_providers,
            max_retries=group.max_conflict_retries,
            sync_interval=group.sync_interval,
            max_backoff=group.max_backoff,
            logger=logger,
        )

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def next_attempt_at(self) -> float:
        with self._state_lock:
            return self._next_attempt_at

    def due(self) -> bool:
        """False while backing off after failures."""
        return self.enabled and self._clock() >= self.next_attempt_at

    def health(self) -> dict[str, Any]:
        with self._state_lock:
            state = "failing" if self._failures else "ok"
            if not self.enabled:
                state = "disabled"
            return {
                "enabled": self.enabled,
                "state": state,
                "last_success": _iso(self._last_success),
                "last_error": self._last_error,
                "consecutive_failures": self._failures,
                "providers": self._providers,
                "next_attempt_at": _iso(self._next_attempt_at) if self._failures else None,
            }

    def sync(self, inventory: Inventory, *, force: bool = False) -> SyncResult:
        """Make Placement match ``inventory``.  Never raises.

        ``force``: ignore the back-off (an operator's "sync now").
        """
        if self._client is None:
            return SyncResult(ok=True, attempted=False, error="Placement reporting is disabled")
        with self._sync_lock:
            if not force and not self.due():
                return SyncResult(
                    ok=False,
                    attempted=False,
                    error=f"backing off after {self._failures} failures until "
                    f"{_iso(self.next_attempt_at)}",
                )
            self._client.writes = 0
            try:
                result = self._sync(self._client, inventory)
            except exception.PlacementError as exc:
                result = SyncResult(ok=False, error=exc.message, writes=self._client.writes)
            except Exception as exc:
                # A bug or an unexpected answer must not kill the caller's loop.
                self._log.exception("Placement sync failed unexpectedly")
                result = SyncResult(ok=False, error=f"unexpected error: {exc!r}")
            self._record(result)
            return result

    # -- bookkeeping --

    def _record(self, result: SyncResult) -> None:
        now = self._clock()
        with self._state_lock:
            if result.ok:
                self._last_success = now
                self._failures = 0
                self._next_attempt_at = 0.0
            else:
                self._failures += 1
                self._last_error = result.error or "; ".join(
                    f"{name}: {why}" for name, why in sorted(result.failures.items())
                )
                # Jitter spreads a fleet's retries once Placement comes back.
                delay = min(self.sync_interval * 2 ** (self._failures - 1), self._max_backoff)
                self._next_attempt_at = now + delay * random.uniform(0.8, 1.0)
            if result.error is None:
                self._providers = result.providers
        if not result.ok:
            self._log.warning(
                "Placement sync failed (%d in a row, next attempt in %.0f s): %s",
                self._failures,
                self._next_attempt_at - now,
                self._last_error,
            )
        elif result.changed:
            self._log.info(
                "Placement sync: %d created, %d updated, %d drained, %d deleted (%d writes)",
                len(result.created),
                len(result.updated),
                len(result.drained),
                len(result.deleted),
                result.writes,
            )

    # -- one sync --

    def _sync(self, client: _Client, inventory: Inventory) -> SyncResult:
        if inventory.host != self.host:
            raise exception.PlacementError(
                reason=f"inventory is for host {inventory.host}, the reporter for {self.host}"
            )
        self._ensured.clear()  # per sync: a Placement rebuilt from scratch recovers
        root_uuid = self._find_root(client)
        actual = self._children(client, root_uuid)
        wanted = {p.name: p for p in inventory.providers}
        tally = _Tally()
        for name in sorted(wanted.keys() | actual.keys()):
            self._converge(client, name, wanted.get(name), actual.get(name), root_uuid, tally)
        self._cache = {s.uuid: s for s in tally.present.values()}
        owned = sum(1 for s in tally.present.values() if s.owned)
        return SyncResult(
            ok=not tally.failures,
            created=tuple(tally.created),
            updated=tuple(tally.updated),
            drained=tuple(tally.drained),
            deleted=tuple(tally.deleted),
            failures=dict(tally.failures),
            writes=client.writes,
            conflicts=tally.conflicts,
            providers=owned,
        )

    def _find_root(self, client: _Client) -> str:
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

    def _children(self, client: _Client, root_uuid: str) -> dict[str, ProviderState]:
        """Direct children of the root, by name (ours and anyone else's)."""
        query = urllib.parse.urlencode({"in_tree": root_uuid})
        tree = client.get(f"/resource_providers?{query}", answers.provider_list)
        children = {}
        for rp in tree:
            if rp.uuid != root_uuid and rp.parent_uuid == root_uuid:
                children[rp.name] = self._state(client, rp)
        return children

    def _state(self, client: _Client, rp: answers.ProviderRef) -> ProviderState:
        base = f"/resource_providers/{rp.uuid}"
        cached = self._cache.get(rp.uuid)
        if cached is not None and cached.generation == rp.generation:
            if not cached.in_use:
                return cached
            # Freed allocations do not bump the generation (module docstring).
            return replace(cached, usages=self._usages(client, base))
        # Tagged with the generation read *before* the contents, so the tag is
        # never newer than the data: a later change always shows as a miss.
        inventories = client.get(f"{base}/inventories", answers.inventories)
        traits = client.get(f"{base}/traits", answers.traits)
        return ProviderState(
            uuid=rp.uuid,
            name=rp.name,
            generation=rp.generation,
            parent_uuid=rp.parent_uuid,
            inventories=inventories.records,
            traits=frozenset(traits.names),
            usages=self._usages(client, base),
        )

    @staticmethod
    def _usages(client: _Client, base: str) -> dict[str, int]:
        usages = client.get(f"{base}/usages", answers.usages)
        return {rc: n for rc, n in usages.items() if n}

    def _refetch(self, client: _Client, uuid: str) -> ProviderState | None:
        rp = client.get_if_present(f"/resource_providers/{uuid}", answers.provider)
        if rp is None:
            return None
        self._cache.pop(uuid, None)
        return self._state(client, rp)

    def _converge(
        self,
        client: _Client,
        name: str,
        desired: Provider | None,
        state: ProviderState | None,
        root_uuid: str,
        tally: _Tally,
    ) -> None:
        """Plan and apply one provider, redriving on generation conflicts."""
        attempts = self._max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                if attempt > 1:
                    state = self._refetch(client, state.uuid if state else provider_uuid(name))
                for action in plan_provider(
                    name, desired, state, root_uuid, take_over=self._take_over
                ):
                    state = self._apply(client, action, state)
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
            return

    def _fail(self, tally: _Tally, name: str, reason: str) -> None:
        # Other providers still converge; this one is retried at the next sync.
        tally.failures[name] = reason
        self._log.error("could not synchronise provider %s: %s", name, reason)

    def _apply(
        self, client: _Client, action: Action, state: ProviderState | None
    ) -> ProviderState | None:
        """Send one action; return the provider's state after it."""
        if isinstance(action, Refuse):
            raise exception.PlacementError(reason=action.reason)
        if isinstance(action, CreateProvider):
            created = client.post(
                "/resource_providers",
                {
                    "name": action.name,
                    "uuid": action.uuid,
                    "parent_provider_uuid": action.parent_uuid,
                },
                answers.provider,
            )
            new: ProviderState | None = ProviderState(
                created.uuid, created.name, created.generation, created.parent_uuid
            )
        elif isinstance(action, DeleteProvider):
            client.delete(f"/resource_providers/{action.uuid}")
            new = None
        else:
            assert state is not None  # plan_provider creates before it writes
            new = self._write(client, action, state)
        self._log.log(
            logging.WARNING if isinstance(action, SetInventory) and action.warns else logging.INFO,
            "%s",
            action.describe(),
        )
        return new

    def _write(
        self, client: _Client, action: SetTraits | SetInventory, state: ProviderState
    ) -> ProviderState:
        base = f"/resource_providers/{state.uuid}"
        if isinstance(action, SetTraits):
            self._ensure(client, "traits", action.traits)
            traits = client.put(
                f"{base}/traits",
                {"resource_provider_generation": state.generation, "traits": list(action.traits)},
                functools.partial(answers.traits, written=True),
            )
            assert traits.generation is not None  # written=True checked it
            return replace(state, generation=traits.generation, traits=frozenset(traits.names))
        self._ensure(client, "resource_classes", action.inventories)
        inventories = client.put(
            f"{base}/inventories",
            {
                "resource_provider_generation": state.generation,
                "inventories": {rc: dict(r) for rc, r in action.inventories.items()},
            },
            functools.partial(answers.inventories, written=True),
        )
        assert inventories.generation is not None  # written=True checked it
        return replace(state, generation=inventories.generation, inventories=inventories.records)

    def _ensure(self, client: _Client, kind: str, names: Iterable[str]) -> None:
        """Create custom traits / resource classes: ``PUT`` is idempotent (201/204).

        Only called before a write that uses them, so a steady state sends none.
        """
        for name in names:
            key = f"{kind}/{name}"
            if name.startswith("CUSTOM_") and key not in self._ensured:
                client.put_name(f"/{key}")
                self._ensured.add(key)
