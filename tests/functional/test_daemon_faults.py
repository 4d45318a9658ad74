"""The real daemon when what it stands on changes under it: its privileged
helper restarted after the config file was edited, its ledger deleted,
replaced, corrupted or on a full disk, a reload that fails.  Nothing is
lost silently: the daemon refuses, says so in /v1/health, and its log and
accelctl say what is wrong."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.functional.daemon_fixture import (
    BOTH,
    AgentDaemon,
    SimAgent,
    agent_config,
    ctl,
    short_dir,
    sim_agent,
    wait_for,
)
from tests.functional.privsep_fixture import _find_daemon_pid, skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

FOREIGN = "f0f0f0f0-0000-4000-8000-0000000000aa"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("faults"), ["nvidia-pf", "mtty"], gpus=2) as host:
        yield host


@pytest.fixture
def agent(sim, tmp_path) -> Iterator[SimAgent]:
    with sim_agent(sim, tmp_path) as setup:
        yield setup


# --- 4. the privileged helper acts on the agent's view ------------------------------------


def test_a_restarted_privsep_helper_acts_on_the_agents_sysfs_root(agent):
    other = agent.workdir / "other-sys"
    materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty"], gpus=2)), str(other))
    creates = sorted(other.glob("devices/**/create"))
    assert creates
    daemon = agent.daemon.start()
    first = daemon.client().allocate("vm-1", 1)
    assert first["mdevs"][0]["uuid"] in agent.host.sysfs_uuids()
    # An operator points the config file elsewhere (a restart would apply it)...
    agent.write(sysfs_root=str(other))
    # ...and the helper dies; oslo.privsep starts a new one on the next call,
    # which reads the edited file.
    os.kill(_find_daemon_pid(agent.config.resolve()), signal.SIGKILL)

    def allocate() -> dict | None:
        # A call that meets the dead helper before the agent noticed its death
        # is answered 503 "retry later" (the API's contract), as a client
        # would be on a loaded host: it retries, as a client must.
        try:
            return daemon.client().allocate("vm-2", 1)
        except exception.ApiError as exc:
            if exc.kwargs.get("code") != "PrivilegedHelperUnavailable":
                raise
            return None

    second = wait_for(allocate, what="an allocate through the new helper")
    uuid = second["mdevs"][0]["uuid"]
    assert uuid in agent.host.sysfs_uuids()
    assert all(path.read_bytes() == b"" for path in creates), "wrote into the other tree"
    # The new helper really is another process, reading the edited file.
    assert "sysfs_root = " + str(other) in agent.config.read_text()
    wait_for(lambda: _find_daemon_pid(agent.config.resolve()), what="the new helper")


# --- 5. the ledger cannot vanish or rot silently ----------------------------------------

LEDGER = "ledger.sqlite3"


def api_error(call) -> exception.ApiError:
    with pytest.raises(exception.ApiError) as info:
        call()
    return info.value


def test_a_ledger_deleted_under_the_running_daemon_refuses_changes_and_says_so(agent):
    daemon = agent.daemon.start()
    client = daemon.client()
    kept = client.allocate("vm-1", 1)["mdevs"][0]["uuid"]
    os.unlink(Path(agent.host.state_dir) / LEDGER)
    error = api_error(lambda: client.allocate("vm-2", 1))
    assert (error.kwargs["status"], error.kwargs["code"]) == (503, "LedgerReplaced")
    assert agent.host.sysfs_uuids() == {kept}  # nothing made that no record would name
    health = client.health()
    assert health["status"] == "degraded"
    assert any("deleted or replaced" in p for p in health["problems"]), health["problems"]


def _damage_pages(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        for page in range(1, size // 4096):  # every b-tree page header but the first page's
            handle.seek(page * 4096)
            handle.write(b"\xa5" * 16)


@pytest.mark.parametrize("damage", ["no database", "damaged pages"])
def test_a_corrupt_ledger_is_reported_as_such_and_the_agent_refuses_to_start(agent, damage):
    daemon = agent.daemon.start()
    daemon.client().allocate("vm-1", 2)
    assert daemon.stop() == 0
    ledger = Path(agent.host.state_dir) / LEDGER
    if damage == "no database":
        ledger.write_bytes(os.urandom(ledger.stat().st_size))
    else:
        _damage_pages(ledger)
    daemon.spawn()
    assert daemon.wait_exit(90) == 1
    log = daemon.log().rsplit("===== run", 1)[-1]
    assert "is corrupt" in log, log[-3000:]
    assert "invalid configuration" not in log
    assert "Traceback" not in log
    # accelctl recover --check says the same, and changes nothing.
    before = ledger.read_bytes()
    result = ctl(agent.config, "--offline", "recover", "--check")
    assert result.returncode == 1, result.stderr
    assert "is corrupt" in result.stderr
    assert ledger.read_bytes() == before


def test_recover_check_passes_on_a_sound_ledger(agent):
    daemon = agent.daemon.start()
    daemon.client().allocate("vm-1", 1)
    result = ctl(agent.config, "recover", "--check")
    assert result.returncode == 0, result.stderr
    assert "recovery done" in result.stdout


def test_a_missing_ledger_while_mdevs_look_like_the_agents_is_a_loud_warning(agent):
    daemon = agent.daemon.start()
    lost = daemon.client().allocate("vm-1", 1)["mdevs"][0]["uuid"]
    assert daemon.stop() == 0
    for name in os.listdir(agent.host.state_dir):
        if name.startswith(LEDGER):
            os.unlink(Path(agent.host.state_dir) / name)
    # A hand-made mdev of a type the config does not give its parent: foreign, not "ours".
    agent.host.create_foreign("mtty", "mtty-1", FOREIGN)
    daemon.start()
    health = daemon.client().health()
    assert health["status"] == "degraded"
    problem = next(p for p in health["problems"] if "was missing" in p)
    assert lost in problem and FOREIGN not in problem
    assert "was missing" in daemon.log()
    result = ctl(agent.config, "recover")
    assert result.returncode == 0, result.stderr
    assert "was missing" in result.stderr and lost in result.stderr
    assert f"unrecorded: {lost}" in result.stdout
    # Adopting it (it is the agent's) settles it.
    assert ctl(agent.config, "adopt", lost).returncode == 0
    wait_for(lambda: daemon.client().health()["status"] == "ok", what="health ok again")


@pytest.mark.parametrize(
    "broken",
    [b"\n[devices\nenabled_mdev_types = mtty-2\n", b"\n# not UTF-8: \xff\xfe\n"],
    ids=["unparsable", "not-utf8"],
)
def test_a_reload_that_cannot_read_the_config_degrades_health(agent, broken):
    daemon = agent.daemon.start()
    good = agent.config.read_bytes()
    agent.config.write_bytes(good + broken)
    daemon.sighup()
    health = wait_for(
        lambda: (h := daemon.client().health())["status"] == "degraded" and h,
        what="health degraded after a failed reload",
    )
    assert any("reload" in p for p in health["problems"]), health["problems"]
    agent.config.write_bytes(good)
    daemon.sighup()
    wait_for(lambda: daemon.client().health()["status"] == "ok", what="health ok again")


def test_a_full_disk_under_the_ledger_degrades_health(sim, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    sim.reset()
    try:
        with short_dir() as sockdir:
            socket_path = str(sockdir / "api.sock")
            config = agent_config(tmp_path / "agent.conf", sim.root, str(small / "state"),
                                  socket_path, BOTH)
            daemon = AgentDaemon(config, socket_path, tmp_path)
            try:
                client = daemon.start().client()
                client.allocate("vm-1", 1)
                assert client.health()["status"] == "ok"
                filler = small / "filler"
                with contextlib.suppress(OSError), open(filler, "wb") as handle:
                    while True:
                        handle.write(b"\0" * 65536)
                        handle.flush()
                health = client.health()
                assert health["status"] == "degraded"
                assert any("no space left" in p for p in health["problems"]), health
                # Changes now fail cleanly (503) or fit in what is left; never a 500.
                for i in range(20):
                    try:
                        client.allocate(f"vm-full-{i}", 1)
                    except exception.ApiError as exc:
                        assert exc.kwargs["status"] == 503, exc.message
                        assert exc.kwargs["code"] in ("LedgerWriteFailed", "LedgerError")
                filler.unlink()
                client.release("vm-1")  # a write that succeeds clears the last failure
                wait_for(lambda: client.health()["status"] == "ok", what="health ok again")
            finally:
                daemon.close()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_recover_does_not_report_an_mdev_it_just_removed_as_foreign(sim):
    sim.reset()
    manager = sim.manager(BOTH)
    try:
        uuid = manager.allocate("vm-1", 1).uuids[0]
        manager.release("vm-1")
        # A crash after the remove intent was recorded, before the sysfs write.
        manager.ledger.record_remove_intent(uuid)
        report = manager.recover()
        assert uuid in report.removed
        assert uuid not in report.foreign
        assert uuid not in sim.sysfs_uuids()
    finally:
        manager.ledger.close()
