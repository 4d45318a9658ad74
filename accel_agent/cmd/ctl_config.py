"""``accelctl check-config`` and ``accelctl reload``: the configuration,
checked against this host or reloaded by the running daemon.

``check-config`` is the start's own check (config/check.py, config/startchecks.py):
what it passes, the start and a reload take; what it refuses, they refuse in
the same words.  It opens the ledger read-only (never created, migrated or
checkpointed; SQLite's quick_check, as the start runs it), also beside a
running daemon, in another process than the daemon's: a device an instance
holds that the configuration would give another owner is one of its errors.
Beside the daemon, the daemon's own socket and metrics port are not in the
way (the daemon is the process serving ``[api] socket_path``).
(``accelctl ledger upgrade`` is accel_agent.cmd.ledger_upgrade.)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from accel_agent import exception, wiring
from accel_agent.cmd import loading, output

# Seconds `accelctl reload` waits for the daemon's answer.
RELOAD_TIMEOUT = 300.0


def add_check_config(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "check-config",
        help="validate the config against this host as the daemon's start does and print "
        "every problem",
        description="Validate the configuration against this host with the checks the "
        "daemon's start runs (accel-agent --check, the start and every reload run the same "
        "ones and refuse in the same words): every option's value (named by file and line); "
        "[devices] enabled_mdev_types, the [mdev_<type>] sections and the VF pools against "
        "sysfs; [DEFAULT] log_config_append or the log file's directory; "
        "[api] socket_group (a group of this host); [api] socket_path (its directory "
        "not writable by others without the sticky bit, nothing but a socket in the way, no "
        "other agent serving it); [accel_agent_privileged] helper_command (its program "
        "exists); [placement] auth options when enabled; [metrics] listen (bound and let go "
        "at once); the ledger (SQLite's quick_check, opened read-only); and each device an "
        "instance holds that the configuration would give another owner (its parent another "
        "type or none, its type reported_by = nova), as recovery and a reload refuse it. "
        "Beside the running agent, its own socket and metrics port are not in the way. "
        "Errors exit 1; warnings (an address that is no mdev parent, a type a parent does "
        "not offer) are printed and become errors with --strict. With --json: one JSON "
        "document on stdout (ok, errors, warnings, each problem with its message, file, "
        "line, section and option where known), nothing on stderr, the same exit status. "
        "With --nova-conf FILE: also each GPU that Nova's [pci] device_spec in FILE and the "
        "agent would both report to Placement (counted twice), an error.",
    )
    check.add_argument("--strict", action="store_true", help="treat warnings as errors")
    check.add_argument(
        "--json", action="store_true",
        help="the result as one JSON document on stdout (exit status unchanged)",
    )
    check.add_argument(
        "--nova-conf", action="append", metavar="FILE", default=[],
        help="also read Nova's [pci] device_spec from FILE (a nova.conf; repeatable, as "
        "nova-compute takes several --config-file) and report, as an error, each GPU it "
        "would count twice: Nova reports the VFs device_spec lists while the agent "
        "reports their GPU itself ([mdev_<type>] reported_by = agent). The same check as "
        "nova-pci-config --check. A FILE that cannot be read, or a device_spec that is "
        "not JSON, is an error too. Nova's files are read only when named here (never "
        "/etc/nova/nova.conf by default)",
    )
    check.set_defaults(func=check_config)


def add_reload(subparsers: argparse._SubParsersAction) -> None:
    reload = subparsers.add_parser(
        "reload",
        help="make the running daemon re-read its configuration files (like SIGHUP) and "
        "say whether it applied them",
        description="Ask the running accel-agent to reload its configuration, as SIGHUP "
        "(systemctl reload) does, and wait for the result. The daemon checks the files "
        "exactly as at start-up (every value and range, named by file and line) and "
        "refuses a configuration that would orphan an assigned device or that changes an "
        "option needing a restart; a refused reload keeps the running configuration. "
        "Exit status: 0 applied, 1 refused (the reason on stderr) or no daemon running.",
    )
    reload.add_argument("--json", action="store_true", help="the daemon's answer as JSON")
    reload.set_defaults(func=reload_config)


def check_config(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        return _check_config_json(args)
    errors, warnings, state = _check(args)
    nova = _check_nova_conf(args, state)
    errors, warnings = nova.joined(errors, warnings, args.strict)
    for warning in warnings:
        output.warning(warning)
    if nova.note:
        sys.stderr.write(f"note: {nova.note}\n")
    if errors or state is None:
        for error in errors:
            output.error(error)
        return output.EXIT_ERROR
    print(
        f"configuration OK: {len(state.policy.types)} mdev type(s) enabled, "
        f"{_providers(args, state)} provider(s) on {len(state.snapshot.parents)} mdev parent(s)"
    )
    return output.EXIT_OK


def _check(args: argparse.Namespace) -> tuple[list[str], list[str], Any]:
    from accel_agent.config import check, startchecks

    conf = loading.load_config(args)
    # Beside the running daemon (check-config && accelctl reload): its own
    # socket and metrics port are not in the way (see the module's docstring).
    running = startchecks.serving_pid(conf.api.socket_path)
    return check.check(conf, strict=args.strict, running=running)


@dataclass(frozen=True)
class _NovaCheck:
    """What ``--nova-conf`` found (issue 23)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # ``counted_twice`` of check-config --json.
    counted_twice: list[dict[str, Any]] = field(default_factory=list)
    # Without --nova-conf on a host where it matters: how to check it.
    note: str = ""

    def joined(
        self, errors: list[str], warnings: list[str], strict: bool
    ) -> tuple[list[str], list[str]]:
        """check-config's errors and warnings with these added (with
        --strict, these warnings are errors too)."""
        if strict:
            return errors + self.errors + self.warnings, warnings
        return errors + self.errors, warnings + self.warnings


