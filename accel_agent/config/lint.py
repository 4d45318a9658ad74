"""The config files as written, beside what oslo.config makes of them.

oslo.config is lenient where a mistake is expensive: an option it has no
definition for is ignored (``device_adresses`` silently turns a
GPU-specific type into the default type), an indented section header is
read as the continuation of the previous value, an option written twice in
one file takes the later value without a word.  This module says so,
naming the file and the line:

* :func:`scan_text`: the section headers and assignments of one file the
  way oslo.config's parser reads them (config/values.py names the file and
  line of a bad value from these);
* :func:`named_file_errors` (before parsing, config/load.py): a file an
  option names that the agent runs or trusts (``log_config_append``) that
  is no regular file or that someone other than root could change ->
  messages;
* :func:`lint` (the check, config/check.py): unknown sections and options,
  indented section headers, an option or a section written twice in one
  file, a private key others can read -> warnings (errors with
  ``--strict``);
* :func:`state_dir_problem`: a ``state_dir`` the agent could not write;
* :func:`locate`: the file, line, section and option a check's message
  names, for ``check-config --json``.

Known options are those of the sample config: the ``oslo.config.opts``
entry points ``accel_agent`` and ``oslo.log`` (what oslo-config-generator
documents: config/registry.py), ``[mdev_<type>]``'s,
``[vf_pool_<name>]``'s and ``[gpu_layout_<name>]``'s options, and the
options of the keystoneauth plugin a ``[placement]`` section names.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING, Any

from accel_agent.config import comments, files
from accel_agent.exception import printable

if TYPE_CHECKING:
    from oslo_config import cfg

# The generator namespaces of etc/oslo-config-generator/accel-agent.conf.
NAMESPACES = ("accel_agent", "oslo.log")
# The sample's stand-ins for the per-name sections (config.options.list_opts).
MDEV_PLACEHOLDER = "mdev_$(mdev_type)"
POOL_PLACEHOLDER = "vf_pool_$(pool)"
LAYOUT_PLACEHOLDER = "gpu_layout_$(layout)"
_INDENTED_HEADER = re.compile(r"[ \t]+\[[^\]]*\]\s*")


# --- files the configuration names ------------------------------------------------------

# Options naming a file the agent runs or trusts: (section, the names it may
# be written as, what the file is, whether its value is a command line whose
# program is the file).  Refused like a config file when someone other than
# root could change the file (named_file_errors).
NAMED_FILES: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("DEFAULT", ("log_config_append", "log_config"),
     "the logging configuration (oslo.log runs what it names, as root)", False),
    ("accel_agent_privileged", ("helper_command",),
     "the privileged helper's program (run as root)", True),
    ("accel_agent_net_privileged", ("helper_command",),
     "the network helper's program (run as root)", True),
    ("accel_agent_nvml_privileged", ("helper_command",),
     "the NVML helper's program (run as root)", True),
    ("placement", ("cafile",),
     "the CA bundle Placement and Keystone are checked against", False),
    ("placement", ("certfile",), "the client certificate sent to Placement", False),
    ("placement", ("keyfile",), "the client certificate's key", False),
)


def _section_key(section: str) -> str:
    """A section's name as oslo.config looks it up (all but DEFAULT lower-cased)."""
    return section if section == "DEFAULT" else section.lower()


def named_files(entries: Sequence[Entry]) -> list[tuple[Entry, str, str]]:
    """(the assignment oslo.config takes, the path, what the file is) of each
    :data:`NAMED_FILES` option set in ``entries`` (the files in the order
    oslo.config reads them: the last assignment wins).  A value with a
    ``$``-substitution is left to the check where the value is used
    (daemon.logs for ``log_config_append``)."""
    import shlex

    last: dict[tuple[str, str, bool], Entry] = {}
    for entry in entries:
        if entry.key is None:
            continue
        name = entry.key.replace("-", "_")
        for section, names, what, is_command in NAMED_FILES:
            if _section_key(entry.section) == section and name in names:
                last[section, what, is_command] = entry
    found = []
    for (_section, what, is_command), entry in last.items():
        value = "\n".join(entry.lines).strip()
        if not value or "$" in value:
            continue
        if is_command:
            try:
                words = shlex.split(value)
            except ValueError:
                continue  # not a command line the helper's start could run either
            if not words or not os.path.isabs(words[0]):
                continue  # found in root's PATH, like every other program
            value = words[0]
        found.append((entry, value, what))
    return found


