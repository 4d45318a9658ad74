"""oslo.config value types that refuse what oslo.config's own accept by mistake.

* :class:`FiniteFloat`: oslo.config's ``Float`` converts with ``float()``, so
  ``nan``, ``inf`` and ``1e999`` pass (``nan`` compares false with every
  bound, so ``min``/``max`` let it through too).  A ``nan`` rescan interval
  silently stops the periodic rescans; an infinite timeout overflows the
  thread waits.  Every float option of the agent is a :class:`FiniteFloatOpt`.
* :class:`ResourceClassName`, :class:`TraitName`: what Placement accepts,
  ``CUSTOM_[A-Z0-9_]+`` (at most 255 characters) or a standard name of
  os-resource-classes / os-traits, so that a typo is refused when the
  configuration is checked rather than at every Placement sync.

The types raise ValueError, as oslo.config's do, when a value is read
(oslo.config converts lazily, on attribute access): ``config_values``
reads every option once to report them all.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Any

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
