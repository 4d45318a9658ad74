"""Placement's HTTP side: each request at :data:`MICROVERSION`, its answer
read with a bound and checked for its shape, its failure as the agent's exception.

The only module of the reporter that talks to keystoneauth (imported lazily:
the daemon without ``[placement] enabled`` never loads it):

* :func:`build_adapter` makes the session and adapter from ``[placement]``
  (:func:`adapter_for_endpoint` from a known endpoint and token);
* :class:`PlacementClient` sends one request; an answer is input, read by
  :mod:`.answers` before anyone uses it: too big, not JSON or of the wrong
  shape raises :class:`~accel_agent.exception.PlacementAnswerRejected` with
  one line naming the request and what was wrong;
* the whole answer (status line, headers, body, same-origin redirects) has
  one deadline, ``[placement] timeout`` (:mod:`.deadline`); a redirect to
  another origin is refused (the token never goes there);
* a failure status becomes :class:`~accel_agent.exception.PlacementUnavailable`
  (nothing else this sync does can succeed: 5xx, 401/403, 406),
  :class:`~accel_agent.exception.PlacementGenerationConflict` (the provider
  changed since it was read: the reporter redrives it) or
  :class:`~accel_agent.exception.PlacementRequestFailed` (this provider fails).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from accel_agent import exception
from accel_agent.reporting.placement import answers, deadline

if TYPE_CHECKING:
    from keystoneauth1.adapter import Adapter
    from oslo_config import cfg

T = TypeVar("T")

# The package's name, not this module's: the reporter's requests were always
# logged as accel_agent.reporting.placement, and log filters name it.
LOG = logging.getLogger("accel_agent.reporting.placement")


# The lowest microversion that has everything the reporter uses: nested
# providers and ``in_tree`` (1.14), POST returning the provider (1.20), error
# codes in 409 bodies (1.23) and ``reserved == total`` for draining (1.26).
# Pinning the floor rather than the newest (1.39 in Placement 16) keeps the
# agent working against every Placement since Rocky; a server too old for it
# answers 406, reported as such.
MICROVERSION = "1.26"

# 409 codes meaning "the provider changed since we read it": refetch, replan.
REDRIVE_CODES = frozenset(
    {
        "placement.concurrent_update",
        "placement.inventory.inuse",
        "placement.resource_provider.inuse",
    }
)


# What of an error body goes into a message: the gist, not megabytes.
_DETAIL_CHARS = 200

# keystoneauth's redirect statuses; same-origin ones are followed (PlacementClient._follow).
REDIRECT_STATUSES = frozenset({301, 302, 303, 305, 307, 308})
MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is no number: an origin of its own
        port = -1
    return scheme, (parts.hostname or "").lower(), port


def _origin_text(url: str) -> str:
    scheme, host, port = _origin(url)
    return exception.printable(f"{scheme}://{host}:{port}")[:200]


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


class PlacementClient:
    """Placement requests at :data:`MICROVERSION`, HTTP failures as exceptions,
    answers read and checked by :mod:`.answers` before anyone uses them."""

    def __init__(self, adapter: Adapter) -> None:
        self._adapter = adapter
        self.writes = 0
        # keystoneauth's timeout bounds each socket read; the whole of an
        # answer (status line, headers, body, redirects) gets as long, so
        # that one trickling in cannot hold a sync (.deadline).
        self._answer_seconds: float | None = getattr(
            getattr(adapter, "session", None), "timeout", None
        )
        deadline.watch(adapter)

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
            # The body is read here, bounded (.answers), not by requests.
            "stream": True,
            # keystoneauth's debug log of a response reads its body whole.
            "log": False,
            "headers": {"Accept-Encoding": "identity"},
            # Redirects are followed here, never to another origin (_follow).
            "redirect": False,
        }
        if body is not None:
            kwargs["json"] = body
        if method != "GET":
            self.writes += 1
        with deadline.within(self._answer_seconds) as watch:
            try:
                resp = self._follow(method, url, kwargs)
            except ks_exc.ClientException as exc:
                # Connection refused/timeout, TLS, endpoint or token lookup.
                raise exception.PlacementUnavailable(
                    reason=f"{method} {url}: {watch.why(exc)}"
                ) from exc
            request_id = resp.headers.get("x-openstack-request-id", "-")
            complete = False
            try:
                data = answers.read_body(resp.raw, resp.headers)
                # A body that ends because the deadline shut the socket may
                # look whole (no Content-Length): it is not.
                complete = not watch.fired
            except answers.AnswerRejected as exc:
                if resp.status_code in ok:
                    raise exception.PlacementAnswerRejected(
                        method=method, url=url, reason=str(exc), request_id=request_id
                    ) from None
                data = bytearray()  # a failure: its status says enough
            except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
                    requests.RequestException) as exc:
                broke = watch.message if watch.fired else f"the answer broke off: {exc}"
                raise exception.PlacementUnavailable(reason=f"{method} {url}: {broke}") from exc
            finally:
                if complete:
                    # Read to its end: the connection can serve the next request.
                    resp.raw.release_conn()
                else:
                    resp.close()  # unread bytes may follow: drop the connection
            if watch.fired:
                raise exception.PlacementUnavailable(reason=f"{method} {url}: {watch.message}")
        LOG.debug(
            "%s %s: %s, %d bytes (request %s)", method, url, resp.status_code, len(data), request_id
        )
        if resp.status_code in ok:
            return _Answer(resp.status_code, data, request_id)
        raise self._failure(method, url, resp.status_code, resp.reason, data, request_id)

    def _follow(self, method: str, url: str, kwargs: dict[str, Any]) -> Any:
        """The answer to ``method url``, through the redirects of the same
        origin (scheme, host and port), as keystoneauth followed them.

        A redirect to another origin is refused, not followed without the
        token: the token (``X-Auth-Token``) and the request's body (this
        host's inventory) would go to a server the operator never named, and
        a Placement that is really there would answer 401 without the token
        anyway.  Refused, the sync fails naming where it was sent, and the
        operator points ``[placement]`` at the right endpoint."""
        target = url
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._adapter.request(target, method, **kwargs)
            if resp.status_code not in REDIRECT_STATUSES:
                return resp
            location = resp.headers.get("Location")
            here = resp.url or target
            resp.close()  # its body, if any, is not read
            if not location:
                raise exception.PlacementUnavailable(
                    reason=f"{method} {url}: {resp.status_code} without a Location"
                )
            there = urllib.parse.urljoin(here, location)
            if _origin(there) != _origin(here):
                raise exception.PlacementUnavailable(
                    reason=f"{method} {url}: answered {resp.status_code}, a redirect to another "
                    f"origin ({_origin_text(there)}); not followed, so that the token is not sent "
                    "there: set [placement] endpoint_override (or the catalog's endpoint) to "
                    "where Placement is"
                )
            target = there
        raise exception.PlacementUnavailable(
            reason=f"{method} {url}: more than {MAX_REDIRECTS} redirects"
        )

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
        if (status == 409 and code in REDRIVE_CODES) or (status == 404 and method == "PUT"):
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

