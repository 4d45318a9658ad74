"""Request ids and the refusal lines of the API (accel_agent.api.requestlog),
through the WSGI application with the fake backend and oslo.log's formatter."""

from __future__ import annotations

import logging
import threading

import pytest
from oslo_config import cfg
from oslo_context import context as oslo_context
from oslo_log import formatters
from oslo_log import log as oslo_logging

from accel_agent import exception
from accel_agent.api import requestlog
from tests.unit.test_api_app import FakeBackend, call


@pytest.fixture
def app():
    from accel_agent.api.app import ApiApplication

    return ApiApplication(FakeBackend())


class Lines(logging.Handler):
    """The lines as oslo.log formats them, with its default format strings."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        conf = cfg.ConfigOpts()
        oslo_logging.register_options(conf)
        conf([], project="test", default_config_files=[], default_config_dirs=[])
        self.setFormatter(formatters.ContextFormatter(project="t", version="0", config=conf))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines():
    handler = Lines()
    logger = logging.getLogger("accel_agent")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_each_answer_has_a_new_request_id_and_the_thread_forgets_it(app, lines):
    ids = set()
    for _ in range(3):
        status, headers, _body = call(app, "GET", "/v1/health")
        assert status == 200
        assert requestlog.REQUEST_ID.match(headers["X-Openstack-Request-Id"])
        ids.add(headers["X-Openstack-Request-Id"])
        # What this thread logs next is no part of the request.
        assert oslo_context.get_current() is None
    assert len(ids) == 3
    logging.getLogger("accel_agent.test").info("between requests")
    assert lines[-1].split("accel_agent.test ")[1] == "[-] between requests"


def test_an_error_answer_has_its_request_id_and_one_warning_naming_it(app, lines):
    status, headers, body = call(app, "PUT", "/v1/instances/vm-1/allocation", {"count": 9})
    assert status == 409 and body["error"]["code"] == "InsufficientCapacity"
    request_id = headers["X-Openstack-Request-Id"]
    mine = [line for line in lines if request_id in line]
    assert len(mine) == 1
    message = body["error"]["message"]
    assert mine[0].endswith(
        f"WARNING accel_agent.api [None {request_id} - - - - - -] [instance: vm-1] API PUT "
        f"/v1/instances/vm-1/allocation refused: 409 InsufficientCapacity: {message}"
    )


def test_a_failure_of_the_agent_is_an_error_line(app, lines):
    app.backend.fail = exception.LedgerError(reason="disk full")
    status, headers, _body = call(app, "GET", "/v1/health")
    assert status == 503
    line, = (line for line in lines if headers["X-Openstack-Request-Id"] in line)
    assert " ERROR accel_agent.api " in line and "failed: 503 LedgerError: " in line


def test_levels():
    assert requestlog.level_for("GET", 404) == logging.INFO
    assert requestlog.level_for("HEAD", 404) == logging.INFO
    assert requestlog.level_for("DELETE", 404) == logging.WARNING
    assert requestlog.level_for("GET", 400) == logging.WARNING
    assert requestlog.level_for("PUT", 409) == logging.WARNING
    assert requestlog.level_for("GET", 500) == logging.ERROR
    assert requestlog.level_for("GET", 503) == logging.ERROR


@pytest.mark.parametrize("given, kept", [
    ("req-12345678-1234-4234-8234-123456789abc", True),
    ("req-12345678-1234-4234-8234-123456789abc\n", False),
    ("req-12345678-1234-4234-8234-123456789ABC", False),
    ("12345678-1234-4234-8234-123456789abc", False),
    ("req-x", False),
    ("", False),
])
def test_a_clients_request_id_is_kept_only_in_the_form_of_one(given, kept):
    found = requestlog.global_request_id({"HTTP_X_OPENSTACK_REQUEST_ID": given})
    assert found == (given if kept else None)


def test_a_long_path_or_message_is_cut_and_newlines_escaped(lines):
    with requestlog.request_context():
        requestlog.log_refusal({}, "GET", "/" + "a" * 5000, 400, "ApiRequestInvalid",
                               "bad\nvalue " + "b" * 5000)
    line = lines[-1]
    assert "\n" not in line and "bad\\nvalue" in line
    assert len(line) < 1400


def test_contexts_of_threads_are_their_own():
    seen = {}

    def other() -> None:
        seen["other"] = oslo_context.get_current()

    with requestlog.request_context() as ctx:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert oslo_context.get_current() is ctx
    assert seen["other"] is None
    assert oslo_context.get_current() is None
