"""``/v1/health``'s ``problem_kinds``: one fixed word per problem message, in
the same order, and the metrics that show them (accel_agent_healthy,
accel_agent_health_problem) agreeing with the document."""

from __future__ import annotations

from types import SimpleNamespace

from accel_agent.daemon import health as health_mod
from accel_agent.daemon.counts import RecoveryView, RescanView
from accel_agent.devices import libvirt_calls
from accel_agent.privileged.guard import HelperHealth
from accel_agent.reporting import health_kinds as kind
from tests.unit.test_service import core  # noqa: F401  (the fixture)


def problem_values(core) -> dict[str, float]:  # noqa: F811
    return {
        k: core.metrics.value("accel_agent_health_problem", {"problem": k})
        for k in kind.PROBLEM_KINDS
    }


def test_an_ok_health_has_no_kinds_and_healthy_is_1(core):  # noqa: F811
    health = core.health()
    assert health["status"] == "ok"
    assert health["problems"] == health["problem_kinds"] == []
    assert core.metrics.value("accel_agent_healthy") == 1
    assert set(problem_values(core).values()) == {0}


def test_each_problem_has_its_kind_in_order(core, monkeypatch):  # noqa: F811
    core.reporter.state = "failing"
    core.rescans.view = RescanView(error="sysfs gone", missing=("m1",), waiting=("w1",),
                                   unrecorded=("u1",))
    core.rescans.recovery = RecoveryView(error="recovery broke")
    core.reloads.failed("bad value")
    ledger = core.devices.ledger
    ledger.identity_problem = lambda: "inode changed"
    ledger.write_error = "disk I/O error"
    monkeypatch.setattr(health_mod, "no_space_left", lambda directory: True)
    down = HelperHealth("sysfs", "restarting", None, 1, "no answer within 30 s", None)
    well = HelperHealth("net", "ok", 7, 0, None, None)
    monkeypatch.setattr(health_mod, "helper_guards",
                        lambda: [SimpleNamespace(health=lambda h=h: h) for h in (down, well)])

    from accel_agent.daemon.rescans import LayoutView
    from accel_agent.devices.layout import BLOCKED, Short

    core.rescans.layout = LayoutView(
        draining=("d1",), missing_gpus=("0000:c1:00.0",),
        short=(("0000:c2:00.0", Short("nvidia-1150", 2, 0, BLOCKED, ("d1",))),),
        error="GPU 0000:c3:00.0: EIO",
    )
    core.devices.domains = SimpleNamespace(uri="qemu:///system")
    stalled = libvirt_calls.Status("qemu:///system", libvirt_calls.STALLED, 0.0,
                                   "listing the domains' mdevs did not answer within 20 s", 20, 1)
    monkeypatch.setattr(libvirt_calls, "status_of", lambda uri: stalled)
    health = core.health()
    expected = [
        (kind.PLACEMENT_SYNC_FAILING, "Placement sync failing"),
        (kind.RESCAN_FAILED, "last rescan failed: sysfs gone"),
        (kind.RECOVERY_FAILED, "last recovery failed: recovery broke"),
        (kind.MDEVS_MISSING, "missing from sysfs"),
        (kind.MDEVS_WAITING_FOR_PARENT, "wait for their parent"),
        (kind.CONFIG_RELOAD_REFUSED, "bad value"),
        (kind.PRIVILEGED_HELPER_DOWN, "privileged helper sysfs is restarting"),
        (kind.LEDGER_REPLACED, "inode changed"),
        (kind.LEDGER_WRITE_FAILED, "disk I/O error"),
        (kind.LEDGER_NO_SPACE, "no space left"),
        (kind.UNRECORDED_MDEVS, "u1"),
        (kind.LAYOUT_CONVERGING, "layout converging, 1 draining"),
        (kind.LAYOUT_GPUS_SHORT, "0000:c2:00.0 has 0 of 2 nvidia-1150 (blocked by 1 device(s) "
                                 "of another type: d1)"),
        (kind.LAYOUT_CONVERGE_FAILED, "layout converge failed: GPU 0000:c3:00.0: EIO"),
        (kind.LAYOUT_GPUS_MISSING, "0000:c1:00.0"),
        (kind.LIBVIRT_STALLED, "libvirt at qemu:///system is not answering since"),
    ]
    assert health["problem_kinds"] == [k for k, _ in expected]
    assert len(health["problems"]) == len(expected)
    for message, (_, says) in zip(health["problems"], expected, strict=True):
        assert says in message
    # Every kind is used (but a drain's second, after a day, and the sync's
    # other state, one sync being failing or running past its deadline: the
    # tests below), and the metrics show exactly the reported ones.
    assert set(health["problem_kinds"]) == set(kind.PROBLEM_KINDS) - {
        kind.LAYOUT_DRAINING_LONG, kind.PLACEMENT_SYNC_STUCK}
    assert health["status"] == "degraded"
    assert core.metrics.value("accel_agent_healthy") == 0
    assert {k for k, v in problem_values(core).items() if v == 1} == set(health["problem_kinds"])
    monkeypatch.setattr(libvirt_calls, "status_of", lambda uri: None)

    # One problem left: its kind alone is 1.
    core.reporter.state = "ok"
    core.rescans.view = RescanView()
    core.rescans.recovery = RecoveryView()
    core.reloads.current().result = "applied"
    ledger.identity_problem = lambda: None
    ledger.write_error = None
    monkeypatch.setattr(health_mod, "helper_guards", lambda: [])
    core.rescans.layout = LayoutView()
    health = core.health()
    assert health["problem_kinds"] == [kind.LEDGER_NO_SPACE]
    assert {k for k, v in problem_values(core).items() if v == 1} == {kind.LEDGER_NO_SPACE}
    assert core.metrics.value("accel_agent_healthy") == 0