def named_file_errors(entries: Sequence[Entry]) -> list[str]:
    """One line per file a :data:`NAMED_FILES` option set in ``entries``
    (the files in the order oslo.config reads them) names that is no
    regular file, or that someone other than root could change, as
    ``file:line: [section] option = value: why``."""
    errors = []
    for entry, path, what in named_files(entries):
        where = f"{entry.path}:{entry.line}: [{entry.section}] {entry.key} = {printable(path)}"
        try:
            files.require_regular(path, what)
        except files.Refused as exc:
            errors.append(f"{where}: {exc}")
            continue
        problem = files.trust_problem(path)
        if problem is not None:
            errors.append(f"{where}: {files.refusal(what, path, problem)}")
    return errors


def _named_file_warnings(entries: Sequence[Entry]) -> list[str]:
    """A private key others can read: not a way in, a secret given away."""
    warnings = []
    for entry, path, what in named_files(entries):
        if entry.key is None or entry.key.replace("-", "_") != "keyfile":
            continue
        try:
            found = os.stat(path)
        except OSError:
            continue
        if files.readable_by_others(found):
            warnings.append(
                f"{entry.path}:{entry.line}: [{entry.section}] {entry.key} = {printable(path)}: "
                f"{what} is readable by others (mode {found.st_mode & 0o7777:04o}): "
                "chmod 0600 it"
            )
    return warnings


# --- the state directory -----------------------------------------------------------------


def state_dir_problem(path: str) -> tuple[str | None, str | None]:
    """(error, warning) about ``state_dir``: it must be a directory the agent
    can write, or be creatable.  Not writable by this user is only a warning
    when this user is not root (the agent runs as root; a listing need not)."""
    head = f"[DEFAULT] state_dir {path}"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{head} is not a directory", None
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{head} cannot be created: {existing} is not a directory", None
    where = "" if existing == path else f" (its closest existing parent {existing})"
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return f"{head}{where} is on a read-only filesystem", None
    except OSError:
        pass
    if not os.access(existing, os.W_OK | os.X_OK):
        text = f"{head}{where} is not writable by uid {os.geteuid()}"
        return (text, None) if os.geteuid() == 0 else (None, text + " (the agent runs as root)")
    return None, None


# --- unknown sections and options, indented headers --------------------------------------


@dataclass(frozen=True)
class Entry:
    path: str
    line: int
    section: str
    key: str | None  # None: the section header itself
    # The value as oslo.config's parser assembles it: the first line's text
    # after the "=" (stripped), then each continuation line without its
    # indentation.
    lines: tuple[str, ...] = field(default=(), compare=False)


def _read_text(path: str) -> str | None:
    """A config file's text (read as config.load.check_files reads it), None
    when it cannot be: check_files has said why already."""
    try:
        return files.read_regular(path, "config file")[0].decode("utf-8")
    except (OSError, files.Refused, UnicodeDecodeError):
        return None


def scan_file(path: str) -> tuple[list[Entry], list[str]]:
    """:func:`scan_text` of the file at ``path``."""
    text = _read_text(path)
    return ([], []) if text is None else scan_text(path, text)


