"""The moving parts of lab 2 (tests/realkernel/labs/trixie.sh): one kernel with the
mtty parent, two libvirtds and two agents beside each other as two "hosts", a VM
with an mtty mdev, and a live migration driven through the agent.  Used by
test_migration_real.py and by benchmark (l) (benchmarks/migration.py).

Two hosts in one guest (docs/design.md §7.4): each libvirtd runs in
its own mount namespace with its own /run, /etc/libvirt, /var/lib/libvirt,
/var/cache/libvirt and /var/log/libvirt, its own socket directory and its own
``host_uuid`` (libvirt refuses a migration to the host it runs on).  Each agent
has its own state_dir, API socket, ``[libvirt] uri`` and ``/run/lock`` (one
agent per host: each "host" has its lock directory); both manage the one
``mtty`` parent, so each sees the other's mdevs as foreign.  Migration data goes
over 127.0.0.1 (``migrate_uri``, ``listen_address``; ``migration_address`` in
qemu.conf cannot be a local address).

Logs go straight into the results share (``$LAB_OUT/logs``), so they come back
even when the guest dies: both agents', both libvirtds', and the inner QEMUs'.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from accel_agent.api.client import ApiClient
from accel_agent.devices.ledger import DeviceRecord, Ledger
from accel_agent.libvirt_xml import QEMU_NAMESPACE
from accel_agent.migration import versions
from accel_agent.migration.source import AgentApi, MigrationSource
from tests.functional.daemon_fixture import AgentDaemon, wait_for
from tests.realkernel import mdevlab

LAB_DIR = Path("/var/lib/accel-lab")
LOG_DIR = Path(os.environ.get("LAB_OUT", "/tmp")) / "logs"
VENV_BIN = Path(sys.executable).parent
MDEV_TYPE = "mtty-1"
# What Debian's kernels (no IOMMUFD) need for a VFIO migration of mtty.
QEMU_GLOBALS = ("vfio-pci.x-device-dirty-page-tracking=off", "vfio-pci.enable-migration=on")
MIGRATION_PORT = 49152
# A libvirtd probes QEMU's capabilities at its first start: ~10-25 s under TCG.
LIBVIRTD_TIMEOUT = 180.0
DOMAIN_TIMEOUT = 120.0
# An agent's start (Python imports, its privsep helper, the first scan) in the
# TCG guest: ~20-40 s on a quiet host, more than 90 s on a loaded one (the
# lab's fault runs beside a soak); only a hang should reach this.
AGENT_START_TIMEOUT = 300.0
# QEMU's capabilities as the first libvirtd of a guest probed them (~40 s under TCG,
# each libvirtd again in its own cache): a libvirtd starting with an empty cache gets
# them from here; libvirt checks them (QEMU's and its own ctime, the kernel, the
# microcode) and probes again when they do not fit.
CAPS_SEED = LAB_DIR / "qemu-capabilities"


def _libvirt() -> Any:
    import libvirt  # the guest's python3-libvirt (Debian), through the venv

    return libvirt


# --- libvirtd ------------------------------------------------------------------------


class Libvirtd:
    """One libvirtd as if alone on its host, in its own mount namespace.

    ``own_run=False``: the guest's /run stays visible (udevd's database, /run/udev,
    which libvirt's node-device driver reads; one such libvirtd at a time)."""

    def __init__(self, name: str, host_uuid: str, own_run: bool = True) -> None:
        self.name = name
        self.host_uuid = host_uuid
        self.own_run = own_run
        self.root = LAB_DIR / f"libvirt-{name}"
        self.log_dir = LOG_DIR / f"libvirt-{name}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.root / "sock" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket}"

    def _write_config(self) -> None:
        for sub in ("sock", "lib", "cache"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        caps = self.root / "cache" / "qemu" / "capabilities"
        if CAPS_SEED.is_dir() and not caps.exists():
            shutil.copytree(CAPS_SEED, caps)
        (self.log_dir / "qemu").mkdir(parents=True, exist_ok=True)
        etc = self.root / "etc"
        shutil.rmtree(etc, ignore_errors=True)
        shutil.copytree("/etc/libvirt", etc, symlinks=True)
        (etc / "libvirtd.conf").write_text(
            textwrap.dedent(
                f"""\
                unix_sock_dir = "{self.socket.parent}"
                auth_unix_rw = "none"
                auth_unix_ro = "none"
                host_uuid = "{self.host_uuid}"
                log_outputs = "3:file:{self.log_dir}/libvirtd.log"
                """
            )
        )
        # Root, no cgroups, namespaces, security driver or virtlogd: the guest has
        # no systemd and needs none of them to run QEMU.
        (etc / "qemu.conf").write_text(
            textwrap.dedent(
                """\
                user = "root"
                group = "root"
                dynamic_ownership = 0
                security_driver = "none"
                cgroup_controllers = [ ]
                namespaces = [ ]
                stdio_handler = "file"
                """
            )
        )

    def start(self) -> None:
        assert self.proc is None, "already started"
        self._write_config()
        for path in ("/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt"):
            os.makedirs(path, exist_ok=True)
        script = textwrap.dedent(
            f"""\
            set -e
            {"mount -t tmpfs -o mode=0755 tmpfs /run" if self.own_run else ""}
            mkdir -p /run/libvirt
            mount --bind {self.root}/etc /etc/libvirt
            mount --bind {self.root}/lib /var/lib/libvirt
            mount --bind {self.root}/cache /var/cache/libvirt
            mount --bind {self.log_dir} /var/log/libvirt
            exec libvirtd --config /etc/libvirt/libvirtd.conf
            """
        )
        with open(self.log_dir / "libvirtd.out", "ab") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = LIBVIRTD_TIMEOUT) -> None:
        """Until the socket answers (after the QEMU driver's capabilities probe)."""
        libvirt = _libvirt()

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"libvirtd {self.name} exited with {self.proc.returncode}:\n{self.log()}"
                )
            if not self.socket.exists():
                return False
            try:
                conn = libvirt.open(self.uri)
            except libvirt.libvirtError:
                return False
            conn.close()
            return True

        wait_for(answers, timeout, 0.2, f"libvirtd {self.name} to answer on {self.socket}")

    def open(self) -> Any:
        """A read-write connection the caller keeps (domains refer to it)."""
        return _libvirt().open(self.uri)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        conn = self.open()
        try:
            yield conn
        finally:
            conn.close()

    def destroy_all(self) -> None:
        """Stop and undefine every domain (a test's leftovers), so their QEMUs
        let go of their mdevs."""
        libvirt = _libvirt()
        with self.connect() as conn:
            for domain in conn.listAllDomains(0):
                with contextlib.suppress(libvirt.libvirtError):
                    if domain.isActive():
                        domain.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    domain.undefine()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        caps = self.root / "cache" / "qemu" / "capabilities"
        if caps.is_dir() and any(caps.iterdir()) and not CAPS_SEED.exists():
            shutil.copytree(caps, CAPS_SEED)

    def log(self) -> str:
        return _tail(self.log_dir / "libvirtd.log") + _tail(self.log_dir / "libvirtd.out")


