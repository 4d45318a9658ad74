"""The real daemon's ``DELETE .../allocation`` and ``DELETE .../attachments``
on a full disk: the ledger cannot take the release, so the answer is 503
``LedgerWriteFailed`` in the API's error format, the instance still holds
its mdev (in the ledger and in sysfs), and the same request succeeds once
the disk has room again.  tests/unit/test_api_release_truth.py covers every
kind of ledger failure on the application alone."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from accel_agent import exception
from tests.functional.daemon_fixture import AgentDaemon, agent_config, short_dir
from tests.functional.privsep_fixture import skip_unless_root
from tests.functional.simhost import SimHost, simulated_host

pytestmark = [pytest.mark.fuse, pytest.mark.privsep]

CONF = "[devices]\nenabled_mdev_types = mtty-2\n[mdev_mtty-2]\ndevice_addresses = mtty\n"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHost]:
    skip_unless_root()
    with simulated_host(tmp_path_factory.mktemp("truth"), ["mtty"]) as host:
        yield host


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the state directory (the ledger), filled on demand."""
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Take every free block of ``disk``: the ledger's next write finds none."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as handle:
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


@pytest.mark.parametrize("remove", [False, True], ids=["keep", "remove"])
def test_a_release_the_full_ledger_refused_answers_503_and_changes_nothing(
    sim: SimHost, small_disk: Path, tmp_path: Path, remove: bool
) -> None:
    sim.reset()
    with short_dir() as sockdir:
        socket_path = str(sockdir / "api.sock")
        config = agent_config(tmp_path / "agent.conf", sim.root, str(small_disk / "state"),
                              socket_path, CONF)
        daemon = AgentDaemon(config, socket_path, tmp_path)
        try:
            client = daemon.start().client()
            allocated = client.allocate("vm-1", 1)["mdevs"]
            attached = client.attach("vm-2", [{"mdev_type": "mtty-2", "count": 1}])
            held = {"vm-1": allocated[0]["uuid"], "vm-2": attached["attachments"][0]["uuid"]}
            assert sim.sysfs_uuids() == set(held.values())
            filler = fill(small_disk)
            releases = {"vm-1": client.release, "vm-2": client.detach}
            for instance, release in releases.items():
                with pytest.raises(exception.ApiError) as info:
                    release(instance, remove=remove)
                assert (info.value.kwargs["status"], info.value.kwargs["code"]) == (
                    503, "LedgerWriteFailed"), info.value.message
                assert "cannot be written" in info.value.message
            # Nothing was released, nothing removed: the 503 told the truth.
            assert [m["uuid"] for m in client.allocation("vm-1")["mdevs"]] == [held["vm-1"]]
            assert [h["uuid"] for h in client.attachment("vm-2")["attachments"]] == [
                held["vm-2"]]
            assert sim.sysfs_uuids() == set(held.values())
            filler.unlink()
            for instance, release in releases.items():
                assert release(instance, remove=remove)["released"] == [held[instance]]
                assert client.allocation(instance)["mdevs"] == []
            assert sim.sysfs_uuids() == (set() if remove else set(held.values()))
        finally:
            daemon.close()
