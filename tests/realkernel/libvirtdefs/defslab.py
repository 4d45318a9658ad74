"""The moving parts of the trixie lab's libvirt-definitions tests
(test_libvirt_defs_real.py): udevd, one libvirtd that sees udev's database, mdevctl's
definitions, and a stand-in for what a boot does to the mdev stack.

libvirt's node-device driver (libvirt-daemon-driver-nodedev) enumerates devices
through libudev and keeps mdev definitions through mdevctl (/etc/mdevctl.d); mdevctl's
udev rule (60-mdevctl.rules) starts a parent's autostart definitions when the parent
registers (MDEV_STATE=registered).  The lab's guest has no systemd: udevd runs here as
a plain process, in the chroot (SYSTEMD_IGNORE_CHROOT=1: udevadm refuses to trigger or
settle in a chroot otherwise).

Debian trixie's mdevctl 1.4.0 ships /usr/bin/mdevctl while its udev rule runs
/usr/sbin/mdevctl (upstream's path, where Fedora and RHEL install it): on Debian the
rule fails silently (its pipe into logger succeeds) and an autostart definition does
not come back when its parent registers.  The lab links /usr/sbin/mdevctl so that the
autostart a boot does elsewhere happens here too (:func:`mdevctl_rule_path`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.functional.daemon_fixture import wait_for
from tests.realkernel import mdevlab
from tests.realkernel.migration import migrationlab

UDEVD = "/usr/lib/systemd/systemd-udevd"
MDEVCTL_RULE = Path("/usr/lib/udev/rules.d/60-mdevctl.rules")
MDEVCTL_DIR = Path("/etc/mdevctl.d")
# Where init.sh puts the lab's mtty.ko: the rootfs has no modules of this kernel.
MTTY_KO = "/lib/modules/lab/mtty.ko"
# libvirt's node-device name of the mtty parent (/sys/devices/virtual/mtty/mtty):
# "<subsystem>_<sysname>", not a PCI name.
PARENT_NODEDEV = "mtty_mtty"
UDEV_ENV = {**os.environ, "SYSTEMD_IGNORE_CHROOT": "1"}
TIMEOUT = 120.0


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=UDEV_ENV, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(mdevlab.describe(result))
    return result


class Udevd:
    """systemd-udevd in the foreground, as a boot would have it running."""

    def __init__(self) -> None:
        self.log_path = migrationlab.LOG_DIR / "udevd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [UDEVD, "--debug"], stdout=out, stderr=subprocess.STDOUT, env=UDEV_ENV
            )
        wait_for(lambda: Path("/run/udev/control").exists(), TIMEOUT, 0.1, "udevd's control socket")

    def settle(self) -> None:
        """Until udevd has handled every queued event (the rules' RUN programs too)."""
        run("udevadm", "settle", f"--timeout={int(TIMEOUT)}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def mdevctl_rule_path() -> tuple[str, bool]:
    """The mdevctl its udev rule runs, and whether the lab linked it (Debian's
    package installs /usr/bin/mdevctl; see the module's docstring)."""
    match = re.search(r"(/\S+/mdevctl) start-parent-mdevs", MDEVCTL_RULE.read_text())
    assert match, f"{MDEVCTL_RULE} runs no mdevctl start-parent-mdevs"
    path = Path(match.group(1))
    if path.exists():
        return str(path), False
    path.symlink_to("/usr/bin/mdevctl")
    return str(path), True


def virsh(uri: str, *args: str) -> str:
    return run("virsh", "-c", uri, *args).stdout


def nodedev_name(uuid: str) -> str:
    """What libvirt 11 names an mtty mdev: mdev_<uuid with _>_<parent_addr>."""
    return f"mdev_{uuid.replace('-', '_')}_{mdevlab.PARENT}"


def mdev_xml(uuid: str, mdev_type: str = migrationlab.MDEV_TYPE) -> str:
    """A node device definition as Nova 34's _create_mdev writes it."""
    return textwrap.dedent(
        f"""\
        <device>
          <parent>{PARENT_NODEDEV}</parent>
          <capability type='mdev'>
            <type id='{mdev_type}'/>
            <uuid>{uuid}</uuid>
          </capability>
        </device>
        """
    )


def mdevctl_defined() -> dict[str, dict[str, Any]]:
    """uuid -> mdevctl's definition (mdev_type, start) of every defined mdev."""
    out = run("mdevctl", "list", "--defined", "--dumpjson").stdout.strip()
    found: dict[str, dict[str, Any]] = {}
    for parent in json.loads(out) if out else []:
        for name, devices in parent.items():
            for device in devices:
                for uuid, spec in device.items():
                    found[uuid] = {"parent": name, **spec}
    return found


def nodedev_state(conn: Any, uuid: str) -> dict[str, bool] | None:
    """libvirt's view of one mdev (any parent): active, persistent, autostart."""
    import libvirt

    try:
        dev = conn.nodeDeviceLookupByName(nodedev_name(uuid))
        return {
            "active": bool(dev.isActive()),
            "persistent": bool(dev.isPersistent()),
            "autostart": bool(dev.autostart()),
        }
    except libvirt.libvirtError as exc:
        # Gone, also between the lookup and a read (libvirt drops a removed
        # mdev a moment later: seen in CI, autostart() after a good lookup).
        if exc.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
            return None
        raise


def reload_mtty(udevd: Udevd) -> None:
    """What a boot does to the mdev stack, below libvirt and the agent: every mdev
    gone, the parent's driver loaded again, udev's rules run for its events."""
    mdevlab.remove_all()
    run("rmmod", "mtty")
    assert not Path(mdevlab.PARENT_DIR).exists()
    run("insmod", MTTY_KO)
    wait_for(lambda: Path(mdevlab.TYPES_DIR).is_dir(), TIMEOUT, 0.1, "the mtty parent")
    udevd.settle()