def _check_nova_conf(args: argparse.Namespace, state: Any) -> _NovaCheck:
    """Each GPU that Nova's ``[pci] device_spec`` (in the --nova-conf files)
    and the agent would both report: one error naming it, its type and the
    first device_spec line that lists it.  The files are read as
    ``nova-pci-config --check`` reads them (reporting/nova_pci.py); oslo.config
    joins a multi-valued option's values across nova-compute's files, so do
    we.  Nova's config is never read unless named: it is another service's
    file (readable by root and nova only, on most hosts), and a check must
    not depend on what happens to be installed where it runs."""
    from accel_agent.reporting import nova_pci

    reported = nova_pci.agent_reported(state.snapshot, state.policy) if state else {}
    paths = list(getattr(args, "nova_conf", None) or [])
    if not paths:
        if not reported:
            return _NovaCheck()
        gpus = len({vf.gpu for vf in reported.values()})
        return _NovaCheck(note=(
            f"Nova's [pci] device_spec was not checked for GPUs counted twice ({gpus} "
            "vendor-VFIO GPU(s) the agent reports itself, reported_by = agent): pass "
            "--nova-conf /etc/nova/nova.conf to check it"
        ))
    errors: list[str] = []
    warnings: list[str] = []
    entries: list[nova_pci.SpecLine] = []
    for path in paths:
        try:
            found = nova_pci.read_nova_conf(path)
        except exception.InvalidConfig as exc:
            errors.append(exc.message)
            continue
        errors += found.problems
        entries += found.entries
    twice = nova_pci.counted_twice(entries, reported)
    for item in twice:
        first = item.lines[0]
        errors.append(f"{first.file}:{first.line}: {item.message()}")
    if reported:
        for entry in nova_pci.not_by_address(entries):
            # devname names a network interface; another vendor is no GPU.
            if "devname" in entry.value or str(
                entry.value.get("vendor_id", nova_pci.NVIDIA_VENDOR)
            ).strip().lower().removeprefix("0x") != nova_pci.NVIDIA_VENDOR:
                continue
            warnings.append(
                f"{entry.file}:{entry.line}: [pci] device_spec names devices by a regex "
                "address: not checked for GPUs counted twice"
            )
    return _NovaCheck(errors=errors, warnings=warnings, counted_twice=[
        {
            "gpu": item.gpu,
            "type": item.mdev_type,
            "vfs": list(item.vfs),
            "device_spec": [
                {"file": line.file, "line": line.line, "value": dict(line.value)}
                for line in item.lines
            ],
        }
        for item in twice
    ])


