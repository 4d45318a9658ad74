"""The shipped unit (systemd/accel-agent.service) grants what the agent's code asks for.

Two things the sandbox must let through, both derived here from the code rather than
listed by hand:

* every capability of every oslo.privsep context of the agent (the contexts in
  ``accel_agent.privileged``, their ``capabilities``) must be in
  ``CapabilityBoundingSet=``: a helper exec'd as uid 0 gets the bounding set and drops
  to its context's, so a capability missing there is one the helper can never get (the
  CAP_NET_ADMIN VF network helper could not start under a unit with ``CAP_CHOWN`` only);
* every sysfs file the privileged writers write must lie under a ``ReadWritePaths=``
  entry: ``ProtectKernelTunables=`` makes /sys read-only.  Each public ``write_*``
  function of the facade is driven against a simulated sysfs tree laid out as the
  kernel's (accel_agent.simulator's static materialiser), with ``write_once`` (the one
  write(2) of the sysfs context, writes.py) recording the resolved path and doing what
  the kernel would; the recorded paths, taken relative to the tree, are the /sys paths.

The lab ``systemd`` (tests/realkernel/systemd/) proves the same on a real kernel under a
real systemd; this test says which line is wrong in a second.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from oslo_config import cfg
from oslo_privsep import capabilities as caps
from oslo_privsep import priv_context

from accel_agent import privileged
from accel_agent.privileged import mdev as mdev_writer
from accel_agent.privileged import pci as pci_writer
from accel_agent.privileged import vgpu as vgpu_writer
from accel_agent.privileged import writes
from accel_agent.simulator import profiles
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.static import materialise

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "accel-agent.service"
DROPINS = REPO / "systemd" / "dropins"
PRIVILEGED = REPO / "accel_agent" / "privileged"
# What the agent's main process itself needs (not a privsep context): giving the API
# socket to [api] socket_group (accel_agent/api/server.py, os.chown).
MAIN_PROCESS_CAPS = {"CAP_CHOWN"}
U_NEW = "83b8f4f2-509f-382f-3c1e-e6bfe0fa2001"
U_OLD = "83b8f4f2-509f-382f-3c1e-e6bfe0fa2002"


def service_settings(text: str) -> dict[str, list[str]]:
    """The [Service] section's assignments, every occurrence of a key kept (systemd
    appends list settings such as ReadWritePaths= given twice)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]":
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def bounding_set(text: str) -> set[str]:
    values = service_settings(text).get("CapabilityBoundingSet", [])
    assert values and not any(v.startswith("~") for v in values), values
    return {name for value in values for name in value.split()}


def read_write_paths(text: str) -> list[str]:
    values = service_settings(text).get("ReadWritePaths", [])
    return [entry.lstrip("-+") for value in values for entry in value.split()]


# --- capabilities ------------------------------------------------------------------------


def context_capabilities() -> dict[str, set[str]]:
    """Each privsep context of the agent and the capabilities it asks for (the default
    it registered for ``[<section>] capabilities``: PrivContext keeps it nowhere else)."""
    contexts = {
        v.cfg_section: v
        for v in vars(privileged).values()
        if isinstance(v, priv_context.PrivContext)
    }
    assert len(contexts) >= 3, contexts  # the sysfs, the VF network and the NVML writers
    found = {}
    for section in contexts:
        numbers = cfg.CONF._get_opt_info("capabilities", section)["default"]
        found[section] = {caps.CAPS_BYVALUE[n].upper() for n in numbers}
    return found


def test_the_contexts_are_the_ones_the_code_has():
    """The premise: every context is found, with what the code says it keeps."""
    assert context_capabilities() == {
        privileged.CFG_SECTION: set(),
        privileged.NET_CFG_SECTION: {"CAP_NET_ADMIN"},
        privileged.NVML_CFG_SECTION: {"CAP_SYS_ADMIN"},
    }


def test_the_main_process_needs_cap_chown_for_the_socket():
    """MAIN_PROCESS_CAPS is not a free pass: the agent does call chown."""
    calls = [
        node
        for path in (REPO / "accel_agent").rglob("*.py")
        if "simulator" not in path.parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("chown", "fchown", "lchown")
    ]
    assert calls


