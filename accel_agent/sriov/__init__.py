"""SR-IOV virtual functions of configured pools (backend ``sriov_vf``).

* :mod:`.vfconfig` -- what a VF's network settings are, their validation,
  and the apply/reset-with-rollback algorithm over a small link interface
  (no I/O);
* :mod:`.netlink` -- that interface over pyroute2 (runs in the CAP_NET_ADMIN
  privsep daemon, or in tests against a real netlink socket);
* :mod:`.pools` -- ``[devices] enabled_vf_pools`` and ``[vf_pool_<name>]``;
* :mod:`.vfpool` -- inventory, ``sriov_numvfs``, and prepare/unprepare of one
  VF for an instance (settings + hand-over to vfio-pci, and back).

The privileged entrypoints are in :mod:`accel_agent.privileged` (its
``net`` module: a privsep context of its own, CAP_NET_ADMIN only; its
``pci`` module: the sysfs writer's context, no capability); the read side
of sysfs is :mod:`accel_agent.sysfs.sriov`.
"""
