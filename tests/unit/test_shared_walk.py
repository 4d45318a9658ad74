"""The listings' /proc walk (daemon/shared_walk.py): never an answer older
than the request, one walk for the requests that wait at once."""

from __future__ import annotations

import threading

import pytest

from accel_agent.daemon.shared_walk import SharedWalk
from tests.functional.daemon_fixture import wait_for


class Proc:
    """What processes hold, changed by the test; each walk counted, and
    held back until ``go`` is set when ``gate`` is."""

    def __init__(self) -> None:
        self.held: frozenset[str] = frozenset()
        self.walks: list[str] = []
        self.gate = False
        self.go = threading.Event()
        self.walking = threading.Event()

    def walk(self, directory: str) -> frozenset[str]:
        self.walks.append(directory)
        answer = self.held  # read when the walk begins
        self.walking.set()
        if self.gate:
            assert self.go.wait(30)
        return answer


def test_each_listing_walks_again_and_sees_a_change_at_once():
    proc = Proc()
    shared = SharedWalk(proc.walk)
    assert shared.held("/dev/vfio") == frozenset()
    proc.held = frozenset({"7"})  # a VM opened group 7: sysfs did not change
    assert shared.held("/dev/vfio") == frozenset({"7"})
    assert shared.held("/dev/vfio2") == frozenset({"7"})
    assert proc.walks == ["/dev/vfio", "/dev/vfio", "/dev/vfio2"]


def test_requests_during_a_walk_share_the_next_one_never_the_older_one():
    proc = Proc()
    proc.gate = True
    shared = SharedWalk(proc.walk)
    answers: dict[str, frozenset[str] | None] = {}
    first = threading.Thread(
        target=lambda: answers.update(first=shared.held("/dev/vfio")), daemon=True)
    first.start()
    assert proc.walking.wait(30)
    # Asked while that walk runs: a VM opened group 7 after it began.
    proc.held = frozenset({"7"})
    late = [threading.Thread(target=lambda i=i: answers.update({f"late{i}": shared.held(
        "/dev/vfio")}), daemon=True) for i in range(5)]
    for thread in late:
        thread.start()
    wait_for(lambda: shared.waiting == 5, what="the five requests waiting")
    proc.go.set()
    for thread in (first, *late):
        thread.join(30)
    assert answers.pop("first") == frozenset()
    assert answers == {f"late{i}": frozenset({"7"}) for i in range(5)}
    assert len(proc.walks) == 2  # one for the first, one shared by the five


def test_a_walk_that_fails_fails_its_caller_and_the_next_walks_again():
    calls: list[int] = []

    def walk(directory: str) -> frozenset[str]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("proc gone")
        return frozenset({"3"})

    shared = SharedWalk(walk)
    with pytest.raises(OSError, match="proc gone"):
        shared.held("/dev/vfio")
    answers: list[frozenset[str] | None] = []
    again = threading.Thread(
        target=lambda: answers.append(shared.held("/dev/vfio")), daemon=True)
    again.start()
    again.join(30)
    assert not again.is_alive(), "the next request waits for a walk nobody runs"
    assert answers == [frozenset({"3"})] and len(calls) == 2


def test_a_shared_walk_answers_only_for_its_own_directory():
    proc = Proc()
    proc.gate = True
    walks: list[str] = []

    def walk(directory: str) -> frozenset[str]:
        walks.append(directory)
        if len(walks) == 1:
            proc.walk(directory)  # the first walk held back
        return frozenset({directory})

    shared = SharedWalk(walk)
    answers: dict[str, frozenset[str] | None] = {}
    threads = [
        threading.Thread(target=lambda d=d: answers.update({d: shared.held(d)}), daemon=True)
        for d in ("/a", "/b", "/c")
    ]
    threads[0].start()
    assert proc.walking.wait(30)
    for thread in threads[1:]:
        thread.start()
    wait_for(lambda: shared.waiting == 2, what="two requests waiting")
    proc.go.set()
    for thread in threads:
        thread.join(30)
    assert answers == {d: frozenset({d}) for d in ("/a", "/b", "/c")}
    assert sorted(walks) == ["/a", "/b", "/c"]
