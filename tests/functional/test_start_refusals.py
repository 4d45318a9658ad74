"""Issue 34: what the start refuses, ``accelctl check-config`` and
``accel-agent --check`` refuse, in the same words (accel_agent/config/startchecks.py).

Each case makes one thing the start refuses (a socket group the host lacks,
Placement without auth, a device an instance holds whose type the
configuration dropped, a busy metrics port, a socket place anyone could
take, a damaged ledger, a privileged helper that is not there, ...) and runs
it three ways: ``check-config`` and ``accel-agent --check`` as processes,
and the daemon's own start in this process (``AgentService.prepare``, the
start's actions themselves: bind, recovery, the metrics bind, ...), whose
refusal is what the daemon prints.  Every line of the start's refusal is one
of the check's errors.  Where a reload can meet the same thing, a running
core's reload is refused with it too.  A static tree of the simulator is the
host: nothing here needs FUSE or root.
"""

from __future__ import annotations

import grp
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.daemon.core import AgentCore
from accel_agent.devices import writers
from accel_agent.devices.ledger import Ledger
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.functional.daemon_fixture import short_dir
from tests.functional.refusals import (
    assert_said_by_all,
    check_and_agent_check,
    daemon_conf,
    errors,
    start,
)

GPU = "0000:84:00.0"
UUID = "4b2f0000-0000-4000-8000-000000000001"
GOOD = "[devices]\nenabled_mdev_types = nvidia-35\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("host") / "sys"
    return materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty"], gpus=2)), str(path))


@dataclass
class Place:
    """One case's files: config, state directory, socket (in a short directory)."""

    root: str
    work: Path
    sockdir: Path

    @property
    def state_dir(self) -> Path:
        return self.work / "state"

    @property
    def socket_path(self) -> str:
        return str(self.sockdir / "api.sock")

    @property
    def config(self) -> Path:
        return self.work / "agent.conf"

    def write(self, body: str) -> Path:
        self.config.write_text(
            f"[DEFAULT]\nsysfs_root = {self.root}\nstate_dir = {self.state_dir}\n"
            f"host = testhost\n[api]\nsocket_path = {self.socket_path}\n[libvirt]\nuri =\n"
            + textwrap.dedent(body)
        )
        return self.config


@pytest.fixture
def place(root, tmp_path) -> Iterator[Place]:
    with short_dir() as sockdir:
        yield Place(root, tmp_path, sockdir)


# --- the cases --------------------------------------------------------------------------


def _missing_group() -> str:
    """The docs' example group, or another when this host happens to have it."""
    for name in ("nova", "accel-no-such-group"):
        try:
            grp.getgrnam(name)
        except KeyError:
            return name
    pytest.skip("every candidate group exists here")


def _assigned_mdev(place: Place, mdev_type: str = "nvidia-35") -> None:
    """The ledger of a host where instance vm-1 holds an mdev of ``mdev_type``
    on GPU, which the reboot took from sysfs (the static tree has none)."""
    with Ledger(place.state_dir) as book:
        book.record_create_intent(UUID, GPU, mdev_type)
        book.settle_created(UUID)
        book.assign(UUID, "vm-1")


def _corrupt_ledger(place: Place) -> None:
    """A ledger SQLite opens whose index page is damaged: quick_check says so."""
    with Ledger(place.state_dir) as book:
        for n in range(40):
            uuid = f"4b2f0000-0000-4000-8000-{n:012d}"
            book.record_create_intent(uuid, GPU, "nvidia-35")
            book.settle_created(uuid)
    path = place.state_dir / "ledger.sqlite3"
    with sqlite3.connect(path) as db:
        page = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'mdevs_by_parent_type'"
        ).fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as handle:
        handle.seek((page - 1) * size + 8)  # past the page header: its cell pointers
        handle.write(b"\xff" * 64)


