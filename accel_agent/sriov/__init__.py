"""SR-IOV virtual functions: their network settings (on the PF's netdev, over
rtnetlink) and their PCI hand-over to vfio-pci.

* :mod:`.vfconfig` -- what a VF's settings are, their validation, and the
  apply-with-rollback algorithm over a small link interface (no I/O);
* :mod:`.netlink` -- that interface over pyroute2 (runs in the CAP_NET_ADMIN
  privsep daemon, or in tests against a real netlink socket);
* :mod:`.pcisysfs` -- unprivileged sysfs reads: a PF's netdev, its VFs, a
  VF's driver and IOMMU group.

The privileged entrypoints are :mod:`accel_agent.privileged_net` (netlink,
CAP_NET_ADMIN only) and :mod:`accel_agent.privileged_pci` (sysfs writes, in
the capability-less sysfs writer's context).
"""
