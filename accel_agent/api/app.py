"""The API as a WSGI application: a route table, OpenAPI validation, one error table.

Adding an endpoint is three small edits, none of them here:

1. describe it in ``openapi.json`` (path, parameters, request body, responses);
2. write a handler in :mod:`accel_agent.api.handlers` (``def f(req) -> Response``);
3. add one ``Route(METHOD, TEMPLATE, handler)`` line to ``ROUTES`` there.

The application validates every request against the operation's OpenAPI
description before the handler runs (path and query parameters, JSON body),
so handlers see only well-typed input; the agent's own checks (instance id,
UUID, capacity) still run behind that and answer in the same error format.

Paths are matched on the raw request URI, segment by segment, and each
segment is percent-decoded after the split: an instance id may contain an
encoded ``/`` without changing which route it reaches.

Why one module of ~530 lines: it is the request path from the WSGI environ
to the handler and back (body read within its limits, JSON with its depth
and duplicate-key rules, OpenAPI validation, routing, the error table), and
each step's checks assume the one before; apart, a reader would have to hold
several files to see what a request passes before a handler runs.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from accel_agent import exception
from accel_agent.api import errors, requestlog

if TYPE_CHECKING:
    from accel_agent.devices.ledger import DeviceRecord
    from accel_agent.devices.results import Allocation, Attachment, RecoveryReport, TakeoverPlan
    from accel_agent.reporting.metrics import AgentMetrics
    from accel_agent.sysfs.model import HostSnapshot

LOG = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
# No request document of the API nests deeper than 3; the limit leaves room
# and keeps every later walk over the document (validation, conversions)
# far from the interpreter's recursion limit.
MAX_JSON_DEPTH = 32
JSON_TYPE = "application/json"
_SCHEMA_URI = "urn:accel-agent:openapi"
_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Devices(Protocol):
    """The device use cases the API calls (accel_agent.devices.manager.DeviceManager)."""

    def allocation(self, instance: str) -> Allocation: ...

    def allocate(
        self, instance: str, count: int, parent: str | None, mdev_type: str | None
    ) -> Allocation: ...

    def release(self, instance: str, remove: bool) -> list[str]: ...

    def attachment(self, instance: str) -> Attachment: ...

    def attach(self, instance: str, requests: Any) -> Attachment: ...

    def adopt(self, uuid: str) -> DeviceRecord: ...

    def takeover(self, adopt_unused: bool = False, dry_run: bool = False) -> TakeoverPlan: ...

    def guest_devices(self, records: Any) -> Any: ...

    # What GET /v1/explain reads (accel_agent.explain.from_manager).
    host: str
    policy: Any
    backends: Mapping[str, Any]

    def scan_all(self) -> HostSnapshot: ...


class Listings(Protocol):
    """The listings, encoded as compact JSON (reporting.views.encode)."""

    def types_json(self) -> bytes: ...

    def mdevs_json(self) -> bytes: ...

    def inventory_json(self) -> bytes: ...


class Backend(Protocol):
    """What the API needs from the agent (accel_agent.daemon.core.AgentCore).
    ``starting`` (accel_agent.daemon.starting.StartState), when it has one,
    says whether the agent is still starting."""

    metrics: AgentMetrics
    devices: Devices
    listings: Listings
    qemu_globals: list[str]

    def health(self) -> dict[str, Any]: ...

    def recover(self, check: bool = False) -> RecoveryReport: ...

    # A reload's outcome: anything with to_dict() (accel_agent.daemon.reloads).
    def request_reload(self) -> Any: ...


def load_openapi() -> dict[str, Any]:
    """The OpenAPI document shipped in the package."""
    text = resources.files("accel_agent.api").joinpath("openapi.json").read_text("utf-8")
    return json.loads(text)


# --- requests and responses ----------------------------------------------------------


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: list[tuple[str, str]] = field(default_factory=list)
    # An error answer's {"code", "message"}, for the log line (api.requestlog).
    error: dict[str, Any] | None = None

    @classmethod
    def json(cls, document: Any, status: int = 200) -> Response:
        # Compact: what accelctl prints into a pipe, byte for byte.
        return cls(status, json.dumps(document, separators=(",", ":")).encode("utf-8"))

    @classmethod
    def text(cls, text: str | bytes, content_type: str, status: int = 200) -> Response:
        body = text.encode("utf-8") if isinstance(text, str) else text
        return cls(status, body, content_type)


@dataclass
class Request:
    backend: Backend
    method: str
    path: str
    params: dict[str, str]  # path parameters, decoded
    query: dict[str, Any]  # validated, converted to the schema's types
    body: Any  # parsed JSON, None when absent
    operation: Operation

    @property
    def openapi(self) -> dict[str, Any]:
        return self.operation.document


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    handler: Handler
    # Served while the agent starts (health, the listings): every other
    # route answers 503 AgentStarting until it is ready.
    while_starting: bool = False

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.template.strip("/").split("/"))


# --- validation from the OpenAPI document ----------------------------------------------


def _bad(reason: str) -> exception.ApiRequestInvalid:
    return exception.ApiRequestInvalid(reason=reason)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    """JSON Schema's ``pattern`` as the standard means it (ECMA-262): ``$``
    is the end of the string.  Python's ``$`` also matches before a final
    newline, so ``"mtty\\n"`` would pass ``^[A-Za-z0-9_.:-]+$``; ``\\Z`` does
    what ``$`` means in the document."""
    import jsonschema

    if not validator.is_type(instance, "string"):
        return
    if re.search(_END_ANCHOR.sub(r"\\Z", pattern), instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


# An unescaped "$" (not "\\$"): the end-of-input anchor.
_END_ANCHOR = re.compile(r"(?<!\\)\$")


def _validator(document: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A Draft 7 validator for ``schema``, whose ``$ref`` point into ``document``."""
    import jsonschema
    from jsonschema import validators
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    resource = Resource.from_contents(document, default_specification=DRAFT7)
    registry = Registry().with_resource(_SCHEMA_URI, resource)
    if "$ref" in schema and schema["$ref"].startswith("#"):
        schema = {"$ref": _SCHEMA_URI + schema["$ref"]}
    strict = validators.extend(jsonschema.Draft7Validator, {"pattern": _ecma_pattern})
    return strict(schema, registry=registry)


