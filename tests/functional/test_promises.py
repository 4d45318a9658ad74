"""Promises that no other test protected: each one here fails when its promise
breaks (tests/faults/promise-*.patch prove it).

In-process managers on one FUSE-simulated host (an mtty parent, an NVIDIA
vGPU 17+ GPU, an igb NIC port), every write through the real privileged
code (``DirectWriter``), every outcome read back from the simulator:

* a vendor-VFIO VF a VM holds is never untyped: no write reaches its
  ``current_vgpu_type`` on any path (release --remove, detach, rollback,
  recovery), also when the driver would accept the ``0`` (the in-use probe
  alone protects it);
* a pool VF a VM holds refuses its detach with 409 and keeps its settings;
* migration claims: ``abort --remove`` spares an mdev a libvirt domain
  references, ``commit`` refuses an instance that holds devices and changes
  nothing, offline ``accelctl recover`` frees expired claims and says so;
* after a config change and a reboot, free devices of a dropped type are
  neither re-created nor kept in the ledger, assigned ones refuse recovery.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accel_agent import exception
from accel_agent.attach_requests import parse
from accel_agent.backends import builtin
from accel_agent.backends.sriov_vf import SriovVfBackend, device_uuid
from accel_agent.devices import domains as domains_mod
from accel_agent.devices.writers import DirectWriter
from accel_agent.migration.destination import MigrationDestination
from accel_agent.migration.versions import HostVersions
from accel_agent.sriov.pools import build_pools
from accel_agent.sriov.vfpool import VfPools
from accel_agent.sysfs import nvidia_vfio
from tests import ledger_sql
from tests.configutil import make_conf
from tests.functional.killharness import typed_vfs
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import SimHost, simulated_host
from tests.functional.vfnet import RESET, StateFileNet
from tests.unit.test_api_app import call

pytestmark = [pytest.mark.fuse]

GPU = "0000:c1:00.0"  # the nvidia-vfio GPU; its VFs are 0000:c1:00.4 ...
PF0 = "0000:10:00.0"  # the igb port; its VFs are 0000:10:10.0, 0000:10:10.2
VGPU_TYPE = "nvidia-1150"  # NVIDIA L40S-4Q
VGPU_ID = 1150
MAC = "52:54:00:12:34:01"
SOURCE = "5a000000-0000-4000-8000-000000000001"  # a migration source's mdev
SOURCE2 = "5a000000-0000-4000-8000-000000000002"
CONF = f"""
[devices]
enabled_mdev_types = mtty-2, {VGPU_TYPE}
enabled_vf_pools = nic_a
[mdev_mtty-2]
device_addresses = mtty
[mdev_{VGPU_TYPE}]
device_addresses = {GPU}
[vf_pool_nic_a]
device_addresses = {PF0}
resource_class = CUSTOM_NIC_A
num_vfs = 2
[libvirt]
uri =
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHost]:
    skip_unless_root()  # the VF hand-over and the group probes are root's writes
    with simulated_host(
        tmp_path_factory.mktemp("promises"), ["mtty", "nvidia-vfio", "igb-sriov"],
        gpus=1, vfs=4, nics=1,
    ) as host:
        yield host


