"""The API socket (safety checks, mode, group), the cheroot server and the stdlib client."""

from __future__ import annotations

import grp
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
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


@pytest.fixture
def served(sockdir) -> Iterator[tuple[str, FakeBackend, ApiServer]]:
    backend = FakeBackend()
    path = str(sockdir / "api.sock")
    server = ApiServer(bind_socket(path), ApiApplication(backend), threads=4, shutdown_timeout=5)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield path, backend, server
    finally:
        server.stop()
        thread.join(10)
        remove_socket(path, None, server.identity)


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
