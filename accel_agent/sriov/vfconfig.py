"""A VF's network settings: what they are, their validation, and the
apply-with-rollback algorithm, over a small link interface (no I/O here).

The settings live on the PF's netdev (rtnetlink ``IFLA_VFINFO_LIST``, one
``IFLA_VF_*`` attribute each).  :func:`apply` writes them **one attribute per
request**: the kernel's ``do_setvfinfo()`` stops at the first attribute the
driver refuses but keeps the ones before it, and its errno does not say which
one failed, so a combined request could neither name the refused setting nor
know what to undo.  After the writes everything is read back (``ext_mask=1``)
and compared; any refusal or mismatch restores what this call changed, in
reverse order, to the values read before it.

Facts tried on igb (docs/design.md §10.4): EOPNOTSUPP for
``link_state``, EINVAL for ``min_tx_rate``, a multicast MAC, ``qos`` 8 or an
absent VF.  A driver that does not report ``spoofchk``/``trust`` reads them
back as ``-1`` (``rtnl_fill_vfinfo()`` presets them): those cannot be
verified and are taken as written.
"""

from __future__ import annotations

import dataclasses
import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accel_agent import exception

LINK_STATES = ("auto", "enable", "disable")  # IFLA_VF_LINK_STATE_AUTO/ENABLE/DISABLE: 0/1/2
ZERO_MAC = "00:00:00:00:00:00"
MAX_VLAN = 4095  # do_setvfinfo(): "ivv->vlan > 4095 || ivv->qos > 7" is EINVAL
MAX_QOS = 7
MAX_RATE = 0xFFFFFFFF  # Mbit/s, a u32 in struct ifla_vf_rate
MAX_VF_INDEX = 0xFFFF  # sriov_totalvfs is a u16

_MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")

# The order of the writes.  Identity first (MAC, VLAN), then the limits and
# the anti-spoofing switches, the VF's link last: a driver that honours
# link_state lets the VF's link up only once its filters are in place.
ORDER = ("mac", "vlan", "rate", "spoofchk", "trust", "link_state")


@dataclass(frozen=True, slots=True)
class VfSettings:
    """What is asked of one VF; None: leave it as it is.  ``qos`` travels
    with ``vlan`` (one ``IFLA_VF_VLAN``), ``min_tx_rate`` with
    ``max_tx_rate`` (one ``IFLA_VF_RATE``), in Mbit/s, 0 = no limit."""

    mac: str | None = None
    vlan: int | None = None
    qos: int | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: str | None = None
    max_tx_rate: int | None = None
    min_tx_rate: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The set fields only (msgpack-able, for the privsep channel)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# What unprepare leaves behind (issue 15): no administrative MAC, no VLAN,
# anti-spoofing on, not trusted, link following the PF's.  The rate limit goes
# too: a limit left on a VF would throttle its next tenant.
RESET = VfSettings(
    mac=ZERO_MAC,
    vlan=0,
    qos=0,
    spoofchk=True,
    trust=False,
    link_state="auto",
    max_tx_rate=0,
    min_tx_rate=0,
)


@dataclass(frozen=True, slots=True)
class VfState:
    """One VF as the PF reports it (``IFLA_VF_INFO``); None: not reported."""

    vf: int
    mac: str | None = None
    vlan: int | None = None
    qos: int | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: str | None = None
    max_tx_rate: int | None = None
    min_tx_rate: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- validation ------------------------------------------------------------------


def _invalid(field: str, value: Any, reason: str) -> exception.InvalidVfSetting:
    return exception.InvalidVfSetting(field=field, value=repr(value), reason=reason)


def _int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(field, value, f"must be an integer in {low}..{high}")
    return value


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _invalid(field, value, "must be true or false")
    return value


def validate_mac(value: Any, field: str = "mac", allow_zero: bool = False) -> str:
    """A unicast MAC in ``aa:bb:cc:dd:ee:ff`` form, returned lower-case.
    The zero MAC only where it means "none" (``allow_zero``: a reset)."""
    if not isinstance(value, str) or not _MAC_RE.fullmatch(value.lower()):
        raise _invalid(field, value, "must be six hex pairs separated by ':'")
    mac = value.lower()
    if mac == ZERO_MAC:
        if allow_zero:
            return mac
        raise _invalid(field, value, "the zero MAC is not an address")
    if int(mac[:2], 16) & 1:
        # The I/G bit: igb answers EINVAL; refuse it before asking.
        raise _invalid(field, value, "is a multicast address, a VF needs a unicast one")
    return mac


def validate_vf_index(value: Any) -> int:
    return _int("vf", value, 0, MAX_VF_INDEX)