def _providers(args: argparse.Namespace, state: Any) -> int:
    """The providers the agent reports (``accelctl inventory``, GET
    /v1/inventory, Placement; DeviceManager.reported_inventory): the GPUs'
    but those of a type Nova reports (``reported_by = nova``), and one per PF
    of a VF pool that has VFs."""
    from accel_agent.config.options import CONF  # the configuration _check loaded and checked

    outside = wiring.build_backends(CONF).values()  # no writer: nothing is written
    return len(state.reported_inventory().providers) + sum(
        len(backend.providers(CONF.host)) for backend in outside
    )


def _check_config_json(args: argparse.Namespace) -> int:
    """``check-config --json``: every problem in one document, each with
    the file, line, section and option its message names; an error that
    ends the check early (a file oslo.config cannot read, a ledger it
    cannot open) is one of its errors too."""
    try:
        errors, warnings, state = _check(args)
    except exception.ConfigErrors as exc:
        errors, warnings, state = [e.message for e in exc.errors], [], None
    except exception.AccelAgentException as exc:
        errors, warnings, state = [exc.message], [], None
    nova = _check_nova_conf(args, state)
    errors, warnings = nova.joined(errors, warnings, args.strict)
    ok = not errors and state is not None
    summary = None
    if ok:
        summary = {
            "mdev_types": len(state.policy.types),
            "providers": _providers(args, state),
            "parents": len(state.snapshot.parents),
        }
    output.emit_json(
        {
            "ok": ok,
            "strict": bool(args.strict),
            "errors": [_problem(m) for m in errors],
            "warnings": [_problem(m) for m in warnings],
            "summary": summary,
            # --nova-conf (issue 23): the files read, and each GPU Nova's
            # device_spec and the agent would both report (also an error).
            "nova_conf": list(getattr(args, "nova_conf", None) or []),
            "counted_twice": nova.counted_twice,
        }
    )
    return output.EXIT_OK if ok else output.EXIT_ERROR


def _problem(message: str) -> dict[str, Any]:
    """One problem of ``check-config --json``: the message, and the file,
    line, section and option it names (null where it names none)."""
    from accel_agent.config import lint

    where = lint.locate(message)
    return {
        "message": message,
        "file": where.file,
        "line": where.line,
        "section": where.section,
        "option": where.option,
    }


def reload_config(args: argparse.Namespace) -> int:
    """Ask the running daemon to reload its configuration, as SIGHUP does,
    and say what happened: 0 applied, 1 refused (the reason on stderr) or
    no daemon."""
    listing, _errors = wiring.listing_config(args.config_file, args.config_dir, "accelctl")
    from accel_agent.api.client import ApiClient

    socket_path = listing.api_socket_path
    try:
        # Validating a configuration scans the host: give a large one time.
        outcome = ApiClient(socket_path, timeout=RELOAD_TIMEOUT).call("POST", "/v1/reload")
    except exception.AgentNotRunning:
        output.error(f"accel-agent is not running (no API socket at {socket_path}): nothing "
                     "to reload; the configuration is read when it starts")
        return output.EXIT_ERROR
    if args.json:
        output.emit_json(outcome)
        return output.EXIT_OK
    for note in outcome.get("notes", []):
        output.warning(note)
    print("configuration reloaded")
    return output.EXIT_OK
