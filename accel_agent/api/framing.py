"""Where a request's body ends (RFC 9112 §6), read strictly.

cheroot reads header fields leniently in the ways that let one request hide
another behind it on the same connection: a second ``Content-Length`` silently
replaces the first, and ``Content-Length`` together with
``Transfer-Encoding: chunked`` is read chunked while the connection is kept,
so bytes the client meant as a body can be served as the next request.  The
API is reached on a unix socket by its own clients only, which makes the rules
easy to choose:

* ``Transfer-Encoding`` is refused, whatever its value and with or without a
  ``Content-Length``.  Every client of the API frames its body with a
  ``Content-Length``: :mod:`accel_agent.api.client` hands ``http.client`` a
  finished ``bytes`` body (http.client then sends ``Content-Length``, never
  chunks), and accelctl's plain listing sends GETs without a body.  A request
  body is a JSON document of at most 64 KiB, built before it is sent: chunked
  bodies would only add a second way of framing to get wrong.
* ``Content-Length`` is one field line whose value is ``1*DIGIT`` (no sign,
  no list, nothing around the digits but spaces and tabs) and at most the
  API's body limit.  A repeated ``Content-Length`` is refused even when the
  values are identical: RFC 9110 §8.6 lets a server either merge identical
  values or refuse them, and none of the API's clients sends two, so a second
  one is a hand-made or broken request; one rule is easier to trust.
* a field folded onto the next line (obs-fold, RFC 9112 §5.2) and whitespace
  between a field name and its colon (§5.1) are refused: both are ways of
  writing a ``Content-Length`` that one parser sees and another does not.

Every such request is answered ``400`` in the API's error format
(``{"error": {"code", "message"}}``) before its body is read, and the
connection is closed after the answer (``Connection: close``): once the end of
a body is unknown, nothing after it on that connection can be trusted to be a
request (RFC 9112 §6.3).  See ``accel_agent.api.server._JsonErrorRequest``.
"""

from __future__ import annotations

from typing import Any

from cheroot import server as cheroot_server

from accel_agent.api.app import MAX_BODY

CRLF = b"\r\n"
CONTENT_LENGTH = b"Content-Length"
TRANSFER_ENCODING = b"Transfer-Encoding"
# Dropped from a refused request's fields, so that cheroot neither parses its
# framing nor invites its body with "100 Continue".
_FRAMING_FIELDS = (CONTENT_LENGTH, TRANSFER_ENCODING, b"Expect")
_OWS = b" \t"
_SHOWN = 64  # characters of a refused value quoted in the answer


def _shown(value: bytes) -> str:
    text = value.decode("latin-1")
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "..."
    return repr(text)  # control characters escaped


def framing_refusal(lengths: list[bytes], codings: list[bytes]) -> str | None:
    """Why a request with these ``Content-Length`` and ``Transfer-Encoding``
    field values (one item per field line, in order) must be refused; None
    when its body is framed as the API accepts."""
    if codings:
        if lengths:
            return (
                "both Content-Length and Transfer-Encoding are given, so where the body "
                "ends is ambiguous"
            )
        return (
            f"Transfer-Encoding {_shown(b', '.join(codings))} is not accepted: send the "
            "body with a Content-Length"
        )
    if len(lengths) > 1:
        return f"Content-Length is given {len(lengths)} times"
    if not lengths:
        return None
    value = lengths[0]
    if b"," in value:
        return f"Content-Length {_shown(value)} is a list, not one length"
    if not value.isdigit():  # bytes.isdigit(): ASCII digits only, and not empty
        return f"Content-Length {_shown(value)} is not a number of bytes"
    # Compared as text first: int() of a 60 KiB digit string is refused by Python.
    digits = value.lstrip(b"0")
    if len(digits) > len(str(MAX_BODY)) or int(digits or b"0") > MAX_BODY:
        return f"the body is larger than {MAX_BODY} bytes"
    return None


class StrictHeaderReader(cheroot_server.HeaderReader):
    """Reads one request's header fields into cheroot's dict as cheroot's own
    reader does (names title-cased, the comma-separated fields joined), and
    keeps in :attr:`refusal` why the request must be refused (None when it
    need not).  One per request: ``_JsonErrorRequest`` makes a new one.

    A refused request's framing fields are left out of the dict, so cheroot
    reads no body for it; the head is still read to its end (bounded by
    ``max_request_header_size``) before the answer goes out.
    """

    def __init__(self) -> None:
        self.refusal: str | None = None

    def __call__(self, rfile: Any, hdict: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
        fields: dict[bytes, bytes] = {} if hdict is None else hdict
        lengths: list[bytes] = []
        codings: list[bytes] = []
        while True:
            line = rfile.readline()
            if not line:
                raise ValueError("Illegal end of headers.")  # cheroot's words: 400, closed
            if line == CRLF:
                break
            if not line.endswith(CRLF):
                raise ValueError("HTTP requires CRLF terminators")
            if line[:1] in (b" ", b"\t"):
                self.refusal = self.refusal or (
                    "a header field is continued on a second line (obs-fold)"
                )
                continue
            name, colon, value = line[:-2].partition(b":")
            if not colon or not name:
                raise ValueError("Illegal header line.")
            if name.rstrip(_OWS) != name:
                self.refusal = self.refusal or (
                    f"whitespace between the header field name {_shown(name.rstrip(_OWS))} "
                    "and its colon"
                )
                continue
            key = name.title()
            value = value.strip(_OWS)
            if key == CONTENT_LENGTH:
                lengths.append(value)
            elif key == TRANSFER_ENCODING:
                codings.append(value)
            if key in cheroot_server.comma_separated_headers and fields.get(key):
                value = fields[key] + b", " + value
            fields[key] = value
        self.refusal = self.refusal or framing_refusal(lengths, codings)
        if self.refusal is not None:
            for key in _FRAMING_FIELDS:
                fields.pop(key, None)
        return fields