def test_a_planned_drain_is_converging_for_a_day_then_degraded(core):  # noqa: F811
    """Issue 34: a planned drain (a lowered N, another type) is a state: the
    status ``converging`` with its note (kind layout_converging, the one
    kind of health_kinds.CONVERGING_KINDS), accel_agent_healthy 1 (no
    AccelAgentUnhealthy), until the drain alert's own limit (a day); then
    degraded, another kind."""
    from accel_agent.daemon.rescans import LayoutView

    now = [1_000_000.0]
    core.rescans._clock = lambda: now[0]
    core.rescans._keep_layout(LayoutView(draining=("d1", "d2")))
    health = core.health()
    assert health["status"] == "converging"
    assert health["problem_kinds"] == [kind.LAYOUT_CONVERGING]
    assert health["problems"] == ["layout converging, 2 draining"]
    assert health["layout"]["draining_since"] is not None
    assert core.metrics.value("accel_agent_healthy") == 1
    assert core.metrics.value("accel_agent_layout_draining") == 2
    # The same drain seen again later keeps its start.
    now[0] += health_mod.DRAINING_LIMIT - 1
    core.rescans._keep_layout(LayoutView(draining=("d1",)))
    assert core.health()["status"] == "converging"
    now[0] += 1
    health = core.health()
    assert health["status"] == "degraded"
    assert health["problem_kinds"] == [kind.LAYOUT_DRAINING_LONG]
    assert "more than a day" in health["problems"][0] and "d1" in health["problems"][0]
    assert core.metrics.value("accel_agent_healthy") == 0
    # Any other problem beside a drain is degraded at once.
    core.rescans._keep_layout(LayoutView())
    core.rescans._keep_layout(LayoutView(draining=("d1",), missing_gpus=("0000:c1:00.0",)))
    health = core.health()
    assert health["status"] == "degraded"
    assert health["problem_kinds"] == [kind.LAYOUT_CONVERGING, kind.LAYOUT_GPUS_MISSING]


def test_a_sync_past_its_deadline_is_a_problem(core):  # noqa: F811
    """reporting.state "syncing" (a sync still running past its deadline) is
    degraded, with its own kind."""
    core.reporter.state = "syncing"
    health = core.health()
    assert health["problem_kinds"] == [kind.PLACEMENT_SYNC_STUCK]
    assert "Placement sync running since" in health["problems"][0]
    assert core.metrics.value("accel_agent_health_problem",
                              {"problem": kind.PLACEMENT_SYNC_STUCK}) == 1


def test_a_short_gpu_is_said_under_its_layout_s_kind():
    """A GPU of a mixed-size layout is short of its mixed-size layout (its
    section named), a standing layout's of its standing layout; both at once
    are one problem of one kind, each under its own words."""
    from accel_agent.daemon.rescans import LayoutView
    from accel_agent.devices.layout import BLOCKED, Short

    mixed = ("0000:c1:00.0", Short("gpu_layout_mix", 4, 0, "does not fit: ..."))
    standing = ("0000:c2:00.0", Short("nvidia-1150", 2, 0, BLOCKED, ("d1",)))
    said = health_mod.layout_problems(LayoutView(short=(mixed,)), 0.0)
    assert said == [(kind.LAYOUT_GPUS_SHORT, "GPU(s) short of their mixed-size or MIG layout: "
                     "0000:c1:00.0 has 0 of 4 gpu_layout_mix (does not fit: ...)")]
    said = health_mod.layout_problems(LayoutView(short=(mixed, standing)), 0.0)
    assert said == [(kind.LAYOUT_GPUS_SHORT, "GPU(s) short of their standing layout: "
                     "0000:c2:00.0 has 0 of 2 nvidia-1150 (blocked by 1 device(s) of another "
                     "type: d1); GPU(s) short of their mixed-size or MIG layout: 0000:c1:00.0 "
                     "has 0 of 4 gpu_layout_mix (does not fit: ...)")]
