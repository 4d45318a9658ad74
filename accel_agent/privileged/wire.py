"""What crosses the privsep channel besides the arguments themselves.

Errors cross it by class name and ``args`` only, which would lose an
``AccelAgentException``'s ``kwargs``.  So the daemon side wraps them in
:class:`WireError` (class name, message, kwargs) and the caller's side
(lifecycle.call) rebuilds the original class with its message and kwargs.

The other way: ``sysfs_root`` (and the VFIO directory) come with each call
from the agent's running configuration, validated here on the daemon's side;
a caller with no configuration of its own passes None and gets the helper's
(the package's docstring says why the root travels with the call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from accel_agent import exception
from accel_agent.config import options as agent_conf
from accel_agent.privileged.validate import validate_sysfs_root, validate_vfio_dev_dir


class WireError(Exception):
    """Carries an AccelAgentException over privsep: (class name, message, kwargs).

    oslo.privsep rebuilds a remote exception as ``cls(*exc.args)``; ours keep
    only the message in ``args``, so the kwargs would be lost.  Never escapes
    the package's public functions.
    """


def _primitive(value: Any) -> Any:
    # msgpack carries these natively; anything else travels as its str().
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def to_wire(exc: exception.AccelAgentException) -> WireError:
    kwargs = {str(k): _primitive(v) for k, v in exc.kwargs.items()}
    return WireError(type(exc).__name__, exc.message, kwargs)


def from_wire(wire: WireError) -> exception.AccelAgentException:
    name, message, kwargs = wire.args
    cls = getattr(exception, name, None)
    if not (isinstance(cls, type) and issubclass(cls, exception.AccelAgentException)):
        return exception.AccelAgentException(f"{name}: {message}")
    return cls(message, **kwargs)


_R = TypeVar("_R")


def daemon_side(func: Callable[[], _R]) -> _R:
    """Run an entrypoint's body in the helper, its errors wrapped for the wire."""
    try:
        return func()
    except exception.AccelAgentException as exc:
        raise to_wire(exc) from None


def daemon_sysfs_root(given: str | None) -> str:
    """The root this call acts on: the agent's, validated, else the daemon's
    own CONF, parsed from the --config-file it was started with (a caller
    with no configuration of its own)."""
    if given is not None:
        return validate_sysfs_root(given)
    return str(agent_conf.CONF.sysfs_root)


def daemon_vfio_dir(given: str | None) -> str:
    """Like :func:`daemon_sysfs_root`: the agent's VFIO directory, validated;
    the helper's own config only for a caller that has none."""
    if given is not None:
        return validate_vfio_dev_dir(given)
    return str(agent_conf.CONF.vfio_dev_dir)
