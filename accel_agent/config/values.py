"""Every option value of the configuration, read once the way the daemon reads it.

oslo.config parses the files at start but converts a value only when it is
read (``conf.event_debounce``), so a bad value (out of range, ``nan``, not a
boolean, a ``$`` naming no option) is found wherever the daemon happens to
read it first: in the middle of its start-up, or after a reload's checks had
passed.  :func:`value_errors` reads them all up front and says what is wrong
with each, in one line naming the file and line, the section and option:

    /etc/accel-agent/accel-agent.conf:12: [DEFAULT] event_debounce = 50: must be at most 10.0

It first registers every option the daemon registers (config/registry.py:
oslo.log's, ``[placement]`` with its auth plugin's, the privileged helpers',
``[mdev_<type>]`` and ``[vf_pool_<name>]`` for the enabled names), so that
``accelctl check-config``, the daemon's start-up check and its reload check
see the same options.  After it returned no error nothing the daemon reads
from that configuration can raise: oslo.config's conversion of the same
parsed text is deterministic.

The agent's own options carry their ranges and types (config/options.py); the options
of libraries it uses get the agent's ranges here (:data:`LIBRARY_BOUNDS`),
where the library gives none.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import util

from oslo_config import cfg, types

from accel_agent.config import comments, lint, registry
from accel_agent.exception import printable

# (section, option) -> (min, max): the agent's ranges for options that
# libraries define without one.  oslo.log's are read when the daemon sets up
# its logging; oslo.privsep's by each privileged helper as it starts.
LIBRARY_BOUNDS: dict[tuple[str, str], tuple[int, int]] = {
    ("DEFAULT", "log_rotate_interval"): (1, 1_000_000),
    ("DEFAULT", "max_logfile_count"): (0, 10_000),
    ("DEFAULT", "max_logfile_size_mb"): (1, 1_048_576),
    ("DEFAULT", "rate_limit_interval"): (0, 86_400),
    ("DEFAULT", "rate_limit_burst"): (0, 1_000_000),
    ("accel_agent_privileged", "thread_pool_size"): (1, 256),
    ("accel_agent_net_privileged", "thread_pool_size"): (1, 256),
    ("accel_agent_nvml_privileged", "thread_pool_size"): (1, 256),
}


# --- which options ---------------------------------------------------------------------


def registered_options(conf: cfg.ConfigOpts) -> Iterator[tuple[str, cfg.Opt]]:
    """(section, option) of every option registered on ``conf``."""
    # oslo.config has no public listing of the Opt objects themselves.
    for info in list(conf._opts.values()):
        yield "DEFAULT", info["opt"]
    for name, group in list(conf._groups.items()):
        for info in list(group._opts.values()):
            yield name, info["opt"]


def journal_available() -> bool:
    """Whether oslo.log's journal handler can be built (``systemd.journal``)."""
    try:
        return util.find_spec("systemd.journal") is not None
    except (ImportError, ValueError):
        return False


# --- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadValue:
    section: str
    option: str
    message: str  # the one line value_errors returns


def value_errors(conf: cfg.ConfigOpts) -> list[str]:
    """Every option value of ``conf`` the daemon would refuse, as one-line
    messages ``file:line: [section] option = value: why`` (the file and line
    the value came from; an environment variable's name instead when it came
    from one).  Never raises for a value.

    Registers the daemon's options on ``conf`` first
    (:func:`accel_agent.config.registry.register`), then reads each registered option
    once; a float must be finite, a library's option within
    :data:`LIBRARY_BOUNDS`.  Empty: every value the daemon reads from
    ``conf`` converts without error."""
    return [bad.message for bad in bad_values(conf)]


def bad_values(conf: cfg.ConfigOpts) -> list[BadValue]:
    """:func:`value_errors` with the section and option of each."""
    registry.register(conf)
    return option_errors(conf, registered_options(conf))


def option_errors(
    conf: cfg.ConfigOpts, options: Iterable[tuple[str, cfg.Opt]]
) -> list[BadValue]:
    """:func:`bad_values` of the given (section, option) pairs, without
    registering anything."""
    sources = _Sources(conf)
    found = []
    for section, opt in options:
        reason = _problem(conf, section, opt, sources)
        if reason is not None:
            message, order = sources.describe(section, opt, reason)
            found.append((order, BadValue(section, opt.dest, message)))
    # In the order of the files and lines, as an operator reads them.
    return [bad for _order, bad in sorted(found, key=lambda pair: pair[0])]


def named_option_errors(conf: cfg.ConfigOpts, names: Iterable[tuple[str, str]]) -> list[str]:
    """The messages of :func:`option_errors` for (section, option name) pairs
    registered on ``conf``."""
    by_name = {(section, opt.dest): opt for section, opt in registered_options(conf)}
    chosen = [(s, by_name[s, n]) for s, n in names if (s, n) in by_name]
    return [bad.message for bad in option_errors(conf, chosen)]


