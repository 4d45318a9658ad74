"""``[mdev_<type>] standing`` and ``reported_by`` as check-config reads them
(issue 23): a layout a GPU cannot hold is a warning naming it, Nova as the
reporter of a type without a layout is refused, a bad value names its line."""

from __future__ import annotations

import subprocess
import sys

from accel_agent.simulator import SimulatedHost, build_spec, materialise


def check(tmp_path, section: str) -> subprocess.CompletedProcess[str]:
    root = materialise(SimulatedHost(build_spec(["nova"])), tmp_path / "sys")
    conf = tmp_path / "agent.conf"
    conf.write_text(
        f"[DEFAULT]\nsysfs_root = {root}\nstate_dir = {tmp_path / 'state'}\n"
        f"[devices]\nenabled_mdev_types = nvidia-11\n[mdev_nvidia-11]\n{section}"
        "[libvirt]\nuri =\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "accel_agent.cmd.ctl", "--config-file", str(conf),
         "check-config"], capture_output=True, text=True, timeout=60,
        env={"ACCEL_AGENT_CACHE_DIR": "", "PATH": "/usr/bin:/bin"},
    )


def test_a_layout_a_gpu_cannot_hold_is_named_with_what_it_keeps(tmp_path):
    done = check(tmp_path, "standing = 12\n")
    assert done.returncode == 0, done.stderr
    # The nova profile's 0000:07:00.0 holds 8 nvidia-11, 0000:06:00.0 16.
    assert "standing = 12 cannot fit GPU 0000:07:00.0: it holds at most 8" in done.stderr
    assert "0000:06:00.0" not in done.stderr


def test_a_layout_that_fits_says_nothing(tmp_path):
    done = check(tmp_path, "standing = 8\nreported_by = nova\n")
    assert done.returncode == 0 and "standing" not in done.stderr, done.stderr


def test_nova_as_reporter_without_a_layout_is_refused(tmp_path):
    done = check(tmp_path, "reported_by = nova\n")
    assert done.returncode == 1
    assert "reported_by = nova needs standing >= 1" in done.stderr


def test_bad_values_name_their_file_and_line(tmp_path):
    done = check(tmp_path, "standing = -1\nreported_by = cyborg\n")
    assert done.returncode == 1
    assert "agent.conf:7: [mdev_nvidia-11] standing = -1" in done.stderr
    assert "agent.conf:8: [mdev_nvidia-11] reported_by = cyborg" in done.stderr