# --- the agent -----------------------------------------------------------------------


class Agent:
    """One accel-agent daemon (the wheel installed in the lab's venv), its
    ``accelctl`` and its ledger, on the host of ``libvirtd``."""

    def __init__(self, name: str, libvirtd: Libvirtd, options: str = "") -> None:
        self.name = name
        self.libvirtd = libvirtd
        self.options = options  # more lines of its [libvirt] section
        self.dir = LAB_DIR / f"agent-{name}"
        self.state_dir = self.dir / "state"
        self.socket = self.dir / "api.sock"
        self.config = self.dir / "accel-agent.conf"
        self.log_dir = LOG_DIR / f"agent-{name}"
        self.daemon: AgentDaemon | None = None

    def _write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text(self.options))

    def config_text(self, options: str = "") -> str:
        """This agent's config; ``options``: more lines of its [libvirt] section."""
        return (
            textwrap.dedent(
                f"""\
                [DEFAULT]
                host = lab-{self.name}
                sysfs_root = {mdevlab.SYSFS}
                state_dir = {self.state_dir}
                debug = true
                # no udevd in the guest; the agent's own writes trigger its rescans
                udev_events = false
                [api]
                socket_path = {self.socket}
                [libvirt]
                uri = {self.libvirtd.uri}
                qemu_globals = {", ".join(QEMU_GLOBALS)}
                {{options}}
                [devices]
                enabled_mdev_types = {MDEV_TYPE}
                [mdev_{MDEV_TYPE}]
                device_addresses = {mdevlab.PARENT}
                """
            )
        ).replace("{options}", options)

    def start(self) -> None:
        self._write_config()
        # Two "hosts" on one kernel: one agent per host holds a lock of the
        # sysfs root in /run/lock/accel-agent (accel_agent/host_lock.py), so
        # each agent gets a /run/lock of its own, as each libvirtd has its /run.
        self.daemon = AgentDaemon(
            self.config, str(self.socket), self.log_dir, command=[
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mkdir -p /run/lock && mount -t tmpfs -o mode=0755 tmpfs /run/lock && exec "$@"',
                "sh", str(VENV_BIN / "accel-agent"),
            ],
        )
        self.daemon.spawn()

    def wait_ready(self) -> None:
        assert self.daemon is not None
        self.daemon.wait_ready(AGENT_START_TIMEOUT)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.close()

    def client(self) -> ApiClient:
        return ApiClient(str(self.socket))

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``accelctl --config-file <this agent's> ARGS`` (the venv's console script)."""
        return mdevlab.accelctl(*args, config=self.config)

    def ledger(self) -> list[DeviceRecord]:
        """The ledger as the agent wrote it, read from its file (a second
        reader, read-only: it never migrates or checkpoints the agent's file)."""
        with Ledger(str(self.state_dir), read_only=True) as book:
            return book.all()

    def log(self) -> str:
        return self.daemon.log()[-8000:] if self.daemon is not None else ""


def _tail(path: Path, size: int = 6000) -> str:
    try:
        return f"--- {path}\n{path.read_text(errors='replace')[-size:]}"
    except OSError:
        return ""


# --- two hosts -----------------------------------------------------------------------


@dataclass
class Hosts:
    """Host A (a migration's source) and host B (its destination) in one guest."""

    libvirt_a: Libvirtd
    libvirt_b: Libvirtd
    a: Agent
    b: Agent

    @property
    def agents(self) -> tuple[Agent, Agent]:
        return (self.a, self.b)


@contextlib.contextmanager
def two_hosts(timings: dict[str, float] | None = None) -> Iterator[Hosts]:
    """Start both libvirtds and both agents (all four at once: each mostly waits
    for its own start-up work), stop them all on the way out.  ``timings`` gets
    the seconds until each answered."""
    libvirt_a = Libvirtd("a", "aaaaaaaa-1111-4111-8111-111111111111")
    libvirt_b = Libvirtd("b", "bbbbbbbb-2222-4222-8222-222222222222")
    hosts = Hosts(libvirt_a, libvirt_b, Agent("a", libvirt_a), Agent("b", libvirt_b))
    start = time.monotonic()
    ready = timings if timings is not None else {}
    try:
        for process in (libvirt_a, libvirt_b, hosts.a, hosts.b):
            process.start()
        for name, process in (
            ("libvirtd a", libvirt_a),
            ("libvirtd b", libvirt_b),
            ("agent a", hosts.a),
            ("agent b", hosts.b),
        ):
            process.wait_ready()
            ready[name] = time.monotonic() - start
        yield hosts
    finally:
        for daemon in (hosts.a, hosts.b, libvirt_a, libvirt_b):
            daemon.stop()


# --- the VM ----------------------------------------------------------------------------


def compose_domain(name: str, uuid: str, parts: str, qemu_settings: bool = True) -> str:
    """A small TCG guest around ``accelctl domain-xml`` output: its ``<hostdev>``
    elements go into ``<devices>``, its ``<qemu:commandline>`` (the QEMU settings)
    into ``<domain>`` unless ``qemu_settings`` is False.  No disk: SeaBIOS
    enumerates PCI (so the mtty UART's I/O BAR gets an address) and then waits
    forever (rebootTimeout -1) instead of rebooting the VM."""
    fragments = etree.fromstring(f"<parts>{parts}</parts>".encode())
    hostdevs = [e for e in fragments if e.tag == "hostdev"]
    commandlines = [e for e in fragments if e.tag == f"{{{QEMU_NAMESPACE}}}commandline"]
    assert hostdevs, f"no <hostdev> in the domain-xml output:\n{parts}"
    domain = etree.fromstring(
        textwrap.dedent(
            f"""\
            <domain type='qemu'>
              <name>{name}</name>
              <uuid>{uuid}</uuid>
              <memory unit='MiB'>64</memory>
              <vcpu>1</vcpu>
              <os><type arch='x86_64' machine='pc'>hvm</type><bios rebootTimeout='-1'/></os>
              <devices>
                <emulator>/usr/bin/qemu-system-x86_64</emulator>
                <controller type='usb' model='none'/>
                <memballoon model='none'/>
              </devices>
            </domain>
            """
        ).encode()
    )
    devices = domain.find("devices")
    assert devices is not None
    devices.extend(hostdevs)
    if qemu_settings:
        domain.extend(commandlines)
    return etree.tostring(domain, encoding="unicode")


def hmp(domain: Any, command: str) -> str:
    import libvirt_qemu

    return libvirt_qemu.qemuMonitorCommand(
        domain, command, libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP
    )


def uart_port(domain: Any) -> int | None:
    """The I/O base of the mtty UART (BAR0 of device ``hostdev0``) once the guest's
    firmware has assigned it, from ``info pci``."""
    for block in re.split(r"\n(?=\s*Bus\s)", hmp(domain, "info pci")):
        if 'id "hostdev0"' in block:
            match = re.search(r"BAR0: I/O at (0x[0-9a-f]+) ", block)
            if match and int(match.group(1), 16) not in (0, 0xFFFF, 0xFFFFFFFFFFFFFFFF):
                return int(match.group(1), 16)
    return None


UART_SCR = 7  # the 16550's scratch register: one byte of device state, guest-visible


def write_scratch(domain: Any, value: int) -> None:
    """Write the UART scratch register as the guest would (an I/O port write,
    through QEMU to the mdev's vfio region, into mtty's emulated registers)."""
    port = wait_for(lambda: uart_port(domain), DOMAIN_TIMEOUT, 0.5, "the UART's I/O BAR")
    hmp(domain, f"o /b {port + UART_SCR:#x} {value:#x}")


def read_scratch(domain: Any) -> int:
    port = wait_for(lambda: uart_port(domain), DOMAIN_TIMEOUT, 0.5, "the UART's I/O BAR")
    answer = hmp(domain, f"i /b {port + UART_SCR:#x}")
    match = re.search(r"=\s*(0x[0-9a-f]+)", answer)
    assert match, f"unexpected answer to 'i': {answer!r}"
    return int(match.group(1), 16)


def active_mdevs(domain: Any) -> list[str]:
    from accel_agent.libvirt_xml import list_mdev_uuids

    return list_mdev_uuids(domain.XMLDesc(0))


def persistent_mdevs(domain: Any) -> list[str]:
    from accel_agent.libvirt_xml import list_mdev_uuids

    return list_mdev_uuids(domain.XMLDesc(_libvirt().VIR_DOMAIN_XML_INACTIVE))


# --- a live migration through the agent ------------------------------------------------


@dataclass
class MigrationRun:
    """What one migration did, with the time of each step (seconds)."""

    mapping: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)


