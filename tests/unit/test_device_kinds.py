"""The core names each device as what it is (issue 35, item 5): an mdev, a
vGPU VF, a pool VF, each backend saying what its devices are called
(``DeviceBackend.kind``), and each failure is raised with the class that
means it: a held VF is a VfInUse (not an MdevInUse), devices of several
kinds a DeviceInUse (the base every caller and the API's table handle), a
device whose backend is not installed a BackendNotInstalled and a VF's
device under a UUID the VF does not fix a VfUuidMismatch (neither a
LedgerError any more)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from accel_agent import exception
from accel_agent.api import errors
from accel_agent.backends.base import DeviceBackend
from accel_agent.backends.mdev import MdevBackend
from accel_agent.backends.nvidia_vfio import NvidiaVfioBackend
from accel_agent.backends.sriov_vf import SriovVfBackend
from accel_agent.backends.sriov_vf import device_uuid as pool_vf_uuid
from accel_agent.devices.allocations import kept_in_use
from accel_agent.devices.ledger import DeviceRecord, DeviceState, OwnerKind
from accel_agent.devices.manager import DeviceManager
from accel_agent.devices.protocol import remove as remove_mod
from accel_agent.sysfs import nvidia_vfio

MDEV = "0b1b2b3b-4b5b-4b6b-8b7b-9b0b1b2b3b4b"
VGPU_VF = "0000:c1:00.4"
POOL_VF = "0000:10:10.0"


def backends() -> dict[str, DeviceBackend]:
    return {b.name: b for b in (MdevBackend(), NvidiaVfioBackend(), SriovVfBackend())}


class Manager(SimpleNamespace):
    """What the use cases ask of the manager here: its backends, and what
    their devices are called (the manager's own methods)."""

    backend = DeviceManager.backend
    device_kind = DeviceManager.device_kind
    device_kinds = DeviceManager.device_kinds


def manager(**more) -> Manager:
    return Manager(backends=backends(), **more)


def record(uuid: str, parent: str, backend: str, device_type: str) -> DeviceRecord:
    return DeviceRecord(
        uuid=uuid, parent=parent, device_type=device_type, state=DeviceState.PRESENT,
        owner="vm-1", owner_kind=OwnerKind.INSTANCE, claim_expires_at=None, intent_id=None,
        adopted=False, created_at=0.0, updated_at=0.0, backend=backend,
    )


MDEV_RECORD = record(MDEV, "0000:84:00.0", "mdev", "nvidia-35")
VGPU_RECORD = record(nvidia_vfio.device_uuid(VGPU_VF), VGPU_VF, "nvidia_vfio", "nvidia-1150")
POOL_RECORD = record(pool_vf_uuid(POOL_VF), POOL_VF, "sriov_vf", "nic")


def test_each_backend_says_what_its_devices_are() -> None:
    m = manager()
    assert {name: m.device_kind(name) for name in m.backends} == {
        "mdev": "mdev", "nvidia_vfio": "vGPU VF", "sriov_vf": "pool VF"
    }
    assert DeviceBackend.kind == "device"  # an out-of-tree backend that says nothing
    assert m.device_kind("toy_vf") == "device"  # not installed
    assert m.device_kinds(["mdev", "mdev"]) == "mdev(s)"
    assert m.device_kinds(["sriov_vf"]) == "pool VF(s)"
    assert m.device_kinds(["mdev", "nvidia_vfio"]) == "device(s)"


@pytest.mark.parametrize(
    ("held", "cls", "said"),
    [
        ([MDEV_RECORD], exception.MdevInUse, f"mediated device {MDEV} is in use: released"),
        ([VGPU_RECORD], exception.VfInUse, f"vGPU VF {VGPU_VF} is in use: released"),
        ([POOL_RECORD], exception.VfInUse, f"pool VF {POOL_VF} is in use: released"),
        ([MDEV_RECORD, POOL_RECORD], exception.DeviceInUse,
         f"device {MDEV}, {POOL_RECORD.uuid} is in use: released"),
    ],
    ids=["mdev", "vgpu-vf", "pool-vf", "both"],
)
def test_a_release_that_keeps_a_held_device_says_its_kind(held, cls, said) -> None:
    error = kept_in_use(manager(), held)
    assert type(error) is cls
    assert error.message.startswith(said)
    assert all(r.uuid in error.message for r in held)
    # Every kind is an in-use error the callers and the API's table handle alike.
    assert isinstance(error, exception.DeviceInUse)
    assert (errors.status_for(error), errors.code_for(error)) == (409, cls.__name__)
    assert not isinstance(error, exception.MdevInUse) or cls is exception.MdevInUse


def test_the_privileged_writers_vf_in_use_says_vf() -> None:
    """The privileged writers act on a PCI function whatever it carries."""
    error = exception.VfInUse(vf=POOL_VF, reason="its VFIO group is open")
    assert error.message == f"VF {POOL_VF} is in use: its VFIO group is open"


def test_a_device_of_a_backend_not_installed_is_no_ledger_error() -> None:
    with pytest.raises(exception.BackendNotInstalled) as refused:
        manager().backend("toy_vf")
    assert not isinstance(refused.value, exception.LedgerError)
    assert refused.value.message == (
        "device backend toy_vf is not installed (the accel_agent.backends entry points "
        "name mdev, nvidia_vfio, sriov_vf); install the package that provides it"
    )


@pytest.mark.parametrize(
    ("backend", "vf", "kind"),
    [(NvidiaVfioBackend(), VGPU_VF, "vGPU VF"), (SriovVfBackend(), POOL_VF, "pool VF")],
    ids=["vgpu-vf", "pool-vf"],
)
def test_a_vf_device_under_another_uuid_is_refused_before_any_write(backend, vf, kind) -> None:
    writes: list[tuple] = []
    writer = SimpleNamespace(
        set_vgpu_type=lambda *a: writes.append(a), bind_vfio=lambda *a: writes.append(a)
    )
    with pytest.raises(exception.VfUuidMismatch) as refused:
        backend.create(writer, vf, "nvidia-1150", MDEV)
    assert not isinstance(refused.value, exception.LedgerError)
    assert f"device {MDEV} is not the device of {kind} {vf}" in refused.value.message
    assert writes == []


def test_a_device_kept_in_use_is_logged_as_its_kind(caplog) -> None:
    said: list[str] = []
    m = manager(
        ledger=SimpleNamespace(get=lambda uuid: POOL_RECORD),
        refused_removes={},
        on_kept_in_use=said.append,
    )
    held = exception.VfInUse(kind="pool VF", vf=POOL_VF, reason="its VFIO group is open")
    with caplog.at_level(logging.DEBUG, logger="accel_agent.devices.protocol"):
        remove_mod.kept_in_use(m, POOL_RECORD.uuid, held)
        remove_mod.kept_in_use(m, POOL_RECORD.uuid, held)  # said once, then at DEBUG
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.WARNING, f"pool VF {POOL_RECORD.uuid} kept as a free pool VF instead of "
                          f"removed: {held.message}"),
        (logging.DEBUG, f"pool VF {POOL_RECORD.uuid} still kept instead of removed: "
                        f"{held.message}"),
    ]
    assert said == [POOL_RECORD.uuid]
