"""How the device backends are found, built and given their options and
writes (accel_agent/backends/__init__.py, base.py; config/registry.py's
hook; wiring.build_backends).

A backend from another distribution is the toy_vf backend of
tests/toy_backend.py, installed into a temporary directory put on the path
of a child process (the daemon's own use of it: tests/functional/
test_daemon_lifecycle.py)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_agent import backends, exception, wiring
from accel_agent.backends.base import NAMESPACE
from accel_agent.backends.mdev import MdevWriter
from accel_agent.backends.nvidia_vfio import VgpuWriter
from accel_agent.backends.sriov_vf import PciWriter, SriovVfBackend
from accel_agent.config import options, registry
from accel_agent.devices import writers
from tests import toy_backend
from tests.configutil import make_conf

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = (MdevWriter, VgpuWriter, PciWriter)


def _run(code: str, site: Path | None = None) -> dict:
    """``code`` in a fresh interpreter (the toy's directory first on its
    path when given); what it prints as JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        str(p) for p in (site, REPO, env.get("PYTHONPATH")) if p
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


# --- the writes: one protocol per backend, one writer implementing them all -------------


def _writes(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize("writer", [writers.PrivsepWriter, writers.DirectWriter])
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_the_privileged_writers_implement_every_backends_writes(writer, protocol) -> None:
    """Each backend declares the writes it calls; both writers of
    devices/writers.py have each of them, with the same parameters."""
    writes = _writes(protocol)
    assert writes  # the protocol is not empty
    for name, signature in writes.items():
        assert hasattr(writer, name), f"{writer.__name__} lacks {protocol.__name__}.{name}"
        assert inspect.signature(getattr(writer, name)).parameters.keys() == \
            signature.parameters.keys(), f"{writer.__name__}.{name}"


def test_every_backends_write_is_counted_as_a_change() -> None:
    """The manager rescans after an operation whose writes moved its count
    (devices/protocol.operation): every write a backend declares counts."""
    from accel_agent.devices.manager import _CountingWriter

    declared = {name for protocol in PROTOCOLS for name in _writes(protocol)}
    assert declared <= _CountingWriter.WRITES


# --- the options: the sriov_vf backend's, through the registry's hook ---------------------


def test_the_vf_pool_options_are_the_sriov_backends_registered_through_the_hook() -> None:
    """The core declares no VF pool option; the sriov_vf backend's module
    does, found from its entry point, and the sample lists them where it
    did: enabled_vf_pools last of [devices], the [vf_pool_$(pool)] group."""
    core = {(group, opt.dest) for group, opts in options.list_opts() for opt in opts}
    assert ("devices", "enabled_vf_pools") not in core
    assert not any(group.startswith("vf_pool_") for group, _ in core)
    assert SriovVfBackend.opts == "accel_agent.sriov.opts"
    assert [room.__name__ for room in registry.backend_rooms()] == ["accel_agent.sriov.opts"]
    listed = dict(registry.list_opts())
    assert [opt.dest for opt in listed["devices"]] == [
        "enabled_mdev_types", "standing_vf_wait", "enabled_gpu_layouts", "enabled_vf_pools"
    ]
    assert [opt.dest for opt in listed["vf_pool_$(pool)"]] == [
        "device_addresses", "resource_class", "traits", "num_vfs"
    ]
    assert len([group for group, _ in registry.list_opts() if group == "devices"]) == 1


def test_a_backend_registers_its_options_on_a_conf_that_has_only_the_cores(tmp_path) -> None:
    """accelctl acting directly registers the core's options alone; building
    the backends registers theirs (the pools' per-name groups included) and
    gives the sriov_vf backend its pool service."""
    conf = make_conf(
        "[devices]\nenabled_vf_pools = nic\n[vf_pool_nic]\ndevice_addresses = 3b:00.0\n"
        "num_vfs = 4\n", sysfs_root=str(tmp_path),
    )
    assert "enabled_vf_pools" not in conf.devices
    built = wiring.build_backends(conf)
    assert set(built) == {"mdev", "nvidia_vfio", "sriov_vf"}
    assert conf.vf_pool_nic.num_vfs == 4
    sriov = built["sriov_vf"]
    assert sriov.pools is not None and set(sriov.served_pools()) == {"nic"}
    assert sriov.served_pools()["nic"].device_addresses == ("0000:3b:00.0",)
    assert all(not b.served_pools() for name, b in built.items() if name != "sriov_vf")


def test_no_pool_no_pool_service_and_a_bad_pool_is_refused_naming_it(tmp_path) -> None:
    built = wiring.build_backends(make_conf("", sysfs_root=str(tmp_path)))
    assert built["sriov_vf"].pools is None and built["sriov_vf"].served_pools() == {}
    with pytest.raises(exception.InvalidVfPoolConfig, match="nic: no device_addresses"):
        wiring.build_backends(make_conf("[devices]\nenabled_vf_pools = nic\n",
                                        sysfs_root=str(tmp_path)))


# --- another distribution's backend --------------------------------------------------------


def test_only_another_distributions_registration_counts_as_out_of_tree(tmp_path) -> None:
    """registered_elsewhere reads entry_points.txt of every dist-info and
    egg-info on the path and names what is not this package's own."""
    own = tmp_path / "own"
    (own / "accel_agent-9.dist-info").mkdir(parents=True)
    (own / "accel_agent-9.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\naccelctl = x:y\n\n[accel_agent.backends]\n"
        + "".join(f"{name} = {target}\n" for name, target in backends.BUILTIN.items())
    )
    (own / "other-1.egg-info").mkdir()
    (own / "other-1.egg-info" / "entry_points.txt").write_text("[oslo.config.opts]\na = b:c\n")
    (own / "none-1.dist-info").mkdir()  # no entry_points.txt at all
    assert backends.registered_elsewhere([str(own), str(tmp_path / "missing")]) == []
    site = toy_backend.install(tmp_path / "site")
    assert backends.registered_elsewhere([str(own), str(site)]) == [toy_backend.ENTRY_POINT]
    # A built-in name pointing elsewhere is someone else's too.
    (own / "accel_agent-9.dist-info" / "entry_points.txt").write_text(
        "[accel_agent.backends]\nmdev = vendor.mdev:Better\n"
    )
    assert backends.registered_elsewhere([str(own)]) == ["mdev = vendor.mdev:Better"]


READS = """
import json, sys
from accel_agent import backends
found = backends.for_reading()
print(json.dumps({
    "backends": {name: type(b).__module__ for name, b in sorted(found.items())},
    "stevedore": "stevedore" in sys.modules,
    "oslo_config": "oslo_config" in sys.modules,
}))
"""
OPTIONS = """
import json
from accel_agent.config import registry
print(json.dumps({
    "rooms": [room.__name__ for room in registry.backend_rooms()],
    "groups": [group for group, _ in registry.list_opts()],
}))
"""
BUILTIN_MODULES = {
    "mdev": "accel_agent.backends.mdev",
    "nvidia_vfio": "accel_agent.backends.nvidia_vfio",
    "sriov_vf": "accel_agent.backends.sriov_vf",
}


def test_a_read_only_command_scans_with_the_builtin_backends_without_stevedore() -> None:
    """No other distribution registers a backend: the listings' path loads
    the built-in backends directly, neither stevedore nor oslo.config."""
    seen = _run(READS)
    assert seen == {"backends": BUILTIN_MODULES, "stevedore": False, "oslo_config": False}


def test_an_out_of_tree_backend_is_found_by_the_reads_and_its_options_listed(tmp_path) -> None:
    """With the toy's distribution on the path, the read-only commands scan
    with it too (through stevedore), and the registry lists its options
    (check-config, the sample of the host it is installed on)."""
    site = toy_backend.install(tmp_path / "site")
    seen = _run(READS, site)
    assert seen["backends"] == {**BUILTIN_MODULES, "toy_vf": "toyvf"}
    assert seen["stevedore"] is True
    seen = _run(OPTIONS, site)
    assert seen["rooms"] == ["accel_agent.sriov.opts", "toyvf.opts"]
    assert "toy_vf" in seen["groups"]


BUILD = """
import json
from accel_agent import wiring
from tests.configutil import make_conf
conf = make_conf("[toy_vf]\\ngive_back = false\\n", sysfs_root=%r)
built = wiring.build_backends(conf)
print(json.dumps({"backends": sorted(built), "give_back": built["toy_vf"].give_back}))
"""


def test_the_mutating_commands_build_an_out_of_tree_backend_with_its_options(tmp_path) -> None:
    seen = _run(BUILD % str(tmp_path), toy_backend.install(tmp_path / "site"))
    assert seen == {"backends": ["mdev", "nvidia_vfio", "sriov_vf", "toy_vf"],
                    "give_back": False}


def test_a_registered_backend_that_cannot_be_loaded_is_refused_naming_it(tmp_path) -> None:
    site = toy_backend.install(tmp_path / "site", "broken = toyvf.nothing:Backend")
    code = """
import json
from accel_agent import backends, exception
try:
    print(json.dumps({"loaded": sorted(backends.for_reading())}))
except exception.BackendNotLoaded as exc:
    print(json.dumps({"message": exc.message}))
"""
    seen = _run(code, site)
    assert "message" in seen, seen
    assert seen["message"].startswith(
        "device backend broken (toyvf.nothing:Backend, registered under the "
        "accel_agent.backends entry points) cannot be loaded: ModuleNotFoundError"
    )


def test_the_namespace_is_the_one_pyproject_registers() -> None:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split(f'[project.entry-points."{NAMESPACE}"]\n')[1].split("\n\n")[0]
    assert dict(
        (name.strip(), target.strip().strip('"'))
        for name, target in (line.split("=", 1) for line in section.splitlines())
    ) == dict(backends.BUILTIN)
