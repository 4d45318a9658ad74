"""Helpers of lab "systemd" (tests/realkernel/labs/systemd.sh): the Debian package's
unit under a real systemd, in a bookworm guest with mtty.  Standard library only: these
tests run with the guest's own python3 and pytest, the agent is the installed package's.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

LAB = "systemd"
UNIT = "accel-agent"
CONFIG = Path("/etc/accel-agent/accel-agent.conf")
SOCKET = "/run/accel-agent/api.sock"
SOCKET_GROUP = "accelops"
STATE = Path("/var/lib/accel-lab")  # on the lab disk: survives the guest's reboot
EXPECTED = STATE / "expected-after-reboot.json"
# The mtty-2 mdevs the standing layout holds at the reboot (issue 23).
STANDING = 5
MDEV_DIR = "/sys/bus/mdev/devices"
TYPES_DIR = "/sys/class/mdev_bus/mtty/mdev_supported_types"
# The VF pool on QEMU's igb (labs/systemd.sh): one VF is enough to hand one over.
POOL = "nic_a"
POOL_NUM_VFS = 1
IGB_DRIVER = "/sys/bus/pci/drivers/igb"
PCI_DEVICES = "/sys/bus/pci/devices"
REPO = Path(__file__).resolve().parents[3]
# The units the package orders after the agent with its drop-ins (systemd/dropins/):
# stand-ins here (no OpenStack, no libvirt in this guest), so that the ordering is real.
ORDERED = ("nova-compute", "libvirt-guests")


def skip_unless_lab() -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        os.environ.get("ACCEL_REALKERNEL_LAB") != LAB or not os.path.isdir(TYPES_DIR),
        reason="runs only in the guest of the real-kernel lab 'systemd' (labs/systemd.sh)",
    )


def run(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


def show(*properties: str, unit: str = UNIT) -> dict[str, str]:
    """``systemctl show -p ...`` of the unit as a dict."""
    out = run("systemctl", "show", unit, *(f"--property={p}" for p in properties)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def write_stand_in(name: str) -> None:
    """A service of that name that just runs (in /etc: the package's drop-in in
    /lib/systemd/system/<name>.service.d/ applies to it as to the real one)."""
    Path(f"/etc/systemd/system/{name}.service").write_text(
        f"[Unit]\nDescription=stand-in for {name} (lab systemd)\n\n"
        "[Service]\nExecStart=/bin/sleep infinity\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def journal(since_cursor: str | None = None) -> list[dict[str, Any]]:
    """The unit's journal entries of this boot (json), oldest first."""
    argv = ["journalctl", "-b", "-u", f"{UNIT}.service", "-o", "json", "--no-pager"]
    if since_cursor:
        argv += ["--after-cursor", since_cursor]
    out = run(*argv).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def messages(entries: list[dict[str, Any]]) -> list[str]:
    found = []
    for entry in entries:
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald sends non-UTF-8 as bytes
            message = bytes(message).decode(errors="replace")
        found.append(str(message))
    return found


def igb_pf() -> str:
    """The PCI address of the igb PF (QEMU's 82576)."""
    found = sorted(n for n in os.listdir(IGB_DRIVER) if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f:.]+", n))
    assert found, f"no PCI device bound to igb in {IGB_DRIVER}"
    return found[0]


def pf_netdev(pf: str) -> str:
    (name,) = os.listdir(f"{PCI_DEVICES}/{pf}/net")
    return name


def vfs_of(pf: str) -> list[str]:
    """The PF's VFs (PCI addresses), by index: sysfs's virtfnN links."""
    device = f"{PCI_DEVICES}/{pf}"
    links = sorted(
        (int(n[6:]), n) for n in os.listdir(device) if n.startswith("virtfn") and n[6:].isdigit()
    )
    return [os.path.basename(os.readlink(f"{device}/{n}")) for _, n in links]


def driver_of(address: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f"{PCI_DEVICES}/{address}/driver"))
    except FileNotFoundError:
        return None


def ip_vf(netdev: str, index: int) -> str:
    """The ``vf N ...`` line of ``ip link show`` (iproute2, not the agent)."""
    out = run("ip", "link", "show", "dev", netdev).stdout
    for line in out.splitlines():
        if re.match(rf"\s*vf {index}\b", line):
            return line.strip()
    raise AssertionError(f"no vf {index} in:\n{out}")


def write_config(mdev_type: str, standing: int = 0) -> None:
    """mtty's type ``mdev_type`` (with a standing layout of ``standing``
    mdevs) and the VF pool on the igb PF."""
    CONFIG.write_text(
        f"""[DEFAULT]
host = lab-systemd

[devices]
enabled_mdev_types = {mdev_type}
enabled_vf_pools = {POOL}

[mdev_{mdev_type}]
device_addresses = mtty
standing = {standing}

[vf_pool_{POOL}]
device_addresses = {igb_pf()}
num_vfs = {POOL_NUM_VFS}
resource_class = CUSTOM_NIC_A

[api]
socket_group = {SOCKET_GROUP}

[libvirt]
# no libvirtd in this guest: no domain can hold an mdev
uri =
"""
    )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def api(method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    """One request to the running agent's API socket: (status, decoded JSON or text)."""
    conn = _UnixConnection(SOCKET, timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read().decode()
        kind = response.getheader("Content-Type", "")
        return response.status, (json.loads(data) if "json" in kind else data)
    finally:
        conn.close()


def ok(method: str, path: str, body: Any = None) -> Any:
    status, answer = api(method, path, body)
    assert status == 200, f"{method} {path}: {status} {answer}"
    return answer


def mdevs() -> dict[str, str]:
    """uuid -> type of every mdev in the kernel, from sysfs."""
    return {
        name: os.path.basename(os.readlink(f"{MDEV_DIR}/{name}/mdev_type"))
        for name in sorted(os.listdir(MDEV_DIR))
    }


def vfio_group_node(uuid: str) -> str:
    group = os.path.basename(os.readlink(f"{MDEV_DIR}/{uuid}/iommu_group"))
    return f"/dev/vfio/{group}"


def wait_for(predicate, what: str, timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def health() -> dict[str, Any]:
    return ok("GET", "/v1/health")


def mdev_types_offered() -> set[str]:
    """The mdev types of the inventory (the pool's providers are not mdevs)."""
    return {
        p["mdev_type"]
        for p in ok("GET", "/v1/inventory")["providers"]
        if p.get("mdev_type") != POOL
    }