MIGRATE_FLAGS_NAMES = ("LIVE", "PEER2PEER", "PERSIST_DEST", "UNDEFINE_SOURCE")


def migration_flags() -> int:
    libvirt = _libvirt()
    flags = 0
    for name in MIGRATE_FLAGS_NAMES:
        flags |= getattr(libvirt, f"VIR_MIGRATE_{name}")
    return flags


def migrate_through_agents(
    domain: Any,
    source: Agent,
    destination: Agent,
    instance: str,
    run: MigrationRun | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> MigrationRun:
    """What an orchestrator (Nova's compute service) does, through the agents'
    own interfaces: the source lists the domain's mdevs (``prepare``, with its
    version gate), the destination claims one of each type through its API (its
    version gates: both hosts), the source migrates with the rewritten XML
    (``MigrationSource.migrate``; peer to peer, data on 127.0.0.1), the
    destination commits once libvirt reported success and the source then
    releases with remove.  A failed migration aborts the destination's claim and
    re-raises.  ``run`` is filled as it goes (a failure leaves what was done)."""
    libvirt = _libvirt()
    run = run if run is not None else MigrationRun()
    dest_api = destination.client()
    migration = MigrationSource(AgentApi(source.client()))
    start = clock()
    mdevs = migration.prepare(domain)
    source_versions = versions.probe(domain.connect()).to_dict()
    run.mapping = dest_api.migration_claim(instance, mdevs, source_versions)["mapping"]
    run.timings["claim"] = clock() - start
    marks: dict[str, float] = {}

    def commit() -> None:
        marks["commit"] = clock()
        dest_api.migration_commit(instance)
        marks["committed"] = clock()

    params = {
        libvirt.VIR_MIGRATE_PARAM_URI: f"tcp://127.0.0.1:{MIGRATION_PORT}",
        libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS: "127.0.0.1",
    }
    start = clock()
    try:
        run.released = migration.migrate(
            domain,
            destination.libvirtd.uri,
            run.mapping,
            migration_flags(),
            params,
            instance=instance,
            remove=True,
            before_release=commit,
        )
    except Exception:
        run.timings["migrate"] = clock() - start
        # Remove, not only free: the failed load may have left the device in a state
        # the next incoming migration cannot start from (mtty keeps RESUMING).
        dest_api.migration_abort(instance, remove=True)
        raise
    end = clock()
    run.timings["migrate"] = marks["commit"] - start
    run.timings["commit"] = marks["committed"] - marks["commit"]
    run.timings["release"] = end - marks["committed"]
    with destination.libvirtd.connect() as conn:
        landed = conn.lookupByName(domain.name())
        run.job = dict(landed.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED))
    return run