def scan_text(path: str, text: str) -> tuple[list[Entry], list[str]]:
    """Section headers and assignments of one file the way oslo.config's
    parser reads it (blank lines, ``#``/``;`` comments, indented lines
    continue a value), plus a warning per indented section header."""
    entries: list[Entry] = []
    warnings: list[str] = []
    lines = text.splitlines()
    section = "DEFAULT"
    value: list[str] | None = None  # the lines of the assignment being read

    def close() -> None:
        nonlocal value
        if value is not None and entries:
            entries[-1] = replace(entries[-1], lines=tuple(value))
        value = None

    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        if not line:
            close()  # a blank line ends a value
            continue
        if line[0] in " \t":
            if _INDENTED_HEADER.fullmatch(line):
                warnings.append(
                    f"{path}:{number}: the indented section header {line.strip()} is read as "
                    "the continuation of the value above it, not as a section; remove the "
                    "indentation"
                )
            if value is not None:
                value.append(line.lstrip())
            continue
        close()
        if line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line[1:-1] if line.endswith("]") else line[1:]
            entries.append(Entry(path, number, section, None))
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut > 0:
            entries.append(Entry(path, number, section, line[:cut].strip()))
            value = [line[cut + 1 :].strip()]
    close()
    return entries, warnings


def _names(opt: Any) -> set[str]:
    names = {opt.dest, opt.name.replace("-", "_")}
    for old in getattr(opt, "deprecated_opts", None) or []:
        if old.name:
            names.add(old.name.replace("-", "_"))
    return names


@cache
def known_opts() -> dict[str, dict[str, Any]]:
    """Section -> option name (every name it may be written as) -> option,
    from the generator's namespaces."""
    from importlib.metadata import entry_points

    known: dict[str, dict[str, Any]] = {}
    for point in entry_points(group="oslo.config.opts"):
        if point.name not in NAMESPACES:
            continue
        for group, opts in point.load()():
            names = known.setdefault(group or "DEFAULT", {})
            for opt in opts:
                names.update(dict.fromkeys(_names(opt), opt))
    return known


def known_options() -> dict[str, frozenset[str]]:
    """Section -> option names, from the generator's namespaces."""
    return {group: frozenset(opts) for group, opts in known_opts().items()}


def _section_opts(section: str, entries: Iterable[Entry]) -> dict[str, Any] | None:
    """The options a section may hold, by name; None when the section is
    unknown."""
    known = known_opts()
    if section in known:
        opts = dict(known[section])
        if section == "placement":
            opts.update(_auth_plugin_options(entries))
        return opts
    if section.startswith("mdev_"):
        return known.get(MDEV_PLACEHOLDER, {})
    if section.startswith("vf_pool_"):
        return known.get(POOL_PLACEHOLDER, {})
    if section.startswith("gpu_layout_"):
        return known.get(LAYOUT_PLACEHOLDER, {})
    if section.startswith("vgpu_"):
        # Nova's legacy group: only that.
        mdev = known.get(MDEV_PLACEHOLDER, {})
        return {"device_addresses": mdev["device_addresses"]} if mdev else {}
    return None


def _section_options(section: str, entries: Iterable[Entry]) -> frozenset[str] | None:
    """The options a section may hold; None when the section is unknown."""
    opts = _section_opts(section, entries)
    return None if opts is None else frozenset(opts)


def _auth_plugin_options(entries: Iterable[Entry]) -> dict[str, Any]:
    """The options of the keystoneauth plugin ``[placement] auth_type`` names
    (the sample config documents only ``password`` and ``admin_token``)."""
    plugin = None
    for entry in entries:
        if entry.section == "placement" and entry.key in ("auth_type", "auth_plugin"):
            plugin = value_at(entry)
    if not plugin:
        return {}
    try:
        from keystoneauth1 import loading as ks_loading

        return {
            name: opt
            for opt in ks_loading.get_auth_plugin_conf_options(plugin)
            for name in _names(opt)
        }
    except Exception:  # an unknown plugin: keystoneauth says so when it is loaded
        return {}


