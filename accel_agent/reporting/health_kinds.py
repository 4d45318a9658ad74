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
# Standing layouts ([mdev_<type>] standing): devices draining, or a GPU short
# of its layout; a configured GPU whose VFs never appeared.
LAYOUT_CONVERGING = "layout_converging"
LAYOUT_GPUS_MISSING = "layout_gpus_missing"
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
    LIBVIRT_STALLED,
    PLACEMENT_SYNC_STUCK,
)
LEDGER_UNWRITABLE = (LEDGER_REPLACED, LEDGER_WRITE_FAILED, LEDGER_NO_SPACE)
