"""SR-IOV virtual functions: their network settings, set on the PF's netdev
over rtnetlink.

* :mod:`.vfconfig` -- what a VF's settings are, their validation, and the
  apply/reset-with-rollback algorithm over a small link interface (no I/O);
* :mod:`.netlink` -- that interface over pyroute2 (runs in the CAP_NET_ADMIN
  privsep daemon, or in tests against a real netlink socket).

The privileged entrypoints are in :mod:`accel_agent.privileged_net` (its own
privsep context, CAP_NET_ADMIN only).
"""