def test_the_bounding_set_is_exactly_what_the_agent_and_its_contexts_need():
    """Every context's capability, and nothing more (a capability here that nothing
    needs is one more a compromised agent would hold)."""
    needed = set(MAIN_PROCESS_CAPS)
    for wanted in context_capabilities().values():
        needed |= wanted
    assert bounding_set(UNIT.read_text()) == needed


def device_allow(text: str) -> dict[str, str]:
    """``DeviceAllow=`` of the unit: specifier -> access (``r``, ``rw``, ...)."""
    found = {}
    for value in service_settings(text).get("DeviceAllow", []):
        spec, _, access = value.partition(" ")
        found[spec] = access.strip()
    return found


def test_device_allow_lets_nvml_open_the_devices_it_needs():
    """NVML (the agent's reads, the NVML writer's writes) opens NVIDIA's
    device groups as accel_agent.nvml.DEVICE_GROUPS says; DevicePolicy=closed
    refuses anything DeviceAllow= does not name, and nothing more is given."""
    from accel_agent import nvml

    text = UNIT.read_text()
    assert service_settings(text)["DevicePolicy"] == ["closed"]
    allowed = device_allow(text)
    nvidia = {spec.removeprefix("char-"): access for spec, access in allowed.items()
              if spec.startswith("char-nvidia")}
    assert nvidia == nvml.DEVICE_GROUPS
    assert allowed["char-vfio"] == "rw"  # the in-use probe's, unchanged


def test_the_former_unit_would_not_let_nvml_in():
    """Not vacuous: the unit before the NVML writer named no NVIDIA device and
    no CAP_SYS_ADMIN; both checks above would name what it lacked."""
    former = ("[Service]\nCapabilityBoundingSet=CAP_CHOWN CAP_NET_ADMIN\n"
              "DevicePolicy=closed\nDeviceAllow=char-vfio rw\n")
    assert "CAP_SYS_ADMIN" not in bounding_set(former)
    assert not any(spec.startswith("char-nvidia") for spec in device_allow(former))


# --- sysfs write paths --------------------------------------------------------------------


def _fake_kernel_write(root: str, written: list[str], path: str, data: bytes) -> None:
    """What ``write_once`` does, recorded; the kernel's answer to a driver's bind and
    unbind imitated on the static tree (its ``driver`` link), any other attribute keeps
    the bytes (so that a read-back sees them)."""
    assert os.path.commonpath([root, path]) == root, path
    written.append(path)
    name = os.path.basename(path)
    if name in ("bind", "unbind"):
        device = os.path.realpath(os.path.join(root, "bus", "pci", "devices", data.decode()))
        link = os.path.join(device, "driver")
        if os.path.lexists(link):
            os.unlink(link)
        if name == "bind":
            os.symlink(os.path.dirname(path), link)
        return
    if name == "drivers_probe":
        return
    with open(path, "wb") as handle:
        handle.write(data)


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[str]]]:
    """A tree with an mdev parent (mtty), a vendor-VFIO GPU (nvidia) and an SR-IOV NIC
    (igb, two VFs enabled), every privileged write recorded, the in-use probes
    passed (they open /dev/vfio, which is DeviceAllow='s business, not a write)."""
    mtty, vfio, igb = (
        profiles.mtty(),
        profiles.nvidia_vfio(gpus=1, vfs=2),
        profiles.igb_sriov(nics=1),
    )
    nic = dataclasses.replace(igb.sriov_pfs[0], num_vfs=2)
    spec = dataclasses.replace(
        mtty,
        sriov_pfs=[*vfio.sriov_pfs, nic],
        profiles=(*mtty.profiles, *vfio.profiles, *igb.profiles),
    )
    host = SimulatedHost(spec)
    host.create_mdev("mtty", "mtty-2", U_OLD)
    root = materialise(host, tmp_path / "sys")
    written: list[str] = []
    for module in (writes, mdev_writer, vgpu_writer, pci_writer):
        monkeypatch.setattr(
            module, "write_once", lambda p, d: _fake_kernel_write(root, written, p, d)
        )
    monkeypatch.setattr(mdev_writer, "probe_group", lambda *a, **k: None)
    monkeypatch.setattr(vgpu_writer, "probe_vf_group", lambda *a, **k: None)
    monkeypatch.setattr(pci_writer, "probe_vf_group", lambda *a, **k: None)
    yield root, written


