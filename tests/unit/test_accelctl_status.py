"""``accelctl health`` and ``accelctl status`` (issue 34): what they print
from the daemon's documents, and their errors without one.  Against a
running daemon: test_standing_layout.py."""

from __future__ import annotations

from accel_agent.cmd import ctl, ctl_status

GPU1, GPU2, GPU3 = "0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0"
TYPE = "nvidia-1150"


def health(**extra) -> dict:
    return {
        "status": "ok", "version": "1.0", "host": "h", "pid": 7, "started_at": "t0",
        "last_rescan": "t1", "rescans": 3, "mdevs": {"assigned": 1, "free": 2, "foreign": 0},
        "providers": 2, "reporting": {"enabled": False, "state": "disabled"},
        "problems": [], **extra,
    }


def test_health_lines_say_the_status_and_what_the_start_waits_for():
    lines = ctl_status.health_lines(health())
    assert lines[0] == "status: ok"
    assert "devices: assigned 1, free 2; providers: 2" in lines
    assert lines[-1] == "problems: none"
    starting = health(status="starting", starting={
        "phase": "waiting for VFs", "since": "t2", "started_at": "t0",
        "waiting_for": [GPU1, GPU2], "until": "t9"})
    assert ctl_status.health_lines(starting)[0] == (
        f"status: starting: waiting for VFs of GPU(s) {GPU1}, {GPU2} "
        "(standing layout; at most until t9)")
    failing = health(status="degraded", problems=["Placement sync failing: x\x1b[31m"],
                     reporting={"enabled": True, "state": "failing", "last_success": None,
                                "consecutive_failures": 2, "next_attempt_at": "t5",
                                "last_error": "x"})
    lines = ctl_status.health_lines(failing)
    assert "reporting: failing, last success never, 2 failure(s) in a row, next attempt t5: x" \
        in lines
    assert lines[-1] == "  - Placement sync failing: x\\x1b[31m"  # escaped, never sent raw


def test_layout_rows_per_gpu_from_health_and_the_listing():
    document = health(layout={
        "draining": ["d1"], "short": {GPU2: {"mdev_type": TYPE, "standing": 2, "present": 1}},
        "missing_gpus": [GPU3], "error": None, "in_use": 1,
        "in_use_by_type": {TYPE: 1}, "in_use_by_gpu": {GPU1: 1, GPU2: 0},
    })
    mdevs = {"mdevs": [
        {"physical_gpu": GPU1, "mdev_type": TYPE, "standing": True, "draining": False},
        {"physical_gpu": GPU1, "mdev_type": TYPE, "standing": True, "draining": False},
        {"physical_gpu": GPU1, "mdev_type": "nvidia-1151", "standing": False, "draining": True},
        {"physical_gpu": GPU2, "mdev_type": TYPE, "standing": True, "draining": False},
        {"physical_gpu": "mtty", "mdev_type": "mtty-2", "standing": False, "draining": False},
    ]}
    rows = ctl_status.layout_rows(document, mdevs, {TYPE: 2}, {GPU3: TYPE})
    assert rows == [
        {"gpu": GPU1, "mdev_type": TYPE, "standing": 2, "present": 2, "in_use": 1,
         "draining": 1, "short": 0, "missing": False},
        {"gpu": GPU2, "mdev_type": TYPE, "standing": 2, "present": 1, "in_use": 0,
         "draining": 0, "short": 1, "missing": False},
        {"gpu": GPU3, "mdev_type": TYPE, "standing": 2, "present": 0, "in_use": 0,
         "draining": 0, "short": 0, "missing": True},
    ]


def test_health_and_status_need_the_running_agent(tmp_path, capsys):
    config = tmp_path / "agent.conf"
    config.write_text(f"[api]\nsocket_path = {tmp_path / 'none.sock'}\n")
    for command in ("health", "status"):
        assert ctl.main(["--config-file", str(config), command]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: accel-agent is not running (no API socket at "
                              f"{tmp_path / 'none.sock'}"), err
        assert ctl.main(["--config-file", str(config), "--offline", command, "--json"]) == 1
        assert "has no --offline form" in capsys.readouterr().err
