"""The standing layouts' devices in use (issue 23): counted at each converge
from what processes hold in /proc, one walk whatever the number of devices,
and shown in health and ``accel_agent_layout_in_use``.

The "held" side comes from a /proc tree built here (a process's fd links to
a group node), not from anything the agent decides: what is counted can only
match what a process holds."""

from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType, SimpleNamespace

import pytest

from accel_agent.daemon import health as health_mod
from accel_agent.daemon import layout_in_use
from accel_agent.daemon.rescans import Rescans
from accel_agent.devices.layout import LAYOUT_OWNER, LayoutReport
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.reporting.metrics import AgentMetrics
from accel_agent.sysfs import vfio_holders
from accel_agent.sysfs.model import HostSnapshot, Mdev, Parent

GPU1, GPU2 = "0000:c1:00.0", "0000:c2:00.0"
TYPE, OTHER = "nvidia-1150", "nvidia-1155"


def uid(n: int) -> str:
    return f"{n:08d}-0000-4000-8000-000000000000"


def rec(n: int, parent: str, *, owner: str | None = LAYOUT_OWNER, layout: bool = False,
        mdev_type: str = TYPE) -> DeviceRecord:
    return DeviceRecord(
        uuid=uid(n), parent=parent, device_type=mdev_type, state=DeviceState.PRESENT,
        owner=owner,
        owner_kind=None if owner is None else (
            OwnerKind.STANDING if owner == LAYOUT_OWNER else OwnerKind.INSTANCE),
        claim_expires_at=None, intent_id=None, adopted=False, created_at=0.0,
        updated_at=0.0, layout=layout,
    )


def vf(gpu: str, fn: int) -> Parent:
    name = gpu[:-1] + str(fn)
    return Parent(name, f"devices/{name}", name, gpu, gpu, None, "nvidia", None, None,
                  MappingProxyType({}), backend="nvidia-vfio")


# Four VFs per GPU; VF n's IOMMU group is 10 + n (n: the record number).
PARENTS = {p.name: p for gpu in (GPU1, GPU2) for p in (vf(gpu, 4), vf(gpu, 5), vf(gpu, 6))}
RECORDS = [
    rec(1, "0000:c1:00.4"),                             # the layout's, free
    rec(2, "0000:c1:00.5", owner="vm-a", layout=True),  # the layout's, an instance has it
    rec(3, "0000:c2:00.4"),                             # the layout's, free
    rec(4, "0000:c2:00.5", owner=None),                 # free, no layout's
    rec(5, "0000:c2:00.6", owner="vm-b"),               # an instance's, no layout's
    rec(6, "0000:c1:00.6", mdev_type=OTHER),            # a layout's of another type
]


def snapshot(records=RECORDS) -> HostSnapshot:
    mdevs = {
        r.uuid: Mdev(r.uuid, r.parent, r.device_type, 10 + int(r.uuid[:8]), backend="nvidia-vfio")
        for r in records
    }
    return HostSnapshot.build("/sim", PARENTS, mdevs)


def test_count_is_per_type_and_gpu_of_the_layout_devices_held_only():
    members = [r for r in RECORDS if r.in_layout]
    assert {r.uuid for r in members} == {uid(1), uid(2), uid(3), uid(6)}
    # Groups 12 (an instance's layout device), 14 and 15 (no layout's) held.
    rows = layout_in_use.count(members, snapshot(), frozenset({"12", "14", "15"}))
    assert rows == ((TYPE, GPU1, 1), (TYPE, GPU2, 0), (OTHER, GPU1, 0))
    assert layout_in_use.by_type(rows) == {TYPE: 1, OTHER: 0}
    assert layout_in_use.by_gpu(rows) == {GPU1: 1, GPU2: 0}
    everything = layout_in_use.count(members, snapshot(), frozenset({"11", "12", "13", "16"}))
    assert layout_in_use.by_type(everything) == {TYPE: 3, OTHER: 1}
    nothing = layout_in_use.count(members, snapshot(), frozenset())
    assert layout_in_use.by_type(nothing) == {TYPE: 0, OTHER: 0}
    # A recorded device not on the host is nobody's to hold.
    gone = layout_in_use.count(members, snapshot(RECORDS[1:]), frozenset({"12"}))
    assert gone == ((TYPE, GPU1, 1), (TYPE, GPU2, 0), (OTHER, GPU1, 0))


