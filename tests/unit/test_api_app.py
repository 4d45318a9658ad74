"""The WSGI application: routing, OpenAPI validation, the error table (fake backend)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from accel_agent import exception
from accel_agent.api import errors
from accel_agent.api.app import ApiApplication, load_openapi
from accel_agent.api.handlers import ROUTES
from accel_agent.devices.ledger import DeviceRecord, DeviceState
from accel_agent.devices.results import Allocation, RecoveryReport
from accel_agent.libvirt_xml.devices import MdevDevice
from accel_agent.reporting.metrics import AgentMetrics

UUID = "0b1b2b3b-4b5b-4b6b-8b7b-9b0b1b2b3b4b"


def record(uuid: str, owner: str | None) -> DeviceRecord:
    return DeviceRecord(
        uuid=uuid,
        parent="0000:84:00.0",
        device_type="nvidia-35",
        state=DeviceState.PRESENT,
        owner=owner,
        owner_kind=None,
        claim_expires_at=None,
        intent_id=None,
        adopted=owner is None,
        created_at=0.0,
        updated_at=0.0,
    )


class FakeBackend:
    """Just enough agent: one instance may hold mdevs; capacity 4.  It plays
    the device use cases and the listings itself (``devices``, ``listings``)."""

    def __init__(self) -> None:
        self.metrics = AgentMetrics()
        self.devices = self
        self.listings = self
        self.held: dict[str, list[str]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.fail: BaseException | None = None
        self.qemu_globals: list[str] = []

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            raise self.fail

    def health(self) -> dict[str, Any]:
        self._maybe_fail()
        return {"status": "ok", "version": "0", "reporting": {"enabled": False,
                "state": "disabled"}, "last_rescan": None, "mdevs": {}}

    def types_json(self) -> bytes:
        return b'{"host":"h","parents":[]}'

    def mdevs_json(self) -> bytes:
        return b'{"host":"h","mdevs":[]}'

    def inventory_json(self) -> bytes:
        return b'{"host":"h","providers":[]}'

    def allocation(self, instance: str) -> Allocation:
        return Allocation(instance, tuple(record(u, instance) for u in self.held.get(instance, [])))

    def guest_devices(self, records) -> list:
        # The agent's answer for mdev-backend records (AgentCore.guest_devices).
        return [MdevDevice(r.uuid) for r in records]

    def allocate(self, instance, count, parent, mdev_type) -> Allocation:
        self._maybe_fail()
        self.calls.append(("allocate", instance, count, parent, mdev_type))
        if count > 4:
            raise exception.InsufficientCapacity(mdev_type="t", parents="p", reason="full")
        self.held[instance] = [UUID][:count] * count
        return self.allocation(instance)

    def release(self, instance: str, remove: bool) -> list[str]:
        # A failure (a ledger write refused) changes nothing, as the agent's.
        self._maybe_fail()
        self.calls.append(("release", instance, remove))
        return self.held.pop(instance, [])

    def adopt(self, uuid: str) -> DeviceRecord:
        self.calls.append(("adopt", uuid))
        return record(uuid, None)

    def recover(self) -> RecoveryReport:
        return RecoveryReport()


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def app(backend: FakeBackend) -> ApiApplication:
    return ApiApplication(backend)


def call(
    app: ApiApplication,
    method: str,
    uri: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    path, _, query = uri.partition("?")
    data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    environ = {
        "REQUEST_METHOD": method,
        "REQUEST_URI": uri,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_LENGTH": str(len(data)) if data else "",
        "wsgi.input": io.BytesIO(data),
    }
    environ.update(headers or {})
    seen: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        seen["status"] = int(status.split()[0])
        seen["headers"] = dict(response_headers)

    out = b"".join(app(environ, start_response))
    content_type = seen["headers"]["Content-Type"]
    parsed: Any = json.loads(out) if content_type == "application/json" else out.decode()
    return seen["status"], seen["headers"], parsed


def error_code(result: tuple[int, dict[str, str], Any]) -> str:
    return result[2]["error"]["code"]


# --- the table and the document agree ---------------------------------------------------


def test_every_route_is_described_and_every_described_operation_is_routed():
    document = load_openapi()
    described = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch")
    }
    routed = {(r.method, r.template) for r in ROUTES}
    assert routed == described


def test_every_operation_documents_its_errors_in_the_error_schema():
    document = load_openapi()
    for item in document["paths"].values():
        for method, op in item.items():
            if method == "parameters":
                continue
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}


# --- routing ----------------------------------------------------------------------------


def test_get_health_and_listings(app):
    assert call(app, "GET", "/v1/health")[2]["status"] == "ok"
    assert call(app, "GET", "/v1/types")[2] == {"host": "h", "parents": []}
    assert call(app, "GET", "/v1/inventory")[0] == 200


def test_while_the_agent_starts_health_and_listings_answer_and_the_rest_is_503(app, backend):
    """Issue 34 item 3: while the agent starts (here: waiting for a standing
    layout's VFs) health and the listings answer; every change, and every
    read of what the start has not settled yet, is 503 AgentStarting naming
    what it waits for, and never reaches the agent."""
    from accel_agent.daemon import starting

    backend.starting = starting.StartState()
    backend.starting.begin()
    backend.starting.enter(starting.WAITING_FOR_VFS, ["0000:c1:00.0"])
    for path in ("/v1/health", "/v1/types", "/v1/mdevs", "/v1/inventory",
                 "/v1/openapi.json", "/metrics"):
        assert call(app, "GET", path)[0] == 200, path
    for method, path, body in (
        ("PUT", "/v1/instances/vm-1/allocation", {"count": 1}),
        ("DELETE", "/v1/instances/vm-1/allocation", None),
        ("GET", "/v1/instances/vm-1/allocation", None),
        ("POST", "/v1/recover", None),
        ("POST", "/v1/reload", None),
    ):
        status, _headers, answer = call(app, method, path, body)
        assert status == 503, (method, path, answer)
        assert answer["error"]["code"] == "AgentStarting"
        assert answer["error"]["message"].startswith(
            "starting: waiting for VFs of GPU(s) 0000:c1:00.0"), answer
    assert backend.calls == []
    backend.starting.end()
    assert call(app, "PUT", "/v1/instances/vm-1/allocation", {"count": 1})[0] == 200
    assert backend.calls == [("allocate", "vm-1", 1, None, None)]


def test_unknown_path_is_404_and_wrong_method_405_with_allow(app):
    status, _, body = call(app, "GET", "/v1/nothing-here")
    assert (status, body["error"]["code"]) == (404, "ApiNotFound")
    status, headers, body = call(app, "POST", "/v1/instances/vm/allocation", {"count": 1})
    assert (status, body["error"]["code"]) == (405, "ApiMethodNotAllowed")
    assert headers["Allow"] == "DELETE, GET, PUT"


def test_put_and_delete_allocation(app, backend):
    status, _, body = call(app, "PUT", "/v1/instances/vm-1/allocation", {"count": 1})
    assert status == 200
    assert body == {
        "instance": "vm-1",
        "mdevs": [{"uuid": UUID, "parent": "0000:84:00.0", "mdev_type": "nvidia-35"}],
    }
    status, _, body = call(app, "DELETE", "/v1/instances/vm-1/allocation?remove=true")
    assert (status, body) == (200, {"instance": "vm-1", "released": [UUID], "removed": True})
    assert backend.calls[-1] == ("release", "vm-1", True)


def test_remove_in_the_body_or_the_query_but_not_contradicting(app, backend):
    assert call(app, "DELETE", "/v1/instances/a/allocation", {"remove": True})[0] == 200
    assert backend.calls[-1] == ("release", "a", True)
    assert call(app, "DELETE", "/v1/instances/a/allocation?remove=0")[0] == 200
    assert backend.calls[-1] == ("release", "a", False)
    result = call(app, "DELETE", "/v1/instances/a/allocation?remove=true", {"remove": False})
    assert (result[0], error_code(result)) == (400, "ApiRequestInvalid")
    result = call(app, "DELETE", "/v1/instances/a/allocation?remove=maybe")
    assert result[0] == 400 and "remove" in result[2]["error"]["message"]


def test_an_encoded_slash_stays_inside_the_instance_id(app, backend):
    status, _, body = call(app, "PUT", "/v1/instances/a%2Fb/allocation", {"count": 1})
    assert status == 200 and body["instance"] == "a/b"
    assert backend.calls[-1][1] == "a/b"


def test_path_that_is_not_utf8_is_400(app):
    assert call(app, "GET", "/v1/instances/%ff/allocation")[0] == 400


# --- validation against the OpenAPI document --------------------------------------------


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"count": "2"}, "not of type 'integer'"),
        ({"count": 0}, "less than the minimum"),
        ({"count": 65}, "greater than the maximum"),
        ({}, "'count' is a required property"),
        ({"count": 1, "colour": "red"}, "Additional properties"),
        ({"count": True}, "not of type 'integer'"),
        ({"count": 1, "parent": "../etc"}, "does not match"),
        (b"{not json", "not valid JSON"),
        (b'{"count": NaN}', "not valid JSON"),
        (b"", "body is required"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_bad_allocation_bodies_are_400_and_never_reach_the_agent(app, backend, body, fragment):
    status, _, answer = call(app, "PUT", "/v1/instances/vm/allocation", body)
    assert status == 400, answer
    assert answer["error"]["code"] == "ApiRequestInvalid"
    assert fragment in answer["error"]["message"]
    assert backend.calls == []


def test_integral_float_count_is_an_integer(app, backend):
    assert call(app, "PUT", "/v1/instances/vm/allocation", b'{"count": 2.0}')[0] == 200
    assert backend.calls[-1] == ("allocate", "vm", 2, None, None)
    assert isinstance(backend.calls[-1][2], int)


def test_unknown_and_repeated_query_parameters_are_refused(app):
    result = call(app, "GET", "/v1/health?verbose=1")
    assert result[0] == 400 and "unknown query parameter 'verbose'" in result[2]["error"]["message"]
    result = call(app, "DELETE", "/v1/instances/a/allocation?remove=true&remove=false")
    assert result[0] == 400 and "more than once" in result[2]["error"]["message"]


def test_oversized_body_is_refused_before_it_is_read(app):
    environ_extra = {"CONTENT_LENGTH": str(10 * 1024 * 1024)}
    result = call(app, "PUT", "/v1/instances/vm/allocation", {"count": 1}, environ_extra)
    assert result[0] == 400 and "larger than" in result[2]["error"]["message"]


def test_too_long_instance_id_is_400(app):
    result = call(app, "GET", "/v1/instances/" + "x" * 256 + "/allocation")
    assert result[0] == 400


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, status",
    [
        (exception.InvalidInstanceId(instance="", reason="empty"), 400),
        (exception.InvalidAllocationRequest(reason="x"), 400),
        (exception.InvalidMdevUUID(uuid="x", where="", reason="y"), 400),
        (exception.MdevNotFound(uuid=UUID), 404),
        (exception.InsufficientCapacity(mdev_type="t", parents="p", reason="r"), 409),
        (exception.InstanceAlreadyAllocated(instance="i", count=1), 409),
        (exception.MdevInUse(uuid=UUID, reason="r"), 409),
        # Every kind of device in use alike (issue 35: each its own code).
        (exception.VfInUse(vf="0000:c1:00.4", reason="r"), 409),
        (exception.DeviceInUse(uuid=UUID, reason="r"), 409),
        (exception.MdevAlreadyAssigned(uuid=UUID, owner_kind="instance", owner="i"), 409),
        (exception.LedgerError(reason="locked"), 503),
        # Once LedgerErrors: answered as they were, with codes of their own.
        (exception.BackendNotInstalled(name="toy_vf", installed="mdev"), 503),
        (exception.VfUuidMismatch(uuid=UUID, kind="VF", vf="v", expected=UUID), 503),
        (exception.SysfsWriteFailed(path="p", error="EIO"), 500),
        (RuntimeError("bug"), 500),
    ],
)
def test_error_table(app, backend, exc, status):
    backend.fail = exc
    result = call(app, "PUT", "/v1/instances/vm/allocation", {"count": 1})
    assert result[0] == status
    assert set(result[2]["error"]) == {"code", "message"}
    assert errors.status_for(exc) == status


def test_a_bug_answers_500_without_internals(app, backend):
    backend.fail = KeyError("secret-internal-detail")
    status, _, body = call(app, "GET", "/v1/health")
    assert status == 500
    assert body["error"]["code"] == "InternalError"
    assert "secret-internal-detail" not in body["error"]["message"]


def test_capacity_error_is_409_with_the_agent_message(app):
    status, _, body = call(app, "PUT", "/v1/instances/vm/allocation", {"count": 5})
    assert status == 409
    assert body["error"] == {
        "code": "InsufficientCapacity",
        "message": "insufficient capacity for type t on p: full",
    }


# --- metrics ----------------------------------------------------------------------------


def test_latency_is_labelled_by_route_template_and_errors_by_code(app, backend):
    call(app, "GET", "/v1/instances/vm-77/allocation")
    call(app, "PUT", "/v1/instances/vm/allocation", {"count": 9})
    value = backend.metrics.value(
        "accel_agent_api_request_duration_seconds_count",
        {"method": "GET", "route": "/v1/instances/{instance}/allocation", "status": "200"},
    )
    assert value == 1.0
    assert backend.metrics.value("accel_agent_errors_total", {"code": "InsufficientCapacity"}) == 1
    status, headers, text = call(app, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert "vm-77" not in text
    assert 'accel_agent_errors_total{code="InsufficientCapacity"} 1.0' in text


def test_domain_xml_for_an_instance_without_mdevs_is_404(app, backend):
    result = call(app, "GET", "/v1/instances/nobody/domain-xml")
    assert (result[0], error_code(result)) == (404, "MdevNotFound")
    call(app, "PUT", "/v1/instances/vm/allocation", {"count": 1})
    status, headers, xml = call(app, "GET", "/v1/instances/vm/domain-xml")
    assert status == 200 and headers["Content-Type"] == "application/xml"
    assert f"uuid='{UUID}'" in xml or f'uuid="{UUID}"' in xml
    assert "commandline" not in xml
    # [libvirt] qemu_globals: one <qemu:commandline> after the hostdevs
    backend.qemu_globals = ["vfio-pci.enable-migration=on"]
    lines = call(app, "GET", "/v1/instances/vm/domain-xml")[2].splitlines()
    assert f'uuid="{UUID}"' in lines[0]
    assert lines[1] == (
        '<qemu:commandline xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0">'
        '<qemu:arg value="-global"/><qemu:arg value="vfio-pci.enable-migration=on"/>'
        "</qemu:commandline>"
    )


def test_adopt_passes_the_uuid_through(app, backend):
    status, _, body = call(app, "POST", f"/v1/mdevs/{UUID}/adopt")
    assert status == 200 and body["uuid"] == UUID and body["owned"] is True
    assert backend.calls[-1] == ("adopt", UUID)
