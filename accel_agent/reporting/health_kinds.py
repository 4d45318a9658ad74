"""The kinds of problem ``GET /v1/health`` reports: a fixed set of words.

Each message of the health document's ``problems`` has one of these kinds
(``problem_kinds``, in the same order), and the metrics export one
``accel_agent_health_problem{problem=<kind>}`` series per kind (1 while a
problem of that kind is reported, else 0).  The messages are free text
(paths, errors, counts); the kinds are what a label may carry and an alert
may match: adding one is a contract addition, renaming one is not allowed.

A leaf module (no imports) so that the metrics and the daemon's health can
both use it without importing each other.
"""

from __future__ import annotations

PLACEMENT_SYNC_FAILING = "placement_sync_failing"
RESCAN_FAILED = "rescan_failed"
RECOVERY_FAILED = "recovery_failed"
MDEVS_MISSING = "mdevs_missing"
MDEVS_WAITING_FOR_PARENT = "mdevs_waiting_for_parent"
CONFIG_RELOAD_REFUSED = "config_reload_refused"
PRIVILEGED_HELPER_DOWN = "privileged_helper_down"
# The three that keep the ledger from recording new work ("ledger not writable").
LEDGER_REPLACED = "ledger_replaced"
LEDGER_WRITE_FAILED = "ledger_write_failed"
LEDGER_NO_SPACE = "ledger_no_space"
UNRECORDED_MDEVS = "unrecorded_mdevs"
# Standing layouts ([mdev_<type>] standing): devices draining after a planned
# change (a state, not a failure: see CONVERGING_KINDS); a configured GPU
# that is not on the host (its VFs not enabled).
LAYOUT_CONVERGING = "layout_converging"
LAYOUT_GPUS_MISSING = "layout_gpus_missing"
# A GPU on the host short of its layout: no room, or blocked by devices of
# another type; a converge that failed; devices draining for longer than
# the drain alert's limit (AccelAgentLayoutDrainingLong, a day).
LAYOUT_GPUS_SHORT = "layout_gpus_short"
LAYOUT_CONVERGE_FAILED = "layout_converge_failed"
LAYOUT_DRAINING_LONG = "layout_draining_long"
# libvirt accepted a call and did not answer it within [libvirt] call_timeout.
LIBVIRT_STALLED = "libvirt_stalled"
# A Placement sync still running past its deadline (reporting.state "syncing").
PLACEMENT_SYNC_STUCK = "placement_sync_stuck"

PROBLEM_KINDS = (
    PLACEMENT_SYNC_FAILING,
    RESCAN_FAILED,
    RECOVERY_FAILED,
    MDEVS_MISSING,
    MDEVS_WAITING_FOR_PARENT,
    CONFIG_RELOAD_REFUSED,
    PRIVILEGED_HELPER_DOWN,
    LEDGER_REPLACED,
    LEDGER_WRITE_FAILED,
    LEDGER_NO_SPACE,
    UNRECORDED_MDEVS,
    LAYOUT_CONVERGING,
    LAYOUT_GPUS_MISSING,
    LAYOUT_GPUS_SHORT,
    LAYOUT_CONVERGE_FAILED,
    LAYOUT_DRAINING_LONG,
    LIBVIRT_STALLED,
    PLACEMENT_SYNC_STUCK,
)
LEDGER_UNWRITABLE = (LEDGER_REPLACED, LEDGER_WRITE_FAILED, LEDGER_NO_SPACE)
# The kinds that are a state the agent is working through, not a failure:
# alone, they make the status "converging" (accel_agent_healthy 1) instead of
# "degraded".  Every other kind is a problem an operator must act on.
CONVERGING_KINDS = (LAYOUT_CONVERGING,)