class FakeProc:
    """A /proc with one process holding the group nodes it is given."""

    def __init__(self, root, groups_dir) -> None:
        self.root = root / "proc"
        self.groups = os.path.realpath(groups_dir)
        (self.root / "4242" / "fd").mkdir(parents=True)
        (self.root / "4243" / "fd").mkdir(parents=True)
        os.symlink("/dev/null", self.root / "4243" / "fd" / "0")
        self.walks = 0

    def hold(self, *groups: int) -> None:
        fds = self.root / "4242" / "fd"
        for link in fds.iterdir():
            link.unlink()
        for fd, group in enumerate(groups, start=3):
            os.symlink(os.path.join(self.groups, str(group)), fds / str(fd))

    def held_groups(self, directory: str, proc: str = "/proc"):
        assert os.path.realpath(directory) == self.groups, directory
        self.walks += 1
        return HELD_GROUPS(directory, str(self.root))


HELD_GROUPS = vfio_holders.held_groups


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """Rescans over a manager whose ledger and converge are fixed here, /proc
    the FakeProc's."""
    groups = tmp_path / "sim" / "vfio"
    groups.mkdir(parents=True)
    proc = FakeProc(tmp_path, groups)
    monkeypatch.setattr(vfio_holders, "held_groups", proc.held_groups)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the fake /proc is readable
    records = list(RECORDS)
    ledger = SimpleNamespace(
        all=lambda: list(records),
        by_owner=lambda owner, kind=None: [r for r in records if r.owner == owner],
    )
    devices = SimpleNamespace(
        ledger=ledger,
        policy=SimpleNamespace(types=(SimpleNamespace(mdev_type=TYPE, standing=2),)),
        sysfs_root=str(tmp_path / "sim"),
        writer=SimpleNamespace(vfio_dev_dir=""),
        converge_layout=LayoutReport,
    )
    rescans = Rescans(devices, AgentMetrics())  # type: ignore[arg-type]
    return SimpleNamespace(rescans=rescans, proc=proc, records=records)


def converge(agent):
    """What a rescan does: converge, read the ledger, scan, count."""
    agent.rescans.run_layout()
    agent.rescans.count_in_use(list(agent.records), snapshot(agent.records))
    return agent.rescans.layout


def gauge(rescans: Rescans, mdev_type: str) -> float | None:
    return rescans.metrics.value("accel_agent_layout_in_use", {"mdev_type": mdev_type})


def test_a_converge_counts_what_processes_hold_in_one_walk(agent):
    agent.proc.hold(11, 12, 14)  # two layout devices of GPU1 and a free non-layout one
    view = converge(agent)
    assert agent.proc.walks == 1  # one walk for all four layout devices
    assert view.in_use == ((TYPE, GPU1, 2), (TYPE, GPU2, 0), (OTHER, GPU1, 0))
    section = health_mod.in_use_section(agent.rescans.layout.in_use)
    assert section == {"in_use": 2, "in_use_by_type": {TYPE: 2, OTHER: 0},
                       "in_use_by_gpu": {GPU1: 2, GPU2: 0}}
    assert gauge(agent.rescans, TYPE) == 2 and gauge(agent.rescans, OTHER) == 0
    # A converge alone (start-up's, before its rescan) keeps the last count.
    assert agent.rescans.run_layout().in_use == view.in_use
    # Let go of one: the next converge says so, again in one walk.
    agent.proc.hold(12)
    converge(agent)
    assert agent.proc.walks == 2
    assert health_mod.in_use_section(agent.rescans.layout.in_use)["in_use"] == 1
    assert gauge(agent.rescans, TYPE) == 1


def test_no_layout_device_no_walk_and_a_type_gone_loses_its_series(agent):
    agent.proc.hold(16)
    converge(agent)
    assert gauge(agent.rescans, OTHER) == 1
    # The other type's device left: its series goes with it.
    agent.records[:] = [r for r in agent.records if r.device_type != OTHER]
    converge(agent)
    assert gauge(agent.rescans, OTHER) is None and gauge(agent.rescans, TYPE) == 0
    walks = agent.proc.walks
    # No layout device in the ledger: nothing to walk /proc for.
    agent.records[:] = [dataclasses.replace(r, layout=False, owner=None, owner_kind=None)
                        for r in agent.records]
    view = converge(agent)
    assert agent.proc.walks == walks
    assert view.in_use == () and health_mod.in_use_section(view.in_use)["in_use"] == 0
    assert gauge(agent.rescans, TYPE) is None


def test_not_knowing_is_null_and_no_sample_not_zero(agent, monkeypatch):
    agent.proc.hold(11)
    converge(agent)
    assert gauge(agent.rescans, TYPE) == 1
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # others' descriptors unreadable
    view = converge(agent)
    assert view.in_use is None
    assert health_mod.in_use_section(view.in_use) == {
        "in_use": None, "in_use_by_type": None, "in_use_by_gpu": None}
    assert gauge(agent.rescans, TYPE) is None