def value_at(entry: Entry) -> str:
    """The value written on ``entry``'s line (its first line only)."""
    text = _read_text(entry.path)
    lines = [] if text is None else text.splitlines()
    if len(lines) < entry.line:
        return ""  # changed since it was scanned
    line = lines[entry.line - 1]
    cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=len(line))
    return line[cut + 1 :].strip()


def lint(paths: Sequence[str]) -> list[str]:
    """One warning per unknown section, unknown option, indented section
    header, option set in the sample's stand-in for a per-name section
    (``[mdev_$(mdev_type)]``) and free string holding what looks like an
    inline comment, of the files oslo.config read, as ``file:line: ...``.
    (An inline comment where a ``#`` cannot belong is an error of
    config/values.py.)"""
    warnings: list[str] = []
    entries: list[Entry] = []
    for path in paths:
        found, indented = scan_file(path)
        entries += found
        warnings += indented
        warnings += _written_twice(found, entries)
    warnings += _named_file_warnings(entries)
    for entry in entries:
        opts = _section_opts(entry.section, entries)
        where = f"{entry.path}:{entry.line}"
        if opts is None:
            if entry.key is None:
                warnings.append(f"{where}: unknown section [{entry.section}]; it is ignored")
            continue
        if entry.key is None:
            continue
        opt = opts.get(entry.key.replace("-", "_"))
        if opt is None:
            close = difflib.get_close_matches(entry.key, sorted(opts), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.append(
                f"{where}: unknown option {entry.key} in [{entry.section}]; it is ignored{hint}"
            )
            continue
        if is_placeholder(entry.section):
            warnings.append(
                f"{where}: {entry.key} is set in [{entry.section}], the sample's stand-in for "
                "one section per name; it applies to nothing: name the section after the "
                f"{'type' if entry.section.startswith('mdev_') else 'pool'}, e.g. "
                f"[{_PLACEHOLDER_EXAMPLES[entry.section.partition('$(')[0]]}]"
            )
            continue
        warnings += _comment_warning(entry, opt)
    return warnings


def _written_twice(found: Sequence[Entry], entries: Sequence[Entry]) -> list[str]:
    """A section, or an option of one section, written twice in one file
    (``found``, its entries): oslo.config takes the last value without a
    word, so the first one an operator reads is not the one in force.
    Across files it is the point of ``accel-agent.conf.d``: not warned."""
    warnings = []
    headers: dict[str, Entry] = {}
    options: dict[tuple[str, str], Entry] = {}
    for entry in found:
        section = _section_key(entry.section)
        if entry.key is None:
            first = headers.setdefault(section, entry)
            if first is not entry:
                warnings.append(
                    f"{entry.path}:{entry.line}: section [{entry.section}] is written again "
                    f"(also at {first.path}:{first.line}); oslo.config reads both as one, an "
                    "option set in both takes the later value: write the section once"
                )
            continue
        opt = (_section_opts(entry.section, entries) or {}).get(entry.key.replace("-", "_"))
        if getattr(opt, "multi", False):
            continue  # each line adds a value
        name = opt.dest if opt is not None else entry.key.replace("-", "_")
        first = options.setdefault((section, name), entry)
        if first is not entry:
            warnings.append(
                f"{entry.path}:{entry.line}: [{entry.section}] {entry.key} is set again "
                f"(also at {first.path}:{first.line}); this value wins and the one at "
                f"{first.path}:{first.line} is ignored: set it once"
            )
    return warnings


_PLACEHOLDER_EXAMPLES = {"mdev_": "mdev_nvidia-35", "vf_pool_": "vf_pool_nic_a",
                         "gpu_layout_": "gpu_layout_l4_mixed",
                         "vgpu_": "mdev_nvidia-35"}


def is_placeholder(section: str) -> bool:
    """Whether ``section`` is the sample's stand-in for a per-name section
    (``[mdev_$(mdev_type)]``, ``[vf_pool_$(pool)]``): a header the sample
    config ships, which names no type or pool."""
    return "$(" in section and section.partition("$(")[0] in _PLACEHOLDER_EXAMPLES


def _comment_warning(entry: Entry, opt: Any) -> list[str]:
    """A free string's value holding what looks like an inline comment (the
    options where a ``#`` cannot belong are config/values.py's errors)."""
    if comments.holds_no_comment(entry.section, opt):
        return []
    comment = comments.inline_comment(entry.lines)
    if comment is None:
        return []
    secret = bool(getattr(opt, "secret", False))
    shown = "****" if secret else printable(entry.lines[0])
    reason = comments.warning_reason(comment, secret)
    return [f"{entry.path}:{entry.line}: [{entry.section}] {entry.key} = {shown}: {reason}"]


def parsed_files(conf: cfg.ConfigOpts) -> list[str]:
    """The files ``conf`` was parsed from (after config.load.load_config)."""
    try:
        config_files = list(conf.config_file or [])
        config_dirs = list(conf.config_dir or [])
    except Exception:  # pragma: no cover - a ConfigOpts without the CLI options
        return []
    return files.source_files(config_files, config_dirs)


# --- where a message points ------------------------------------------------------------

# The shapes of the one-line messages of check-config (this module,
# config/values.py, the policy, the VF pools' and state_dir's checks), for
# `accelctl check-config --json`: the file and line a message starts with,
# and the first section and option it names.
_FILE_LINE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+): ")
_INVALID = r"^(?:Invalid configuration: )?"
_FILE_ELSEWHERE = (
    re.compile(_INVALID + r"config file (?P<file>.+) is not UTF-8 text \(byte 0x[0-9a-f]+ "
               r"on line (?P<line>\d+)\)$"),
    re.compile(_INVALID + r"--config-file (?P<file>.+) is a directory;"),
    re.compile(_INVALID + r"config file not found: \['(?P<file>[^']+)'\]$"),
    re.compile(_INVALID + r"config (?:file|directory) (?P<file>.+?)(?: \(a link to .*\))? "
               r"(?:is an? [A-Za-z ]+, not a regular file;|is larger than \d+ bytes;|"
               r"could be changed by another user than root: |changed while it was being read;)"),
)
_SECTION = r"\[(?P<section>[^\]\s]+)\]"
_OPTION = r"(?P<option>[A-Za-z_][A-Za-z0-9_-]*)"
_PLACES = (
    re.compile(rf"^(?:environment variable \S+: )?{_SECTION} {_OPTION}\b"),
    re.compile(rf"^unknown option {_OPTION} in {_SECTION}"),
    re.compile(rf"^{_OPTION} is set in {_SECTION}"),
    re.compile(rf"^unknown section {_SECTION}"),
    re.compile(rf"^the indented section header {_SECTION}"),
    re.compile(rf"^section {_SECTION} is (?:ignored|written again)"),
    re.compile(rf"\(in {_SECTION} {_OPTION}[;)]"),
    re.compile(rf"{_SECTION} {_OPTION}\b"),
)


@dataclass(frozen=True)
class Location:
    file: str | None = None
    line: int | None = None
    section: str | None = None
    option: str | None = None


def locate(message: str) -> Location:
    """The file, line, section and option a check-config message names,
    where it names them (None for each it does not)."""
    file = line = None
    rest = message
    found = _FILE_LINE.match(message)
    if found:
        file, line = found["file"], int(found["line"])
        rest = message[found.end() :]
    else:
        for pattern in _FILE_ELSEWHERE:
            found = pattern.match(message)
            if found:
                file = found["file"]
                line = int(found["line"]) if "line" in found.groupdict() else None
                break
    for pattern in _PLACES:
        place = pattern.search(rest)
        if place:
            groups = place.groupdict()
            return Location(file, line, groups.get("section"), groups.get("option"))
    return Location(file, line)
