"""Placement's answers as the reporter may use them: bounded, JSON, of the right shape.

An answer comes from the network, so it is input like any other (issue 21):
``200 {}`` for a provider listing gave ``KeyError: 'uuid'`` and a traceback
at every sync, and a 200 MB answer was read whole, keeping the daemon's RSS
200 MB higher for good.  Here:

* a body is read in chunks, undecoded, and never beyond
  :data:`MAX_ANSWER_BYTES`: a ``Content-Length`` above it is refused before
  the first byte, a body that grows past it stops the read (and the
  connection is dropped).  (One that trickles in is cut by the whole
  answer's deadline, :mod:`.deadline`: a check between two reads cannot, one
  read waits for a whole chunk.)  The answers the reporter reads are one
  host's providers, a few KiB; the bound is a thousand times that.  A body
  the server compressed (the reporter asks for ``identity``) is refused
  rather than inflated: 64 KiB of gzip can inflate to 64 MB;
* a body is parsed as JSON (too deep a nesting is refused, not a crash);
* every field the reporter uses is checked for its type (and a provider UUID
  for being one: it becomes part of the URLs the reporter writes to) before
  any of it is used; extra fields are ignored.

Each failure raises :class:`AnswerRejected` with one line saying what was
wrong (``resource_providers[0].uuid is missing``); the client turns it into
a failed sync naming the request.
"""

from __future__ import annotations

import json
import math
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# Far above any real answer to the reporter (a host's subtree: a few KiB).
MAX_ANSWER_BYTES = 8 * 1024 * 1024
READ_CHUNK = 64 * 1024

INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")
_INTEGER_FIELDS = INVENTORY_FIELDS[:-1]
_UUID_CHARACTERS = frozenset("0123456789abcdefABCDEF-")


class AnswerRejected(Exception):
    """An answer the reporter will not use; ``str()`` is the one-line reason."""


class RawBody(Protocol):
    """What the reader needs of a response body (urllib3's ``HTTPResponse``)."""

    def read(self, amt: int, decode_content: bool) -> bytes: ...


def read_body(
    raw: RawBody,
    headers: Mapping[str, str],
    *,
    limit: int = MAX_ANSWER_BYTES,
) -> bytearray:
    """The body, at most ``limit`` bytes of it (its time is the deadline's:
    :mod:`.deadline` shuts the socket down)."""
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerRejected(f"a {encoding[:40]!r}-encoded body (identity was asked for); not read")
    declared = headers.get("Content-Length")
    if declared is not None:
        declared = declared.strip()
        if not (declared.isascii() and declared.isdigit()):
            raise AnswerRejected(f"Content-Length {declared[:40]!r} is not a number; not read")
        if len(declared) > 19 or int(declared) > limit:
            raise AnswerRejected(
                f"Content-Length {declared[:20]} exceeds the {limit} bytes an answer may have; "
                "not read"
            )
    body = bytearray()
    while True:
        chunk = raw.read(READ_CHUNK, decode_content=False)
        if not chunk:
            return body
        if len(body) + len(chunk) > limit:
            raise AnswerRejected(
                f"the body exceeds the {limit} bytes an answer may have; read stopped there"
            )
        body += chunk


