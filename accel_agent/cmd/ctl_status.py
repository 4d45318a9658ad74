"""``accelctl health`` and ``accelctl status``: the running daemon's word on
itself, without curl on its socket.

``health`` prints ``GET /v1/health``: a few lines (status, what the start
waits for while the agent starts, the problems), or the document itself
with ``--json``.  ``status`` is one screen: health's summary, each GPU's
standing layout (its N, the devices present, in use, draining, what it is
short of) and Placement reporting.  Both ask the daemon: health is the
running agent's, so ``--offline`` or no daemon is an error (exit 1).  Both
answer while the agent starts (the API serves health and the listings
then, accel_agent.daemon.starting).
"""

from __future__ import annotations

import argparse
from typing import Any

from accel_agent import exception, wiring
from accel_agent.cmd import daemon, output
from accel_agent.exception import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    health = subparsers.add_parser(
        "health",
        help="the running daemon's health (GET /v1/health): ok, degraded or starting, "
        "and why",
        description="Ask the running accel-agent for its health (GET /v1/health) and print "
        "it: the status (ok, degraded, or starting: then what the start is doing or waits "
        "for), the agent, its last rescan, Placement reporting and every problem. With "
        "--json: the document as the daemon sent it. Exit status: 0 the daemon answered "
        "(whatever its status), 1 no daemon runs or it cannot be reached.",
    )
    health.add_argument("--json", action="store_true", help="the health document as JSON")
    health.set_defaults(func=show_health)
    status = subparsers.add_parser(
        "status",
        help="one screen: health, each GPU's standing layout, Placement reporting",
        description="One screen of the running accel-agent: its health (as 'accelctl "
        "health' says it), each GPU with a standing layout ([mdev_<type>] standing: its "
        "N, the devices present, in use by a VM, draining, and how many it is short of "
        "or that the GPU is missing) and the state of Placement reporting. With --json: "
        "the same as one document (health, layouts, reporting). Exit status: 0 the daemon "
        "answered, 1 no daemon runs or it cannot be reached.",
    )
    status.add_argument("--json", action="store_true", help="the screen as one JSON document")
    status.set_defaults(func=show_status)


# --- asking the daemon --------------------------------------------------------------------


def _ask(args: argparse.Namespace, what: str, *paths: str) -> list[Any]:
    """GET each of ``paths`` from the running daemon; an error when there is none."""
    if args.offline:
        raise exception.AccelAgentException(
            f"{what} is the running daemon's to tell: it has no --offline form"
        )
    listing, _errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
    socket_path = listing.api_socket_path
    answers = daemon.via_api(
        args, socket_path, lambda api: [api.call("GET", path) for path in paths]
    )
    if answers is daemon.OFFLINE:
        raise exception.AccelAgentException(
            f"accel-agent is not running (no API socket at {socket_path}, or nobody listens "
            f"on it): no {what} to show"
        )
    return answers


def show_health(args: argparse.Namespace) -> int:
    (document,) = _ask(args, "health", "/v1/health")
    if args.json:
        output.emit_json(document)
    else:
        print("\n".join(health_lines(document)))
    return output.EXIT_OK


def show_status(args: argparse.Namespace) -> int:
    document, mdevs = _ask(args, "status", "/v1/health", "/v1/mdevs")
    layouts = layout_rows(document, mdevs, *_standing(args))
    if args.json:
        output.emit_json({
            "health": document,
            "layouts": layouts,
            "reporting": document.get("reporting"),
        })
        return output.EXIT_OK
    print("\n".join(health_lines(document, problems=False)))
    print()
    if layouts:
        print("standing layouts:")
        output.table(
            ("gpu", "type", "standing", "present", "in use", "draining", "short"),
            [
                (r["gpu"], r["mdev_type"], r["standing"], r["present"], r["in_use"],
                 r["draining"], "missing" if r["missing"] else r["short"])
                for r in layouts
            ],
        )
    else:
        print("standing layouts: none")
    problems = document.get("problems") or []
    if problems:
        print()
        print("problems:")
        for problem in problems:
            print(f"  - {printable(problem)}")
    return output.EXIT_OK


# --- what is printed ---------------------------------------------------------------------


