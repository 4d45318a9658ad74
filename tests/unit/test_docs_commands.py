"""Every ``accelctl`` command line README.md and docs/ show exists, and the
read-only ones run on a simulated host (issue 34: the docs sent operators to
``accelctl health --json`` before it existed).

Each line is taken from the documents' shell blocks and inline code, its
placeholders (``<instance uuid>``, ``UUID``, ``ADDRESS``, ...) filled in,
and parsed by accelctl's own parser: an unknown command or option fails here
by name.  The lines that only read (check-config, the listings, explain,
nova-pci-config, health, status) then run as a real accelctl process against
a materialised simulated host with no daemon (``--offline``): none may end
in a usage error or a traceback.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from accel_agent.cmd import ctl
from accel_agent.simulator import SimulatedHost, build_spec, materialise
from tests.configutil import write_conf

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# What a placeholder of the documents stands for on the test's host.
PLACEHOLDERS = {
    "<instance uuid>": "vm-1",
    "<instance>": "vm-1",
    "INSTANCE": "vm-1",
    "<address>": "0000:84:00.0",
    "ADDRESS": "0000:84:00.0",
    "<uuid>": "4b2f0000-0000-4000-8000-000000000001",
    "UUID": "4b2f0000-0000-4000-8000-000000000001",
    "4b2f...": "4b2f0000-0000-4000-8000-000000000001",
    "/etc/nova/nova.conf": "{nova_conf}",
}
# Commands that only read: run for real, offline.
READ_ONLY = {"check-config", "types", "mdevs", "inventory", "explain", "nova-pci-config",
             "health", "status"}


def _shell_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```(?:sh|console|bash|shell)\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ").removeprefix("# ")
            lines.append(line)
    return lines


def documented() -> list[tuple[str, str]]:
    """(document, command line) of every accelctl line the documents show."""
    found: dict[str, str] = {}
    for document in DOCUMENTS:
        text = document.read_text()
        candidates = _shell_lines(text) + re.findall(r"`(accelctl [^`]+)`", text)
        for raw in candidates:
            if "<TAB>" in raw:
                continue  # shell completion shown, not a command
            # A table cell's escaped pipe (`auto\\|yes`) is part of the line.
            for part in re.split(r"&&|\|\||;|(?<!\\)\|", raw):
                part = part.replace("\\|", "|").split("  #")[0].split(" # ")[0].strip()
                if part.startswith("accelctl ") and "..." not in part.replace("4b2f...", ""):
                    found.setdefault(" ".join(part.split()), document.name)
    return sorted((doc, line) for line, doc in found.items())


def argv_of(line: str, nova_conf: str) -> list[str] | None:
    """The line's arguments with its placeholders filled in; None for a line
    that is prose rather than a command (an option alone, a bracketed form)."""
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    line = line.replace("{nova_conf}", nova_conf)
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        return None
    # A synopsis (`accelctl ledger upgrade [--json]`) says what may be given:
    # drop the optional part.
    words = [w for w in words if not (w.startswith("[") or w.endswith("]"))]
    if not words or all(w.startswith("-") for w in words):
        return None
    if any(w.startswith("<") for w in words):
        return None
    return words


LINES = documented()


def test_the_documents_show_accelctl_commands():
    assert len(LINES) > 20
    assert any(line.startswith("accelctl health") for _, line in LINES)


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def _valued(parser: argparse.ArgumentParser) -> set[str]:
    """The options that take a value (the next word is theirs)."""
    return {o for action in parser._actions if action.nargs != 0 for o in action.option_strings}


@pytest.mark.parametrize(("document", "line"), LINES, ids=[line for _, line in LINES])
def test_a_documented_command_and_its_options_exist(document, line):
    """The command path (``ledger upgrade``, ``simulate mount``) is one of
    accelctl's, and every option the line names is one of that command's
    (or a global one); placeholders and synopsis brackets are left aside."""
    words = shlex.split(line.replace("LISTING", "types"))[1:]
    if all(w.startswith("-") for w in words):
        pytest.skip("options alone: prose about every command")
    parser = ctl.build_parser()
    known = _options(parser)
    valued = _valued(parser)
    command = parser
    path = []
    skip = False
    for word in words:
        if skip or word.startswith("-"):
            skip = word.split("=")[0] in valued and "=" not in word
            continue
        if path == ["simulate"]:
            command = ctl.simulate_parser()  # the simulator's own parser
        choices = _choices(command)
        if not choices:
            break
        if word in choices:
            command = choices[word]
            path.append(word)
            known |= _options(command)
            valued |= _valued(command)
        elif not path:
            pytest.fail(f"{document}: {line!r}: {word!r} is no accelctl command")
        else:
            break
    named = {w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("-")}
    unknown = sorted(o for o in named if o not in known)
    assert not unknown, f"{document}: {line!r}: no option {unknown} of accelctl {' '.join(path)}"


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("docs")
    root = materialise(SimulatedHost(build_spec(["nvidia-pf", "mtty"], gpus=2)),
                       str(base / "sys"))
    conf = write_conf(
        str(base / "agent.conf"),
        f"""
        state_dir = {base}/state
        [api]
        socket_path = {base}/api.sock
        [devices]
        enabled_mdev_types = nvidia-35
        [libvirt]
        uri =
        """,
        root,
    )
    nova = base / "nova.conf"
    nova.write_text("[pci]\n")
    return {"conf": conf, "nova": str(nova)}


READ_LINES = [(doc, line) for doc, line in LINES if line.split()[1:2]
              and line.split()[1] in READ_ONLY]


@pytest.mark.parametrize(("document", "line"), READ_LINES, ids=[line for _, line in READ_LINES])
def test_a_documented_read_only_command_runs_on_a_simulated_host(document, line, host):
    argv = argv_of(line, host["nova"])
    if argv is None:
        pytest.skip("prose, not a command line")
    try:
        ctl.parse(argv, ctl.build_parser())
    except SystemExit:
        pytest.skip("a synopsis (its arguments named, not given)")
    proc = subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--offline", "--config-file",
         host["conf"], *argv],
        capture_output=True, text=True, timeout=120,
        env={"ACCEL_AGENT_CACHE_DIR": "", "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" not in proc.stderr, (document, line, proc.stderr)
    assert proc.returncode in (0, 1), (document, line, proc.returncode, proc.stderr)
    if proc.returncode == 1:
        # An error the command means (no daemon for health, an address not on
        # this host), said on stderr as the CLI contract wants.
        assert proc.stderr.startswith("error: "), (document, line, proc.stderr)
