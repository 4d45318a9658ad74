"""The API socket (safety checks, mode, group), the cheroot server and the stdlib client."""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import re
import select
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.api import connections
from accel_agent.api.app import ApiApplication
from accel_agent.api.client import ApiClient
from accel_agent.api.server import (
    ApiServer,
    bind_socket,
    check_socket_path,
    remove_socket,
    socket_identity,
)
from tests.unit.test_api_app import UUID, FakeBackend


@pytest.fixture
def sockdir(tmp_path_factory) -> Iterator[Path]:
    import shutil
    import tempfile

    # Short: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="aa-unit-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def serving(
    sockdir: Path, backend: FakeBackend, threads: int = 4, **options: float
) -> Iterator[tuple[str, ApiServer]]:
    """The real cheroot server on a socket in ``sockdir``, in this process."""
    path = str(sockdir / "api.sock")
    server = ApiServer(
        bind_socket(path), ApiApplication(backend), threads=threads, shutdown_timeout=5,
        **options,
    )
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield path, server
    finally:
        server.stop()
        thread.join(10)
        remove_socket(path, None, server.identity)


@pytest.fixture
def served(sockdir) -> Iterator[tuple[str, FakeBackend, ApiServer]]:
    backend = FakeBackend()
    with serving(sockdir, backend) as (path, server):
        yield path, backend, server


# --- where the socket may live ---------------------------------------------------------


def test_a_regular_file_in_the_way_is_refused_and_kept(sockdir):
    path = sockdir / "api.sock"
    path.write_text("not a socket")
    with pytest.raises(exception.ApiSocketUnsafe, match="regular file is in the way"):
        bind_socket(str(path))
    assert path.read_text() == "not a socket"


def test_a_symlink_in_the_way_is_refused(sockdir):
    (sockdir / "api.sock").symlink_to("/etc/passwd")
    with pytest.raises(exception.ApiSocketUnsafe, match="symlink"):
        check_socket_path(str(sockdir / "api.sock"))


def test_world_writable_directory_needs_the_sticky_bit(sockdir):
    os.chmod(sockdir, 0o777)
    with pytest.raises(exception.ApiSocketUnsafe, match="world-writable without the sticky bit"):
        check_socket_path(str(sockdir / "api.sock"))
    os.chmod(sockdir, 0o1777)
    check_socket_path(str(sockdir / "api.sock"))  # like /tmp: fine


def test_missing_directory_is_refused(sockdir):
    with pytest.raises(exception.ApiSocketUnsafe, match="does not exist"):
        check_socket_path(str(sockdir / "nope" / "api.sock"))


def test_a_missing_socket_directory_is_made_for_root_and_the_socket_group(sockdir):
    """Issue 34: a start outside systemd (no RuntimeDirectory=) makes its
    socket's directory: the agent's, 0755; 0750 with [api] socket_group's
    group; never loosened when it exists; refused when its parent is missing."""
    path = str(sockdir / "run" / "api.sock")
    sock = bind_socket(path)
    sock.close()
    made = os.stat(sockdir / "run")
    assert stat.S_IMODE(made.st_mode) == 0o755 and made.st_uid == os.geteuid()
    group = grp.getgrgid(os.getgid()).gr_name if os.getuid() != 0 else "daemon"
    path = str(sockdir / "grouped" / "api.sock")
    sock = bind_socket(path, group)
    sock.close()
    made = os.stat(sockdir / "grouped")
    assert stat.S_IMODE(made.st_mode) == 0o750
    assert made.st_gid == grp.getgrnam(group).gr_gid
    os.mkdir(sockdir / "private", 0o700)
    sock = bind_socket(str(sockdir / "private" / "api.sock"), group)
    sock.close()
    assert stat.S_IMODE(os.stat(sockdir / "private").st_mode) == 0o700  # left as it was
    with pytest.raises(exception.ApiSocketUnsafe, match="nor its parent"):
        bind_socket(str(sockdir / "no" / "where" / "api.sock"))
    assert not os.path.exists(sockdir / "no")


