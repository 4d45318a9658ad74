"""Hostile requests to the WSGI application and its client: a clear 4xx, no
traceback, nothing changed; and what accelctl says when the agent is swamped."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.api.app import MAX_JSON_DEPTH, ApiApplication
from accel_agent.api.client import ApiClient
from accel_agent.cmd import ctl_migration, output
from tests.functional.daemon_fixture import short_dir
from tests.unit.test_api_app import FakeBackend, call

UUID = "0b1b2b3b-4b5b-4b6b-8b7b-9b0b1b2b3b4b"
ALLOCATION = "/v1/instances/vm-1/allocation"


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def app(backend: FakeBackend) -> ApiApplication:
    return ApiApplication(backend)


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


# --- JSON bodies ------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [30_000, 1_000, MAX_JSON_DEPTH + 1])
def test_deeply_nested_json_is_400_without_a_traceback(app, backend, caplog, depth):
    body = ("[" * depth + "]" * depth).encode()
    for document in (body, b'{"count": ' + body + b"}"):
        status, _, answer = call(app, "PUT", ALLOCATION, document)
        assert status == 400, answer
        assert answer["error"]["code"] == "ApiRequestInvalid"
        assert "nests deeper" in answer["error"]["message"]
    assert backend.calls == []
    no_traceback(caplog)


def test_json_nested_as_deep_as_allowed_is_parsed(app):
    inner = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    status, _, answer = call(app, "PUT", ALLOCATION, f'{{"count": {inner}}}'.encode())
    assert status == 400
    assert "nests deeper" not in answer["error"]["message"]  # refused by the schema instead


@pytest.mark.parametrize(
    "path, body, key",
    [
        (ALLOCATION, '{"count": 1, "count": 2}', "count"),
        ("/v1/domain-xml/rewrite",
         '{"xml": "<domain/>", "mapping": {"U": "a", "U": "b"}}'.replace("U", UUID), UUID),
        ("/v1/migrations/vm-1/claim",
         '{"mdevs": {"U": "nvidia-35", "U": "nvidia-36"}}'.replace("U", UUID), UUID),
    ],
)
def test_a_key_given_twice_is_refused(app, backend, path, body, key):
    method = "PUT" if path == ALLOCATION else "POST"
    status, _, answer = call(app, method, path, body.encode())
    assert status == 400, answer
    assert f"key {key!r} is given more than once" in answer["error"]["message"]
    assert backend.calls == []


def test_a_body_shorter_than_its_content_length_is_400(app, backend, caplog):
    environ_body = b'{"count": 1}'
    status, _, answer = call(
        app, "PUT", ALLOCATION, environ_body, headers={"CONTENT_LENGTH": "100"}
    )
    assert status == 400
    assert "ended after 12 of its 100 bytes" in answer["error"]["message"]
    assert backend.calls == []
    no_traceback(caplog)


def test_a_body_that_never_arrives_is_400_without_a_traceback(app, backend, caplog):
    class Stalled(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise TimeoutError("timed out")  # what the deadline makes a read raise

    status, _, answer = call(
        app, "PUT", ALLOCATION, b"", headers={"CONTENT_LENGTH": "12", "wsgi.input": Stalled()}
    )
    assert status == 400
    assert "did not arrive" in answer["error"]["message"]
    no_traceback(caplog)


# --- names with newlines and control characters ---------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"count": 1, "parent": "mtty\n"},
        {"count": 1, "parent": "0000:84:00.0\n"},
        {"count": 1, "mdev_type": "nvidia-35\n"},
    ],
)
def test_a_trailing_newline_in_a_name_is_refused(app, backend, body):
    status, _, answer = call(app, "PUT", ALLOCATION, body)
    assert status == 400, answer
    assert "\\n" in answer["error"]["message"]  # quoted escaped
    assert backend.calls == []


@pytest.mark.parametrize("instance", ["vm-1%0A", "vm-1%1B%5B31m", "vm%00x"])
def test_a_control_character_in_an_instance_id_is_refused_and_escaped(app, backend, instance):
    status, _, answer = call(app, "GET", f"/v1/instances/{instance}/allocation")
    assert status == 400
    message = answer["error"]["message"]
    assert message.isprintable(), message


def test_error_messages_escape_the_values_they_quote(app, backend):
    backend.fail = exception.InsufficientCapacity(
        mdev_type="evil\n\x1b[31mtype", parents="p", reason="r"
    )
    status, _, answer = call(app, "PUT", ALLOCATION, {"count": 1})
    assert status == 409
    assert "evil\\n\\x1b[31mtype" in answer["error"]["message"]
    assert backend.fail.kwargs["mdev_type"] == "evil\n\x1b[31mtype"  # kept as given


def test_tables_escape_control_characters(capsys):
    output.table(("name", "type"), [("GRID\nM60", "\x1b[2Jnvidia-35")])
    out = capsys.readouterr().out
    assert out.count("\n") == 2  # the header and one row
    assert "\x1b" not in out and "GRID\\nM60" in out and "\\x1b[2Jnvidia-35" in out


def test_warnings_and_errors_escape_control_characters(capsys):
    output.warning("sysfs: type \x1b[31mx")
    output.error("bad \x07value")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b[31mx" in err


def test_accelctl_refuses_a_source_mdev_given_twice():
    with pytest.raises(exception.InvalidMigrationRequest, match="given twice"):
        ctl_migration._pairs([f"{UUID}=nvidia-35", f"{UUID}=nvidia-36"], "--mdev")


# --- an overloaded agent, as accelctl sees it -------------------------------------------------


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_dir("aa-ovl-") as directory:
        yield directory


def test_a_full_connection_queue_is_reported_as_overloaded(sockdir):
    path = str(sockdir / "api.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(0)
    queued = []
    try:
        while True:  # fill the backlog: nobody accepts
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except BlockingIOError:
                sock.close()
                break
            queued.append(sock)
        with pytest.raises(exception.AgentUnreachable) as info:
            ApiClient(path, timeout=0.5).health()
        assert "overloaded" in info.value.message
    finally:
        for sock in queued:
            sock.close()
        listener.close()


def test_an_agent_that_accepts_but_never_answers_is_reported(sockdir):
    path = str(sockdir / "api.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    try:
        with pytest.raises(exception.AgentUnreachable) as info:
            ApiClient(path, timeout=0.5).health()
        assert "no answer within 0.5 s" in info.value.message
        assert "overloaded" in info.value.message
    finally:
        thread.join(5)
        for sock in accepted:
            sock.close()
        listener.close()


def test_cheroots_busy_answer_says_overloaded():
    error = ApiClient._api_error(
        503, json.dumps({"error": {"code": "ServiceUnavailable",
                                   "message": "503 Service Unavailable"}}).encode()
    )
    assert "overloaded" in error.message