def _too_new_ledger(place: Place) -> None:
    with Ledger(place.state_dir):
        pass
    db = sqlite3.connect(place.state_dir / "ledger.sqlite3")
    db.execute("PRAGMA user_version = 999")
    db.close()


def _file_in_the_way(place: Place) -> None:
    Path(place.socket_path).write_text("precious")


def _open_directory(place: Place) -> None:
    os.chmod(place.sockdir, 0o777)


@dataclass(frozen=True)
class Case:
    name: str
    body: str
    prepare: Callable[[Place], None] = lambda place: None
    # The start in this process without a writer starts the privileged helper.
    privileged: bool = False
    # A running core's reload meets it too (not the ledger's cases: a reload
    # judges its own ledger).
    reload: bool = True


CASES = [
    Case("socket-group", GOOD + "[api]\nsocket_group = {group}\n"),
    Case("placement-auth", GOOD + "[placement]\nenabled = true\n"),
    Case("recovery-type-dropped", "[devices]\nenabled_mdev_types = nvidia-36\n",
         _assigned_mdev, reload=False),
    Case("metrics-port-busy", GOOD + "[metrics]\nlisten = 127.0.0.1:{port}\n"),
    Case("metrics-address-not-here", GOOD + "[metrics]\nlisten = 192.0.2.1:9100\n"),
    Case("socket-file-in-the-way", GOOD, _file_in_the_way),
    Case("socket-directory-open", GOOD, _open_directory),
    Case("ledger-corrupt", GOOD, _corrupt_ledger, reload=False),
    Case("ledger-too-new", GOOD, _too_new_ledger, reload=False),
    Case("privileged-helper-missing",
         GOOD + "[accel_agent_privileged]\nhelper_command = /nonexistent/privsep-helper\n",
         privileged=True),
]


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port another process holds (not this one: the beside-the-agent test
    shows this process's own ports are not in the way of check-config)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        yield int(holder.stdout.readline())
    finally:
        holder.stdin.close()
        holder.wait(30)


@pytest.fixture(scope="module")
def running_core(root, tmp_path_factory) -> Iterator[AgentCore]:
    """An agent core on the good configuration, for the reloads."""
    work = tmp_path_factory.mktemp("running")
    with short_dir() as sockdir:
        place = Place(root, work, sockdir)
        core = AgentCore(daemon_conf(place.write(GOOD)), writer=writers.DirectWriter(root))
        core.startup()
        try:
            yield core
        finally:
            core.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_what_the_start_refuses_check_config_and_check_refuse_in_its_words(
    place, root, busy_port, running_core, case
):
    config = place.write(case.body.format(group=_missing_group(), port=busy_port))
    case.prepare(place)
    check, agent_check = check_and_agent_check(config)
    said = start(config, root, writer=None if case.privileged else "direct")
    assert_said_by_all(said, check, agent_check)
    if case.reload:
        with pytest.raises(exception.ReloadRefused) as refused:
            running_core.reload(daemon_conf(config))
        for line in said:
            assert line in refused.value.message, (line, refused.value.message)


def test_the_docs_cases_say_what_the_start_says(place, root):
    """The three restart loops of issue 34, by their words."""
    config = place.write(GOOD + f"[api]\nsocket_group = {_missing_group()}\n"
                         "[placement]\nenabled = true\n")
    check, _agent_check = check_and_agent_check(config)
    assert f"Invalid configuration: [api] socket_group '{_missing_group()}' is not a group on " \
        "this host" in errors(check)
    assert any("[placement] enabled = true needs auth_type" in e for e in errors(check))


def test_beside_the_running_agent_its_own_socket_and_port_are_not_in_the_way(place, root):
    """``check-config && accelctl reload``: check-config runs beside the daemon,
    whose socket and metrics port are its own; ``--check`` (the unit's
    ExecStartPre, before a start) refuses them, as the start would."""
    agent_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    metrics = socket.socket()
    try:
        agent_socket.bind(place.socket_path)
        agent_socket.listen()
        metrics.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        metrics.bind(("127.0.0.1", 0))
        metrics.listen()
        port = metrics.getsockname()[1]
        config = place.write(GOOD + f"[metrics]\nlisten = 127.0.0.1:{port}\n")
        check, agent_check = check_and_agent_check(config)
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith("configuration OK")
        assert agent_check.returncode == 1
        assert f"another accel-agent already serves the API on {place.socket_path}" in errors(
            agent_check)
        assert any(f"[metrics] listen = 127.0.0.1:{port}:" in e and "in use" in e
                   for e in errors(agent_check)), agent_check.stderr
    finally:
        agent_socket.close()
        metrics.close()


@pytest.mark.parametrize("body, said", [
    ("[DEFAULT]\nlog_file = {work}/no-such-dir/agent.log\n",
     "cannot open a log file in {work}/no-such-dir ([DEFAULT] log_file, log_dir): "
     "no such directory"),
    ("[DEFAULT]\nlog_config_append = {work}/logging.ini\n",
     "cannot read [DEFAULT] log_config_append {work}/logging.ini: No such file or directory"),
], ids=["log-directory-missing", "log-config-missing"])
def test_the_logging_files_the_start_opens_are_checked_in_its_words(place, body, said):
    """oslo.log's files, which the start opens before anything else (it
    failed with a traceback): the daemon itself as a process, beside
    check-config and --check, all refuse with one line."""
    config = place.write(GOOD + body.format(work=place.work))
    said = said.format(work=place.work)
    check, agent_check = check_and_agent_check(config)
    daemon = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.agent", "--config-file", str(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in daemon.stderr, daemon.stderr
    assert errors(daemon) == ["refusing to start: invalid configuration", said]
    assert_said_by_all(errors(daemon), check, agent_check)
    assert not os.path.exists(place.socket_path)


def test_a_socket_directory_the_start_makes_or_cannot_make(place, root):
    """The start makes a missing socket directory whose parent exists (a start
    outside systemd: api.server.make_socket_dir) and refuses one whose parent
    is missing too; check-config and ``--check`` say exactly that, with the
    same function (api.server.socket_dir_unmakeable)."""
    def config(socket_path: Path) -> Path:
        place.config.write_text(
            f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {place.state_dir}\nhost = testhost\n"
            f"[api]\nsocket_path = {socket_path}\n[libvirt]\nuri =\n{GOOD}"
        )
        return place.config

    makeable = config(place.sockdir / "run" / "api.sock")
    check, agent_check = check_and_agent_check(makeable)
    assert (check.returncode, agent_check.returncode) == (0, 0), (check.stderr,
                                                                   agent_check.stderr)
    assert not (place.sockdir / "run").exists()  # a check makes nothing

    unmakeable = config(place.sockdir / "no" / "run" / "api.sock")
    check, agent_check = check_and_agent_check(unmakeable)
    said = start(unmakeable, root, writer="direct")
    assert any("does not exist, nor its parent" in line for line in said), said
    assert_said_by_all(said, check, agent_check)
    assert not (place.sockdir / "no").exists()


def test_another_agent_on_the_host_is_named_by_the_check_as_by_the_start(place, root):
    """One agent per host: another process holding the host-wide locks of
    this sysfs root and state directory (accel_agent/host_lock.py) refuses
    the start with its pid and config; check-config and ``--check`` read the
    same from /proc/locks, without taking the locks."""
    config = place.write(GOOD)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""\
            import sys
            from accel_agent import host_lock
            host_lock.take_agent_locks({root!r}, {str(place.state_dir)!r},
                                       ["/etc/other.conf"], "/run/other.sock")
            print("held", flush=True)
            sys.stdin.read()
            """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        check, agent_check = check_and_agent_check(config)
        said = start(config, root, writer="direct")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert any(f"another accel-agent (pid {holder.pid}, config /etc/other.conf)" in line
               for line in said), said
    assert_said_by_all(said, check, agent_check)
