"""``accelctl xml``: list and rewrite the mdev UUIDs of a domain XML on stdin.

``accelctl xml rewrite --map SRC=DST [--map SRC=DST ...] < in.xml > out.xml``
writes the input bytes unchanged except for the mapped mdev UUIDs, so an
operator can migrate by hand (``virsh migrate --xml out.xml``) or diff the
result.  Exit status: 0 done (unused ``--map`` entries are warned about on
stderr), 1 refused (reason on stderr, *nothing* on stdout, so a shell
redirection never leaves a half-written file that looks valid), 2 usage error.

``accelctl xml list < in.xml`` prints the domain's mdev UUIDs, one a line;
with ``--json``, ``{"mdevs": [{"uuid": UUID}, ...]}`` in document order.

Only argparse is imported at module level: ``accelctl`` imports every
subcommand at start-up, and lxml costs tens of milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

__all__ = ["Streams", "main", "register"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Streams:
    """Where a command reads and writes; the process's streams unless a test says otherwise."""

    stdin: BinaryIO
    stdout: BinaryIO
    stderr: TextIO

    @classmethod
    def from_sys(cls) -> Streams:
        return cls(sys.stdin.buffer, sys.stdout.buffer, sys.stderr)


def _map_arg(value: str) -> tuple[str, str]:
    """argparse ``type=`` for ``--map SRC=DST``; a bad one is a usage error (exit 2)."""
    from accel_agent import exception
    from accel_agent.libvirt_xml.hostdev import canonical_uuid

    source, sep, target = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected SRC=DST, got {value!r}")
    try:
        return canonical_uuid(source.strip()), canonical_uuid(target.strip())
    except exception.InvalidMdevUUID as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``xml`` subcommand to accelctl's ``add_subparsers()`` object."""
    xml = subparsers.add_parser(
        "xml",
        help="list or rewrite the mdev UUIDs of a libvirt domain XML",
        description="Work on a libvirt domain XML read from stdin.",
    )
    commands = xml.add_subparsers(dest="xml_command", metavar="{rewrite,list}", required=True)

    rewrite = commands.add_parser(
        "rewrite",
        help="replace mdev UUIDs (for live migration), changing no other byte",
        description=(
            "Read a domain XML on stdin and write it to stdout with each "
            "devices/hostdev[@type='mdev']/source/address/@uuid replaced by its --map "
            "destination. Every other byte is copied unchanged. Refuses (exit 1, "
            "nothing on stdout) when an mdev has no --map entry, when two sources map "
            "to one destination, or when the input is not a safe <domain> document."
        ),
    )
    rewrite.add_argument(
        "--map",
        dest="mappings",
        metavar="SRC=DST",
        action="append",
        type=_map_arg,
        default=[],
        help="source mdev UUID = destination mdev UUID (repeatable, case-insensitive)",
    )
    rewrite.set_defaults(func=_cmd_rewrite)

    listing = commands.add_parser(
        "list",
        help="print the domain's mdev UUIDs, one a line",
        description="Print the mdev UUIDs of the domain XML on stdin, in document order.",
    )
    listing.add_argument(
        "--json", action="store_true", help='{"mdevs": [{"uuid": UUID}, ...]}, in document order'
    )
    listing.set_defaults(func=_cmd_list)
    return xml


def _cmd_rewrite(args: argparse.Namespace, streams: Streams | None = None) -> int:
    from accel_agent import exception

    streams = streams or Streams.from_sys()
    mapping: dict[str, str] = {}
    for source, target in args.mappings:
        if mapping.get(source, target) != target:
            # argparse cannot see across repeated options; same status as its errors.
            print(
                f"accelctl xml rewrite: error: --map {source} given twice, "
                f"to {mapping[source]} and to {target}",
                file=streams.stderr,
            )
            return EXIT_USAGE
        mapping[source] = target

    data = streams.stdin.read()
    try:
        from accel_agent.libvirt_xml.rewrite import rewrite_mdev_uuids

        result = rewrite_mdev_uuids(data, mapping)
    except exception.AccelAgentException as exc:
        print(f"accelctl xml rewrite: error: {exc}", file=streams.stderr)
        return EXIT_REFUSED
    for key in result.unused_keys:
        print(
            f"accelctl xml rewrite: warning: --map {key}={mapping[key]} matched no mdev "
            f"in the domain XML",
            file=streams.stderr,
        )
    streams.stdout.write(bytes(result.xml))  # bytes in, so bytes out
    streams.stdout.flush()
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, streams: Streams | None = None) -> int:
    from accel_agent import exception

    streams = streams or Streams.from_sys()
    data = streams.stdin.read()
    try:
        from accel_agent.libvirt_xml.mdevs import list_mdev_uuids

        uuids = list_mdev_uuids(data)
    except exception.AccelAgentException as exc:
        print(f"accelctl xml list: error: {exc}", file=streams.stderr)
        return EXIT_REFUSED
    if args.json:
        import json

        document = {"mdevs": [{"uuid": uuid} for uuid in uuids]}
        streams.stdout.write(json.dumps(document).encode("ascii") + b"\n")
    else:
        streams.stdout.write("".join(f"{uuid}\n" for uuid in uuids).encode("ascii", "replace"))
    streams.stdout.flush()
    return EXIT_OK


def main(
    argv: list[str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``xml ...`` as accelctl would, with injectable streams; returns the exit status.

    argparse prints usage errors to ``sys.stderr`` and help to ``sys.stdout`` and
    then raises SystemExit; both are redirected to the given streams and the
    status is returned instead of exiting, so tests can call this in-process.
    """
    streams = Streams(
        stdin if stdin is not None else sys.stdin.buffer,
        stdout if stdout is not None else sys.stdout.buffer,
        stderr if stderr is not None else sys.stderr,
    )
    parser = argparse.ArgumentParser(prog="accelctl")
    register(parser.add_subparsers(dest="command", metavar="{xml}", required=True))

    help_text = io.StringIO()
    try:
        with contextlib.redirect_stderr(streams.stderr), contextlib.redirect_stdout(help_text):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        streams.stdout.write(help_text.getvalue().encode())
        streams.stdout.flush()
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    result: int = args.func(args, streams)
    return result


if __name__ == "__main__":
    sys.exit(main())
