"""``DELETE .../allocation`` and ``DELETE .../attachments`` tell the truth: 2xx
only when the release persisted in the ledger; a ledger that refuses the write
(disk full, I/O error, replaced, busy) answers 503 in the API's error format,
and the instance still holds what it held.  The fake backend of
test_api_app.py; tests/functional/test_api_release_truth.py does the same
with the real daemon on a full disk."""

from __future__ import annotations

import pytest

from accel_agent import exception
from tests.unit.test_api_app import UUID, FakeBackend, call

RELEASES = [
    pytest.param("/v1/instances/vm-1/allocation", id="delete-allocation"),
    pytest.param("/v1/instances/vm-1/allocation?remove=true", id="delete-allocation-remove"),
    pytest.param("/v1/instances/vm-1/attachments", id="delete-attachments"),
    pytest.param("/v1/instances/vm-1/attachments?remove=true", id="delete-attachments-remove"),
]
LEDGER_FAILURES = [
    pytest.param(exception.LedgerWriteFailed(path="/var/lib/accel-agent/ledger.sqlite3",
                                             detail="database or disk is full"), id="disk-full"),
    pytest.param(exception.LedgerWriteFailed(path="/var/lib/accel-agent/ledger.sqlite3",
                                             detail="disk I/O error"), id="io-error"),
    pytest.param(exception.LedgerReplaced(path="/var/lib/accel-agent/ledger.sqlite3",
                                          detail="the file is gone"), id="replaced"),
    pytest.param(exception.LedgerError(reason="database is locked"), id="busy"),
]


@pytest.fixture
def app_and_backend():
    from accel_agent.api.app import ApiApplication

    backend = FakeBackend()
    backend.held["vm-1"] = [UUID]
    return ApiApplication(backend), backend


@pytest.mark.parametrize("uri", RELEASES)
@pytest.mark.parametrize("failure", LEDGER_FAILURES)
def test_a_release_the_ledger_refused_answers_503_and_releases_nothing(
    app_and_backend, uri, failure
):
    app, backend = app_and_backend
    backend.fail = failure
    status, headers, body = call(app, "DELETE", uri)
    assert status == 503, body
    assert headers["Content-Type"] == "application/json"
    assert body == {"error": {"code": type(failure).__name__, "message": failure.message}}
    assert backend.held == {"vm-1": [UUID]}  # still held: nothing was acknowledged
    assert backend.metrics.render()[0].count(type(failure).__name__.encode()) >= 1
    # Once the ledger takes writes again, the same request releases for real.
    backend.fail = None
    status, _, body = call(app, "DELETE", uri)
    assert (status, body["released"], body["instance"]) == (200, [UUID], "vm-1")
    assert backend.held == {}


@pytest.mark.parametrize("uri", RELEASES)
def test_a_release_answers_2xx_only_after_the_backend_returned(app_and_backend, uri):
    app, backend = app_and_backend
    status, _, body = call(app, "DELETE", uri)
    assert status == 200
    assert body == {"instance": "vm-1", "released": [UUID], "removed": "remove=true" in uri}
    assert backend.calls == [("release", "vm-1", "remove=true" in uri)]
