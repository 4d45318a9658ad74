"""oslo.config value types that refuse what oslo.config's own accept by mistake,
and the types of values oslo.config has no type for.

* :class:`FiniteFloat`: oslo.config's ``Float`` converts with ``float()``, so
  ``nan``, ``inf`` and ``1e999`` pass (``nan`` compares false with every
  bound, so ``min``/``max`` let it through too).  A ``nan`` rescan interval
  silently stops the periodic rescans; an infinite timeout overflows the
  thread waits.  Every float option of the agent is a :class:`FiniteFloatOpt`.
* :class:`ResourceClassName`, :class:`TraitName`: what Placement accepts,
  ``CUSTOM_[A-Z0-9_]+`` (at most 255 characters) or a standard name of
  os-resource-classes / os-traits, so that a typo is refused when the
  configuration is checked rather than at every Placement sync.
* :class:`ListenAddress`: ``[metrics] listen``, where the optional HTTP
  metrics endpoint listens (:func:`parse_listen`).

The types raise ValueError, as oslo.config's do, when a value is read
(oslo.config converts lazily, on attribute access): config/values.py reads
every option once to report them all.

A leaf of the configuration room (the standard library and oslo.config
only): the core's options (config/options.py) take their types from here,
and the metrics server its listen address, without loading the reporting
room into every accelctl run (tests/unit/test_house.py).
"""

from __future__ import annotations

import ipaddress
import math
import re
from functools import cache
from typing import Any, NamedTuple

from oslo_config import cfg, types

# Placement's rule for the names an operator may create (resource classes
# and traits alike).
CUSTOM_NAME_REGEX = r"CUSTOM_[A-Z0-9_]+"
_CUSTOM_NAME = re.compile(CUSTOM_NAME_REGEX)
MAX_NAME_LENGTH = 255


class FiniteFloat(types.Float):
    """``types.Float`` that refuses ``nan`` and the infinities."""

    def __call__(self, value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0  # not a number at all: the parent says so
        if not math.isfinite(number):
            raise ValueError("must be a finite number")
        return super().__call__(value)


class FiniteFloatOpt(cfg.FloatOpt):
    """``cfg.FloatOpt`` whose type is :class:`FiniteFloat` (still a FloatOpt
    for oslo-config-generator: same type name, same ``min``/``max`` lines)."""

    def __init__(
        self, name: str, min: float | None = None, max: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(name, min=min, max=max, **kwargs)
        self.type = FiniteFloat(min=min, max=max)


def make_finite(opt: cfg.Opt) -> cfg.Opt:
    """Give a float option another library built (keystoneauth's session
    options) the :class:`FiniteFloat` type with the same bounds."""
    if isinstance(opt.type, types.Float) and not isinstance(opt.type, FiniteFloat):
        opt.type = FiniteFloat(min=opt.type.min, max=opt.type.max)
    return opt


@cache
def standard_resource_classes() -> frozenset[str]:
    import os_resource_classes

    return frozenset(os_resource_classes.STANDARDS)


@cache
def standard_traits() -> frozenset[str]:
    import os_traits  # imports every trait module: only when a trait is checked

    return frozenset(os_traits.get_traits())


def _placement_name(value: Any, what: str, standard: frozenset[str]) -> str:
    name = str(value)
    if len(name) <= MAX_NAME_LENGTH and (_CUSTOM_NAME.fullmatch(name) or name in standard):
        return name
    raise ValueError(f"{what} {name!r} is neither {CUSTOM_NAME_REGEX} nor a standard {what}")


class ResourceClassName(types.String):
    """A Placement resource class: ``CUSTOM_*`` or a standard class."""

    def __init__(self) -> None:
        super().__init__(max_length=MAX_NAME_LENGTH)

    def __call__(self, value: Any) -> str:
        return _placement_name(super().__call__(value), "resource class",
                               standard_resource_classes())


class TraitName(types.String):
    """A Placement trait: ``CUSTOM_*`` or a standard trait of os-traits."""

    def __init__(self) -> None:
        super().__init__(max_length=MAX_NAME_LENGTH)

    def __call__(self, value: Any) -> str:
        return _placement_name(super().__call__(value), "trait", standard_traits())


# --- [metrics] listen ------------------------------------------------------------------
#
# ``""`` (the default): nowhere, the metrics are on the API's unix socket only.
# ``PORT``: ``127.0.0.1:PORT``, loopback, for a node-local scraper or proxy.
# ``ADDRESS:PORT`` / ``[IPV6]:PORT``: that address as written, ``0.0.0.0`` or
# ``[::]`` included: writing a non-loopback address is the operator's explicit
# choice to let a remote Prometheus scrape the node (the endpoint serves
# ``GET /metrics`` and nothing else, and takes no request that changes
# anything).  The address is an IP literal, never a host name: the daemon's
# start must not depend on name resolution.

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


def parse_listen(value: str) -> Listen | None:
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
    """An oslo.config string type that refuses what :func:`parse_listen`
    refuses, so that ``accelctl check-config`` names a bad value."""

    def __init__(self) -> None:
        super().__init__(type_name="listen address")

    def __call__(self, value: Any) -> str:
        text = super().__call__(value)
        parse_listen(text)
        return text
