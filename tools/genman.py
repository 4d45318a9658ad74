"""The manual pages and the bash completion the Debian package ships, generated
from the argparse parsers of ``accelctl`` and ``accel-agent`` as the tree has
them when the package is built (tools/build-deb.sh runs this):

* ``accelctl.8`` and ``accel-agent.8`` by argparse-manpage;
* ``accelctl`` (bash completion) by shtab.

Both tools walk the parsers themselves, so a subcommand or option added to
the code is in the next package without anyone editing a page.  Pinned in
constraints.txt, installed by ``make venv`` (the ``test`` extra).

``python tools/genman.py OUTDIR`` writes the three files into OUTDIR.
``accelctl_parser`` and ``agent_parser`` are also what tests/package compares
the shipped pages against.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANUAL_TITLE = "accel-agent"
SECTION = "8"  # system administration commands: both run as root on a KVM host
# What the NAME line says after "accelctl - " (man-pages(7): one short phrase).
SUMMARIES = {
    "accelctl": "inspect and manage the mediated devices (vGPUs) of this host",
    "accel-agent": "the agent that owns the mediated devices (vGPUs) of this KVM host",
}


def accelctl_parser() -> argparse.ArgumentParser:
    from accel_agent.cmd import ctl

    return ctl.build_parser()


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _capture(build: Callable[[], object]) -> argparse.ArgumentParser:
    """The parser a function builds and parses with, taken at its first
    parse: accel-agent builds its parser inside ``parse_args`` and exposes no
    builder, and this reads whatever that function builds today."""

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> object:
        raise _Captured(self)

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args)
    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = grab  # type: ignore[method-assign]
    try:
        build()
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{build!r} parsed no arguments: no parser to document")


def agent_parser() -> argparse.ArgumentParser:
    from accel_agent.cmd import agent

    builder = getattr(agent, "build_parser", None)
    if builder is not None:
        return builder()
    return _capture(lambda: agent.parse_args([]))


def _version() -> str:
    import accel_agent

    return accel_agent.__version__


def _tool(name: str) -> str:
    """A console script of the interpreter running this (the venv's)."""
    return str(Path(sys.executable).parent / name)


def write_manpage(prog: str, function: str, output: Path) -> None:
    subprocess.run(
        [
            _tool("argparse-manpage"),
            "--pyfile", str(HERE / "genman.py"),
            "--function", function,
            "--prog", prog,
            "--project-name", "accel-agent",
            "--version", _version(),
            "--description", SUMMARIES[prog],
            "--manual-section", SECTION,
            "--manual-title", MANUAL_TITLE,
            "--include", str(HERE / "man" / f"{prog}.include"),
            "--output", str(output),
        ],
        check=True,
        env=_env(),
    )


def write_completion(output: Path) -> None:
    script = subprocess.run(
        [
            _tool("shtab"), "--shell=bash", "--prog", "accelctl", "--prefix", "accelctl",
            "genman.accelctl_parser",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=HERE,
    ).stdout
    output.write_text(script)


def _env() -> dict[str, str]:
    # The tree being packaged first (its accel_agent), then this directory
    # (shtab imports genman as a module).
    tree = str(HERE.parent)
    path = os.pathsep.join(p for p in (tree, str(HERE), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, help="where accelctl.8, accel-agent.8, accelctl go")
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    write_manpage("accelctl", "accelctl_parser", args.outdir / "accelctl.8")
    write_manpage("accel-agent", "agent_parser", args.outdir / "accel-agent.8")
    write_completion(args.outdir / "accelctl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
