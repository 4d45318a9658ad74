"""``GET /v1/health``: ``ok``, ``converging`` or ``degraded``, with every
problem an operator must act on, in one document (its shape is in
openapi.json).

Degraded while: Placement syncs fail, the last rescan or recovery failed,
recorded devices are missing or wait for their parent, the last reload was
refused, a privileged helper is restarting or cannot be started, the ledger
cannot record new work (deleted or replaced under the agent, a failed write,
a full filesystem), devices that look like the agent's were found while
its ledger was missing, or a standing layout is not in place (a GPU short of
room or blocked by devices of another type, its GPU missing, a converge that
failed, devices draining for longer than a day), libvirt does not answer
within its deadline, or a Placement sync runs past its own.

Converging while the only note is a planned drain (a lowered N or another
type: devices in use drain until free, ``layout_converging``), for up to a
day (the limit of the alert AccelAgentLayoutDrainingLong); then degraded
(``layout_draining_long``).  ``accel_agent_healthy`` is 1 for ``ok`` and
``converging``: a planned drain is no failure for AccelAgentUnhealthy.  A
client tells a state from a failure by the kind: every kind but those of
``health_kinds.CONVERGING_KINDS`` is a failure.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import accel_agent
from accel_agent.daemon import layout_in_use
from accel_agent.daemon.counts import RescanView, iso
from accel_agent.daemon.rescans import LayoutView, helper_guards
from accel_agent.devices.gpu_layouts import SECTION_PREFIX
from accel_agent.reporting import health_kinds as kind

if TYPE_CHECKING:
    from accel_agent.daemon.core import AgentCore
    from accel_agent.devices.ledger import Ledger


def no_space_left(directory: str) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    # f_bavail: what an unprivileged writer has; root may still use the reserve.
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) == 0


# (kind, message): the kind is one of accel_agent.reporting.health_kinds.
Problem = tuple[str, str]


def ledger_problems(ledger: Ledger, rescan: RescanView) -> list[Problem]:
    """What keeps the ledger from recording the agent's work, now."""
    from accel_agent.devices.recovery import unrecorded_warning

    problems: list[Problem] = []
    replaced = ledger.identity_problem()
    if replaced is not None:
        problems.append((
            kind.LEDGER_REPLACED,
            f"the mdev ledger {ledger.path} was deleted or replaced while the agent had it "
            f"open ({replaced}): every change is refused; restart the agent",
        ))
    if ledger.write_error is not None:
        problems.append((
            kind.LEDGER_WRITE_FAILED,
            f"the mdev ledger {ledger.path} cannot be written: {ledger.write_error}",
        ))
    if no_space_left(str(ledger.state_dir)):
        problems.append((
            kind.LEDGER_NO_SPACE,
            f"no space left on the filesystem of {ledger.state_dir}: the mdev ledger cannot "
            "record new work",
        ))
    if rescan.unrecorded:
        problems.append((
            kind.UNRECORDED_MDEVS,
            unrecorded_warning(str(ledger.path), list(rescan.unrecorded)),
        ))
    return problems


# How long a planned drain is a state before it is a problem: the ``for`` of
# docs/prometheus-alerts.yml's AccelAgentLayoutDrainingLong.
DRAINING_LIMIT = 24 * 3600.0


def layout_problems(layout: LayoutView, now: float) -> list[Problem]:
    """The layouts not in place: standing (devices/layout.py), mixed-size
    and MIG-backed (devices/gpu_layout_converge.py)."""
    problems: list[Problem] = []
    if layout.draining:
        since = layout.draining_since
        if since is not None and now - since >= DRAINING_LIMIT:
            problems.append((
                kind.LAYOUT_DRAINING_LONG,
                f"layout draining for more than a day: {len(layout.draining)} device(s) a "
                f"changed layout no longer wants are still in use: {', '.join(layout.draining)}",
            ))
        else:
            problems.append(
                (kind.LAYOUT_CONVERGING, f"layout converging, {len(layout.draining)} draining")
            )
    short = short_text(layout)
    if short:
        problems.append((kind.LAYOUT_GPUS_SHORT, short))
    if layout.error:
        problems.append((kind.LAYOUT_CONVERGE_FAILED, f"layout converge failed: {layout.error}"))
    if layout.missing_gpus:
        problems.append((
            kind.LAYOUT_GPUS_MISSING,
            f"GPU(s) a layout names not on this host (VFs not enabled? "
            f"nvidia-sriov.service): {', '.join(layout.missing_gpus)}",
        ))
    return problems


def short_text(layout: LayoutView) -> str | None:
    """The GPUs short of their layout, each under its layout's kind: a
    standing layout (``[mdev_<type>] standing``, its type named) or a
    mixed-size one (``[gpu_layout_<name>]``, its section named); None when
    none is.  One problem, so one kind (``layout_gpus_short``)."""
    standing: list[str] = []
    mixed: list[str] = []
    for gpu, found in layout.short:
        if gpu not in layout.missing_gpus:
            mine = mixed if found.device_type.startswith(SECTION_PREFIX) else standing
            mine.append(found.text(gpu))
    said = [f"GPU(s) short of their {what} layout: " + "; ".join(texts)
            for what, texts in (("standing", standing), ("mixed-size or MIG", mixed)) if texts]
    return "; ".join(said) or None


def status_of(problems: list[Problem]) -> str:
    """``ok`` without problems, ``converging`` with only planned drains,
    else ``degraded``."""
    if not problems:
        return "ok"
    if all(problem_kind in kind.CONVERGING_KINDS for problem_kind, _ in problems):
        return "converging"
    return "degraded"


