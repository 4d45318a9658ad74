"""The GPU instances of MIG-backed layouts (issue 37, schema 7): each one the
agent made, by GPU and placement, with its profile and the layout that owns
it, so recovery rebuilds the same instances at the same placements after a
reboot, a driver reload, a GPU reset or a VF re-enable (none survives them),
and a converge knows which instances are the layouts' own."""

from __future__ import annotations

from dataclasses import dataclass

from accel_agent import exception
from accel_agent.devices.ledger.connection import LedgerConnection
from accel_agent.sysfs import address

MAX_SLICE = 255
MAX_PROFILE_ID = 255
MAX_OWNER = 64


@dataclass(frozen=True, slots=True)
class GpuInstanceRecord:
    """One GPU instance a layout owns: where it is and of what profile."""

    gpu: str
    start: int
    size: int
    profile_id: int
    owner: str  # the layout's section, gpu_layout_<name>


def _check(record: GpuInstanceRecord) -> None:
    if not address.is_pci_address(record.gpu) or address.parse_pci_address(
            record.gpu) != record.gpu:
        raise exception.LedgerError(reason=f"GPU {record.gpu!r} is not a canonical PCI address")
    for what, value, low, high in (("start", record.start, 0, MAX_SLICE),
                                   ("size", record.size, 1, MAX_SLICE),
                                   ("profile id", record.profile_id, 0, MAX_PROFILE_ID)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise exception.LedgerError(
                reason=f"GPU instance {what} {value!r} must be an integer in {low}..{high}")
    if not isinstance(record.owner, str) or not 1 <= len(record.owner) <= MAX_OWNER:
        raise exception.LedgerError(reason=f"GPU instance owner {record.owner!r} is no layout")


class GpuInstanceStore(LedgerConnection):
    """The ``gpu_instances`` table."""

    def gpu_instances(self, gpu: str | None = None) -> list[GpuInstanceRecord]:
        """The recorded instances (of ``gpu``), by GPU then start."""
        where, params = ("WHERE gpu = ?", (gpu,)) if gpu is not None else ("", ())
        with self._lock:
            rows = self._rows(
                "SELECT gpu, start, size, profile_id, owner FROM gpu_instances "
                f"{where} ORDER BY gpu, start", params)
        return [GpuInstanceRecord(str(g), int(s), int(z), int(p), str(o))
                for g, s, z, p, o in rows]

    def record_gpu_instance(self, record: GpuInstanceRecord) -> None:
        """An instance the agent created and read back (replacing any record
        at its place)."""
        _check(record)
        with self.transaction():
            self._execute(
                "INSERT OR REPLACE INTO gpu_instances (gpu, start, size, profile_id, owner, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (record.gpu, record.start, record.size, record.profile_id, record.owner,
                 self._clock()))

    def forget_gpu_instance(self, gpu: str, start: int) -> None:
        """An instance destroyed (or no longer the layouts'). Idempotent."""
        with self.transaction():
            self._execute("DELETE FROM gpu_instances WHERE gpu = ? AND start = ?", (gpu, start))
