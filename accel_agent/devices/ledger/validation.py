"""What may become a ledger key or column: instance ids (from API callers),
device UUIDs, parents, types and backend names, each checked before any
SQL runs, so bad input is a clear error that changes nothing."""

from __future__ import annotations

import re
from typing import Any

from accel_agent import exception

MAX_ID_LEN = 255

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def validate_instance_id(value: Any) -> str:
    """Instance ids come from API callers; they become ledger keys and log text."""
    if not isinstance(value, str):
        raise exception.InvalidInstanceId(instance=value, reason="not a string")
    if not value or not value.strip():
        raise exception.InvalidInstanceId(instance=value, reason="empty")
    if len(value) > MAX_ID_LEN:
        raise exception.InvalidInstanceId(
            instance=value, reason=f"longer than {MAX_ID_LEN} characters"
        )
    if "\x00" in value or not value.isprintable():
        raise exception.InvalidInstanceId(
            instance=value, reason="contains NUL or non-printable characters"
        )
    return value


def validate_uuid(value: Any) -> str:
    if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
        raise exception.InvalidMdevUUID(
            uuid=value, where=" for the ledger", reason="expected lowercase 8-4-4-4-12 hex"
        )
    return value


def validate_name(what: str, value: Any) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ID_LEN
        or not value.isprintable()
    ):
        raise exception.LedgerError(reason=f"invalid {what} {value!r}")
    return value


# A vGPU placement id: an offset in its GPU's placement units (the column's CHECK).
MAX_PLACEMENT_ID = 65536


def validate_placement_id(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (
        0 <= value <= MAX_PLACEMENT_ID
    ):
        raise exception.LedgerError(reason=f"invalid placement id {value!r}")
    return value
