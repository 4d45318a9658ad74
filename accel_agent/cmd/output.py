"""Human and JSON output of accelctl: aligned tables, stable JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from accel_agent import exception
from accel_agent.exception import printable

# accelctl's exit codes (a public contract, docs/design.md §6.2).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(printable(str(v)) for v in value) or "-"
    # A name read from sysfs or given by a caller may hold a newline or a
    # terminal escape: shown escaped, it can neither break the table's rows
    # nor drive the terminal.
    return printable(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO | None = None) -> None:
    """Print an aligned table; numbers are right-aligned so columns of
    counters read at a glance."""
    out = out or sys.stdout
    text_rows = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [
        all(row[i].isdigit() or row[i] == "-" for row in text_rows) and bool(text_rows)
        for i in range(len(headers))
    ]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    out.write(fmt([h.upper() for h in headers]) + "\n")
    for row in text_rows:
        out.write(fmt(row) + "\n")


def emit_json(document: Any, out: TextIO | None = None) -> None:
    """Indented for a person at a terminal; compact for a pipe.  Python's
    C encoder only runs without ``indent``, and a 1,000-GPU host's listing
    is megabytes: scripts should not pay for whitespace they never read."""
    out = out or sys.stdout
    if out.isatty():
        json.dump(document, out, indent=2)
    else:
        # Documents are trees built by the views: no cycle to guard against.
        out.write(json.dumps(document, separators=(",", ":"), check_circular=False))
    out.write("\n")


def allocation(document: dict[str, Any], as_json: bool) -> None:
    """An instance's allocation (``allocate``, ``migration commit``): the
    document as JSON, or one row per mdev."""
    if as_json:
        emit_json(document)
        return
    table(
        ("uuid", "parent", "type"),
        [(m["uuid"], m["parent"], m["mdev_type"]) for m in document["mdevs"]],
    )


def emit_json_bytes(document: bytes) -> None:
    """Compact JSON received from the daemon, printed as it is."""
    sys.stdout.flush()
    sys.stdout.buffer.write(document.rstrip(b"\n") + b"\n")
    sys.stdout.buffer.flush()


def error(message: str) -> None:
    """One error per line on stderr, as the CLI contract says."""
    for line in str(message).splitlines() or [""]:
        sys.stderr.write(f"error: {printable(line)}\n")


def warning(message: str) -> None:
    sys.stderr.write(f"warning: {printable(str(message))}\n")


def permission_denied(exc: PermissionError) -> str:
    """The one line for a file or directory this user may not use."""
    what = f"{exc.filename}: " if exc.filename else ""
    return (
        f"{what}permission denied: this command reads or changes the agent's own files "
        "(its state directory, ledger and lock); run it as root, or through the running "
        "agent (without --offline)"
    )


def exit_status(command: Callable[[], int]) -> int:
    """Run ``command``; an agent error becomes its message(s) on stderr and
    exit 1 (the CLI contract), never a traceback."""
    try:
        return command()
    except exception.ConfigErrors as exc:
        for item in exc.errors:
            error(item.message)
        return EXIT_ERROR
    except exception.AccelAgentException as exc:
        request_id = exc.kwargs.get("request_id") if isinstance(exc, exception.ApiError) else None
        # The agent's request id, for a grep of its log.
        error(f"{exc.message} (request {request_id})" if request_id else exc.message)
        return EXIT_ERROR
    except PermissionError as exc:
        # An offline command run by a user who may not touch the agent's
        # state (its directory is 0700 under the shipped unit): one line
        # naming what was refused, not a traceback.
        error(permission_denied(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (``accelctl types | head``): no traceback, and
        # nothing more to flush into the closed pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
