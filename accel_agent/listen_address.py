"""``[metrics] listen``: where the optional HTTP metrics endpoint listens.

``""`` (the default): nowhere, the metrics are on the API's unix socket only.
``PORT``: ``127.0.0.1:PORT``, loopback, for a node-local scraper or proxy.
``ADDRESS:PORT`` / ``[IPV6]:PORT``: that address as written, ``0.0.0.0`` or
``[::]`` included: writing a non-loopback address is the operator's explicit
choice to let a remote Prometheus scrape the node (the endpoint serves
``GET /metrics`` and nothing else, and takes no request that changes
anything).  The address is an IP literal, never a host name: the daemon's
start must not depend on name resolution.

A leaf module outside accel_agent.reporting (the standard library and
oslo.config's types only): conf.py, which every accelctl run imports and which
must not load the reporting room (tests/unit/test_house.py), takes its type.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, NamedTuple

from oslo_config import types

LOOPBACK = "127.0.0.1"
_PORT = re.compile(r"^[0-9]{1,5}$")  # ASCII digits (str.isdigit takes other scripts')
_FORMS = "PORT, ADDRESS:PORT or [IPV6]:PORT"


class Listen(NamedTuple):
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse(value: str) -> Listen | None:
    """``value`` as (host, port), None when empty; ValueError says why not."""
    text = value.strip()
    if not text:
        return None
    if _PORT.match(text):
        host, port_text = LOOPBACK, text
    else:
        host, colon, port_text = text.rpartition(":")
        if text.endswith("]") or not colon:
            raise ValueError(f"{value!r} is not {_FORMS}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(f"{value!r}: brackets are for an IPv6 address")
        elif ":" in host:
            raise ValueError(f"{value!r}: write an IPv6 address in brackets ([{host}]:PORT)")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"{value!r}: {host!r} is not an IP address (write 127.0.0.1, 0.0.0.0, "
                "[::1] or the node's address, not a host name)"
            ) from None
    if not _PORT.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 1 to 65535")
    return Listen(host, int(port_text))


class ListenAddress(types.String):
    """An oslo.config string type that refuses what :func:`parse` refuses,
    so that ``accelctl check-config`` names a bad value."""

    def __init__(self) -> None:
        super().__init__(type_name="listen address")

    def __call__(self, value: Any) -> str:
        text = super().__call__(value)
        parse(text)
        return text
