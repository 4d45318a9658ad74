"""The kernel's mdev ABI, read side: scan a sysfs root into an immutable snapshot."""

from accel_agent.sysfs.model import HostSnapshot, Mdev, MdevType, Parent
from accel_agent.sysfs.scanner import scan

__all__ = ["HostSnapshot", "Mdev", "MdevType", "Parent", "scan"]
