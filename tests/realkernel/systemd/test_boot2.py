"""Lab "systemd", second boot (after test_boot1.py enabled the unit and rebooted the
guest): the enabled unit re-created the ledger's mdevs before it told systemd READY=1,
and `systemd-analyze security` of the shipped unit is recorded for docs/security.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.realkernel.systemd import unitlab as lab

pytestmark = lab.skip_unless_lab()


def _expected() -> dict[str, list[str]]:
    assert lab.EXPECTED.exists(), "test_boot1.py did not leave its ledger for this boot"
    return json.loads(lab.EXPECTED.read_text())


def test_enabled_unit_is_active_after_the_reboot():
    props = lab.show("ActiveState", "UnitFileState", "NRestarts", "StatusText")
    assert props["UnitFileState"] == "enabled"
    assert props["ActiveState"] == "active", props
    assert props["NRestarts"] == "0"
    assert props["StatusText"].startswith("serving the API on"), props


def test_the_pool_s_vfs_are_enabled_again_at_boot():
    """VFs do not survive a reboot: the enabled unit's agent enabled the pool's again."""
    vfs = lab.vfs_of(lab.igb_pf())
    assert len(vfs) == lab.POOL_NUM_VFS, vfs
    assert [lab.driver_of(vf) for vf in vfs] == ["igbvf"] * lab.POOL_NUM_VFS


def test_nova_compute_and_libvirt_guests_started_once_the_agent_was_ready():
    """The drop-ins' After=: with Type=notify the agent is active once it sent READY=1,
    after its recovery; the ordered units' processes started no earlier."""
    ready = int(lab.show("ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"])
    assert ready > 0
    for name in lab.ORDERED:
        props = lab.show("ActiveState", "ExecMainStartTimestampMonotonic", unit=name)
        assert props["ActiveState"] == "active", (name, props)
        assert int(props["ExecMainStartTimestampMonotonic"]) >= ready, (name, props, ready)


def test_the_ledger_mdevs_are_re_created_in_the_new_kernel():
    expected = _expected()
    # mtty's mdevs do not survive a reboot: each one here was made by this boot's agent
    assert lab.mdevs() == {uuid: "mtty-2" for uuids in expected.values() for uuid in uuids}
    for instance, uuids in expected.items():
        if instance == "layout":
            continue
        held = lab.ok("GET", f"/v1/instances/{instance}/allocation")["mdevs"]
        assert sorted(m["uuid"] for m in held) == uuids


def test_the_standing_layout_stands_again_with_the_same_mdevs():
    """Issue 23: the layout's own 2 mdevs (standing = 5 with 3 held by instances)
    came back with their UUIDs, still the layout's, before READY (the next test
    checks the order)."""
    layout = _expected()["layout"]
    assert len(layout) == lab.STANDING - 3
    listed = {m["uuid"]: m for m in lab.ok("GET", "/v1/mdevs")["mdevs"]}
    assert all(listed[u]["standing"] and listed[u]["instance"] is None for u in layout)
    assert sum(m["standing"] for m in listed.values()) == lab.STANDING
    assert lab.health()["layout"]["draining"] == []


def test_mdevs_were_re_created_before_ready():
    """The agent logs its recovery before it sends READY=1; systemd marks the unit
    active when READY=1 arrives (ActiveEnterTimestampMonotonic).  Both on the
    monotonic clock of this boot."""
    expected = {uuid for uuids in _expected().values() for uuid in uuids}
    active_at = int(lab.show("ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"])
    assert active_at > 0
    entries = lab.journal()
    recovery = [
        (int(entry["__MONOTONIC_TIMESTAMP"]), message)
        for entry, message in zip(entries, lab.messages(entries), strict=True)
        if "recovery re-created" in message
    ]
    assert len(recovery) == 1, lab.messages(entries)
    logged_at, message = recovery[0]
    assert all(uuid in message for uuid in expected), message
    assert f"re-created {len(expected)} mdev(s)" in message
    assert logged_at < active_at, (logged_at, active_at, message)
    ready = [
        int(entry["__MONOTONIC_TIMESTAMP"])
        for entry, message in zip(entries, lab.messages(entries), strict=True)
        if " ready: API on " in message
    ]
    assert ready and logged_at < ready[0] <= active_at + 1_000_000


def test_systemd_analyze_security_is_recorded():
    proc = lab.run("systemd-analyze", "security", "--no-pager", f"{lab.UNIT}.service")
    out = os.environ["LAB_OUT"]
    os.makedirs(f"{out}/logs", exist_ok=True)
    with open(f"{out}/systemd-analyze-security.txt", "w") as handle:
        handle.write(proc.stdout)
    assert "Overall exposure level for accel-agent.service" in proc.stdout
    assert "PrivateDevices=" in proc.stdout


def test_cleanup_release_and_stop():
    # standing = 0: the layout's own mdevs go (none is in use); then the instances'.
    lab.write_config("mtty-2")
    lab.run("systemctl", "reload", lab.UNIT)
    lab.wait_for(lambda: len(lab.mdevs()) == 3, "the standing layout's mdevs removed")
    for instance in _expected():
        if instance == "layout":
            continue
        assert lab.ok("DELETE", f"/v1/instances/{instance}/allocation?remove=true")["removed"]
    assert lab.mdevs() == {}
    # One transaction, as at shutdown: the ordered units stop first (the reverse of After=),
    # so the agent begins to stop only once they are down.  `systemctl stop A B C` is not
    # one transaction (one job per unit, sent one after the other: the agent's job, queued
    # alone, may run before the others are queued; seen in CI), so a target that conflicts
    # with the three, as shutdown.target conflicts with every unit, stops them together.
    ordered = [f"{name}.service" for name in lab.ORDERED]
    units = " ".join([f"{lab.UNIT}.service", *ordered])
    Path("/etc/systemd/system/lab-stop.target").write_text(
        "[Unit]\nDescription=lab systemd: stop the agent and its consumers as shutdown does\n"
        f"Conflicts={units}\nAfter={units}\n"
    )
    lab.run("systemctl", "daemon-reload")
    lab.run("systemctl", "start", "lab-stop.target", timeout=120)
    assert lab.show("ActiveState")["ActiveState"] == "inactive"
    assert lab.show("Result")["Result"] == "success"
    agent_stopping = int(lab.show("ActiveExitTimestampMonotonic")["ActiveExitTimestampMonotonic"])
    for name in lab.ORDERED:
        down = int(
            lab.show("InactiveEnterTimestampMonotonic", unit=name)[
                "InactiveEnterTimestampMonotonic"
            ]
        )
        assert 0 < down <= agent_stopping, (name, down, agent_stopping)