def validate_settings(raw: Mapping[str, Any], *, allow_zero_mac: bool = False) -> VfSettings:
    """VfSettings from a request's fields, or InvalidVfSetting naming the first
    bad field.  Unknown fields are refused, not ignored: a typo would
    otherwise leave a VF unconfigured without a word."""
    if not isinstance(raw, Mapping):
        raise _invalid("settings", raw, "must be a mapping")
    known = {f.name for f in dataclasses.fields(VfSettings)}
    for key in raw:
        if key not in known:
            raise _invalid(
                str(key), raw[key], f"unknown VF setting (known: {', '.join(sorted(known))})"
            )
    values: dict[str, Any] = {}
    if raw.get("mac") is not None:
        values["mac"] = validate_mac(raw["mac"], allow_zero=allow_zero_mac)
    if raw.get("vlan") is not None:
        values["vlan"] = _int("vlan", raw["vlan"], 0, MAX_VLAN)
    if raw.get("qos") is not None:
        if raw.get("vlan") is None:
            raise _invalid("qos", raw["qos"], "needs vlan (both go in one IFLA_VF_VLAN)")
        values["qos"] = _int("qos", raw["qos"], 0, MAX_QOS)
    for name in ("spoofchk", "trust"):
        if raw.get(name) is not None:
            values[name] = _bool(name, raw[name])
    if raw.get("link_state") is not None:
        if raw["link_state"] not in LINK_STATES:
            raise _invalid(
                "link_state", raw["link_state"], f"must be one of {', '.join(LINK_STATES)}"
            )
        values["link_state"] = raw["link_state"]
    for name in ("max_tx_rate", "min_tx_rate"):
        if raw.get(name) is not None:
            values[name] = _int(name, raw[name], 0, MAX_RATE)
    settings = VfSettings(**values)
    if (
        settings.max_tx_rate
        and settings.min_tx_rate
        and settings.min_tx_rate > settings.max_tx_rate
    ):
        raise _invalid("min_tx_rate", settings.min_tx_rate, "exceeds max_tx_rate")
    return settings


# --- the link interface and the algorithm ------------------------------------------


class LinkRefused(Exception):
    """A write the kernel or driver answered with an errno."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text


class VfLink(Protocol):
    """The PF's netdev as :func:`apply` needs it (``accel_agent.sriov.netlink``)."""

    name: str

    def read(self, vf: int) -> VfState:
        """The VF's current settings; VfNotReported / VfIndexOutOfRange."""

    def write(self, vf: int, attribute: str, value: dict[str, Any]) -> None:
        """One ``IFLA_VF_<attribute>`` (pyroute2's keys); LinkRefused on an errno."""