def in_use_section(rows: layout_in_use.InUse | None) -> dict[str, Any]:
    """The layout's devices in use: in all, per type, per physical GPU."""
    if rows is None:
        return {"in_use": None, "in_use_by_type": None, "in_use_by_gpu": None}
    return {
        "in_use": sum(n for _, _, n in rows),
        "in_use_by_type": layout_in_use.by_type(rows),
        "in_use_by_gpu": layout_in_use.by_gpu(rows),
    }


def libvirt_section(core: AgentCore) -> tuple[dict[str, Any], list[Problem]]:
    """libvirt at the running ``[libvirt] uri``, as its calls found it
    (devices/libvirt_calls.py): a problem while it is stalled."""
    from accel_agent.devices import libvirt_calls

    uri = getattr(getattr(core.devices, "domains", None), "uri", "")
    status = libvirt_calls.status_of(uri)
    if status is None:
        return {"state": "not_configured", "uri": "", "since": None, "last_error": None,
                "call_timeout": None, "blocked_calls": 0}, []
    section = status.to_dict(iso)
    if status.state != libvirt_calls.STALLED:
        return section, []
    return section, [(
        kind.LIBVIRT_STALLED,
        f"libvirt at {uri} is not answering since {section['since']} ({status.last_error}): "
        "mdev listings show its fields null, removes leave libvirt's definitions to recovery, "
        "takeovers are refused",
    )]


def reporting_problems(reporting: dict[str, Any]) -> list[Problem]:
    """A Placement sync failing, or running past its deadline."""
    if reporting["state"] == "failing":
        return [(kind.PLACEMENT_SYNC_FAILING, f"Placement sync failing: {reporting['last_error']}")]
    if reporting["state"] == "syncing":
        return [(
            kind.PLACEMENT_SYNC_STUCK,
            f"Placement sync running since {reporting.get('syncing_since')}, past its "
            f"{reporting.get('sync_deadline')} s ([placement] sync_interval or timeout): "
            "Placement answers slowly; reporting is behind "
            f"(last success {reporting.get('last_success')})",
        )]
    return []


def health(core: AgentCore) -> dict[str, Any]:
    rescan, recovery = core.rescans.views()
    reload = core.reloads.current()
    reporting = core.reporter.health()
    problems: list[Problem] = reporting_problems(reporting)
    if rescan.error:
        problems.append((kind.RESCAN_FAILED, f"last rescan failed: {rescan.error}"))
    if recovery.error:
        problems.append((kind.RECOVERY_FAILED, f"last recovery failed: {recovery.error}"))
    if rescan.missing:
        problems.append((
            kind.MDEVS_MISSING,
            f"{len(rescan.missing)} recorded device(s) are missing from sysfs and could not "
            "be re-created",
        ))
    if rescan.waiting:
        problems.append((
            kind.MDEVS_WAITING_FOR_PARENT,
            f"{len(rescan.waiting)} recorded device(s) wait for their parent to come back",
        ))
    if reload.result == "refused":
        problems.append(
            (kind.CONFIG_RELOAD_REFUSED, f"configuration reload refused: {reload.reason}")
        )
    helpers = [guard.health() for guard in helper_guards()]
    problems += [
        (
            kind.PRIVILEGED_HELPER_DOWN,
            f"privileged helper {h.name} is {h.state}: {h.last_error or 'no answer yet'}",
        )
        for h in helpers
        if not h.ok
    ]
    problems += ledger_problems(core.devices.ledger, rescan)
    layout = core.rescans.layout
    problems += layout_problems(layout, core.rescans.now())
    libvirt, libvirt_problems = libvirt_section(core)
    problems += libvirt_problems
    return {
        "status": status_of(problems),
        "version": accel_agent.__version__,
        "host": core.host,
        "pid": os.getpid(),
        "started_at": iso(core.started_at),
        "last_rescan": iso(rescan.at),
        "rescans": rescan.count,
        "mdevs": dict(rescan.counts),
        "providers": rescan.providers,
        "reporting": reporting,
        "recovery": {
            "last_run": iso(recovery.at),
            "recreated": list(recovery.recreated),
            "error": recovery.error,
            "missing": list(rescan.missing),
            "waiting_for_parent": list(rescan.waiting),
        },
        "config": {
            "loaded_at": iso(reload.loaded_at),
            "last_reload": iso(reload.at),
            "last_reload_result": reload.result,
            "last_reload_error": reload.reason,
        },
        "layout": {
            "draining": list(layout.draining),
            "draining_since": iso(layout.draining_since),
            "short": {
                gpu: {
                    "mdev_type": short.device_type,
                    "standing": short.standing,
                    "present": short.present,
                    "reason": short.reason,
                    "blocked_by": list(short.blocked_by),
                }
                for gpu, short in layout.short
            },
            "missing_gpus": list(layout.missing_gpus),
            "error": layout.error,
            # Held open by a consumer (a VM) at the last converge; null: not known.
            **in_use_section(layout.in_use),
        },
        "privileged_helpers": {h.name: h.to_dict() for h in helpers},
        "libvirt": libvirt,
        "problems": [message for _, message in problems],
        # One kind per problem, in the same order (accel_agent.reporting.health_kinds):
        # what a client or an alert matches on instead of the free-text message.
        "problem_kinds": [problem_kind for problem_kind, _ in problems],
    }
