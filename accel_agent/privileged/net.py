"""The net writer: VF network settings over rtnetlink, in ``net_admin``.

``net_admin`` (context.py) is a privsep context of its own with **CAP_NET_ADMIN only**,
beside ``accel_agent.privileged.sysfs_admin``, which keeps no capability at
all: writing ``IFLA_VF_*`` on a PF's netdev needs CAP_NET_ADMIN
(``rtnl_setlink()`` checks it through ``netlink_ns_capable``), and nothing
else in the agent does, so the sysfs writer does not get it and this daemon
gets nothing more (os-vif's one-context-per-job rule, docs/design.md
§2.2).  Nova, for comparison, runs ``ip link
set <pf> vf N mac .. vlan ..`` from its CAP_SYS_ADMIN-holding context and
tolerates exit code 2 (``check_exit_code=[0, 2, 254]``): a refusal there is
silent.  Here a refusal is an error naming the VF, the setting and the
driver's errno, and the rest is rolled back (``accel_agent.sriov.vfconfig``).

Entrypoints take primitives (the PF's netdev name, the VF index, a dict of
settings), validate them in the daemon before any request, and return the
VF's state read back (``ext_mask=1``) before and after, as dicts.  Reading a
VF's state needs no capability (RTM_GETLINK): :func:`read_vf` runs in the
caller's process.  Errors cross the channel as the sysfs writers' do
(wire.py: class name, message, kwargs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from accel_agent import exception
from accel_agent.privileged.context import net_admin
from accel_agent.privileged.lifecycle import call
from accel_agent.privileged.wire import daemon_side

MAX_PF_LABEL = 64
_PF_LABEL_RE = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")


def _validate_pf_label(value: Any) -> str | None:
    """How messages name the PF (its PCI address); None: the netdev's name."""
    if value is None:
        return None
    if not isinstance(value, str) or not _PF_LABEL_RE.fullmatch(value):
        raise exception.PrivilegedInputRejected(reason=f"PF name {value!r} is not printable")
    return value


def apply_local(
    pf_netdev: str,
    vf: int,
    settings: Mapping[str, Any],
    pf: str | None = None,
    clean: bool = False,
) -> dict[str, dict[str, Any]]:
    """:func:`apply_vf_settings` in this process (tests; the daemon's body)."""
    from accel_agent.sriov import netlink, vfconfig

    vf = vfconfig.validate_vf_index(vf)
    wanted = vfconfig.validate_settings(settings)
    if not isinstance(clean, bool):
        raise exception.PrivilegedInputRejected(reason=f"clean={clean!r} is not a boolean")
    baseline = vfconfig.RESET if clean else None
    with netlink.PfLink(pf_netdev, _validate_pf_label(pf)) as link:
        before, after = vfconfig.apply(link, link.pf, vf, wanted, baseline)
    return {"before": before.to_dict(), "after": after.to_dict()}


def reset_local(pf_netdev: str, vf: int, pf: str | None = None) -> dict[str, dict[str, Any]]:
    """:func:`reset_vf_settings` in this process."""
    from accel_agent.sriov import netlink, vfconfig

    vf = vfconfig.validate_vf_index(vf)
    with netlink.PfLink(pf_netdev, _validate_pf_label(pf)) as link:
        before, after = vfconfig.reset(link, link.pf, vf)
    return {"before": before.to_dict(), "after": after.to_dict()}


# --- through the helper ------------------------------------------------------------


@net_admin.entrypoint
def _priv_apply(
    pf_netdev: str, vf: int, settings: dict[str, Any], pf: str | None = None, clean: bool = False
) -> dict[str, dict[str, Any]]:
    return daemon_side(lambda: apply_local(pf_netdev, vf, settings, pf, clean))


@net_admin.entrypoint
def _priv_reset(pf_netdev: str, vf: int, pf: str | None = None) -> dict[str, dict[str, Any]]:
    return daemon_side(lambda: reset_local(pf_netdev, vf, pf))


def apply_vf_settings(
    pf_netdev: str,
    vf: int,
    settings: Mapping[str, Any],
    *,
    pf: str | None = None,
    clean: bool = False,
) -> dict[str, dict[str, Any]]:
    """Set VF ``vf`` of the PF netdev ``pf_netdev`` (``pf``: its PCI address,
    for messages) in the CAP_NET_ADMIN daemon; returns ``{"before": state,
    "after": state}`` as read back.  ``clean``: on top of the reset state,
    so that nothing a previous tenant left (trust, a rate) survives.
    Raises InvalidVfSetting (nothing sent), PfNetdevNotFound, VfNotReported,
    VfIndexOutOfRange, VfSettingRefused (rolled back), VfRollbackFailed
    (half-configured), VfSettingNotApplied."""
    return call(_priv_apply, pf_netdev, vf, dict(settings), pf=pf, clean=clean)


def reset_vf_settings(
    pf_netdev: str, vf: int, *, pf: str | None = None
) -> dict[str, dict[str, Any]]:
    """Back to MAC 0, VLAN 0, spoofchk on, trust off, link auto, no rate
    limit, writing only what differs (``vfconfig.reset``)."""
    return call(_priv_reset, pf_netdev, vf, pf=pf)


def read_vf(pf_netdev: str, vf: int, *, pf: str | None = None) -> dict[str, Any]:
    """VF ``vf``'s state as the PF reports it; unprivileged (RTM_GETLINK)."""
    from accel_agent.sriov import netlink, vfconfig

    with netlink.PfLink(pf_netdev, pf) as link:
        return link.read(vfconfig.validate_vf_index(vf)).to_dict()