def _writes(wanted: VfSettings, before: VfState) -> list[tuple[str, dict[str, Any]]]:
    """(attribute, value) per setting to write, in ORDER.  A setting that
    travels with another (qos with vlan, min with max rate) takes the VF's
    current value when not asked for."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in ORDER:
        if name == "mac" and wanted.mac is not None:
            out.append(("mac", {"mac": wanted.mac}))
        elif name == "vlan" and wanted.vlan is not None:
            out.append(("vlan", {"vlan": wanted.vlan, "qos": wanted.qos or 0}))
        elif name == "rate" and (wanted.max_tx_rate is not None or wanted.min_tx_rate is not None):
            out.append(
                (
                    "rate",
                    {
                        "min_tx_rate": _pick(wanted.min_tx_rate, before.min_tx_rate),
                        "max_tx_rate": _pick(wanted.max_tx_rate, before.max_tx_rate),
                    },
                )
            )
        elif name in ("spoofchk", "trust") and getattr(wanted, name) is not None:
            out.append((name, {name: int(getattr(wanted, name))}))
        elif name == "link_state" and wanted.link_state is not None:
            out.append(("link_state", {"link_state": LINK_STATES.index(wanted.link_state)}))
    return out


def _pick(wanted: int | None, current: int | None) -> int:
    return wanted if wanted is not None else (current or 0)


def _restore(before: VfState, attribute: str) -> dict[str, Any] | None:
    """The value that undoes a write of ``attribute``, from the state read
    before; None when the state did not report it (nothing to go back to)."""
    if attribute == "mac":
        return None if before.mac is None else {"mac": before.mac}
    if attribute == "vlan":
        return None if before.vlan is None else {"vlan": before.vlan, "qos": before.qos or 0}
    if attribute == "rate":
        if before.max_tx_rate is None:
            return None
        return {"min_tx_rate": before.min_tx_rate or 0, "max_tx_rate": before.max_tx_rate}
    if attribute in ("spoofchk", "trust"):
        value = getattr(before, attribute)
        return None if value is None else {attribute: int(value)}
    if attribute == "link_state":
        return (
            None
            if before.link_state is None
            else {"link_state": LINK_STATES.index(before.link_state)}
        )
    raise AssertionError(attribute)


def _mismatches(wanted: VfSettings, after: VfState) -> list[tuple[str, Any, Any]]:
    """(setting, wanted, found) for every asked setting the read-back
    contradicts; a setting the driver does not report is not a mismatch."""
    found = []
    for name, value in wanted.to_dict().items():
        got = getattr(after, name)
        if got is None:
            continue
        if name == "qos" and wanted.vlan is None:
            continue
        if got != value:
            found.append((name, value, got))
    return found


def errno_name(code: int) -> str:
    # 95 is EOPNOTSUPP in the kernel's netlink code; Python's table says ENOTSUP.
    if code == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(code, str(code))


def _rollback(link: VfLink, vf: int, before: VfState, done: list[str]) -> tuple[str, list[str]]:
    """Undo ``done`` (attributes written) in reverse order; (summary, failures)."""
    failed = []
    for attribute in reversed(done):
        value = _restore(before, attribute)
        if value is None:
            failed.append(f"{attribute} (its previous value was not reported)")
            continue
        try:
            link.write(vf, attribute, value)
        except LinkRefused as err:
            failed.append(f"{attribute} ({errno_name(err.code)})")
    if not done:
        return "nothing was changed", failed
    undone = ", ".join(reversed(done))
    if failed:
        return f"rolling back {undone} failed for {', '.join(failed)}", failed
    return f"rolled back {undone}", failed


def merged(wanted: VfSettings, baseline: VfSettings, before: VfState) -> VfSettings:
    """``wanted``, plus every ``baseline`` setting it does not name whose
    reported value differs from the baseline's: a driver refuses some
    settings outright (igb: any ``link_state``), and one that already reads
    as the baseline needs no write.  A setting the driver does not report is
    left alone unless asked for: it has no ``ndo_get_vf_config`` field, and
    none of the drivers known sets what it cannot report."""
    out = wanted.to_dict()
    for name, value in baseline.to_dict().items():
        current = getattr(before, name)
        if name not in out and current is not None and current != value:
            out[name] = value
    if "qos" in out and "vlan" not in out:
        out["vlan"] = baseline.vlan if baseline.vlan is not None else before.vlan or 0
    return VfSettings(**out)


def apply(
    link: VfLink, pf: str, vf: int, wanted: VfSettings, baseline: VfSettings | None = None
) -> tuple[VfState, VfState]:
    """Write ``wanted`` (on top of ``baseline``: :func:`merged`) to VF ``vf``
    of ``link``, read back, and return (state before, state after).  On a
    refusal or a read-back that contradicts a setting, everything this call
    wrote is restored and VfSettingRefused / VfSettingNotApplied is raised
    (VfRollbackFailed when the restore itself failed: the VF is
    half-configured).  ``pf`` names the PF in messages (its PCI address, or
    the netdev)."""
    before = link.read(vf)
    if baseline is not None:
        wanted = merged(wanted, baseline, before)
    done: list[str] = []
    for attribute, value in _writes(wanted, before):
        try:
            link.write(vf, attribute, value)
        except LinkRefused as err:
            summary, failed = _rollback(link, vf, before, done)
            cls = exception.VfRollbackFailed if failed else exception.VfSettingRefused
            raise cls(
                pf=pf,
                vf=vf,
                setting=attribute,
                value=_shown(attribute, value),
                errno=errno_name(err.code),
                error=err.text,
                rollback=summary,
            ) from None
        done.append(attribute)
    after = link.read(vf)
    wrong = _mismatches(wanted, after)
    if wrong:
        name, value, got = wrong[0]
        summary, failed = _rollback(link, vf, before, done)
        raise exception.VfSettingNotApplied(
            pf=pf,
            vf=vf,
            setting=name,
            wanted=value,
            found=got,
            rollback=summary + (": the VF is left half-configured" if failed else ""),
        )
    return before, after


def reset(link: VfLink, pf: str, vf: int) -> tuple[VfState, VfState]:
    """Back to :data:`RESET`, writing only what differs from it (:func:`merged`)."""
    return apply(link, pf, vf, VfSettings(), baseline=RESET)


def _shown(attribute: str, value: dict[str, Any]) -> str:
    """A write as ``ip link`` would spell it: ``vlan 100 qos 3``, ``link_state enable``."""
    if attribute == "link_state":
        return LINK_STATES[value["link_state"]]
    if attribute in ("spoofchk", "trust"):
        return "on" if value[attribute] else "off"
    if attribute in ("mac", "vlan"):
        return " ".join(str(v) if k == attribute else f"{k} {v}" for k, v in value.items())
    return " ".join(f"{k} {v}" for k, v in value.items())
