"""accelctl's commands and options are a public contract: add, never rename.

tests/unit/accelctl_commands.json holds every command path of accelctl's
parser (the simulator's and the xml command's included), in the order of the
help, each with its arguments (option strings, value, required, repeatable).
It was written once from the parser as it was before its commands moved to
modules of their own (issue 22); a change to a command's name, order or
options fails here until the file is rewritten on purpose:

    .venv/bin/python tests/unit/test_accelctl_cli.py --write

The help texts themselves are not compared (that would fail on every edit of
a sentence); tools/accelctl-snapshot.py prints every byte for a by-hand diff.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent.cmd import ctl

GOLDEN = Path(__file__).with_name("accelctl_commands.json")
# For the parametrisation (a missing file fails the golden fixture instead).
GOLDEN_COMMANDS = list(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else []


def _value(action: argparse.Action) -> str:
    if isinstance(action.metavar, tuple):
        return " ".join(action.metavar)
    return action.metavar or (action.dest.upper() if action.option_strings else action.dest)


def _argument(action: argparse.Action) -> str:
    """One argument as its usage shows it, plus what the usage leaves out."""
    if action.option_strings:
        text = ", ".join(action.option_strings)
        if action.nargs != 0:
            text += f" {_value(action)}"
        if action.required:
            text += " (required)"
    elif action.nargs == argparse.REMAINDER:
        text = f"{action.dest} ..."
    else:
        text = _value(action) if action.nargs != "?" else f"[{_value(action)}]"
    if isinstance(action, argparse._AppendAction):
        text += " (repeatable)"
    return text


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, list[str]]]:
    """(command path, its arguments) for ``parser`` and every subcommand
    below it, depth first in the order of the help."""
    children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, [_argument(a) for a in parser._actions if a not in children]
    for action in children:
        for name, sub in action.choices.items():
            yield from _walk(sub, f"{path} {name}")


def cli_shape() -> dict[str, list[str]]:
    shape = dict(_walk(ctl.build_parser(), "accelctl"))
    # `accelctl simulate ...` is parsed by the simulator's own parser.
    simulator = dict(_walk(ctl.simulate_parser(), "accelctl simulate"))
    shape["accelctl simulate"] = simulator.pop("accelctl simulate")
    return {**shape, **simulator}


@pytest.fixture(scope="module")
def shape() -> dict[str, list[str]]:
    return cli_shape()


@pytest.fixture(scope="module")
def golden() -> dict[str, list[str]]:
    return json.loads(GOLDEN.read_text())


def test_the_commands_are_the_same_in_the_same_order(shape, golden):
    assert list(shape) == list(golden)
    # Not vacuous: the groups of every command module are there.
    assert {"accelctl check-config", "accelctl types", "accelctl attach", "accelctl adopt",
            "accelctl migration claim", "accelctl ledger upgrade", "accelctl nova-pci-config",
            "accelctl simulate mount", "accelctl xml rewrite"} <= set(golden)


@pytest.mark.parametrize("command", GOLDEN_COMMANDS)
def test_each_command_keeps_its_options(shape, golden, command):
    assert shape.get(command) == golden[command]


@pytest.mark.parametrize("command", GOLDEN_COMMANDS)
def test_each_command_answers_help(command, capsys):
    """``accelctl <command> --help``: exit 0 and the usage of that command
    (the parser path, simulate's own parser included)."""
    words = command.split()[1:]
    with pytest.raises(SystemExit) as exit_:
        ctl.main([*words, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {command} ")


# What building accelctl's parser must not import: every command pays for
# it, so each command module imports these inside the command that needs them.
HEAVY = (
    "oslo_config", "http.client", "sqlite3", "lxml", "libvirt", "oslo_privsep",
    "accel_agent.api", "accel_agent.simulator", "accel_agent.migration",
    "accel_agent.reporting", "accel_agent.privileged", "accel_agent.devices.manager",
    "accel_agent.devices.ledger",
)
PROBE = """
import sys
from accel_agent.cmd import ctl
bare = sorted(m for m in sys.modules if m.startswith("accel_agent.cmd.ctl_"))
ctl.build_parser()
built = sorted(m for m in sys.modules if m.startswith("accel_agent.cmd.ctl_"))
print(repr((bare, built, sorted(m for m in sys.modules if m.startswith({heavy!r})))))
"""


def test_building_the_parser_imports_nothing_heavy():
    """The command modules' own imports stay light (the commands import
    the rest when they run); importing ctl alone, as ``python -m
    accel_agent.cmd.ctl`` does before its plain listing path, imports no
    command module at all."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY)],
        capture_output=True, text=True, check=True, timeout=60,
    )
    bare, built, heavy = ast.literal_eval(proc.stdout)
    assert bare == []
    assert "accel_agent.cmd.ctl_devices" in built  # the probe sees the command modules
    assert heavy == [], f"building the parser imported {heavy}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write  (rewrites {GOLDEN.name} from the parser)")
    GOLDEN.write_text(json.dumps(cli_shape(), indent=1) + "\n")