def _describe(error: Any, what: str) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    at = f"{what}/{where}" if where else what
    return f"{at}: {error.message}"


@dataclass
class Parameter:
    name: str
    location: str  # path, query
    required: bool
    schema: dict[str, Any]
    validator: Any

    def convert(self, raw: str) -> Any:
        kind = self.schema.get("type")
        if kind == "boolean":
            lowered = raw.lower()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
            raise _bad(f"{self.location} parameter {self.name!r} must be true or false, "
                       f"not {raw!r}")
        if kind == "integer":
            try:
                return int(raw, 10)
            except ValueError:
                raise _bad(f"{self.location} parameter {self.name!r} must be an integer, "
                           f"not {raw!r}") from None
        return raw

    def check(self, raw: str) -> Any:
        value = self.convert(raw)
        error = next(iter(self.validator.iter_errors(value)), None)
        if error is not None:
            raise _bad(_describe(error, f"{self.location} parameter {self.name}"))
        return value


@dataclass
class Operation:
    """One (method, path) of the OpenAPI document, compiled for validation."""

    document: dict[str, Any]
    parameters: dict[tuple[str, str], Parameter]
    body_validator: Any | None
    body_required: bool

    @classmethod
    def compile(cls, document: dict[str, Any], template: str, method: str) -> Operation:
        path_item = document.get("paths", {}).get(template)
        if path_item is None or method.lower() not in path_item:
            raise ValueError(f"{method} {template} is not described in openapi.json")
        op = path_item[method.lower()]
        parameters: dict[tuple[str, str], Parameter] = {}
        for spec in [*path_item.get("parameters", []), *op.get("parameters", [])]:
            schema = spec.get("schema", {})
            parameters[(spec["in"], spec["name"])] = Parameter(
                spec["name"],
                spec["in"],
                bool(spec.get("required", spec["in"] == "path")),
                schema,
                _validator(document, schema),
            )
        body = op.get("requestBody")
        body_validator = None
        if body is not None:
            schema = body["content"][JSON_TYPE]["schema"]
            body_validator = _validator(document, schema)
        return cls(
            document, parameters, body_validator, bool(body and body.get("required", False))
        )

    def check_path(self, raw: Mapping[str, str]) -> dict[str, str]:
        return {name: self.parameters[("path", name)].check(value) for name, value in raw.items()}

    def check_query(self, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for name, raw in pairs:
            param = self.parameters.get(("query", name))
            if param is None:
                known = sorted(n for (where, n) in self.parameters if where == "query")
                raise _bad(
                    f"unknown query parameter {name!r}"
                    + (f" (known: {', '.join(known)})" if known else "")
                )
            if name in seen:
                raise _bad(f"query parameter {name!r} given more than once")
            seen[name] = param.check(raw)
        for (where, name), param in self.parameters.items():
            if where == "query" and param.required and name not in seen:
                raise _bad(f"query parameter {name!r} is required")
        return seen

    def check_body(self, raw: bytes) -> Any:
        if self.body_validator is None:
            return None
        if not raw.strip():
            if self.body_required:
                raise _bad("a JSON request body is required")
            return None
        try:
            document = json.loads(
                raw.decode("utf-8"),
                parse_constant=_no_constants,
                object_pairs_hook=_unique_keys,
            )
        except RecursionError:
            # The C decoder recurses per level: 30,000 "[" exhaust the stack.
            raise _bad(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise _bad(f"the body is not valid JSON: {exc}") from None
        _check_depth(document)
        document = _integral_floats(document)
        error = next(iter(self.body_validator.iter_errors(document)), None)
        if error is not None:
            raise _bad(_describe(error, "body"))
        return document


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice: which value would be meant?
    (``json.loads`` keeps the last one silently; accelctl refuses it too.)"""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise ValueError(f"key {key!r} is given more than once")
            seen.add(key)
    return document


def _check_depth(document: Any) -> None:
    """Refuse a document nested deeper than MAX_JSON_DEPTH (iteratively:
    the check itself must not recurse)."""
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise _bad(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def _integral_floats(value: Any) -> Any:
    """``2.0`` is the integer 2 for JSON Schema; make it one for the agent too."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


# --- the application --------------------------------------------------------------------


def _raw_path(environ: Mapping[str, Any]) -> str:
    """The request path as sent (still percent-encoded), without the query."""
    uri = environ.get("REQUEST_URI") or environ.get("RAW_URI")
    if uri:
        path = urllib.parse.urlsplit(uri).path if "://" in uri else uri.split("?", 1)[0]
        return path or "/"
    # PEP 3333: PATH_INFO is already decoded, as latin-1 code points of the bytes.
    decoded = environ.get("PATH_INFO", "/").encode("latin-1")
    return urllib.parse.quote_from_bytes(decoded, safe="/")


def _logged_path(environ: Mapping[str, Any]) -> str:
    """The path for a log line about a request refused before its path was read."""
    try:
        return _raw_path(environ)
    except Exception:  # a line about a refusal must not fail on its own
        return "?"


def _segments(path: str) -> list[str]:
    parts = path.strip("/").split("/") if path.strip("/") else []
    out = []
    for part in parts:
        try:
            out.append(urllib.parse.unquote_to_bytes(part).decode("utf-8"))
        except UnicodeDecodeError:
            raise _bad("the path is not valid UTF-8 once percent-decoded") from None
    return out


def _query(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    text = environ.get("QUERY_STRING", "")
    if not text:
        return []
    try:
        return urllib.parse.parse_qsl(
            text, keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"malformed query string: {exc}") from None


def _read_body(environ: Mapping[str, Any]) -> bytes:
    length_text = environ.get("CONTENT_LENGTH") or ""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    if length_text:
        try:
            length = int(length_text)
        except ValueError:
            raise _bad(f"Content-Length {length_text!r} is not a number") from None
        if length < 0:
            raise _bad("negative Content-Length")
        if length > MAX_BODY:
            raise _bad(f"the body is larger than {MAX_BODY} bytes")
        if not length:
            return b""
        try:
            data = stream.read(length)
        except OSError:
            # TimeoutError when it did not come within [api] request_timeout.
            raise _bad(f"the body did not arrive (Content-Length {length})") from None
        if len(data) < length:
            raise _bad(f"the body ended after {len(data)} of its {length} bytes (Content-Length)")
        return data
    if "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower():
        try:
            data = stream.read(MAX_BODY + 1)
        except (OSError, ValueError):
            # ValueError: cheroot's chunked reader on a malformed chunk size.
            raise _bad("the chunked body did not arrive whole") from None
        if len(data) > MAX_BODY:
            raise _bad(f"the body is larger than {MAX_BODY} bytes")
        return data
    return b""


class ApiApplication:
    """The WSGI callable.  Thread-safe: handlers share only the backend."""

    def __init__(
        self,
        backend: Backend,
        routes: Iterable[Route] | None = None,
        document: dict[str, Any] | None = None,
    ) -> None:
        if routes is None:
            from accel_agent.api.handlers import ROUTES

            routes = ROUTES
        self.backend = backend
        self.document = document or load_openapi()
        self.routes = tuple(routes)
        self._operations = {
            (r.method, r.template): Operation.compile(self.document, r.template, r.method)
            for r in self.routes
        }

    def match(self, segments: Sequence[str]) -> list[tuple[Route, dict[str, str]]]:
        found = []
        for route in self.routes:
            template = route.segments
            if len(template) != len(segments):
                continue
            params: dict[str, str] = {}
            for want, got in zip(template, segments, strict=True):
                if want.startswith("{") and want.endswith("}"):
                    if not got:
                        break
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                found.append((route, params))
        return found

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        # One request id for this request: on every line logged while it is
        # served (in this worker thread) and on its answer.
        with requestlog.request_context(environ) as context:
            response = self._respond(environ)
            headers = [
                ("Content-Type", response.content_type),
                ("Content-Length", str(len(response.body))),
                *response.headers,
                (requestlog.HEADER, context.request_id),
            ]
            start_response(f"{response.status} {_REASONS.get(response.status, '')}", headers)
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        return [response.body] if method != "HEAD" else [b""]

    def _respond(self, environ: dict[str, Any]) -> Response:
        started = time.monotonic()
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        route_label = "unmatched"
        path: str | None = None
        try:
            # Read the body first, whatever the answer: a reply sent while the
            # client is still writing its body would break its pipe.
            raw_body = _read_body(environ)
            path = _raw_path(environ)
            matches = self.match(_segments(path))
            if not matches:
                raise exception.ApiNotFound(path=path)
            route, raw_params = next(
                ((r, p) for r, p in matches if r.method == method), (None, matches[0][1])
            )
            if route is None:
                allowed = ", ".join(sorted({r.method for r, _ in matches}))
                route_label = matches[0][0].template
                response = self._error(
                    exception.ApiMethodNotAllowed(method=method, path=path, allowed=allowed)
                )
                response.headers.append(("Allow", allowed))
            else:
                route_label = route.template
                response = self._dispatch(environ, method, path, route, raw_params, raw_body)
        except exception.AccelAgentException as exc:
            response = self._error(exc)
        except Exception as exc:  # a bug: log it, answer 500 in our format
            LOG.exception("API %s %s failed", method, environ.get("PATH_INFO"))
            response = self._error(exc)
        took = time.monotonic() - started
        if response.status >= 400:
            error = response.error or {}
            requestlog.log_refusal(
                environ, method, path or _logged_path(environ), response.status,
                str(error.get("code", "")), str(error.get("message", "")),
            )
        else:
            requestlog.log_answer(method, path or _logged_path(environ), response.status, took)
        self.backend.metrics.request_latency.labels(
            method=method, route=route_label, status=str(response.status)
        ).observe(took)
        return response

    def _dispatch(
        self,
        environ: Mapping[str, Any],
        method: str,
        path: str,
        route: Route,
        raw_params: dict[str, str],
        raw_body: bytes,
    ) -> Response:
        if not route.while_starting:
            self._refuse_while_starting()
        operation = self._operations[(route.method, route.template)]
        params = operation.check_path(raw_params)
        if "instance" in params:
            requestlog.name_instance(params["instance"])
        query = operation.check_query(_query(environ))
        body = operation.check_body(raw_body)
        request = Request(self.backend, method, path, params, query, body, operation)
        return route.handler(request)

    def _refuse_while_starting(self) -> None:
        """503 AgentStarting while the agent starts (recovery, the wait for
        a standing layout's VFs): nothing may change the host before the
        start has settled it, and nothing may be read from a ledger or a
        host it has not settled yet, apart from health and the listings."""
        state = getattr(self.backend, "starting", None)
        phase = state.current() if state is not None else None
        if phase is not None:
            raise exception.AgentStarting(waiting=phase.describe())

    def _error(self, exc: BaseException) -> Response:
        status = errors.status_for(exc)
        body = errors.error_body(exc)
        self.backend.metrics.error(body["error"]["code"])
        response = Response.json(body, status)
        response.error = body["error"]  # logged once the request is answered
        return response
