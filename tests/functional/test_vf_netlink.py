"""VF network settings against a REAL netlink socket, through the REAL
CAP_NET_ADMIN privsep daemon (``accel_agent.privileged.net``).

The test thread moves into a network namespace of its own (namespaces are
per thread: the rest of pytest stays where it was) holding a veth pair, and
the daemon started from it inherits that namespace.  A veth has no VFs, and
this kernel has no netdevsim, so what is proven here is the link level: the
lookup by name, the ``ext_mask=1`` read that reports no ``IFLA_NUM_VF``, every
``IFLA_VF_*`` attribute as pyroute2 encodes it passing the kernel's netlink
policy (a short struct would be EINVAL; the veth driver's missing
``ndo_set_vf_*`` answers EOPNOTSUPP after it), the daemon's capability set,
and input refused before any request.  The VF itself is the igb lab's
(tests/realkernel/sriov).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception, privileged
from accel_agent.sriov import netlink
from accel_agent.sriov.vfconfig import LinkRefused
from tests.functional.privsep_fixture import REPO_ROOT, skip_unless_root

pytestmark = pytest.mark.privsep

CLONE_NEWNET = 0x40000000
CAP_NET_ADMIN = 12
PF = "pf0"


@contextlib.contextmanager
def private_netns() -> Iterator[None]:
    """This thread in a fresh network namespace, and back afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            pytest.skip(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the test's namespace")
    finally:
        os.close(home)


def _daemon_pid(config_file: Path) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(config_file) in argv and b"--privsep_context" in argv:
            return int(entry)
    raise RuntimeError("no net_admin privsep daemon found")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    skip_unless_root()
    from pyroute2 import IPRoute

    config = tmp_path_factory.mktemp("netpriv") / "accel-agent.conf"
    config.write_text("[DEFAULT]\n")
    with private_netns():
        with IPRoute() as ipr:
            try:
                ipr.link("add", ifname=PF, kind="veth", peer=f"{PF}p")
            except Exception as err:  # a kernel without veth
                pytest.skip(f"cannot create a veth pair: {err}")
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old) if p)
        try:
            privileged.start_net_privsep([str(config)], [])
        finally:
            if old is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = old
        try:
            yield _daemon_pid(config)
        finally:
            privileged.stop_net_privsep()


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_daemon_holds_cap_net_admin_and_nothing_else(daemon: int) -> None:
    status = _status(daemon)
    assert int(status["CapEff"], 16) == 1 << CAP_NET_ADMIN, status["CapEff"]
    assert int(status["CapPrm"], 16) == 1 << CAP_NET_ADMIN, status["CapPrm"]
    assert status["Uid"].split()[0] == "0"
    # in the test's namespace, not the host's: it sees the veth
    assert os.readlink(f"/proc/{daemon}/ns/net") == os.readlink("/proc/thread-self/ns/net")


def test_a_netdev_without_vfs_is_named_through_the_daemon(daemon: int) -> None:
    with pytest.raises(exception.VfNotReported) as info:
        privileged.apply_vf_settings(PF, 0, {"mac": "52:54:00:00:00:01"}, pf="0000:01:00.0")
    assert info.value.kwargs["pf"] == "0000:01:00.0"  # kwargs survive the channel
    assert "IFLA_NUM_VF: absent" in str(info.value)
    with pytest.raises(exception.VfNotReported):
        privileged.reset_vf_settings(PF, 0)


def test_a_missing_netdev_is_named(daemon: int) -> None:
    with pytest.raises(exception.PfNetdevNotFound) as info:
        privileged.apply_vf_settings("nosuch0", 0, {"vlan": 5}, pf="0000:01:00.0")
    assert "nosuch0" in str(info.value)


@pytest.mark.parametrize(
    ("pf_netdev", "vf", "settings", "refused"),
    [
        (PF, 0, {"mac": "01:00:5e:00:00:01"}, "mac"),
        (PF, 0, {"vlan": 4096}, "vlan"),
        (PF, 0, {"link_state": "up"}, "link_state"),
        (PF, -1, {"vlan": 1}, "vf"),
        ("../eth0", 0, {"vlan": 1}, None),
        ("a" * 16, 0, {"vlan": 1}, None),
    ],
)
def test_bad_input_is_refused_in_the_daemon_before_any_request(
    daemon: int, pf_netdev: str, vf: int, settings: dict, refused: str | None
) -> None:
    with pytest.raises(exception.PrivilegedInputRejected) as info:
        privileged.apply_vf_settings(pf_netdev, vf, settings)
    if refused is not None:
        assert isinstance(info.value, exception.InvalidVfSetting)
        assert info.value.kwargs["field"] == refused


def test_read_is_unprivileged_and_says_no_vfs(daemon: int) -> None:
    with netlink.PfLink(PF) as link:
        assert link.num_vfs() is None
        assert link.states() == {}
    with pytest.raises(exception.VfNotReported):
        privileged.read_vf(PF, 0)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("mac", {"mac": "52:54:00:00:00:01"}),
        ("vlan", {"vlan": 100, "qos": 3}),
        ("rate", {"min_tx_rate": 0, "max_tx_rate": 100}),
        ("spoofchk", {"spoofchk": 1}),
        ("trust", {"trust": 0}),
        ("link_state", {"link_state": 2}),
    ],
)
def test_every_attribute_passes_the_kernels_netlink_policy(
    daemon: int, attribute: str, value: dict
) -> None:
    """EOPNOTSUPP comes from do_setvfinfo() after nla_parse_nested() with
    ifla_vf_policy accepted the attribute: a short or misnamed one is EINVAL."""
    with netlink.PfLink(PF) as link, pytest.raises(LinkRefused) as info:
        link.write(0, attribute, value)
    assert info.value.code == errno.EOPNOTSUPP, info.value.text
