"""The daemon's log as an operator follows it (the real ``accel-agent`` on the
FUSE-simulated host, its log read line by line):

* every API request has its own request id, answered in
  ``X-Openstack-Request-Id`` and carried by every line logged while it is
  served; lines outside requests read ``[-]``;
* a refused or failed request is one WARNING (ERROR for a failure of the
  agent) naming the instance, the request, the status, the error code and
  message; a GET of something absent is INFO;
* a refused reload says its reason once; a release that keeps an mdev in use
  never says it removed it;
* a reload that changes ``debug`` applies it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.api.client import UnixHTTPConnection
from tests.functional.daemon_fixture import sim_agent, wait_for
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

NVIDIA_ONLY = """
[devices]
enabled_mdev_types = nvidia-35
"""
REQUEST_ID = re.compile(r"req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# oslo.log's default context format: "[<global id> <request id> <user identity>] ".
CONTEXT = re.compile(r" \[None (req-[0-9a-f-]{36}) - - - - - -\] ")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("logs"), ["nvidia-pf", "mtty"], gpus=1) as host:
        yield host


@pytest.fixture
def agent(sim, tmp_path):
    with sim_agent(sim, tmp_path) as agent:
        yield agent


def call(socket_path: str, method: str, path: str, body=None, headers=None):
    """(status, headers, JSON body) of one request."""
    conn = UnixHTTPConnection(socket_path, 60)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={
            "Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def lines_of(daemon, request_id: str) -> list[str]:
    return [line for line in daemon.log().splitlines() if request_id in line]


def log_since(daemon, mark: int) -> list[str]:
    return daemon.log()[mark:].splitlines()


def test_a_request_refused_for_capacity_is_one_warning_with_its_request_id(agent):
    daemon = agent.daemon.start()
    status, headers, body = call(daemon.socket_path, "PUT", "/v1/instances/vm-big/allocation",
                                 {"count": 60, "parent": "mtty"})
    assert status == 409 and body["error"]["code"] == "InsufficientCapacity"
    request_id = headers["X-Openstack-Request-Id"]
    assert REQUEST_ID.fullmatch(request_id)
    warnings = [line for line in lines_of(daemon, request_id) if " WARNING " in line]
    assert len(warnings) == 1, daemon.log()[-3000:]
    line = warnings[0]
    assert CONTEXT.search(line).group(1) == request_id
    assert "[instance: vm-big] API PUT /v1/instances/vm-big/allocation refused: 409 " \
        "InsufficientCapacity: insufficient capacity for type mtty-2 on mtty" in line
    assert f"(client pid {os.getpid()}, uid 0)" in line
    # Said once: no exception summary appended by oslo.log.
    assert line.count("insufficient capacity") == 1


def test_every_answer_has_its_own_request_id_and_lines_outside_requests_have_none(agent):
    daemon = agent.daemon.start()
    ids = []
    for _ in range(3):
        status, headers, _body = call(daemon.socket_path, "GET", "/v1/health")
        assert status == 200
        ids.append(headers["X-Openstack-Request-Id"])
    assert len(set(ids)) == 3 and all(REQUEST_ID.fullmatch(i) for i in ids)
    # An allocation: every line it logs (its rescan included) carries its id
    # and names the instance; the start-up's lines carry none.
    status, headers, _body = call(daemon.socket_path, "PUT", "/v1/instances/vm-a/allocation",
                                  {"count": 1, "parent": "mtty"})
    assert status == 200
    request_id = headers["X-Openstack-Request-Id"]
    mine = lines_of(daemon, request_id)
    allocated = [line for line in mine if "allocated 1 mdev(s) for vm-a" in line]
    assert len(allocated) == 1 and "[instance: vm-a] " in allocated[0]
    ready = [line for line in daemon.log().splitlines() if " ready: API on " in line]
    assert len(ready) == 1 and " [-] " in ready[0] and "req-" not in ready[0]
    # A client's own id of the right form is kept as the global request id;
    # anything else in the header is ignored, never logged.
    given = "req-12345678-1234-4234-8234-123456789abc"
    status, headers, _body = call(daemon.socket_path, "GET", "/v1/instances/vm-x/domain-xml",
                                  headers={"X-Openstack-Request-Id": given})
    assert status == 404 and headers["X-Openstack-Request-Id"] != given
    line, = lines_of(daemon, headers["X-Openstack-Request-Id"])
    assert f"[{given} {headers['X-Openstack-Request-Id']} - - - - - -]" in line
    status, headers, _body = call(daemon.socket_path, "GET", "/v1/instances/vm-x/domain-xml",
                                  headers={"X-Openstack-Request-Id": "req-<script>\u00e9"})
    line, = lines_of(daemon, headers["X-Openstack-Request-Id"])
    assert "<script>" not in line and "[None req-" in line


def test_levels_a_404_of_a_get_is_info_a_bad_request_a_warning(agent):
    daemon = agent.daemon.start()
    status, headers, _body = call(daemon.socket_path, "GET", "/v1/instances/vm-x/domain-xml")
    assert status == 404
    line, = lines_of(daemon, headers["X-Openstack-Request-Id"])
    assert " INFO accel_agent.api " in line
    assert "API GET /v1/instances/vm-x/domain-xml refused: 404 MdevNotFound" in line
    status, headers, _body = call(daemon.socket_path, "PUT", "/v1/instances/vm-x/allocation",
                                  {"count": 0})
    assert status == 400
    line, = lines_of(daemon, headers["X-Openstack-Request-Id"])
    assert " WARNING accel_agent.api " in line and "refused: 400 ApiRequestInvalid: " in line
    assert "[instance: vm-x] " in line


def test_a_kernel_enospc_on_create_is_a_warning_with_the_request_id(agent, sim):
    daemon = agent.daemon.start()
    sim.sim.fail_next_create("ENOSPC", parent="mtty")
    status, headers, body = call(daemon.socket_path, "PUT", "/v1/instances/vm-e/allocation",
                                 {"count": 1, "parent": "mtty"})
    assert status == 409 and body["error"]["code"] == "InsufficientCapacity"
    request_id = headers["X-Openstack-Request-Id"]
    warning, = [line for line in lines_of(daemon, request_id) if " WARNING " in line]
    assert "[instance: vm-e] API PUT /v1/instances/vm-e/allocation refused: 409 " \
        "InsufficientCapacity: " in warning
    assert body["error"]["message"] in warning


def test_a_request_the_server_refuses_itself_has_a_request_id_and_a_warning(agent):
    daemon = agent.daemon.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(daemon.socket_path)
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Length: 3\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    assert head.startswith("HTTP/1.1 400 ")
    request_id = re.search(r"X-Openstack-Request-Id: (\S+)", head).group(1)
    line, = lines_of(daemon, request_id)
    assert " WARNING accel_agent.api " in line
    assert "API GET /v1/health refused: 400 ApiRequestInvalid: " in line


# --- reloads and releases ----------------------------------------------------------------


def test_a_refused_reload_says_its_reason_once(agent):
    daemon = agent.daemon.start()
    uuid = daemon.client().allocate("vm-o", 1, parent="mtty")["mdevs"][0]["uuid"]
    agent.body = NVIDIA_ONLY
    agent.write()
    mark = len(daemon.log())
    daemon.sighup()
    wait_for(lambda: daemon.health()["config"]["last_reload_result"] == "refused",
             what="the refusal")
    refused = [line for line in log_since(daemon, mark) if "reload refused" in line]
    assert len(refused) == 1
    assert refused[0].endswith(
        " ERROR accel_agent.service [-] configuration reload refused, the running "
        f"configuration is kept: mdev {uuid} of instance vm-o is mtty-2 on parent mtty, "
        "which would get type nvidia-35")
    # Through the API: the same line, with the request's id.
    mark = len(daemon.log())
    status, headers, _body = call(daemon.socket_path, "POST", "/v1/reload")
    assert status == 409
    request_id = headers["X-Openstack-Request-Id"]
    refused = [line for line in log_since(daemon, mark) if "reload refused" in line]
    assert len(refused) == 2  # the reload's own line and the API's refusal
    error, warning = refused
    assert f" ERROR accel_agent.service [None {request_id} " in error
    assert error.count("which would get type nvidia-35") == 1
    assert f" WARNING accel_agent.api [None {request_id} " in warning
    assert "API POST /v1/reload refused: 409 ReloadRefused: " in warning


def test_a_release_that_keeps_an_mdev_in_use_never_says_it_removed_it(agent, sim):
    daemon = agent.daemon.start()
    client = daemon.client()
    uuid = client.allocate("vm-k", 1, parent="mtty")["mdevs"][0]["uuid"]
    group = os.path.basename(os.readlink(
        os.path.join(sim.root, "bus", "mdev", "devices", uuid, "iommu_group")))
    mark = len(daemon.log())
    fd = os.open(os.path.join(sim.root, "vfio", group), os.O_RDONLY)
    try:
        with pytest.raises(exception.ApiError):
            client.release("vm-k", remove=True)
    finally:
        os.close(fd)
    lines = [line for line in log_since(daemon, mark) if "accel_agent.devices" in line]
    kept, released = lines
    assert kept.endswith(
        f"mdev {uuid} kept as a free mdev instead of removed: mediated device {uuid} is in "
        f"use: its VFIO group {sim.root}/vfio/{group} is open (a VM or another process "
        "holds it); kept, not removed")
    assert " WARNING accel_agent.devices.protocol [None req-" in kept
    assert released.endswith(
        f"released 1 mdev(s) of instance vm-k: 1 kept (in use, not removed): {uuid}")
    assert "removed)" not in released.replace("not removed)", "")
    # Nothing holds it now: the same release removes it, and says so.
    client.allocate("vm-k", 1, parent="mtty")
    mark = len(daemon.log())
    client.release("vm-k", remove=True)
    released, = [line for line in log_since(daemon, mark) if "released " in line]
    assert released.endswith("released 1 mdev(s) of instance vm-k: 1 removed")
    client.allocate("vm-k", 1, parent="mtty")
    mark = len(daemon.log())
    client.release("vm-k")
    released, = [line for line in log_since(daemon, mark) if "released " in line]
    assert released.endswith("released 1 mdev(s) of instance vm-k: 1 left free for reuse")


def _write_debug(agent, debug: bool) -> None:
    agent.write()
    text = agent.config.read_text()
    assert "debug = true" in text
    agent.config.write_text(text.replace("debug = true", f"debug = {str(debug).lower()}"))


def test_a_reload_that_changes_debug_applies_it(agent):
    _write_debug(agent, False)
    daemon = agent.daemon.start()

    def debug_lines_of_a_request() -> list[str]:
        # Each answer that is no refusal has a DEBUG line, logged before it is sent.
        status, headers, _body = call(daemon.socket_path, "GET", "/v1/health")
        assert status == 200
        return [line for line in lines_of(daemon, headers["X-Openstack-Request-Id"])
                if " DEBUG " in line]

    assert debug_lines_of_a_request() == []
    _write_debug(agent, True)
    mark = len(daemon.log())
    daemon.sighup()
    wait_for(lambda: "configuration reloaded" in daemon.log()[mark:], what="the reload")
    line, = debug_lines_of_a_request()
    assert " DEBUG accel_agent.api [None req-" in line and "API GET /v1/health: 200 in " in line
    _write_debug(agent, False)
    mark = len(daemon.log())
    daemon.sighup()
    wait_for(lambda: "configuration reloaded" in daemon.log()[mark:], what="the reload")
    assert daemon.health()["config"]["last_reload_result"] == "applied"
    assert debug_lines_of_a_request() == []
    # Nothing at DEBUG once the reload said it was done (its own rescan may
    # run before, with the level it found).
    after = daemon.log()[mark:]
    after = after[after.index("configuration reloaded"):]
    assert " DEBUG " not in after


def test_a_reload_that_changes_a_logging_option_needing_a_restart_says_so(agent):
    daemon = agent.daemon.start()
    log_file = Path(agent.workdir) / "other.log"
    agent.write(extra=f"[DEFAULT]\nlog_file = {log_file}\n")
    status, _headers, body = call(daemon.socket_path, "POST", "/v1/reload")
    assert status == 200 and body["result"] == "applied"
    assert "[DEFAULT] log_file changed; it applies at the next restart" in body["notes"]
    assert not log_file.exists()


# --- use_journal ---------------------------------------------------------------------------

SINK = Path(__file__).with_name("journal_sink.py")


def journal_entries(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_use_journal_sends_every_line_to_the_journal_with_its_request_id(agent, tmp_path):
    """With the systemd bindings (the ``journal`` extra), the daemon runs with
    ``use_journal = true`` and each line reaches journald's socket (a stand-in
    bound in a private mount namespace), a request's with its REQUEST_ID field."""
    pytest.importorskip("systemd.journal", reason="the journal extra (systemd-python) is "
                        "not installed")
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is not installed")
    journal = tmp_path / "journal.jsonl"
    agent.write(extra="[DEFAULT]\nuse_journal = true\n")
    agent.daemon.command = [
        "unshare", "--mount", "--propagation", "private", "--",
        sys.executable, str(SINK), str(journal), "--",
        sys.executable, "-m", "accel_agent.cmd.agent",
    ]
    daemon = agent.daemon.start()
    status, headers, _body = call(daemon.socket_path, "PUT", "/v1/instances/vm-j/allocation",
                                  {"count": 60, "parent": "mtty"})
    assert status == 409
    request_id = headers["X-Openstack-Request-Id"]
    entry, = wait_for(
        lambda: [e for e in journal_entries(journal) if e.get("REQUEST_ID") == request_id],
        what="the refusal in the journal")
    assert entry["PRIORITY"] == "4"  # warning
    assert entry["LOGGER_NAME"] == "accel_agent.api"
    assert "[instance: vm-j] API PUT /v1/instances/vm-j/allocation refused: 409 " \
        "InsufficientCapacity: " in entry["MESSAGE"]
    ready, = (e for e in journal_entries(journal) if " ready: API on " in e["MESSAGE"])
    assert ready["PRIORITY"] == "6" and "REQUEST_ID" not in ready
    assert daemon.stop() == 0
    stopped = [e for e in journal_entries(journal) if "accel-agent stopped" in e["MESSAGE"]]
    assert len(stopped) == 1
    # Nothing went to the daemon's stdout or stderr (no traceback, no fallback).
    assert "Traceback" not in daemon.log() and "Systemd bindings" not in daemon.log()


def test_use_journal_without_the_bindings_refuses_to_start_saying_so(agent):
    from accel_agent.config import values

    if values.journal_available():
        pytest.skip("the systemd bindings are installed (the journal extra)")
    agent.write(extra="[DEFAULT]\nuse_journal = true\n")
    proc = agent.daemon.spawn()
    assert proc.wait(60) == 1
    log = agent.daemon.log()
    assert "refusing to start: invalid configuration" in log
    assert "[DEFAULT] use_journal = true: needs the systemd Python bindings" in log
    assert "Traceback" not in log and "Systemd bindings do not exist" not in log