def _virtfn(root: str, pf: str, index: int) -> str:
    return os.path.basename(os.readlink(os.path.join(root, "bus", "pci", "devices", pf,
                                                     f"virtfn{index}")))


def _pf_of(root: str, driver: str) -> str:
    directory = os.path.join(root, "bus", "pci", "drivers", driver)
    pfs = [
        n for n in sorted(os.listdir(directory))
        if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f:.]+", n)
        and os.path.exists(os.path.join(directory, n, "sriov_numvfs"))
    ]
    assert pfs, directory
    return pfs[0]


# Every public write_* function of the facade, driven once.  A new writer makes
# test_every_writer_is_driven fail until it is added here.
def _drive_every_writer(root: str) -> set[str]:
    driven = set()
    privileged.write_create(root, "mtty", "mtty-2", U_NEW)
    driven.add("write_create")
    privileged.write_remove(root, U_OLD, 5.0)
    driven.add("write_remove")

    gpu_vf = _virtfn(root, _pf_of(root, "nvidia"), 0)
    type_id = profiles.L40S_VGPU_TYPES[0].type_id
    privileged.write_vgpu_type(root, gpu_vf, type_id)
    driven.add("write_vgpu_type")
    placement = os.path.join(root, "bus", "pci", "devices", gpu_vf, "nvidia", "placement_id")
    with open(placement, "w") as handle:
        handle.write("0\n")  # what the driver shows once the line below is taken
    privileged.write_vgpu_placement(root, gpu_vf, 0)
    driven.add("write_vgpu_placement")
    privileged.write_vgpu_clear(root, gpu_vf, 5.0)
    driven.add("write_vgpu_clear")

    nic = _pf_of(root, "igb")
    privileged.write_num_vfs(root, nic, 1)  # 2 -> 0 -> 1: both writes
    driven.add("write_num_vfs")
    nic_vf = _virtfn(root, nic, 0)
    privileged.write_bind_vfio(root, nic_vf)
    driven.add("write_bind_vfio")
    privileged.write_unbind_vfio(root, nic_vf)
    driven.add("write_unbind_vfio")
    return driven


def test_every_writer_is_driven(sysfs):
    root, _ = sysfs
    public = {name for name in privileged.__all__ if name.startswith("write_")}
    assert _drive_every_writer(root) == public


def test_write_once_is_the_only_write_of_the_privileged_code():
    """The recorder sees every write only if no other code path writes: no os.write
    and no open() for writing outside writes.py."""
    offenders = []
    for path in sorted(PRIVILEGED.glob("*.py")):
        if path.name == "writes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("write", "O_WRONLY", "O_RDWR"):
                offenders.append(f"{path.name}:{node.lineno}: {node.attr}")
    assert offenders == []


def sysfs_writes(root: str, written: list[str]) -> dict[str, str]:
    """The /sys path of every recorded write, by what it is (``create``, ``bind``, ...)."""
    return {"/sys/" + os.path.relpath(path, root): os.path.basename(path) for path in written}


def test_every_sysfs_write_is_under_a_read_write_path(sysfs):
    root, written = sysfs
    _drive_every_writer(root)
    paths = sysfs_writes(root, written)
    # Each kind of write the code has was exercised (nothing passes by being skipped).
    assert set(paths.values()) == {
        "create", "remove", "current_vgpu_type", "vgpu_params", "sriov_numvfs",
        "driver_override", "unbind", "bind", "drivers_probe",
    }
    allowed = read_write_paths(UNIT.read_text())
    outside = [
        path
        for path in paths
        if not any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in allowed)
    ]
    assert outside == [], f"outside ReadWritePaths={' '.join(allowed)}"


