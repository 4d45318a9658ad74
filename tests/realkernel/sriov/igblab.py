"""The igb lab's pieces: the real PF, the agent's pool service wired to its
real privsep daemons, and ``ip link show`` read independently of the agent."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from accel_agent import privileged
from accel_agent.devices.writers import PrivsepWriter
from accel_agent.sriov.pools import build_pools
from accel_agent.sriov.vfpool import PrivsepNet, VfPools
from accel_agent.sysfs import sriov as sriov_sysfs
from tests.configutil import make_conf

SYS = "/sys"
POOL = "nic_a"
NUM_VFS = 2


def igb_pf() -> str:
    drivers = Path(SYS, "bus", "pci", "drivers", "igb")
    found = sorted(p.name for p in drivers.iterdir() if re.fullmatch(r"[0-9a-f:.]+", p.name))
    assert found, f"no PCI device bound to igb in {drivers}"
    return found[0]


@dataclass
class Lab:
    pf: str
    pools: VfPools

    @property
    def info(self) -> sriov_sysfs.PfInfo:
        return sriov_sysfs.read_pf(SYS, self.pf)

    @property
    def netdev(self) -> str:
        netdev = self.info.netdev
        assert netdev, f"igb registered no netdev for {self.pf}"
        return netdev

    def vf(self, index: int) -> sriov_sysfs.VfInfo:
        return self.info.vfs[index]

    def ip_vf(self, index: int) -> str:
        """The ``vf N ...`` line of ``ip link show`` (iproute2, not the agent)."""
        out = subprocess.run(
            ["ip", "link", "show", "dev", self.netdev],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        for line in out.splitlines():
            if re.match(rf"\s*vf {index}\b", line):
                return line.strip()
        raise AssertionError(f"no vf {index} in:\n{out}")

    def clean(self) -> None:
        """Every VF back on igbvf and reset, through the agent itself."""
        for vf in self.info.vfs:
            self.pools.unprepare(vf.address)
        assert [v.driver for v in self.info.vfs] == ["igbvf"] * NUM_VFS


def link_up(netdev: str, timeout: float = 30.0) -> None:
    """The PF's link up, as an operator's network config leaves it: igb
    refuses a VF rate limit while the PF has no link (igb_ndo_set_vf_bw:
    E1000_STATUS_LU), and nothing in the guest brings interfaces up."""
    subprocess.run(["ip", "link", "set", "dev", netdev, "up"], check=True, timeout=30)
    deadline = time.monotonic() + timeout
    carrier = Path(SYS, "class", "net", netdev, "carrier")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if carrier.read_text().strip() == "1":
                return
        time.sleep(0.5)
    raise AssertionError(f"{netdev} has no carrier after {timeout:.0f}s")


@contextlib.contextmanager
def started(work: Path) -> Iterator[Lab]:
    pf = igb_pf()
    netdev = sriov_sysfs.read_pf(SYS, pf).netdev
    assert netdev, f"igb registered no netdev for {pf}"
    link_up(netdev)
    config = work / "accel-agent.conf"
    config.write_text(
        f"[DEFAULT]\nsysfs_root = {SYS}\nstate_dir = {work}/state\n"
        f"[devices]\nenabled_vf_pools = {POOL}\n"
        f"[vf_pool_{POOL}]\ndevice_addresses = {pf}\nnum_vfs = {NUM_VFS}\n"
        "resource_class = CUSTOM_NIC_A\n"
    )
    privileged.start_privsep([str(config)], [])
    privileged.start_net_privsep([str(config)], [])
    try:
        conf = make_conf(config.read_text())
        pools = VfPools(SYS, build_pools(conf), PrivsepWriter(SYS), PrivsepNet(), host="lab")
        pools.ensure_num_vfs()
        yield Lab(pf, pools)
    finally:
        with contextlib.suppress(Exception):
            privileged.stop_net_privsep()
        with contextlib.suppress(Exception):
            privileged.stop_privsep()


def hold_group(vf: sriov_sysfs.VfInfo) -> int:
    """Open the VF's VFIO group as a VM's QEMU would (the agent's probe then
    gets EBUSY)."""
    return os.open(f"/dev/vfio/{vf.iommu_group}", os.O_RDWR | os.O_CLOEXEC)