def decode_json(body: bytes | bytearray) -> Any:
    try:
        return json.loads(body)
    except RecursionError:
        raise AnswerRejected("a JSON body nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise AnswerRejected(f"a body that is not JSON ({str(exc)[:120]})") from None


# --- shapes ---------------------------------------------------------------------------


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AnswerRejected(f"{where} is {_kind(value)}, not an object")
    return value


def _field(doc: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise AnswerRejected(f"{_join(where, key)} is missing")
    return doc[key]


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise AnswerRejected(f"{where} is {_kind(value)}, not a list")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise AnswerRejected(f"{where} is {_kind(value)}, not a string")
    return value


def _integer(value: Any, where: str) -> int:
    # bool is an int to Python, never to Placement.
    if not isinstance(value, int) or isinstance(value, bool):
        raise AnswerRejected(f"{where} is {_kind(value)}, not an integer")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AnswerRejected(f"{where} is {_kind(value)}, not a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise AnswerRejected(f"{where} is not a finite number")
    return number


def _uuid(value: Any, where: str) -> str:
    """A UUID as Placement spells them, and nothing that could change the
    path of a URL it is put in (``..``, ``/``, ``?``)."""
    text = _string(value, where)
    try:
        uuidlib.UUID(text)
    except ValueError:
        text = ""
    if not text or not set(text) <= _UUID_CHARACTERS:
        raise AnswerRejected(f"{where} is {_kind(value)}, not a UUID")
    return text


def _kind(value: Any) -> str:
    """What a value is, briefly and safely quoted: ``a string 'x'``, ``an object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"a string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, int | float):
        return f"a number {str(value)[:20]}"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


@dataclass(frozen=True)
class ProviderRef:
    """The fields of one resource provider the reporter uses."""

    uuid: str
    name: str
    generation: int
    parent_uuid: str | None


def provider(doc: Any, where: str = "") -> ProviderRef:
    """``GET /resource_providers/{uuid}``, ``POST /resource_providers``
    (microversion 1.20+), and each item of a listing."""
    doc = _object(doc, where or "the body")
    parent = doc.get("parent_provider_uuid")
    return ProviderRef(
        uuid=_uuid(_field(doc, "uuid", where), _join(where, "uuid")),
        name=_string(_field(doc, "name", where), _join(where, "name")),
        generation=_integer(_field(doc, "generation", where), _join(where, "generation")),
        parent_uuid=None
        if parent is None
        else _string(parent, _join(where, "parent_provider_uuid")),
    )


def provider_list(doc: Any) -> list[ProviderRef]:
    """``GET /resource_providers?...``."""
    items = _list(
        _field(_object(doc, "the body"), "resource_providers", ""), "resource_providers"
    )
    return [provider(item, f"resource_providers[{i}]") for i, item in enumerate(items)]


@dataclass(frozen=True)
class Inventories:
    records: dict[str, dict[str, Any]]
    # Only in the answer to a PUT (the reporter's next write carries it).
    generation: int | None = None


def inventories(doc: Any, *, written: bool = False) -> Inventories:
    """``GET`` (or, ``written``, ``PUT``) ``/resource_providers/{uuid}/inventories``."""
    doc = _object(doc, "the body")
    records = _object(_field(doc, "inventories", ""), "inventories")
    checked: dict[str, dict[str, Any]] = {}
    for rc, record in records.items():
        where = f"inventories.{rc[:40]}"
        record = _object(record, where)
        for name in _INTEGER_FIELDS:
            _integer(_field(record, name, where), f"{where}.{name}")
        _number(_field(record, "allocation_ratio", where), f"{where}.allocation_ratio")
        checked[rc] = record
    return Inventories(checked, _generation(doc) if written else None)


@dataclass(frozen=True)
class Traits:
    names: tuple[str, ...]
    generation: int | None = None


def traits(doc: Any, *, written: bool = False) -> Traits:
    """``GET`` (or, ``written``, ``PUT``) ``/resource_providers/{uuid}/traits``."""
    doc = _object(doc, "the body")
    names = _list(_field(doc, "traits", ""), "traits")
    return Traits(
        tuple(_string(name, f"traits[{i}]") for i, name in enumerate(names)),
        _generation(doc) if written else None,
    )


def usages(doc: Any) -> dict[str, int]:
    """``GET /resource_providers/{uuid}/usages``."""
    used = _object(_field(_object(doc, "the body"), "usages", ""), "usages")
    return {rc: _integer(n, f"usages.{rc[:40]}") for rc, n in used.items()}


def _generation(doc: Mapping[str, Any]) -> int:
    return _integer(
        _field(doc, "resource_provider_generation", ""), "resource_provider_generation"
    )
