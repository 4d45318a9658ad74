"""The PF's netdev over rtnetlink with pyroute2: :class:`vfconfig.VfLink`.

Runs where CAP_NET_ADMIN is (the ``net_admin`` privsep daemon,
``accel_agent.privileged.net``) or in tests against a real netlink socket.
One ``IPRoute`` socket per operation (os-vif's ``with IPRoute()``), never a
long-lived one: the daemon may sit idle for days, and a socket that missed
a netns or driver change would answer about a world that is gone.

Reads ask with ``ext_mask=1`` (RTEXT_FILTER_VF): without it the kernel
leaves ``IFLA_NUM_VF`` and ``IFLA_VFINFO_LIST`` out of the answer.  The
kernel reports VFs only for a netdev with a parent device whose driver has
``ndo_get_vf_config`` (``rtnl_vf_ports_fill()``); a veth reports none.

VLANs are written in the plain ``IFLA_VF_VLAN`` form: pyroute2 0.7.7 encodes
the ``IFLA_VF_VLAN_LIST`` form 2 bytes short of ``struct ifla_vf_vlan_info``
and the kernel answers EINVAL (docs/design.md §10.4); 802.1Q
is all the agent sets.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from accel_agent import exception
from accel_agent.sriov.vfconfig import LINK_STATES, LinkRefused, VfState, errno_name

IFNAMSIZ = 16  # the kernel's limit, with its NUL
# dev_valid_name(): not empty, < IFNAMSIZ, not "." or "..", no '/', ':' or
# whitespace; the agent also keeps to printable ASCII.
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.@+-]{1,15}")
_UNREPORTED = 0xFFFFFFFF  # rtnl_fill_vfinfo() presets spoofchk/trust to -1


def validate_ifname(value: Any) -> str:
    if not isinstance(value, str) or not _IFNAME_RE.fullmatch(value) or value in (".", ".."):
        raise exception.PrivilegedInputRejected(
            reason=f"network interface name {value!r} is not a valid netdev name"
        )
    return value


def _flag(value: int | None) -> bool | None:
    return None if value is None or value == _UNREPORTED else bool(value)


def _state(vf: int, info: Any) -> VfState:
    def field(attr: str, key: str) -> Any:
        found = info.get(attr)
        return None if found is None else found.get(key)

    link_state = field("IFLA_VF_LINK_STATE", "link_state")
    return VfState(
        vf=vf,
        mac=field("IFLA_VF_MAC", "mac"),
        vlan=field("IFLA_VF_VLAN", "vlan"),
        qos=field("IFLA_VF_VLAN", "qos"),
        spoofchk=_flag(field("IFLA_VF_SPOOFCHK", "spoofchk")),
        trust=_flag(field("IFLA_VF_TRUST", "trust")),
        link_state=LINK_STATES[link_state] if link_state in (0, 1, 2) else None,
        max_tx_rate=field("IFLA_VF_RATE", "max_tx_rate"),
        min_tx_rate=field("IFLA_VF_RATE", "min_tx_rate"),
    )


class PfLink:
    """The PF netdev ``name``, open for the duration of a ``with`` block."""

    def __init__(self, name: str, pf: str | None = None) -> None:
        self.name = validate_ifname(name)
        self.pf = pf or name  # how messages name the PF (its PCI address)
        self._ipr: IPRoute | None = None
        self._index = 0

    def __enter__(self) -> PfLink:
        self._ipr = IPRoute()
        try:
            found = self._ipr.link_lookup(ifname=self.name)
        except NetlinkError as err:
            self.close()
            raise self._failed("lookup", err) from None
        if not found:
            self.close()
            raise exception.PfNetdevNotFound(pf=self.pf, reason=f"no netdev {self.name}")
        self._index = found[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ipr is not None:
            with contextlib.suppress(Exception):
                self._ipr.close()
            self._ipr = None

    def _failed(self, operation: str, err: NetlinkError) -> exception.NetlinkRequestFailed:
        return exception.NetlinkRequestFailed(
            operation=operation,
            netdev=self.name,
            errno=errno_name(err.code),
            error=str(err.args[-1]),
        )

    def _message(self) -> Any:
        assert self._ipr is not None, "PfLink used outside its with block"
        try:
            return self._ipr.link("get", index=self._index, ext_mask=1)[0]
        except NetlinkError as err:
            raise self._failed("get", err) from None

    def num_vfs(self) -> int | None:
        """``IFLA_NUM_VF``, None when the netdev reports no VFs at all."""
        return self._message().get("IFLA_NUM_VF")

    def states(self) -> dict[int, VfState]:
        """Every VF the PF reports, by index."""
        vflist = self._message().get("IFLA_VFINFO_LIST")
        found = {}
        for info in vflist.get_attrs("IFLA_VF_INFO") if vflist is not None else ():
            mac = info.get("IFLA_VF_MAC")
            if mac is not None:
                found[mac["vf"]] = _state(mac["vf"], info)
        return found

    def read(self, vf: int) -> VfState:
        message = self._message()
        num = message.get("IFLA_NUM_VF")
        if num is None:
            raise exception.VfNotReported(pf=self.pf, vf=vf, num_vfs="absent")
        if not 0 <= vf < num:
            raise exception.VfIndexOutOfRange(pf=self.pf, num_vfs=num, vf=vf)
        vflist = message.get("IFLA_VFINFO_LIST")
        for info in vflist.get_attrs("IFLA_VF_INFO") if vflist is not None else ():
            mac = info.get("IFLA_VF_MAC")
            if mac is not None and mac["vf"] == vf:
                return _state(vf, info)
        raise exception.VfNotReported(pf=self.pf, vf=vf, num_vfs=num)

    def write(self, vf: int, attribute: str, value: dict[str, Any]) -> None:
        assert self._ipr is not None, "PfLink used outside its with block"
        spec: dict[str, Any] = {"vf": vf}
        if attribute in ("vlan", "rate"):
            spec[attribute] = dict(value)  # IFLA_VF_VLAN / IFLA_VF_RATE, as one struct
        else:
            spec.update(value)
        try:
            self._ipr.link("set", index=self._index, vf=spec)
        except NetlinkError as err:
            raise LinkRefused(err.code, str(err.args[-1])) from None


@contextlib.contextmanager
def open_pf(name: str, pf: str | None = None) -> Iterator[PfLink]:
    with PfLink(name, pf) as link:
        yield link