def health_lines(document: dict[str, Any], problems: bool = True) -> list[str]:
    status = str(document.get("status", "?"))
    head = f"status: {status}"
    if status == "starting":
        from accel_agent.api.client import describe_starting

        head += f": {describe_starting(document.get('starting'))}"
    lines = [head]
    lines.append(
        f"agent: accel-agent {document.get('version', '?')} on {document.get('host', '?')}, "
        f"pid {document.get('pid', '?')}, started {document.get('started_at', '?')}"
    )
    lines.append(
        f"last rescan: {document.get('last_rescan') or 'none yet'} "
        f"({document.get('rescans', 0)} in all)"
    )
    counts = document.get("mdevs") or {}
    shown = ", ".join(f"{state} {n}" for state, n in sorted(counts.items()) if n)
    lines.append(f"devices: {shown or 'none'}; providers: {document.get('providers', 0)}")
    lines.append(f"reporting: {reporting_line(document.get('reporting') or {})}")
    listed = document.get("problems") or []
    if problems:
        if listed:
            lines.append("problems:")
            lines += [f"  - {printable(p)}" for p in listed]
        else:
            lines.append("problems: none")
    return [printable(line) for line in lines]


def reporting_line(reporting: dict[str, Any]) -> str:
    state = str(reporting.get("state", "?"))
    if state == "disabled":
        return "disabled ([placement] enabled = false)"
    text = f"{state}, last success {reporting.get('last_success') or 'never'}"
    if state == "failing":
        text += (f", {reporting.get('consecutive_failures', '?')} failure(s) in a row, next "
                 f"attempt {reporting.get('next_attempt_at') or '?'}: "
                 f"{reporting.get('last_error')}")
    return text


def _standing(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, str]]:
    """``[mdev_<type>] standing`` of each type that has one, and the type of
    each GPU such a type names, from the config files (both empty when they
    cannot be read: the N is then not shown)."""
    from accel_agent.cmd import loading
    from accel_agent.devices import policy as policy_mod

    try:
        policy = policy_mod.build_policy(loading.load_config(args))
    except exception.AccelAgentException:
        return {}, {}
    types = [t for t in policy.types if t.standing > 0]
    return (
        {t.mdev_type: t.standing for t in types},
        {gpu: t.mdev_type for t in types for gpu in t.device_addresses},
    )


def layout_rows(
    health: dict[str, Any],
    mdevs: dict[str, Any],
    standing: dict[str, int],
    type_of_gpu: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per GPU with a standing layout: from health's ``layout``
    (short, missing, in use) and the mdevs listing (the layout's devices
    present and draining, per physical GPU)."""
    layout = health.get("layout") or {}
    short = layout.get("short") or {}
    missing = set(layout.get("missing_gpus") or [])
    in_use = layout.get("in_use_by_gpu")
    rows: dict[str, dict[str, Any]] = {}

    def row(gpu: str, mdev_type: str | None) -> dict[str, Any]:
        found = rows.setdefault(gpu, {
            "gpu": gpu, "mdev_type": mdev_type, "standing": None, "present": 0,
            "in_use": None if in_use is None else in_use.get(gpu, 0), "draining": 0,
            "short": 0, "missing": gpu in missing,
        })
        if found["mdev_type"] is None:
            found["mdev_type"] = mdev_type
        return found

    for mdev in mdevs.get("mdevs") or []:
        gpu = mdev.get("physical_gpu")
        if not gpu:
            continue
        if mdev.get("standing") and not mdev.get("draining"):
            row(gpu, mdev.get("mdev_type"))["present"] += 1
        elif mdev.get("draining"):
            row(gpu, None)["draining"] += 1
    for gpu, wanted in short.items():
        found = row(gpu, wanted.get("mdev_type"))
        found["standing"] = wanted.get("standing")
        found["present"] = wanted.get("present", found["present"])
        found["short"] = max(0, int(wanted.get("standing", 0)) - int(found["present"]))
    for gpu in missing:
        row(gpu, None)
    for found in rows.values():
        if found["mdev_type"] is None:
            found["mdev_type"] = (type_of_gpu or {}).get(found["gpu"])
        if found["standing"] is None:
            found["standing"] = standing.get(found["mdev_type"] or "")
    return [rows[gpu] for gpu in sorted(rows)]
