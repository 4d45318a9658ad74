"""accelctl's plain listing path takes exactly the forms whose meaning it
shares with the parser path, and leaves every other command to it."""

from __future__ import annotations

import pytest

from accel_agent.cmd import plain_listing


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["types", "--json"], ("types", [], [], False, None)),
        (["--config-file", "a.conf", "mdevs", "--json"], ("mdevs", ["a.conf"], [], False, None)),
        (
            ["--config-file=a", "--config-dir", "d", "--config-file", "b", "inventory", "--json"],
            ("inventory", ["a", "b"], ["d"], False, None),
        ),
        (["--offline", "--sysfs-root=/x", "--sysfs-root", "/y", "types", "--json"],
         ("types", [], [], True, "/y")),
        # The global options after the listing, as accelctl's parser takes them.
        (["types", "--json", "--offline"], ("types", [], [], True, None)),
        (["--config-file", "a", "mdevs", "--config-file", "b", "--json", "--config-dir=d"],
         ("mdevs", ["a", "b"], ["d"], False, None)),
        (["--sysfs-root", "/x", "inventory", "--sysfs-root=/y", "--json"],
         ("inventory", [], [], False, "/y")),
    ],
)
def test_plain_forms_are_taken(argv, expected):
    request = plain_listing.parse(argv)
    assert request is not None
    got = (request.listing, request.config_files, request.config_dirs, request.offline,
           request.sysfs_root)
    assert got == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["types"],  # a table: the parser path renders it
        ["types", "--json", "--json"],
        ["--json", "types"],
        ["-v", "types", "--json"],
        ["--verbose", "types", "--json"],
        ["--config-f", "a.conf", "types", "--json"],  # an abbreviation argparse accepts
        ["--config-file", "types", "--json"],  # argparse's error to report
        ["--config-file", "-x", "types", "--json"],
        ["--config-file="],
        ["--offline=yes", "types", "--json"],
        ["types", "--json", "-v"],
        ["types", "--offline"],  # no --json
        ["types", "mdevs", "--json"],
        ["types", "--json", "--config-file"],
        ["types", "--json=1"],
        ["allocate", "vm", "--count", "1", "--json"],
        # types' filters: the parser path filters the document
        ["types", "--json", "--configured"],
        ["types", "--type", "nvidia-1150", "--json"],
        ["types", "--json", "--parent=84:00.0"],
        ["check-config"],
        ["-h"],
        [],
    ],
)
def test_everything_else_goes_to_the_parser_path(argv):
    assert plain_listing.parse(argv) is None
