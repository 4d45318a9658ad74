"""A comment written after a value, which oslo.config reads as the value.

oslo.config's INI parser knows comments only as whole lines (``#`` or ``;``
in the first column): everything after the ``=`` is the value, so

    host = node1   # the root resource provider

makes every provider name start with ``node1   # the root resource
provider``, and ``max_instances = 4   # per GPU`` is not an integer.  This
module finds such a comment in a value as written and says whether the
option can hold one at all:

* :func:`inline_comment`: the ``#``/``;`` text that looks like a comment in
  a value's lines (after a blank, or a whole continuation line); a value in
  quotes is taken as meant (oslo.config removes the quotes);
* :func:`holds_no_comment`: options whose values are numbers, booleans,
  choices, names, addresses, URIs or versions, which a ``#`` cannot belong
  to: such a value is an error (config/values.py); in a free string (a path, a
  password, a log format) it is a warning (config/lint.py), since the ``#``
  may be meant.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oslo_config import types

from accel_agent.exception import printable

# A "#" or ";" at the start of a value's line or after a blank.
_COMMENT = re.compile(r"(?:^|\s)([#;])")

# Plain string options (no type, regex or choices oslo.config checks) whose
# values are names, identifiers, addresses, URIs or versions, none of which
# holds a blank followed by "#": (section kind, option).  The section kind
# is the section, or its prefix for the per-name sections (section_kind).
NAME_OPTIONS = frozenset(
    {
        ("DEFAULT", "host"),
        ("DEFAULT", "syslog_log_facility"),
        ("DEFAULT", "default_log_levels"),  # logger=LEVEL pairs
        ("devices", "enabled_mdev_types"),
        ("devices", "enabled_vf_pools"),
        ("mdev_", "device_addresses"),
        ("vf_pool_", "device_addresses"),
        ("devices", "enabled_gpu_layouts"),
        ("gpu_layout_", "gpus"),
        ("gpu_layout_", "vgpus"),
        ("gpu_layout_", "mig"),  # <profile>:<count> items
        ("api", "socket_group"),
        ("libvirt", "uri"),
        ("migration", "min_libvirt_version"),
        ("migration", "min_qemu_version"),
        ("migration", "min_kernel_version"),
        ("accel_agent_privileged", "user"),
        ("accel_agent_privileged", "group"),
        ("accel_agent_net_privileged", "user"),
        ("accel_agent_net_privileged", "group"),
        ("accel_agent_nvml_privileged", "user"),
        ("accel_agent_nvml_privileged", "group"),
        ("placement", "auth_type"),
        ("placement", "auth_section"),
        ("placement", "auth_url"),
        ("placement", "endpoint_override"),
        ("placement", "service_type"),
        ("placement", "valid_interfaces"),
        ("placement", "version"),
        ("placement", "min_version"),
        ("placement", "max_version"),
        ("placement", "system_scope"),
        ("placement", "domain_id"),
        ("placement", "project_id"),
        ("placement", "project_domain_id"),
        ("placement", "user_id"),
        ("placement", "user_domain_id"),
        ("placement", "trust_id"),
        ("placement", "default_domain_id"),
    }
)

_PER_NAME_PREFIXES = ("mdev_", "vgpu_", "vf_pool_", "gpu_layout_")


def section_kind(section: str) -> str:
    """``mdev_nvidia-35`` (and Nova's legacy ``vgpu_nvidia-35``) -> ``mdev_``,
    ``vf_pool_nic`` -> ``vf_pool_``; any other section is its own kind."""
    for prefix in _PER_NAME_PREFIXES:
        if section.startswith(prefix):
            return "mdev_" if prefix == "vgpu_" else prefix
    return section


def _is_free_string(kind: Any) -> bool:
    """A string oslo.config takes as it is: its plain String (no regex, no
    choices) or keystoneauth's ``str``.  Its subclasses check a format."""
    if kind is str:
        return True
    if type(kind) in (types.String, types.MultiString):
        return kind.regex is None and not kind.choices
    return False


def holds_no_comment(section: str, opt: Any) -> bool:
    """Whether a ``#`` after a blank cannot belong to this option's value:
    a typed value (number, boolean, choice, a string with a format) or a
    string that is a name, address, URI or version (:data:`NAME_OPTIONS`)."""
    kind = opt.type.item_type if isinstance(opt.type, types.List) else opt.type
    if not _is_free_string(kind):
        return True
    kind_of_section = section_kind(section)
    return any(
        (kind_of_section, name.replace("-", "_")) in NAME_OPTIONS
        for name in {opt.dest, opt.name}
    )


@dataclass(frozen=True)
class Comment:
    text: str  # from its "#" or ";" to the end of its line
    indented: bool  # a whole continuation line: "#" after the indentation


def inline_comment(lines: Sequence[str]) -> Comment | None:
    """The comment-like text of a value as the parser assembles it (its
    first line stripped, its continuation lines without their indentation),
    from its ``#`` or ``;``; None when there is none.  A first line in
    matching quotes is literal: oslo.config takes what is inside them."""
    for index, text in enumerate(lines):
        if index == 0 and len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            continue
        found = _COMMENT.search(text)
        if found:
            return Comment(text[found.start(1) :], indented=index > 0 and found.start(1) == 0)
    return None


def _shorten(text: str, limit: int = 40) -> str:
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fix(comment: Comment) -> str:
    if comment.indented:
        return ("an indented line continues the value above it: start the comment in "
                "the first column")
    return "put the comment on a line of its own"


def error_reason(comment: Comment) -> str:
    """Why the value of an option that holds no comment is refused."""
    return (
        f"oslo.config has no inline comments, {_shorten(comment.text)!r} is part of the "
        f"value; {_fix(comment)}"
    )


def warning_reason(comment: Comment, secret: bool) -> str:
    """What a free string holding a comment-like text is told."""
    mark = comment.text[0]
    what = f"{mark!r} and what follows it" if secret else repr(_shorten(comment.text))
    return (
        f"{what} is part of the value (oslo.config has no inline comments); if it is a "
        f"comment, {_fix(comment)}; if the {mark!r} belongs to the value, quote the value"
    )