def test_a_stale_socket_is_replaced_and_a_live_one_refused(sockdir):
    path = str(sockdir / "api.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: a killed daemon's socket
    sock = bind_socket(path)
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        with pytest.raises(exception.AgentAlreadyRunning):
            bind_socket(path)
    finally:
        sock.close()


def test_socket_is_0660_and_given_to_the_configured_group(sockdir):
    group = grp.getgrgid(os.getgid()).gr_name if os.getuid() != 0 else "daemon"
    path = str(sockdir / "api.sock")
    sock = bind_socket(path, group)
    try:
        st = os.lstat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == grp.getgrnam(group).gr_gid
    finally:
        sock.close()


def test_unknown_group_is_a_config_error(sockdir):
    with pytest.raises(exception.InvalidConfig, match="no-such-group-xyz"):
        bind_socket(str(sockdir / "api.sock"), "no-such-group-xyz")
    assert not os.path.exists(sockdir / "api.sock")


def test_remove_socket_leaves_a_newer_agents_socket_alone(sockdir):
    path = str(sockdir / "api.sock")
    first = bind_socket(path)
    identity = socket_identity(path)
    first.close()
    os.unlink(path)
    second = bind_socket(path)
    try:
        remove_socket(path, None, identity)
        assert os.path.exists(path)
    finally:
        second.close()


# --- client <-> cheroot ---------------------------------------------------------------


def test_client_round_trip_over_the_socket(served):
    path, backend, _ = served
    client = ApiClient(path)
    assert client.health()["status"] == "ok"
    assert client.allocate("vm/1", 1)["instance"] == "vm/1"
    assert backend.calls[-1] == ("allocate", "vm/1", 1, None, None)
    assert client.release("vm/1", remove=True)["removed"] is True
    with pytest.raises(exception.ApiError) as caught:
        client.allocate("vm", 9)
    assert caught.value.kwargs["status"] == 409
    assert caught.value.kwargs["code"] == "InsufficientCapacity"
    assert caught.value.message == "insufficient capacity for type t on p: full"
    assert client.adopt(UUID)["uuid"] == UUID


def test_client_tells_not_running_from_unreachable(sockdir):
    missing = str(sockdir / "missing.sock")
    with pytest.raises(exception.AgentNotRunning):
        ApiClient(missing).health()
    stale = str(sockdir / "stale.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(stale)  # bound, never listening: connection refused
    try:
        with pytest.raises(exception.AgentNotRunning):
            ApiClient(stale).health()
        # Listening but never answering: an error, not "not running".
        mute = str(sockdir / "mute.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(mute)
        listener.listen(1)
        try:
            with pytest.raises(exception.AgentUnreachable, match="no answer"):
                ApiClient(mute, timeout=0.5).health()
        finally:
            listener.close()
    finally:
        sock.close()


class StartingBackend(FakeBackend):
    """An agent that is starting (waiting for VFs) and whose mdevs listing
    hangs until ``let_go``."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = threading.Event()

    def health(self) -> dict:
        return {**super().health(), "status": "starting", "starting": {
            "phase": "waiting for VFs", "since": "t", "started_at": "t",
            "waiting_for": ["0000:c1:00.0"], "until": None}}

    def mdevs_json(self) -> bytes:
        self.let_go.wait(30)
        return super().mdevs_json()


def test_a_request_without_an_answer_says_what_the_start_waits_for(sockdir):
    """Issue 34 item 3: no answer in time from an agent that is starting is
    "starting: waiting for ...", not "overloaded or stuck"."""
    backend = StartingBackend()
    with serving(sockdir, backend) as (path, _server):
        try:
            with pytest.raises(exception.AgentUnreachable) as refused:
                ApiClient(path, timeout=0.5).mdevs()
            assert "starting: waiting for VFs of GPU(s) 0000:c1:00.0" in refused.value.message
            assert "overloaded or stuck" not in refused.value.message
        finally:
            backend.let_go.set()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another user")
@pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")
def test_another_user_is_denied_by_the_socket_mode(served, sockdir):
    path, _, _ = served
    os.chmod(sockdir, 0o755)  # the directory is open: only the socket's 0660 stops them
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, trying the API
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                ApiClient(path).health()
                code = 2
            except exception.AgentUnreachable as exc:
                os.write(write_end, exc.message.encode())
                code = 3
        finally:
            os._exit(code)
    os.close(write_end)
    message = os.read(read_end, 4096).decode()
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3, message
    assert "permission denied" in message


def test_stop_lets_an_in_flight_request_finish(served):
    path, backend, server = served
    entered, proceed = threading.Event(), threading.Event()
    original = backend.allocate

    def slow_allocate(*args):
        entered.set()
        proceed.wait(10)
        return original(*args)

    backend.allocate = slow_allocate  # type: ignore[method-assign]
    results: list[object] = []
    worker = threading.Thread(
        target=lambda: results.append(ApiClient(path).allocate("vm", 1)), daemon=True
    )
    worker.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    # New connections are refused once stop() closed the listening socket...
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            ApiClient(path, timeout=1).health()
        except exception.AgentNotRunning:
            break
        except exception.AgentUnreachable:
            pass  # accepted while the server was stopping: not yet refused
        time.sleep(0.02)
    else:
        pytest.fail("the listening socket stayed open during stop()")
    # ...while the request already in progress completes normally.
    proceed.set()
    worker.join(10)
    stopper.join(10)
    assert results and results[0]["instance"] == "vm"  # type: ignore[index]


def test_requests_cheroot_refuses_itself_get_the_api_error_format(served):
    path, _, _ = served
    import json

    for request in (
        b"GET no-slash HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/health#frag HTTP/1.1\r\nHost: x\r\n\r\n",
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(path)
            conn.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), data
        assert b"Content-Type: application/json" in head
        assert json.loads(body)["error"]["code"] == "ApiRequestInvalid"


def test_an_early_error_answer_reaches_a_client_still_sending_its_body(served):
    path, _, _ = served
    status, content_type, _ = ApiClient(path).request("GET", "/v1/nowhere", {"x": "y" * 10})
    assert (status, content_type) == (404, "application/json")


# --- framing (RFC 9112 §6): refused before the body, and the connection closed --------

# An allocation sent on the same connection right behind the refused request:
# a server that misjudged where the first one ends would execute it.
SMUGGLED = (
    b"PUT /v1/instances/smuggled/allocation HTTP/1.1\r\nHost: x\r\n"
    b'Content-Type: application/json\r\nContent-Length: 12\r\n\r\n{"count": 1}'
)


def put_head(*fields: str) -> bytes:
    lines = "".join(f"{field}\r\n" for field in fields)
    return (
        "PUT /v1/instances/front/allocation HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\n{lines}\r\n"
    ).encode()


def exchange(path: str, data: bytes, timeout: float = 30) -> tuple[bytes, bool]:
    """Send ``data`` on one connection, keep our side open and read until the
    server closes it: (everything answered, whether the server closed it)."""
    answer = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(data)
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass  # closed with our unread request in its queue: still closed
        except TimeoutError:
            return answer, False
    return answer, True


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (["Content-Length: 0", "Transfer-Encoding: chunked"], "both Content-Length and Transfer"),
        (["Transfer-Encoding: chunked", "Content-Length: 12"], "both Content-Length and Transfer"),
        (["Transfer-Encoding: chunked"], "Transfer-Encoding 'chunked' is not accepted"),
        (["Transfer-Encoding: gzip, chunked"], "is not accepted: send the body with a Content"),
        (["Transfer-Encoding: identity"], "is not accepted"),
        (["Content-Length: 0", "Content-Length: 12"], "Content-Length is given 2 times"),
        (["Content-Length: 0", "Content-Length: 0"], "Content-Length is given 2 times"),
        (["Content-Length: 0, 0"], "Content-Length '0, 0' is a list"),
        (["Content-Length: 0,12"], "is a list"),
        (["Content-Length: +0"], "Content-Length '+0' is not a number of bytes"),
        (["Content-Length: -1"], "is not a number of bytes"),
        (["Content-Length: 0x0"], "is not a number of bytes"),
        (["Content-Length: 1 2"], "is not a number of bytes"),
        (["Content-Length:"], "Content-Length '' is not a number of bytes"),
        (["Content-Length: \u0661".encode().decode("latin-1")], "is not a number of bytes"),
        (["Content-Length: " + "9" * 30], "the body is larger than 65536 bytes"),
        (["Content-Length: " + "1" * 5000], "the body is larger than 65536 bytes"),
        (["Content-Length : 0"], "whitespace between the header field name 'Content-Length'"),
        (["Transfer-Encoding\t: chunked"], "whitespace between"),
        (["X-Note: a", " Content-Length: 12"], "(obs-fold)"),
    ],
)
def test_ambiguous_framing_is_400_and_closes_the_connection(served, fields, fragment):
    path, backend, _ = served
    answer, closed = exchange(path, put_head(*fields) + SMUGGLED)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"\r\nConnection: close" in head
    assert b"\r\nContent-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "ApiRequestInvalid"
    assert fragment in error["message"]
    assert answer.count(b"HTTP/1.1 ") == 1  # one answer: the one behind was never read
    assert closed
    assert backend.calls == []  # neither the refused request nor the smuggled one ran


def test_a_content_length_given_with_spaces_or_leading_zeros_is_one_length(served):
    path, backend, _ = served
    body = b'{"count": 1}'
    answer, closed = exchange(
        path,
        put_head("Content-Length: \t0012 ") + body
        + b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    # Both answered on the one connection: keeping it is still the normal case.
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer
    assert closed
    assert backend.calls == [("allocate", "front", 1, None, None)]


def test_fields_given_twice_that_may_be_are_still_joined(served):
    path, _, _ = served
    answer, _ = exchange(
        path,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n"
        b"Accept: application/json\r\nConnection: close\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer


# --- clients that do not read their answers ------------------------------------------


def closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes ``conn`` within ``within`` seconds, seen
    without reading what it sent (POLLRDHUP)."""
    poller = select.poll()
    poller.register(conn, select.POLLRDHUP)
    return bool(poller.poll(within * 1000))


def test_a_request_pipelined_behind_unread_answers_waits_and_is_not_served(sockdir):
    backend = FakeBackend()
    with (
        serving(sockdir, backend, threads=2, write_timeout=1.0) as (path, _),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hog,
    ):
        hog.connect(path)
        hog.sendall(
            b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
            + SMUGGLED.replace(b"smuggled", b"pipelined")
        )
        # It never reads: after write_timeout its connection is closed,
        # and the allocation it pipelined was never served.
        assert closed_by_server(hog, within=30)
        assert backend.calls == []
        assert ApiClient(path, timeout=30).health()["status"] == "ok"


def test_a_pipelining_client_that_reads_gets_every_answer(served):
    path, backend, _ = served
    answer, closed = exchange(
        path,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
        + SMUGGLED.replace(b"Host: x", b"Host: x\r\nConnection: close"),
    )
    assert answer.count(b"HTTP/1.1 200 OK") == 3, answer[:300]
    assert closed
    assert backend.calls == [("allocate", "smuggled", 1, None, None)]


def big_listing(backend: FakeBackend, size: int) -> bytes:
    entry = b'"' + b"m" * 62 + b'"'
    listing = b'{"host":"h","mdevs":[' + b",".join([entry] * (size // 65)) + b"]}"
    backend.mdevs_json = lambda: listing  # type: ignore[method-assign]
    return listing


def test_a_client_that_reads_its_answer_slowly_is_cut_off_and_frees_the_worker(sockdir):
    backend = FakeBackend()
    listing = big_listing(backend, 4 * 1024 * 1024)
    # One worker: while the slow client held it, nothing else would be served.
    with (
        serving(sockdir, backend, threads=1, write_timeout=1.0) as (path, _),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow,
    ):
        slow.connect(path)
        slow.sendall(b"GET /v1/mdevs HTTP/1.1\r\nHost: x\r\n\r\n")
        health: list[object] = []
        asker = threading.Thread(
            target=lambda: health.append(ApiClient(path, timeout=30).health()), daemon=True
        )
        asker.start()
        # A little at a time, often enough that no single send waits long:
        # only a deadline over the whole answer cuts this client off.
        received = 0
        for _ in range(800):  # 40 s at most; the whole answer would take 50
            if closed_by_server(slow, within=0.05):
                break
            received += len(slow.recv(4096))
        else:
            pytest.fail(f"still sending after {received} bytes: the worker is held")
        asker.join(30)
        assert health and health[0]["status"] == "ok"  # type: ignore[index]
        with contextlib.suppress(ConnectionResetError):
            while chunk := slow.recv(1 << 20):
                received += len(chunk)
        assert received < len(listing)


def test_clients_that_never_read_are_told_in_one_line_without_a_traceback(sockdir, caplog):
    backend = FakeBackend()
    big_listing(backend, 4 * 1024 * 1024)
    caplog.set_level(logging.INFO)
    with serving(sockdir, backend, threads=1, write_timeout=0.5) as (path, _):
        hogs = []
        try:
            for _ in range(3):
                hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                hogs.append(hog)
                hog.connect(path)
                hog.sendall(b"GET /v1/mdevs HTTP/1.1\r\nHost: x\r\n\r\n")
            for hog in hogs:
                assert closed_by_server(hog, within=30)
            assert ApiClient(path, timeout=30).health()["status"] == "ok"
        finally:
            for hog in hogs:
                hog.close()
    lines = [r.getMessage() for r in caplog.records if "did not take its answer" in r.getMessage()]
    assert len(lines) == 1, lines  # the two others within the interval are counted, not logged
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


# --- one line per interval ------------------------------------------------------------


def test_a_repeated_failure_is_logged_once_per_interval_and_counted(caplog):
    now = [0.0]
    limited = connections.OncePerInterval("API server: cannot accept", 10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING)
    for step in range(1000):  # one every 35 ms for 35 s
        now[0] = step * 0.035
        limited.note(f"failure {step}")
    now[0] = 60.0
    limited.flush()
    limited.flush()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines  # at 0, 10, 20, 30 s, and the flush of the rest
    assert lines[0] == "API server: cannot accept: failure 0"
    counted = [int(re.search(r"(\d+) more", line).group(1)) for line in lines[1:]]  # type: ignore[union-attr]
    assert len(lines) + sum(counted) - 1 == 1000  # every failure logged or counted
    assert lines[-1].endswith("(the last: failure 999)")


def test_an_error_answer_carries_the_agents_request_id_to_the_client(served, capsys):
    from accel_agent.cmd import output

    path, _backend, _ = served
    client = ApiClient(path)
    with pytest.raises(exception.ApiError) as caught:
        client.allocate("vm", 9)
    request_id = caught.value.kwargs["request_id"]
    assert re.fullmatch(r"req-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", request_id)
    status, headers, _data = client.exchange("GET", "/v1/health")
    assert status == 200 and headers["x-openstack-request-id"] != request_id

    def fails() -> int:
        client.allocate("vm", 9)
        return 0

    assert output.exit_status(fails) == 1
    line = capsys.readouterr().err
    assert re.fullmatch(r"error: insufficient capacity for type t on p: full "
                        r"\(request req-[0-9a-f-]{36}\)\n", line)
