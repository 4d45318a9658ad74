"""The real ``accel-agent`` daemon (subprocess, real privsep daemon, FUSE-simulated
host): readiness, the socket, SIGTERM draining, SIGHUP reloads, rescans that
re-create vanished mdevs, accelctl as its client, and a device backend another
distribution registers, loaded and used."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from accel_agent.devices.writers import DirectWriter
from tests import ledger_sql, toy_backend
from tests.functional.daemon_fixture import (
    BOTH,
    AgentDaemon,
    agent_config,
    ctl,
    short_dir,
    wait_for,
)
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

GPU = "0000:84:00.0"
LISTINGS = ("types", "mdevs", "inventory")
NVIDIA_ONLY = """
[devices]
enabled_mdev_types = nvidia-35
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    skip_unless_root()
    with simulated_host(
        tmp_path_factory.mktemp("daemon"), ["nvidia-pf", "mtty", "igb-sriov"], gpus=2, nics=1
    ) as host:
        yield host


class Setup:
    """One test's agent: its config file, socket and daemon."""

    def __init__(self, host, workdir: Path, sockdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.socket_path = str(sockdir / "api.sock")
        self.config = workdir / "agent.conf"
        self.daemon = AgentDaemon(self.config, self.socket_path, workdir)

    def write(self, body: str, rescan_interval: float = 60.0, extra: str = "") -> Path:
        return agent_config(
            self.config,
            self.host.root,
            self.host.state_dir,
            self.socket_path,
            body,
            rescan_interval,
            extra,
        )

    def start(self, body: str = BOTH, rescan_interval: float = 60.0) -> AgentDaemon:
        self.write(body, rescan_interval)
        return self.daemon.start()


@pytest.fixture
def setup(sim, tmp_path) -> Iterator[Setup]:
    sim.reset()
    with short_dir() as sockdir:
        state = Setup(sim, tmp_path, sockdir)
        try:
            yield state
        finally:
            state.daemon.close()
            sim.sim.call("status")  # the simulator is still healthy


def ledger_rows(host) -> dict[str, str | None]:
    return ledger_sql.owners(host.state_dir)


# --- start, socket, stop ----------------------------------------------------------------


def test_ready_notification_socket_mode_and_clean_sigterm(setup):
    daemon = setup.start()
    assert daemon.notifications[0] == "READY=1"
    st = os.lstat(setup.socket_path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    health = daemon.health()
    assert health["status"] == "ok", health
    assert health["providers"] == 3 and health["rescans"] >= 1
    assert health["reporting"]["state"] == "disabled"
    assert daemon.stop() == 0
    assert "STOPPING=1" in daemon.read_notifications()
    assert not os.path.exists(setup.socket_path)
    assert "privsep daemon exiting" in daemon.log() or "EOF on privsep" in daemon.log()


def test_refuses_to_start_when_a_regular_file_is_in_the_sockets_place(setup):
    Path(setup.socket_path).write_text("precious")
    setup.write(BOTH)
    proc = setup.daemon.spawn()
    assert proc.wait(60) == 1
    assert "not a socket" in setup.daemon.log()
    assert Path(setup.socket_path).read_text() == "precious"
    assert "READY=1" not in setup.daemon.read_notifications()


def test_stale_socket_after_sigkill_is_replaced_and_a_second_agent_refused(setup):
    daemon = setup.start()
    daemon.kill()
    assert stat.S_ISSOCK(os.lstat(setup.socket_path).st_mode)  # left behind
    daemon.start()  # replaces it
    assert daemon.health()["status"] == "ok"
    second = AgentDaemon(setup.config, setup.socket_path, setup.workdir / "second")
    (setup.workdir / "second").mkdir()
    try:
        assert second.spawn().wait(60) == 1
        # One agent per host: refused by the host-wide lock, before the
        # socket, naming the agent that runs (accel_agent/host_lock.py).
        assert (f"another accel-agent (pid {daemon.pid}, config {setup.config}) already uses "
                f"the sysfs root {os.path.realpath(setup.host.root)}") in second.log()
    finally:
        second.close()
    assert daemon.health()["status"] == "ok"  # the first one is untouched


def test_refuses_to_start_when_recovery_would_need_another_type(setup):
    setup.write(BOTH)
    assert ctl(setup.config, "--offline", "allocate", "vm-s", "--count", "1", "--parent",
               "mtty").returncode == 0
    setup.host.sim.reboot()  # the mdev must be re-created, with a type no longer configured
    setup.write(NVIDIA_ONLY)
    proc = setup.daemon.spawn()
    assert proc.wait(60) == 1
    log = setup.daemon.log()
    assert "refusing to start" in log
    assert "vm-s" in log and "mtty-2" in log and "mtty" in log
    assert not os.path.exists(setup.socket_path)


def test_release_remove_of_an_mdev_in_use_keeps_it_through_the_real_privsep_helper(setup):
    """The in-use probe runs in the privsep helper, beside the write it guards:
    a process holding the VFIO group makes release --remove answer 409 at once
    (no remove write reaches the kernel), the mdev stays free and owned, and
    the kept removal is counted."""
    daemon = setup.start()
    client = daemon.client()
    uuid = client.allocate("vm-k", 1)["mdevs"][0]["uuid"]
    group = os.path.basename(os.readlink(
        os.path.join(setup.host.root, "bus", "mdev", "devices", uuid, "iommu_group")))
    blocked_before = setup.host.sim.status()["blocked_removes"]
    fd = os.open(os.path.join(setup.host.root, "vfio", group), os.O_RDONLY)
    try:
        with pytest.raises(exception.ApiError) as info:
            client.release("vm-k", remove=True)
    finally:
        os.close(fd)
    assert info.value.kwargs["status"] == 409 and info.value.kwargs["code"] == "MdevInUse"
    assert uuid in info.value.message
    assert setup.host.sim.status()["blocked_removes"] == blocked_before
    assert uuid in setup.host.sysfs_uuids()
    assert ledger_rows(setup.host) == {uuid: None}  # released, kept, owned
    assert daemon.metric("accel_agent_mdevs_kept_in_use_total") == 1
    # Nothing holds it any more: the next allocation reuses it.
    assert [m["uuid"] for m in client.allocate("vm-l", 1)["mdevs"]] == [uuid]


def test_sigterm_lets_the_request_in_flight_finish(setup):
    daemon = setup.start()
    client = daemon.client()
    uuid = client.allocate("vm-d", 1)["mdevs"][0]["uuid"]
    # A VM opens it right after the in-use probe: the remove write blocks.
    setup.host.sim.hold(uuid, after_probe=True)
    answers: list[object] = []

    def release() -> None:
        try:
            answers.append(client.release("vm-d", remove=True))
        except exception.AccelAgentException as exc:
            answers.append(exc)

    worker = threading.Thread(target=release, daemon=True)
    worker.start()
    wait_for(lambda: setup.host.sim.status()["blocked_removes"], what="the blocked remove")
    daemon.signal(signal.SIGTERM)

    def refused() -> bool:
        try:
            daemon.client(timeout=2).health()
        except exception.AgentNotRunning:
            return True
        except exception.AgentUnreachable:
            pass  # accepted while the listener was closing
        return False

    wait_for(refused, what="the socket to stop accepting")
    assert daemon.running  # still serving the request in flight
    setup.host.sim.release(uuid)
    worker.join(60)
    assert answers and isinstance(answers[0], dict), answers
    assert answers[0] == {"instance": "vm-d", "released": [uuid], "removed": True}
    assert daemon.wait_exit() == 0
    assert uuid not in setup.host.sysfs_uuids()


# --- accelctl as a client ---------------------------------------------------------------


def test_accelctl_uses_the_daemon_and_acts_directly_when_it_is_gone(setup):
    daemon = setup.start()
    proc = ctl(setup.config, "allocate", "vm-c", "--count", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    uuids = [m["uuid"] for m in json.loads(proc.stdout)["mdevs"]]
    assert daemon.metric("accel_agent_allocations_total") == 1.0  # it went through the API
    # Each mdev names its instance and its GPU as DCGM does (docs/metrics.md).
    for uuid in uuids:
        labels = {"uuid": uuid, "instance_id": "vm-c", "state": "assigned"}
        wait_for(lambda labels=labels: daemon.metric("accel_agent_mdev_info", **labels) == 1.0,
                 what=f"accel_agent_mdev_info of {uuid}")
        join = {"Hostname": os.uname().nodename, "pci_bus_id": "00000000:84:00.0"}
        assert daemon.metric("accel_agent_mdev_info", uuid=uuid, mdev_type="nvidia-35",
                             physical_gpu=GPU, **join) == 1.0
    for listing in ("types", "mdevs", "inventory"):
        route = {"method": "GET", "route": f"/v1/{listing}", "status": "200"}
        served = daemon.metric("accel_agent_api_request_duration_seconds_count", **route)
        via_api = ctl(setup.config, listing, "--json")
        offline = ctl(setup.config, "--offline", listing, "--json")
        assert via_api.returncode == offline.returncode == 0, via_api.stderr
        # Into a pipe the daemon's body is printed as sent: the same bytes.
        assert via_api.stdout == offline.stdout, listing
        json.loads(via_api.stdout)
        after = daemon.metric("accel_agent_api_request_duration_seconds_count", **route)
        assert after == served + 1, listing
    table = ctl(setup.config, "inventory").stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in table}
    assert rows["testhost_pci_0000_84_00_0"][3:5] == ["16", "2"]  # total, used
    refused = ctl(setup.config, "allocate", "vm-x", "--count", "64")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: insufficient capacity")
    assert ctl(setup.config, "adopt", "not-a-uuid").returncode == 1
    xml = ctl(setup.config, "domain-xml", "vm-c").stdout
    assert xml.count("<hostdev") == 2 and all(u in xml for u in uuids)
    # --json through the daemon: its text, split into elements (issue 25).
    document = json.loads(ctl(setup.config, "domain-xml", "vm-c", "--json").stdout)
    assert document["xml"] == xml.rstrip("\n")
    assert sorted(d["uuid"] for d in document["devices"]) == sorted(uuids)
    report = json.loads(ctl(setup.config, "recover", "--json").stdout)
    assert report["recreated"] == []
    # --offline acts directly even though the daemon runs (the file lock serialises)
    assert ctl(setup.config, "--offline", "release", "vm-c").returncode == 0
    assert daemon.metric("accel_agent_releases_total", remove="false") == 0.0
    assert daemon.stop() == 0
    # no daemon: direct mode
    proc = ctl(setup.config, "allocate", "vm-c2", "--count", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "vm-c2" in ledger_rows(setup.host).values()


def test_listings_from_the_daemon_show_an_mdev_made_behind_its_back_at_once(setup):
    """No periodic rescan (an hour) and no udev on a simulated host: only the
    listing's own re-read of the mdev list can see another process's create."""
    daemon = setup.start(rescan_interval=3600)
    api = daemon.client()
    before = {name: api.call_json_bytes("GET", f"/v1/{name}") for name in LISTINGS}
    assert api.call_json_bytes("GET", "/v1/types") == before["types"]  # kept while unchanged
    foreign = "fe0fe0fe-0000-4000-8000-0000000000aa"
    setup.host.create_foreign(GPU, "nvidia-35", foreign)
    after = {name: json.loads(api.call_json_bytes("GET", f"/v1/{name}")) for name in LISTINGS}
    gpu = next(p for p in after["types"]["parents"] if p["name"] == GPU)
    counters = {t["type_id"]: (t["available_instances"], t["mdevs"]) for t in gpu["types"]}
    assert counters["nvidia-35"] == (15, 1)
    assert counters["nvidia-36"][0] == 0  # one type per M60: the others' counters moved too
    listed = {m["uuid"]: m for m in after["mdevs"]["mdevs"]}
    assert listed[foreign]["owned"] is False and listed[foreign]["instance"] is None
    provider = next(p for p in after["inventory"]["providers"] if p["parent_device"] == GPU)
    assert provider["inventory"]["total"] == 16  # the foreign mdev counts against capacity
    for name in LISTINGS:  # exactly what a full scan says
        offline = ctl(setup.config, "--offline", name, "--json")
        assert json.loads(offline.stdout) == after[name], name
    with open(os.path.join(setup.host.root, "bus/mdev/devices", foreign, "remove"), "w") as f:
        f.write("1")
    gone = json.loads(api.call_json_bytes("GET", "/v1/types"))
    assert gone == json.loads(before["types"])
    assert daemon.metric("accel_agent_rescans_total", reason="periodic") == 0.0


# Modules accelctl's plain listing path must not need (plain_listing.py).
HEAVY = ("oslo_config", "argparse", "http.client", "accel_agent.cmd.ctl", "accel_agent.api")
PROBE = """
import sys
from accel_agent.cmd import accelctl
sys.argv[1:] = {argv!r}
status = accelctl.main()
sys.stdout.flush()
heavy = {heavy!r}
sys.stderr.write(repr(sorted(m for m in sys.modules if m.startswith(heavy))))
sys.exit(status)
"""


def plain(config, *argv: str) -> tuple[int, str, list[str]]:
    """The accelctl console script's main() with these arguments: (status,
    stdout, the HEAVY modules it imported)."""
    code = PROBE.format(argv=["--config-file", str(config), *argv], heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=str(Path(__file__).resolve().parents[2]))
    return proc.returncode, proc.stdout, ast.literal_eval(proc.stderr.splitlines()[-1])


def test_plain_listings_reach_the_daemon_without_oslo_config_or_the_parser(setup):
    daemon = setup.start()
    assert ctl(setup.config, "allocate", "vm-p", "--count", "1").returncode == 0
    # The first listing after a config change loads oslo.config and caches it.
    assert ctl(setup.config, "types", "--json").returncode == 0
    for name in LISTINGS:
        route = {"method": "GET", "route": f"/v1/{name}", "status": "200"}
        served = daemon.metric("accel_agent_api_request_duration_seconds_count", **route)
        status, out, heavy = plain(setup.config, name, "--json")
        assert (status, heavy) == (0, []), name
        assert daemon.metric("accel_agent_api_request_duration_seconds_count", **route) == (
            served + 1
        ), f"{name} did not come from the daemon"
        assert out == ctl(setup.config, "--offline", name, "--json").stdout, name
    assert daemon.stop() == 0
    # No daemon: the same plain path scans sysfs itself, still without them.
    for name in LISTINGS:
        status, out, heavy = plain(setup.config, name, "--json")
        assert (status, heavy) == (0, []), name
        assert out == ctl(setup.config, "--offline", name, "--json").stdout, name
    # A terminal, a table or -v: the parser path (which imports them).
    status, out, heavy = plain(setup.config, "-v", "types", "--json")
    assert status == 0 and "argparse" in heavy


def test_accelctl_fails_instead_of_falling_back_when_the_daemon_is_broken(setup):
    setup.write(BOTH)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(setup.socket_path)
    listener.listen(8)

    def garbage() -> None:  # a "daemon" that answers nonsense
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"this is not HTTP\r\n\r\n")

    threading.Thread(target=garbage, daemon=True).start()
    try:
        proc = ctl(setup.config, "allocate", "vm-b", "--count", "1")
        assert proc.returncode == 1
        assert "cannot talk to accel-agent" in proc.stderr
        assert ledger_rows(setup.host) == {}  # no second writer
        assert setup.host.sysfs_uuids() == set()
        assert ctl(setup.config, "--offline", "types").returncode == 0
    finally:
        listener.close()


# --- SIGHUP --------------------------------------------------------------------------


def provider_names(daemon: AgentDaemon) -> set[str]:
    return {p["name"] for p in daemon.client().inventory()["providers"]}


def test_sighup_applies_a_changed_type_list_without_restart(setup):
    daemon = setup.start(NVIDIA_ONLY)
    pid = daemon.pid
    assert "testhost_mtty_mtty" not in provider_names(daemon)
    setup.write(BOTH)
    daemon.sighup()
    wait_for(lambda: "testhost_mtty_mtty" in provider_names(daemon), what="the mtty provider")
    assert daemon.pid == pid and daemon.running
    wait_for(lambda: daemon.read_notifications().count("READY=1") == 2, what="READY=1 again")
    notes = daemon.notifications
    assert notes.index("RELOADING=1") < len(notes) - 1 - notes[::-1].index("READY=1")
    assert daemon.health()["config"]["last_reload_result"] == "applied"
    # the new type is usable at once
    assert daemon.client().allocate("vm-h", 1, parent="mtty")["mdevs"][0]["mdev_type"] == "mtty-2"


def test_sighup_that_would_orphan_an_assigned_mdev_is_refused(setup):
    daemon = setup.start(BOTH)
    uuid = daemon.client().allocate("vm-o", 1, parent="mtty")["mdevs"][0]["uuid"]
    before = daemon.client().inventory()
    setup.write(NVIDIA_ONLY)
    daemon.sighup()
    wait_for(
        lambda: daemon.health()["config"]["last_reload_result"] == "refused",
        what="the refusal",
    )
    health = daemon.health()
    assert health["status"] == "degraded"
    assert uuid in health["config"]["last_reload_error"]
    log = daemon.log()
    assert "configuration reload refused" in log and uuid in log and "vm-o" in log
    assert daemon.client().inventory() == before  # old configuration kept
    assert daemon.client().allocation("vm-o")["mdevs"][0]["uuid"] == uuid
    # A config error is refused too, with check-config's own message.
    setup.write(BOTH + "[mdev_nvidia-35]\ndevice_addresses = 84:00.0, 0000:84:00.0\n")
    daemon.sighup()
    wait_for(lambda: "duplicate" in (daemon.health()["config"]["last_reload_error"] or ""),
             what="the duplicate-address refusal")
    # Releasing the mdev makes the same reload acceptable.
    daemon.client().release("vm-o", remove=True)
    setup.write(NVIDIA_ONLY)
    daemon.sighup()
    wait_for(lambda: "testhost_mtty_mtty" not in provider_names(daemon), what="mtty to go")
    wait_for(lambda: daemon.health()["status"] == "ok", what="health ok after the reload")
    assert daemon.health()["config"]["last_reload_result"] == "applied"


def sighup_mask(pid: int) -> tuple[bool, bool]:
    """(blocked, caught): SIGHUP in the main thread's SigBlk and SigCgt."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    bit = 1 << (signal.SIGHUP - 1)
    return bool(int(fields["SigBlk"], 16) & bit), bool(int(fields["SigCgt"], 16) & bit)


def test_sighup_is_held_from_the_first_statement_and_sigterm_goes_ahead_of_reloads(setup):
    """Issue 33 item 6.  A SIGHUP right after exec (systemctl reload after a
    start) is held, then one reload, never the end of the process: SIGHUP is
    blocked before any handler exists, read from /proc, then caught.  A
    SIGTERM behind 50 SIGHUPs that wait for a running reload stops the agent
    (exit 0) without running them."""
    setup.write(BOTH)
    # Paused after the configuration's check, before service.run: the same
    # instant on every run (tests/functional/paused_start.py).
    gate = setup.workdir / "gate"
    gate.mkdir()
    os.mkfifo(gate / "go")
    setup.daemon.command = [sys.executable, str(Path(__file__).with_name("paused_start.py")),
                            str(gate)]
    try:
        proc = setup.daemon.spawn()
    finally:
        setup.daemon.command = None
    wait_for(lambda: (gate / "paused").exists() or proc.poll() is not None, timeout=120,
             what="the start paused before service.run")
    assert proc.poll() is None, setup.daemon.log()
    assert sighup_mask(proc.pid) == (True, False), "SIGHUP is not blocked before its handler"
    os.kill(proc.pid, signal.SIGHUP)
    with open(gate / "go", "w") as go:
        go.write("go\n")
    setup.daemon.wait_ready()
    wait_for(lambda: "configuration reloaded" in setup.daemon.log(), what="the held reload")
    assert sighup_mask(proc.pid) == (False, True)
    # The manager's lock, held here, keeps the next reload at its apply.
    from oslo_concurrency import lockutils

    from accel_agent.devices.protocol import LOCK_NAME

    started, done = "reloading the configuration from", "configuration reloaded"
    with lockutils.lock(LOCK_NAME, external=True, lock_path=setup.host.state_dir):
        before, finished = setup.daemon.log().count(started), setup.daemon.log().count(done)
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: setup.daemon.log().count(started) == before + 1,
                 what="a reload waiting for the manager's lock")
        for _ in range(50):
            os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: "one more reload follows it" in setup.daemon.log(),
                 what="a reload waiting behind the running one")
        os.kill(proc.pid, signal.SIGTERM)
        wait_for(lambda: "SIGTERM received" in setup.daemon.log(), what="SIGTERM acted on")
        assert setup.daemon.log().count(done) == finished  # it still waits for the lock
    assert setup.daemon.wait_exit(60) == 0
    assert setup.daemon.log().count(started) == before + 1, "a waiting reload ran"


# --- rescans -----------------------------------------------------------------------


def test_an_mdev_removed_behind_the_agents_back_is_recreated_within_a_rescan(setup):
    daemon = setup.start(BOTH, rescan_interval=1.0)
    client = daemon.client()
    uuids = [m["uuid"] for m in client.allocate("vm-r", 2)["mdevs"]]
    parent = client.allocation("vm-r")["mdevs"][0]["parent"]
    # The rescan the allocation asked for is done: only periodic ones follow.
    wait_for(lambda: daemon.health()["mdevs"]["assigned"] == 2, what="the post-allocate rescan")
    remove = Path(setup.host.root, "bus", "mdev", "devices", uuids[0], "remove")
    fd = os.open(remove, os.O_WRONLY)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    assert uuids[0] not in setup.host.sysfs_uuids()
    wait_for(lambda: uuids[0] in daemon.health()["recovery"]["recreated"], what="recovery")
    assert set(uuids) <= setup.host.sysfs_uuids()
    mdevs = {m["uuid"]: m for m in client.mdevs()["mdevs"]}
    assert mdevs[uuids[0]]["instance"] == "vm-r" and mdevs[uuids[0]]["parent"] == parent
    used = {p["name"]: p["used"] for p in client.inventory()["providers"]}
    assert used["testhost_pci_" + parent.replace(":", "_").replace(".", "_")] == 2
    assert daemon.metric("accel_agent_recreated_mdevs_total") >= 1
    assert daemon.metric("accel_agent_rescans_total", reason="periodic") >= 1

    # The parent goes away (driver unloaded): nothing to re-create on, reported...
    setup.host.sim.unregister(parent)
    wait_for(lambda: daemon.health()["recovery"]["waiting_for_parent"], what="waiting")
    assert daemon.health()["status"] == "degraded"
    assert parent not in {p["name"] for p in client.types()["parents"]}
    # ...and back when it re-registers, with the same UUIDs.
    setup.host.sim.register(parent)
    wait_for(lambda: set(uuids) <= setup.host.sysfs_uuids(), what="re-created after register")
    wait_for(lambda: daemon.health()["status"] == "ok", what="health ok again")
    assert {m["uuid"] for m in client.allocation("vm-r")["mdevs"]} == set(uuids)


# --- systemd ------------------------------------------------------------------------


def test_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = Path(__file__).resolve().parents[2] / "systemd" / "accel-agent.service"
    text = unit.read_text()
    assert "Type=notify" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text
    # verify checks that ExecStart= exists: point it at this checkout's script.
    script = os.path.join(os.path.dirname(sys.executable), "accel-agent")
    if not os.path.exists(script):
        pytest.skip("the accel-agent console script is not installed")
    copy = tmp_path / "accel-agent.service"
    copy.write_text(text.replace("/usr/bin/accel-agent", script))
    proc = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for complaint in ("Unknown key", "Unknown section", "ignoring", "Failed", "not executable"):
        assert complaint not in output, output


# --- a backend from another distribution ----------------------------------------------------

IGB_PF = "0000:10:00.0"  # the igb-sriov profile's port; its first VFs:
TOY_VFS = ["0000:10:10.0", "0000:10:10.2"]
TOY = f"""
[devices]
enabled_mdev_types = {toy_backend.TYPE}
[mdev_{toy_backend.TYPE}]
device_addresses = {IGB_PF}
[{toy_backend.NAME}]
give_back = false
"""


def _driver(host, address: str) -> str | None:
    link = os.path.join(host.root, "bus", "pci", "devices", address, "driver")
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else None


def test_a_backend_another_distribution_registers_is_loaded_and_used(setup, tmp_path,
                                                                     monkeypatch):
    """Issue 35: the toy_vf backend (tests/toy_backend.py), installed as a
    distribution of its own on the daemon's PYTHONPATH and named nowhere in
    the agent, is loaded by the daemon through its entry point: its parents
    are scanned and listed (by the offline listing too), an allocation on
    them is made by its make() and a release unmade by its destroy(), with
    the option it declares ([toy_vf] give_back) read by the daemon."""
    site = toy_backend.install(tmp_path / "site")
    trace = tmp_path / "toy.trace"
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("TOYVF_TRACE", str(trace))
    DirectWriter(setup.host.root).set_num_vfs(IGB_PF, 2)  # the NIC's VFs, as its driver enables
    daemon = setup.start(TOY)
    # The start's check scanned with it too, and knew its option.
    assert f"{IGB_PF} (configured for" not in daemon.log()
    assert "unknown section [toy_vf]" not in daemon.log()
    client = daemon.client()
    parents = {p["name"]: p for p in client.types()["parents"] if p["backend"] == "toy_vf"}
    assert sorted(parents) == TOY_VFS
    assert {p["configured_type"] for p in parents.values()} == {toy_backend.TYPE}
    (provider,) = client.inventory()["providers"]
    assert (provider["physical_gpu"], provider["inventory"]["total"]) == (IGB_PF, 2)
    # accelctl's offline listing scans with it too (another distribution registers a backend).
    offline = ctl(setup.config, "--offline", "types", "--json")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout) == json.loads(ctl(setup.config, "types", "--json").stdout)

    (device,) = client.allocate("vm-toy", 1)["mdevs"]
    vf, uuid = device["parent"], device["uuid"]
    assert vf in TOY_VFS and device["mdev_type"] == toy_backend.TYPE
    assert trace.read_text().splitlines() == [f"made {vf} {toy_backend.TYPE} {uuid}"]
    assert _driver(setup.host, vf) == "vfio-pci"
    assert ledger_sql.owners(setup.host.state_dir) == {uuid: "vm-toy"}
    wait_for(lambda: any(m["uuid"] == uuid and m["backend"] == "toy_vf" and m["instance"]
                         == "vm-toy" for m in client.mdevs()["mdevs"]), what="the toy device")

    client.release("vm-toy")
    assert trace.read_text().splitlines()[1:] == [f"unmade {vf} {uuid} give_back=False"]
    assert _driver(setup.host, vf) is None  # [toy_vf] give_back = false, as configured
    assert ledger_sql.owners(setup.host.state_dir) == {}
    assert daemon.stop() == 0