def test_the_former_unit_would_fail_both_checks(sysfs):
    """The unit as it was before VF pools were run under it (CAP_CHOWN only, no
    /sys/bus/pci): both checks above name what it lacks."""
    root, written = sysfs
    former = (
        "[Service]\nCapabilityBoundingSet=CAP_CHOWN\n"
        "ReadWritePaths=/sys/devices -/sys/class/mdev_bus -/sys/bus/mdev\n"
    )
    assert "CAP_NET_ADMIN" not in bounding_set(former)
    _drive_every_writer(root)
    allowed = read_write_paths(former)
    outside = {
        kind
        for path, kind in sysfs_writes(root, written).items()
        if not any(path.startswith(entry + "/") for entry in allowed)
    }
    assert outside == {"bind", "unbind", "drivers_probe"}


# --- systemd-analyze verify ------------------------------------------------------------------


def test_the_drop_ins_order_nova_compute_and_libvirt_guests_after_the_agent():
    """After= only: they start after the agent's READY=1 and stop before it; no Wants= or
    Requires=, so starting them never starts an agent the operator did not enable."""
    found = sorted(p.relative_to(DROPINS).as_posix() for p in DROPINS.rglob("*.conf"))
    assert found == [
        "libvirt-guests.service.d/accel-agent.conf",
        "nova-compute.service.d/accel-agent.conf",
    ]
    for name in found:
        keys = {}
        for line in (DROPINS / name).read_text().splitlines():
            if line and not line.startswith(("#", "[")):
                key, _, value = line.partition("=")
                keys[key] = value
        assert keys == {"After": "accel-agent.service"}, (name, keys)


def test_the_drop_ins_are_shipped_in_the_package():
    install = (REPO / "packaging" / "debian" / "accel-agent.install").read_text()
    manifest = (REPO / "MANIFEST.in").read_text()
    for name in ("nova-compute", "libvirt-guests"):
        source = f"systemd/dropins/{name}.service.d/accel-agent.conf"
        assert f"{source} lib/systemd/system/{name}.service.d/" in install.splitlines()
    assert "recursive-include systemd/dropins *.conf" in manifest.splitlines()


def test_systemd_analyze_verifies_the_drop_ins(tmp_path):
    """Each drop-in on a stand-in of its unit, beside the agent's unit: systemd-analyze
    loads them and finds nothing to complain about (an unknown key, a typo)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    true = shutil.which("true") or "/bin/true"
    (tmp_path / "accel-agent.service").write_text(
        f"[Unit]\nDescription=stand-in\n[Service]\nExecStart={true}\n"
    )
    units = []
    for directory in sorted(DROPINS.iterdir()):
        unit = directory.name.removesuffix(".d")
        (tmp_path / unit).write_text(f"[Unit]\nDescription=stand-in\n[Service]\nExecStart={true}\n")
        shutil.copytree(directory, tmp_path / directory.name)
        units.append(str(tmp_path / unit))
    proc = subprocess.run(
        [analyze, "verify", *units], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:"),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for complaint in ("Unknown key", "Unknown section", "ignoring", "Failed"):
        assert complaint not in output, output



def test_the_agent_starts_after_nvidias_vf_enabling_unit_without_needing_it():
    """After a reboot NVIDIA's nvidia-sriov.service enables the vGPU 17+ VFs
    (issue 23): ordered after it, the agent's standing layouts are placed on
    them before READY.  After= only: a host without NVIDIA's package starts
    the agent all the same (a Wants= or Requires= would pull in or fail on it)."""
    unit = [line for line in UNIT.read_text().splitlines() if not line.startswith("#")]
    after = " ".join(line.split("=", 1)[1] for line in unit if line.startswith("After="))
    assert "nvidia-sriov.service" in after.split()
    pulled = " ".join(line for line in unit if line.startswith(("Wants=", "Requires=",
                                                                 "BindsTo=", "Requisite=")))
    assert "nvidia-sriov" not in pulled