def _problem(conf: cfg.ConfigOpts, section: str, opt: cfg.Opt, sources: _Sources) -> str | None:
    """Why the value of this option cannot be used; None when it can."""
    # Before the value is read: "4   # per GPU" is "not an integer" there,
    # and "node1   # the root provider" a host name oslo.config accepts.
    comment = sources.inline_comment(section, opt)
    if comment is not None:
        return comments.error_reason(comment)
    try:
        value = conf[opt.dest] if section == "DEFAULT" else conf[section][opt.dest]
    except cfg.NoSuchOptError:
        # A "$name" in the value that names no option: oslo.config raises this
        # (for [DEFAULT], naming the option read instead of the missing one).
        return "its $-substitution names no option (write $$ for a literal $)"
    except (ValueError, cfg.Error) as exc:
        return _reason(opt, exc)
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"  # a float option of a library, not FiniteFloat
    if (section, opt.dest) == ("DEFAULT", "use_journal") and value and not journal_available():
        return ("needs the systemd Python bindings, which are not installed (pip "
                "install 'accel-agent[journal]', i.e. systemd-python); or log to "
                "stderr, which systemd's journal records too")
    bounds = LIBRARY_BOUNDS.get((section, opt.dest))
    # The library's own default (oslo.privsep's is the host's CPU count) is
    # the library's business: the agent bounds what an operator writes.
    if bounds is not None and value is not None and sources.written(section, opt):
        low, high = bounds
        if value < low:
            return f"must be at least {low}"
        if value > high:
            return f"must be at most {high}"
    return None


_OSLO_PREFIX = re.compile(r"^Value for option .*? is not valid: ", re.DOTALL)


def _reason(opt: cfg.Opt, exc: Exception) -> str:
    """oslo.config's message without its location prefix, in plainer words."""
    text = _OSLO_PREFIX.sub("", str(exc)).strip()
    kind = opt.type.item_type if isinstance(opt.type, types.List) else opt.type
    if text.startswith("Should be greater than or equal to "):
        return "must be at least " + text.rsplit(" ", 1)[-1]
    if text.startswith("Should be less than or equal to "):
        return "must be at most " + text.rsplit(" ", 1)[-1]
    if isinstance(kind, types.Boolean) or text.startswith("Unexpected boolean value"):
        return "not a boolean (true/false, yes/no, on/off, 1/0)"
    if isinstance(kind, types.Integer) and text.startswith("invalid literal"):
        return "not an integer"
    if isinstance(kind, types.Float) and text.startswith("could not convert"):
        return "not a number"
    return text[:1].lower() + text[1:] if text else type(exc).__name__


# --- where a value came from -----------------------------------------------------------


def _norm(name: str) -> str:
    return name.replace("-", "_")


class _Sources:
    """The files ``conf`` was parsed from, scanned once for section/key lines."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self._entries: list[lint.Entry] | None = None
        self._conf = conf

    def entries(self) -> list[lint.Entry]:
        if self._entries is None:
            self._entries = []
            for path in lint.parsed_files(self._conf):
                self._entries += lint.scan_file(path)[0]
        return self._entries

    def inline_comment(
        self, section: str, opt: cfg.Opt
    ) -> comments.Comment | None:
        """What looks like an inline comment in the written value of an
        option that cannot hold one (config/comments.py); None otherwise."""
        if _environment_variable(section, opt) is not None:
            return None  # the environment's value is the one read
        if not comments.holds_no_comment(section, opt):
            return None
        found = self._last_entry(section, opt)
        return None if found is None else comments.inline_comment(found[1].lines)

    def written(self, section: str, opt: cfg.Opt) -> bool:
        """Whether the value comes from a file or the environment (not a default)."""
        return (
            _environment_variable(section, opt) is not None
            or self._last_entry(section, opt) is not None
        )

    def describe(self, section: str, opt: cfg.Opt, reason: str) -> tuple[str, tuple[int, ...]]:
        """The one-line message, and where it sorts (files and lines first)."""
        variable = _environment_variable(section, opt)
        if variable is not None:
            raw = os.environ[variable]
            message = (
                f"environment variable {variable}: [{section}] {opt.dest} = {printable(raw)}: "
                f"{reason}"
            )
            return message, (1,)
        found = self._last_entry(section, opt)
        if found is None:
            return f"[{section}] {opt.dest}: {reason}", (2,)
        index, entry = found
        raw = _value_text(entry)
        message = (
            f"{entry.path}:{entry.line}: [{entry.section}] {entry.key} = {printable(raw)}: "
            f"{reason}"
        )
        return message, (0, index)

    def _last_entry(
        self, section: str, opt: cfg.Opt
    ) -> tuple[int, lint.Entry] | None:
        """The line oslo.config took the value from: the last one naming
        the option (or one of its deprecated names) in the last file; and
        its index among the entries of all files."""
        names = {(section, _norm(opt.dest)), (section, _norm(opt.name))}
        for old in getattr(opt, "deprecated_opts", None) or []:
            names.add((old.group or section, _norm(old.name or opt.name)))
        found = None
        for index, entry in enumerate(self.entries()):
            if entry.key is not None and (entry.section, _norm(entry.key)) in names:
                found = index, entry
        return found


def _environment_variable(section: str, opt: cfg.Opt) -> str | None:
    """oslo.config reads ``OS_<SECTION>__<OPTION>`` before the files."""
    name = f"OS_{section.upper()}__{opt.dest.upper()}"
    return name if name in os.environ else None


def _value_text(entry: lint.Entry) -> str:
    try:
        return lint.value_at(entry)
    except (OSError, UnicodeDecodeError, IndexError):  # the file changed since
        return "?"
