"""Client of the agent's API over its unix socket: stdlib only (``http.client``).

``accelctl`` imports this on every call that may reach the daemon, so it
pulls in nothing beyond the standard library and accel_agent.exception.

Whether the daemon runs is decided by the connection, not by guessing:

* no socket file, or a socket nobody listens on (ECONNREFUSED): the daemon
  is not running -> :class:`~accel_agent.exception.AgentNotRunning`, and the
  caller may act directly (the manager's file lock still serialises it);
* anything else that fails (permission denied, a timeout, a reply that is
  not HTTP/JSON) -> :class:`~accel_agent.exception.AgentUnreachable`: an
  error, never a reason to become a second writer behind a live daemon;
* an HTTP error answer -> :class:`~accel_agent.exception.ApiError` with the
  API's code and message.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import socket
import time
import urllib.parse
from typing import Any

from accel_agent import exception

READ_TIMEOUT = 60.0
# A mutation may create up to 64 mdevs or wait for blocked removes.
WRITE_TIMEOUT = 600.0
_NOT_RUNNING = (errno.ENOENT, errno.ECONNREFUSED)
# The agent's request id on every answer (accel_agent.api.requestlog.HEADER;
# not imported: this module stays standard library only).
REQUEST_ID_HEADER = "X-Openstack-Request-Id"


# How long a request that got no answer waits for health to say why.
STARTING_PEEK = 5.0


def describe_starting(starting: Any) -> str:
    """One line from health's ``starting`` (GET /v1/health while the agent
    starts): its phase, and the GPUs it waits for."""
    if not isinstance(starting, dict):
        return "starting"
    phase = str(starting.get("phase") or "starting")
    waiting = [str(gpu) for gpu in starting.get("waiting_for") or []]
    if waiting:
        until = starting.get("until")
        return (f"{phase} of GPU(s) {', '.join(waiting)}"
                + (f" (standing layout; at most until {until})" if until else ""))
    return f"{phase} (since {starting.get('since')})"


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over an AF_UNIX stream socket."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        # A full listen backlog answers EAGAIN on AF_UNIX (not a wait, as TCP
        # would): the agent is busy, not gone, so retry until the timeout.
        deadline = time.monotonic() + (self.timeout or READ_TIMEOUT)
        delay = 0.005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.socket_path)
            except BlockingIOError:
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            return


def quote(segment: str) -> str:
    """One path segment, fully percent-encoded (``/`` included)."""
    return urllib.parse.quote(segment, safe="")


class ApiClient:
    def __init__(self, socket_path: str, timeout: float | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, str, bytes]:
        """(status, content type, body); raises AgentNotRunning / AgentUnreachable."""
        status, headers, data = self.exchange(method, path, body, timeout)
        return status, headers.get("Content-Type", ""), data

    def exchange(
        self, method: str, path: str, body: Any = None, timeout: float | None = None,
        *, explain: bool = True,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """(status, headers, body) of one request: :meth:`request` with every
        header (looked up by name in any case).  ``explain``: a request that
        gets no answer in time asks health why (:meth:`_starting`)."""
        if timeout is None:
            timeout = self.timeout or (READ_TIMEOUT if method == "GET" else WRITE_TIMEOUT)
        conn = UnixHTTPConnection(self.socket_path, timeout)
        headers = {"Accept": "application/json", "Connection": "close"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            try:
                conn.connect()
            except OSError as exc:
                if exc.errno in _NOT_RUNNING:
                    raise exception.AgentNotRunning(socket=self.socket_path) from None
                raise self._unreachable(exc, timeout, explain) from None
            try:
                # The server may answer (an error) before reading all we
                # sent; its answer is then waiting to be read.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise self._unreachable(exc, timeout, explain) from None
            return resp.status, resp.headers, data
        finally:
            conn.close()

    def _unreachable(
        self, exc: BaseException, timeout: float | None = None, explain: bool = True
    ) -> exception.AgentUnreachable:
        waited = f" {timeout:g} s" if timeout else ""
        if isinstance(exc, PermissionError):
            reason = (
                "permission denied on the socket (mode 0660: run as root or as a member "
                "of [api] socket_group)"
            )
        elif isinstance(exc, BlockingIOError):
            # connect() kept failing with EAGAIN: the listen backlog is full.
            reason = (
                f"the agent is overloaded: it accepted no connection for{waited} (its "
                "connection queue is full); it is running, retry later"
            )
        elif isinstance(exc, TimeoutError | socket.timeout):
            starting = self._starting(timeout) if explain else None
            if starting:
                # It answers health while it starts: say what it is doing.
                reason = (
                    f"starting: {starting}; no answer within{waited} (it answers once its "
                    "start is complete: accelctl health)"
                )
            else:
                reason = (
                    f"no answer within{waited}: the agent is overloaded or stuck (see its "
                    "log and accelctl health)"
                )
        else:
            reason = str(exc) or type(exc).__name__
        return exception.AgentUnreachable(socket=self.socket_path, reason=reason)

    def _starting(self, timeout: float | None = None) -> str | None:
        """What the agent's start is doing, when health says it is starting
        (asked briefly, after a request got no answer within ``timeout``);
        None otherwise."""
        try:
            status, _headers, data = self.exchange(
                "GET", "/v1/health", timeout=min(STARTING_PEEK, timeout or STARTING_PEEK),
                explain=False,
            )
            document = json.loads(data) if status == 200 else {}
        except (exception.AccelAgentException, ValueError):
            return None
        if not isinstance(document, dict) or document.get("status") != "starting":
            return None
        return describe_starting(document.get("starting"))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """JSON in, JSON out; an error answer raises ApiError."""
        status, headers, data = self.exchange(method, path, body)
        content_type = headers.get("Content-Type", "")
        if status >= 400:
            raise self._api_error(status, data, headers.get(REQUEST_ID_HEADER))
        if "json" not in content_type:
            return data.decode("utf-8", "replace")
        try:
            return json.loads(data)
        except ValueError:
            raise exception.AgentUnreachable(
                socket=self.socket_path, reason=f"the answer to {method} {path} is not JSON"
            ) from None

    def call_json_bytes(self, method: str, path: str) -> bytes:
        """The JSON body exactly as the daemon sent it (compact): for
        ``accelctl ... --json`` into a pipe, which need not decode and
        re-encode megabytes to print them."""
        status, headers, data = self.exchange(method, path)
        content_type = headers.get("Content-Type", "")
        if status >= 400:
            raise self._api_error(status, data, headers.get(REQUEST_ID_HEADER))
        if "json" not in content_type:
            raise exception.AgentUnreachable(
                socket=self.socket_path, reason=f"the answer to {method} {path} is not JSON"
            )
        return data

    @staticmethod
    def _api_error(status: int, data: bytes, request_id: str | None = None) -> exception.ApiError:
        try:
            error = json.loads(data)["error"]
            code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "HTTP", data.decode("utf-8", "replace").strip() or f"HTTP {status}"
        if status == 503 and code == "ServiceUnavailable":
            # cheroot's own answer when every worker is busy and its queue full.
            message = f"the agent is overloaded ({message}); it is running, retry later"
        # The agent's request id: its log lines about this request carry it.
        return exception.ApiError(message, status=status, code=code, request_id=request_id)

    # --- the API -----------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self.call("GET", "/v1/health")

    def types(self) -> dict[str, Any]:
        return self.call("GET", "/v1/types")

    def mdevs(self) -> dict[str, Any]:
        return self.call("GET", "/v1/mdevs")

    def inventory(self) -> dict[str, Any]:
        return self.call("GET", "/v1/inventory")

    def allocation(self, instance: str) -> dict[str, Any]:
        return self.call("GET", f"/v1/instances/{quote(instance)}/allocation")

    def allocate(
        self,
        instance: str,
        count: int,
        parent: str | None = None,
        mdev_type: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"count": count}
        if parent is not None:
            body["parent"] = parent
        if mdev_type is not None:
            body["mdev_type"] = mdev_type
        return self.call("PUT", f"/v1/instances/{quote(instance)}/allocation", body)

    def release(self, instance: str, remove: bool = False) -> dict[str, Any]:
        query = "?remove=true" if remove else ""
        return self.call("DELETE", f"/v1/instances/{quote(instance)}/allocation{query}")

    def attachment(self, instance: str) -> dict[str, Any]:
        return self.call("GET", f"/v1/instances/{quote(instance)}/attachments")

    def attach(self, instance: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return self.call(
            "POST", f"/v1/instances/{quote(instance)}/attachments", {"requests": requests}
        )

    def detach(self, instance: str, remove: bool = False) -> dict[str, Any]:
        query = "?remove=true" if remove else ""
        return self.call("DELETE", f"/v1/instances/{quote(instance)}/attachments{query}")

    def domain_xml(self, instance: str) -> str:
        return self.call("GET", f"/v1/instances/{quote(instance)}/domain-xml")

    def adopt(self, uuid: str) -> dict[str, Any]:
        return self.call("POST", f"/v1/mdevs/{quote(uuid)}/adopt")

    def takeover(self, adopt_unused: bool = False, dry_run: bool = False) -> dict[str, Any]:
        query = "&".join(
            name for name, on in (("all=true", adopt_unused), ("dry_run=true", dry_run)) if on
        )
        return self.call("POST", "/v1/takeover/libvirt" + (f"?{query}" if query else ""))

    def recover(self, check: bool = False) -> dict[str, Any]:
        return self.call("POST", "/v1/recover" + ("?check=true" if check else ""))

    def migration_claim(
        self, instance: str, mdevs: dict[str, str], source_versions: dict[str, str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"mdevs": mdevs}
        if source_versions is not None:
            body["source_versions"] = source_versions
        return self.call("POST", f"/v1/migrations/{quote(instance)}/claim", body)

    def migration_commit(self, instance: str) -> dict[str, Any]:
        return self.call("POST", f"/v1/migrations/{quote(instance)}/commit")

    def migration_abort(self, instance: str, remove: bool = False) -> dict[str, Any]:
        query = "?remove=true" if remove else ""
        return self.call("DELETE", f"/v1/migrations/{quote(instance)}{query}")

    def rewrite_domain_xml(
        self, xml: str, mapping: dict[str, str], pci_addresses: dict[str, str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"xml": xml, "mapping": mapping}
        if pci_addresses is not None:
            body["pci_addresses"] = pci_addresses
        return self.call("POST", "/v1/domain-xml/rewrite", body)
