"""One request id per API request, on its answer and on every log line it causes.

The id is oslo.context's (``req-<uuid4>``), held by a
:class:`oslo_context.context.RequestContext` stored in the thread that serves
the request (a cheroot worker), which is where oslo.log's formatter looks:
every line logged while the request is served reads
``[None req-... - - - - - -]`` instead of ``[-]`` (``[DEFAULT]
logging_context_format_string``), and ``[instance: ID]`` when the route names
an instance.  The id is answered in the ``X-Openstack-Request-Id`` header, on
errors too, so that an operator can grep the log for the id a client shows.

As OpenStack services do, the agent makes its own id for each request; a
client's ``X-Openstack-Request-Id`` of the same form is kept as the
``global_request_id`` (the first field of the brackets), anything else in it
is ignored.

Refused and failed answers are logged here, once, with the method, the path,
the status, the error code and message (:func:`log_refusal`).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

from oslo_context import context as oslo_context

LOG = logging.getLogger("accel_agent.api")

HEADER = "X-Openstack-Request-Id"
_ENVIRON_HEADER = "HTTP_X_OPENSTACK_REQUEST_ID"
# oslo.context's generate_request_id(): "req-" and a UUID 4 in lower case.
REQUEST_ID = re.compile(
    r"req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"
)
# A path or a message in a log line is cut here: a request line may be 64 KiB
# and a schema error quotes the value it refused.
_LOG_TEXT_MAX = 512


def global_request_id(environ: Mapping[str, Any]) -> str | None:
    """The client's ``X-Openstack-Request-Id`` when it is a request id; None otherwise
    (a value of another form never reaches the log)."""
    value = environ.get(_ENVIRON_HEADER)
    if isinstance(value, str) and REQUEST_ID.match(value):
        return value
    return None


def current() -> oslo_context.RequestContext | None:
    return oslo_context.get_current()


def _forget() -> None:
    # oslo.context stores the context in a thread-local and has no call to
    # forget it: a cheroot worker serves request after request, and what it
    # logs between them (and a helper thread that never served one) must
    # read "[-]", not the last request's id.
    with contextlib.suppress(AttributeError):
        del oslo_context._request_store.context


@contextlib.contextmanager
def request_context(environ: Mapping[str, Any] | None = None) -> Iterator[
    oslo_context.RequestContext
]:
    """A new request id for the request served in this thread, forgotten
    when it is answered."""
    ctx = oslo_context.RequestContext(
        global_request_id=global_request_id(environ or {}), overwrite=True
    )
    try:
        yield ctx
    finally:
        _forget()


def name_instance(instance: str) -> None:
    """Name the instance the request is about on its log lines (oslo.log's
    ``[instance: ID]``); ``instance`` passed the API's validation (printable,
    at most 255 characters)."""
    ctx = current()
    if ctx is not None:
        ctx.resource_uuid = instance


def _cut(text: str) -> str:
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= _LOG_TEXT_MAX else text[:_LOG_TEXT_MAX] + "..."


def _client(environ: Mapping[str, Any]) -> str:
    pid, uid = environ.get("X_REMOTE_PID"), environ.get("X_REMOTE_UID")
    return f" (client pid {pid}, uid {uid})" if pid and uid else ""


def level_for(method: str, status: int) -> int:
    """ERROR for a failure of the agent (5xx); INFO for a read of something
    that does not exist (404 to GET or HEAD: a poller's question, answered,
    nothing refused, and repeated as often as it polls); WARNING for every
    other refusal."""
    if status >= 500:
        return logging.ERROR
    if status == 404 and method in ("GET", "HEAD"):
        return logging.INFO
    return logging.WARNING


def log_answer(method: str, path: str, status: int, took: float) -> None:
    """A DEBUG line for each answer that is no refusal (``debug = true``)."""
    LOG.debug("API %s %s: %d in %.3f s", method, _cut(path), status, took)


def log_refusal(
    environ: Mapping[str, Any], method: str, path: str, status: int, code: str, message: str
) -> None:
    """One line for an answer >= 400: ``PUT /v1/instances/vm-1/allocation
    refused: 409 InsufficientCapacity: ...`` (``failed`` for a 5xx)."""
    outcome = "failed" if status >= 500 else "refused"
    LOG.log(
        level_for(method, status),
        "API %s %s %s: %d %s: %s%s",
        method,
        _cut(path),
        outcome,
        status,
        code,
        _cut(message),
        _client(environ),
    )
