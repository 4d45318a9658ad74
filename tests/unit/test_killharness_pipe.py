"""The random-kill harness reads its child's lines without losing any: a
child that wrote "ready", "begin" and its "ack" before the harness read the
first line (a loaded machine) must still be seen acknowledging.  With a
buffered readline followed by ``communicate`` the ack was lost and the child
looked as if it had died on its own (issue 11: "child for recover died on its
own (0)", seen in the soak at load ~4.5)."""

from __future__ import annotations

import sys

from tests.functional.killharness import finish_child, read_line, start_child


def test_lines_written_before_the_first_read_are_all_seen() -> None:
    child = start_child(
        [sys.executable, "-c",
         "import sys; sys.stdout.write('ready\\nbegin\\nack 0.1 [1]\\n'); sys.stdout.flush()"]
    )
    child.wait()  # everything is in the pipe before the first read
    assert read_line(child) == "ready\n"
    out, err = finish_child(child)
    assert out.splitlines() == ["begin", "ack 0.1 [1]"] and err == ""