class Env:
    """The agent's manager (every backend, a VF pool whose network half is a
    state file) on the simulated host, and what sysfs says independently."""

    def __init__(self, host: SimHost, conf: str = CONF, **manager_kwargs: Any) -> None:
        self.host = host
        self.net = StateFileNet(str(host.work / "vfnet.json"))
        self.pools = VfPools(
            host.root, build_pools(make_conf(conf, sysfs_root=host.root)),
            DirectWriter(host.root), self.net, host="testhost",
        )
        backends = {**builtin(), "sriov_vf": SriovVfBackend(self.pools)}
        self.manager = host.manager(conf, backends=backends, **manager_kwargs)
        self.pools.ensure_num_vfs()

    def attach(self, instance: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return self.manager.attach(instance, parse(requests, self.pools.pools)).to_dict()

    def typed(self) -> dict[str, int]:
        """VF -> vGPU type id of every typed VF, read from sysfs."""
        return {vf: value for vf, value in typed_vfs(self.host.root).items() if value}

    def driver(self, vf: str) -> str | None:
        link = os.path.join(self.host.root, "bus", "pci", "devices", vf, "driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def rows(self) -> dict[str, tuple[str | None, str | None, str]]:
        """uuid -> (owner, owner kind, state), read with plain SQL (never a
        second Ledger beside the manager's in this process)."""
        rows = ledger_sql.rows(self.host.state_dir)
        return {r.uuid: (r.owner, r.owner_kind, r.state) for r in rows}


@pytest.fixture
def env(sim: SimHost) -> Iterator[Env]:
    sim.reset()  # a reboot: no mdev, every VF untyped, no pool VF; no ledger
    for name in ("vfnet.json", "vfnet.json.lock"):
        (sim.work / name).unlink(missing_ok=True)
    setup = Env(sim)
    try:
        yield setup
    finally:
        setup.manager.ledger.close()


def api(env: Env) -> Callable[..., tuple[int, dict[str, str], Any]]:
    """The real WSGI application over the real AgentCore and this manager."""
    from accel_agent.api.app import ApiApplication
    from accel_agent.daemon.core import AgentCore

    conf = make_conf(CONF + f"\n[DEFAULT]\nstate_dir = {env.host.state_dir}\n",
                     sysfs_root=env.host.root)
    app = ApiApplication(AgentCore(conf, manager=env.manager))
    return lambda method, uri, body=None: call(app, method, uri, body)


# --- a vendor-VFIO VF in use is never untyped -------------------------------------------


def last_write(env: Env) -> int:
    writes = env.host.sim.status(counters=False)["vgpu_writes"]
    return writes[-1]["seq"] if writes else 0


def held_writes(env: Env, since: int) -> list[dict[str, Any]]:
    """Writes to a ``current_vgpu_type`` that reached the driver while a VM held
    that VF, after write number ``since``: what must never happen."""
    writes = env.host.sim.status(counters=False)["vgpu_writes"]
    return [w for w in writes if w["seq"] > since and w["held"]]


def held_vgpu(env: Env, instance: str, via_attach: bool = False) -> tuple[str, str]:
    """One vGPU VF given to ``instance``, then held by its VM: (VF, device UUID)."""
    if via_attach:
        (handle,) = env.attach(instance, [{"mdev_type": VGPU_TYPE, "count": 1}])["attachments"]
        vf, uuid = handle["address"], handle["uuid"]
    else:
        (record,) = env.manager.allocate(instance, 1, device_type=VGPU_TYPE).mdevs
        vf, uuid = record.parent, record.uuid
    env.host.sim.hold(vf)
    return vf, uuid


def assert_kept_typed_and_free(env: Env, vf: str, uuid: str, since: int) -> None:
    assert held_writes(env, since) == []  # not one write reached the held VF
    assert env.typed()[vf] == VGPU_ID  # the VM's vGPU is still there
    assert env.rows()[uuid] == (None, None, "present")  # free, owned: never leaked


DRIVERS = [pytest.param(False, id="driver-refuses"), pytest.param(True, id="driver-accepts")]


def driver_answer(env: Env, accepts: bool) -> None:
    """``accepts``: a driver that destroys a held vGPU when told to (only the
    agent's in-use probe then stands between the write and the VM)."""
    env.host.sim.accept_held_vgpu_destroy(accepts)


@pytest.mark.parametrize("accepts", DRIVERS)
def test_release_remove_never_writes_to_a_held_vf(env: Env, accepts: bool) -> None:
    driver_answer(env, accepts)
    vf, uuid = held_vgpu(env, "vm-1")
    since = last_write(env)
    # A VF's own class (an in-use error as an mdev's is), naming its kind.
    with pytest.raises(exception.VfInUse) as info:
        env.manager.release("vm-1", remove=True)
    assert isinstance(info.value, exception.DeviceInUse)
    assert not isinstance(info.value, exception.MdevInUse)
    assert uuid in info.value.message and f"vGPU VF {vf} is in use" in info.value.message
    assert_kept_typed_and_free(env, vf, uuid, since)


@pytest.mark.parametrize("accepts", DRIVERS)
def test_detach_remove_through_the_api_never_writes_to_a_held_vf(
    env: Env, accepts: bool
) -> None:
    driver_answer(env, accepts)
    vf, uuid = held_vgpu(env, "vm-1", via_attach=True)
    since = last_write(env)
    status, _, body = api(env)("DELETE", "/v1/instances/vm-1/attachments?remove=true")
    assert (status, body["error"]["code"]) == (409, "VfInUse"), body
    assert uuid in body["error"]["message"]
    assert_kept_typed_and_free(env, vf, uuid, since)


@pytest.mark.parametrize("accepts", DRIVERS)
def test_a_rollback_never_writes_to_a_vf_a_vm_took_meanwhile(
    sim: SimHost, env: Env, accepts: bool
) -> None:
    """Two vGPUs asked for; a VM takes the first VF before the second one's
    type write fails: the rollback keeps the first (free, owned, typed)."""
    env.manager.ledger.close()
    taken: list[str] = []
    since = last_write(env)

    def on_step(step: str) -> None:
        if step == "allocate.created" and not taken:
            (vf,) = (v["address"] for v in sim.sim.status(counters=False)["vgpus"])
            sim.sim.hold(vf)
            sim.sim.fail_next_vgpu_write("EIO", type_id=VGPU_ID)  # the second VF
            taken.append(vf)

    env = Env(sim, on_step=on_step)
    driver_answer(env, accepts)
    try:
        with pytest.raises(exception.VgpuTypeWriteFailed):
            env.manager.allocate("vm-1", 2, device_type=VGPU_TYPE)
        (vf,) = taken
        uuid = nvidia_vfio.device_uuid(vf)
        assert_kept_typed_and_free(env, vf, uuid, since)
        assert env.typed() == {vf: VGPU_ID}  # the second VF was never typed
        assert env.manager.ledger.pending_intents() == []
    finally:
        env.manager.ledger.close()


@pytest.mark.parametrize("accepts", DRIVERS)
def test_recovery_of_an_interrupted_remove_never_writes_to_a_held_vf(
    env: Env, accepts: bool
) -> None:
    driver_answer(env, accepts)
    vf, uuid = held_vgpu(env, "vm-1")
    env.manager.release("vm-1")
    env.manager.ledger.record_remove_intent(uuid)  # a crash after the intent, before the write
    since = last_write(env)
    report = env.manager.recover()
    assert report.kept_in_use == [uuid] and report.removed == []
    assert_kept_typed_and_free(env, vf, uuid, since)
    env.host.sim.release(vf)
    # The VM gone, the same VF is untyped on the next remove.
    env.manager.ledger.record_remove_intent(uuid)
    assert env.manager.recover().removed == [uuid]
    assert env.typed() == {} and env.rows() == {}


# --- a pool VF (sriov_vf) a VM holds: detach answers 409, its settings stay --------------


def held_pool_vf(env: Env, instance: str) -> tuple[str, str]:
    (handle,) = env.attach(instance, [{"pool": "nic_a", "mac": MAC, "vlan": 7}])["attachments"]
    vf = handle["address"]
    assert handle["uuid"] == device_uuid(vf) and env.driver(vf) == "vfio-pci"
    env.host.sim.hold(vf)
    return vf, handle["uuid"]


def assert_vf_kept_with_its_settings(env: Env, vf: str, uuid: str) -> None:
    assert env.net.settings(PF0, 0) == {**RESET, "mac": MAC, "vlan": 7}
    assert env.driver(vf) == "vfio-pci"
    assert env.rows() == {uuid: (None, None, "present")}  # recorded: recover returns it


def assert_recover_returns_it_once_free(env: Env, vf: str, uuid: str) -> None:
    env.host.sim.release(vf)
    assert env.manager.recover().removed == [uuid]
    assert env.net.settings(PF0, 0) == RESET and env.driver(vf) == "igbvf"
    assert env.rows() == {}


@pytest.mark.parametrize("remove", [False, True], ids=["detach", "detach-remove"])
def test_detaching_a_held_pool_vf_is_refused_by_the_manager_and_keeps_it(
    env: Env, remove: bool
) -> None:
    vf, uuid = held_pool_vf(env, "vm-1")
    with pytest.raises(exception.VfInUse) as info:
        env.manager.release("vm-1", remove=remove)
    assert uuid in info.value.message and f"pool VF {vf} is in use" in info.value.message
    assert_vf_kept_with_its_settings(env, vf, uuid)
    assert_recover_returns_it_once_free(env, vf, uuid)


def test_detaching_a_held_pool_vf_through_the_api_answers_409_and_keeps_it(env: Env) -> None:
    vf, uuid = held_pool_vf(env, "vm-1")
    status, _, body = api(env)("DELETE", "/v1/instances/vm-1/attachments")
    assert (status, body["error"]["code"]) == (409, "VfInUse"), body
    assert uuid in body["error"]["message"]
    assert_vf_kept_with_its_settings(env, vf, uuid)
    assert_recover_returns_it_once_free(env, vf, uuid)


# --- migration claims ---------------------------------------------------------------------


def destination(env: Env) -> MigrationDestination:
    versions = HostVersions(libvirt=(11, 0, 0), qemu=(10, 0, 0), kernel=(6, 12, 0))
    return MigrationDestination(env.manager, lambda: versions)


@pytest.fixture
def libvirt_default() -> Iterator[Any]:
    """libvirt's ``test:///default`` driver: its state is shared by every
    connection of this process, so a domain defined here is one the agent's
    own (read-only) connection sees."""
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    conn = libvirt.open("test:///default")
    defined: list[Any] = []
    conn.defined = defined
    try:
        yield conn
    finally:
        for domain in defined:
            domain.undefine()
        conn.close()


def define_domain(conn: Any, name: str, mdevs: list[str]) -> None:
    hostdevs = "".join(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>"
        f"<source><address uuid='{m}'/></source></hostdev>"
        for m in mdevs
    )
    conn.defined.append(conn.defineXML(
        f"<domain type='test'><name>{name}</name><memory>1048576</memory>"
        f"<os><type>hvm</type></os><devices>{hostdevs}</devices></domain>"
    ))


def test_abort_remove_spares_a_claimed_mdev_a_libvirt_domain_references(
    env: Env, libvirt_default: Any
) -> None:
    dest = destination(env)
    mapping = dest.claim("vm-m", {SOURCE: "mtty-2", SOURCE2: "mtty-2"})
    used, spare = mapping[SOURCE], mapping[SOURCE2]
    assert {used, spare} <= env.host.sysfs_uuids()
    # The incoming domain was defined here before the migration failed.
    define_domain(libvirt_default, "incoming-vm-m", [used])
    env.manager.domains = domains_mod.LibvirtDomains("test:///default")
    with pytest.raises(exception.MdevInUse) as info:
        dest.abort("vm-m", remove=True)
    assert used in info.value.message and spare not in info.value.message
    assert env.host.sysfs_uuids() == {used}  # the referenced one kept, the other removed
    assert env.rows() == {used: (None, None, "present")}  # kept free, owned
    assert env.manager.ledger.pending_intents() == []


def test_commit_refuses_an_instance_that_holds_devices_and_changes_nothing(env: Env) -> None:
    dest = destination(env)
    held = env.manager.allocate("vm-c", 1, device_type="mtty-2").uuids
    mapping = dest.claim("vm-c", {SOURCE: "mtty-2"})
    before = env.rows()
    assert before[mapping[SOURCE]][:2] == ("vm-c", "claim")
    with pytest.raises(exception.InstanceAlreadyAllocated):
        dest.commit("vm-c")
    assert env.rows() == before  # the claim still a claim, the allocation untouched
    assert env.manager.allocation("vm-c").uuids == held
    # Aborting the claim leaves the instance with what it asked for, no more.
    assert dest.abort("vm-c") == [mapping[SOURCE]]
    assert env.manager.allocation("vm-c").uuids == held


def ctl(config: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", config, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_offline_recover_frees_expired_claims_and_says_so(env: Env, as_json: bool) -> None:
    expired = env.manager.claim("vm-x", {SOURCE: "mtty-2"}, time.time() - 1)[SOURCE]
    live = env.manager.claim("vm-y", {SOURCE2: "mtty-2"}, time.time() + 3600)[SOURCE2]
    env.manager.ledger.close()
    # No daemon listens on this socket: accelctl works offline, on the ledger.
    config = env.host.config(
        CONF + f"\n[api]\nsocket_path = {env.host.work / 'no-daemon.sock'}\n"
    )
    out = ctl(config, "recover", *(["--json"] if as_json else [])).stdout
    if as_json:
        assert json.loads(out)["released_claims"] == [expired]
    else:
        assert f"released claims: {expired}" in out.splitlines()
        assert live not in out
    rows = env.rows()
    assert rows[expired] == (None, None, "present")  # freed, kept for reuse
    assert rows[live][:2] == ("vm-y", "claim")
    assert {expired, live} <= env.host.sysfs_uuids()


# --- a config change and a reboot: free devices of a dropped type -------------------------

# mtty-2 dropped for mtty-1, and the GPU's vGPU type changed to another size;
# or both types dropped with no other in their place (the GPU unconfigured).
VGPU_OTHER = "nvidia-1147"  # NVIDIA L40S-1Q
DROPPED = CONF.replace("mtty-2", "mtty-1").replace(VGPU_TYPE, VGPU_OTHER)
DROPPED_WHOLE = f"""
[devices]
enabled_mdev_types = mtty-1
enabled_vf_pools = nic_a
[mdev_mtty-1]
device_addresses = mtty
[vf_pool_nic_a]
device_addresses = {PF0}
resource_class = CUSTOM_NIC_A
num_vfs = 2
[libvirt]
uri =
"""
CONFIG_CHANGES = [pytest.param(DROPPED, id="type-replaced"),
                  pytest.param(DROPPED_WHOLE, id="type-removed")]


def reboot_with(env: Env, conf: str) -> Env:
    env.manager.ledger.close()
    env.host.sim.reboot()  # every mdev gone, every VF untyped, the pool's VFs disabled
    assert env.host.sysfs_uuids() == set() and env.typed() == {}
    return Env(env.host, conf)


@pytest.mark.parametrize("conf", CONFIG_CHANGES)
def test_free_devices_of_a_dropped_type_are_forgotten_after_a_reboot(
    env: Env, conf: str, caplog: pytest.LogCaptureFixture
) -> None:
    mdev = env.manager.allocate("vm-1", 1, device_type="mtty-2").uuids[0]
    (vgpu_record,) = env.manager.allocate("vm-2", 1, device_type=VGPU_TYPE).mdevs
    vgpu, vgpu_vf = vgpu_record.uuid, vgpu_record.parent
    kept = env.attach("vm-3", [{"pool": "nic_a", "mac": MAC}])["attachments"][0]["uuid"]
    env.manager.release("vm-1")
    env.manager.release("vm-2")
    assert set(env.rows()) == {mdev, vgpu, kept}
    after = reboot_with(env, conf)
    caplog.set_level(logging.INFO, logger="accel_agent.devices")
    try:
        report = after.manager.recover()
        assert sorted(report.forgotten) == sorted([mdev, vgpu])
        assert report.recreated == [kept]  # the pool VF's pool is still configured
        assert after.host.sysfs_uuids() == set()  # no mtty-2 (nor mtty-1) made
        assert after.typed() == {}  # no VF typed, with the old type or the new one
        assert set(after.rows()) == {kept}  # no row left for what is gone
        said = [r.getMessage() for r in caplog.records if "forgot free " in r.getMessage()]
        assert sorted(said) == sorted(  # what the operator reads in the journal, each by its kind
            f"forgot free {k} {u}: gone from sysfs, and the config no longer gives {p} type {t}"
            for k, u, p, t in (("mdev", mdev, "mtty", "mtty-2"),
                               ("vGPU VF", vgpu, vgpu_vf, VGPU_TYPE))
        )
        again = after.manager.recover()  # nothing waits, nothing comes back
        assert (again.recreated, again.forgotten, again.waiting_for_parent) == ([], [], [])
    finally:
        after.manager.ledger.close()


def test_before_the_reboot_a_free_device_of_a_dropped_type_is_never_given_out(
    env: Env,
) -> None:
    """A reload or a restart alone: the free devices still exist, stay
    recorded, and an allocation of the type now configured does not get them
    (it asked for mtty-1, not the free mtty-2; nvidia-1147, not the free
    nvidia-1150 VF, which also keeps the card at its size: no room)."""
    mdev = env.manager.allocate("vm-1", 1, device_type="mtty-2").uuids[0]
    vgpu = env.manager.allocate("vm-2", 1, device_type=VGPU_TYPE).uuids[0]
    env.manager.release("vm-1")
    env.manager.release("vm-2")
    env.manager.ledger.close()
    after = Env(env.host, DROPPED)
    try:
        (got,) = after.manager.allocate("vm-3", 1, device_type="mtty-1").mdevs
        assert got.uuid != mdev and got.device_type == "mtty-1"
        with pytest.raises(exception.InsufficientCapacity):
            after.manager.allocate("vm-4", 1, device_type=VGPU_OTHER)
        rows = after.rows()
        assert rows[mdev] == rows[vgpu] == (None, None, "present")  # recorded, free
        assert mdev in after.host.sysfs_uuids() and VGPU_ID in after.typed().values()
    finally:
        after.manager.ledger.close()


@pytest.mark.parametrize("conf", CONFIG_CHANGES)
@pytest.mark.parametrize("mdev_type", ["mtty-2", VGPU_TYPE])
def test_an_assigned_device_of_a_dropped_type_refuses_recovery(
    env: Env, mdev_type: str, conf: str
) -> None:
    uuid = env.manager.allocate("vm-1", 1, device_type=mdev_type).uuids[0]
    free = env.manager.allocate("vm-2", 1, device_type=mdev_type).uuids[0]
    env.manager.release("vm-2")
    before = env.rows()
    after = reboot_with(env, conf)
    try:
        with pytest.raises(exception.ConfigErrors) as info:
            after.manager.recover()
        assert uuid in str(info.value) and mdev_type in str(info.value)
        assert free not in str(info.value)
        assert after.rows() == before  # nothing changed, the free one not forgotten yet
        assert after.host.sysfs_uuids() == set() and after.typed() == {}
        assert after.manager.ledger.pending_intents() == []
    finally:
        after.manager.ledger.close()



# --- check-config's summary counts what the agent reports ----------------------------------

# The vGPU type Nova reports ([mdev_<type>] reported_by = nova, with its layout),
# with and without the VF pool; CONF: the agent reports the GPU and the pool.
NOVA_REPORTS = CONF.replace(
    f"[mdev_{VGPU_TYPE}]\ndevice_addresses = {GPU}\n",
    f"[mdev_{VGPU_TYPE}]\ndevice_addresses = {GPU}\nstanding = 1\nreported_by = nova\n",
)
NOVA_NO_POOL = NOVA_REPORTS.replace("enabled_vf_pools = nic_a\n", "").split("[vf_pool_nic_a]")[0] \
    + "[libvirt]\nuri =\n"


@pytest.mark.parametrize("conf", [CONF, NOVA_NO_POOL, NOVA_REPORTS],
                         ids=["vf-pool", "reported-by-nova", "both"])
def test_check_config_counts_the_providers_the_agent_reports(sim: SimHost, conf: str) -> None:
    """Issue 34: check-config's summary counts exactly the providers the
    agent's inventory reports (GET /v1/inventory, what ``accelctl inventory
    --json`` prints through the daemon): none for a GPU whose type Nova
    reports, one per PF of a VF pool."""
    sim.reset()
    for name in ("vfnet.json", "vfnet.json.lock"):
        (sim.work / name).unlink(missing_ok=True)
    env = Env(sim, conf)  # the pool's VFs made, as the daemon's start makes them
    try:
        status, _, inventory = api(env)("GET", "/v1/inventory")
    finally:
        env.manager.ledger.close()
    assert status == 200
    config = sim.config(conf + f"\n[api]\nsocket_path = {sim.work / 'no-daemon.sock'}\n")
    summary = json.loads(ctl(config, "check-config", "--json").stdout)["summary"]
    assert summary["providers"] == len(inventory["providers"]), inventory["providers"]
    # accelctl inventory without a daemon leaves out the GPUs Nova reports too.
    # (Its VF pool providers need the pools' configuration, which the cached
    # listing configuration does not carry yet: compared without them.)
    offline = json.loads(ctl(config, "--offline", "inventory", "--json").stdout)["providers"]
    assert sorted(p["name"] for p in offline) == sorted(
        p["name"] for p in inventory["providers"] if p["resource_class"] != "CUSTOM_NIC_A"
    )
