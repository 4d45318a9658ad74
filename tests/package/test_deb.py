"""The Debian package `make deb` builds (dist/accel-agent_*.deb): its
metadata, its layout, its maintainer scripts, and an install, reinstall and
purge with apt on a clean Debian bookworm (a debootstrap chroot).

Run by `make test-package` (part of `make test`), which builds the package
first; skipped with the reason when there is no package or no root.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import accel_agent

REPO = Path(__file__).resolve().parents[2]
# A pristine bookworm minbase, made once per machine (~35 s) and copied per run.
BASE = Path(os.environ.get("ACCEL_CHROOT_CACHE", "/var/tmp/accel-agent-test")) / "bookworm-base"
MIRROR = "http://deb.debian.org/debian"

pytestmark = pytest.mark.package


def debian_version(version: str) -> str:
    """tools/build-deb.sh's spelling of a Python version."""
    return re.sub(r"\.?(a|b|rc|dev)(\d+)", r"~\1\2", version)


@pytest.fixture(scope="module")
def deb() -> Path:
    found = sorted(glob.glob(str(REPO / "dist" / "accel-agent_*.deb")))
    if not found:
        pytest.skip("no dist/accel-agent_*.deb: run make deb (make test-package does)")
    assert len(found) == 1, f"more than one package in dist/: {found}"
    return Path(found[0])


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], check=True, capture_output=True, text=True).stdout


def field(deb: Path, name: str) -> str:
    return dpkg_deb("--field", str(deb), name).strip()


@pytest.fixture(scope="module")
def contents(deb) -> dict[str, str]:
    """path -> the line of dpkg-deb --contents (mode, owner, size, link)."""
    paths = {}
    for line in dpkg_deb("--contents", str(deb)).splitlines():
        path = line.split(None, 5)[5].split(" -> ")[0]
        paths["/" + path.lstrip("./").rstrip("/")] = line
    return paths


@pytest.fixture(scope="module")
def control(deb, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("control")
    subprocess.run(["dpkg-deb", "--control", str(deb), str(directory)], check=True)
    return directory


def test_the_version_is_the_python_packages_and_the_dependencies_are_debians(deb):
    assert field(deb, "Package") == "accel-agent"
    assert field(deb, "Version") == debian_version(accel_agent.__version__)
    depends = field(deb, "Depends")
    # The venv runs Debian's own interpreter: tied to its minor version.
    assert "python3 (>= 3.11)" in depends and "python3 (<< 3.12)" in depends
    assert re.search(r"\blibvirt0\b", depends), depends  # libvirt-python's module links it
    assert re.search(r"\blibsystemd0\b", depends), depends  # the journal extra's module
    assert debian_version("1.2.0rc1") == "1.2.0~rc1"


def test_layout_venv_links_unit_config_and_docs(contents):
    for path in (
        "/opt/accel-agent/bin/python",
        "/opt/accel-agent/bin/accel-agent",
        "/opt/accel-agent/bin/accelctl",
        "/opt/accel-agent/bin/privsep-helper",  # started by the agent from its own prefix
        "/opt/accel-agent/pyvenv.cfg",
        "/lib/systemd/system/accel-agent.service",
        "/etc/accel-agent/accel-agent.conf",
        "/etc/accel-agent/accel-agent.conf.d",
        "/usr/share/doc/accel-agent/README.md",
        "/usr/share/doc/accel-agent/docs/README.md",
    ):
        assert path in contents, path
    for name in ("accel-agent", "accelctl"):
        assert contents[f"/usr/bin/{name}"].endswith(f"-> /opt/accel-agent/bin/{name}")
    # The interpreter is Debian's, not the build machine's.
    assert contents["/opt/accel-agent/bin/python3"].endswith("-> /usr/bin/python3")
    # Only the agent and its dependencies: no checkout, no test suite of ours.
    assert {p.split("/")[1] for p in contents if p != "/"} == {"etc", "lib", "opt", "usr"}
    assert not [p for p in contents if "/site-packages/tests/" in p]
    # The journal extra: use_journal = true works from the package.
    assert [p for p in contents if p.endswith("/site-packages/systemd/journal.py")]


def test_the_unit_is_the_repositorys_and_names_files_the_package_ships(deb, contents, tmp_path):
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(tmp_path)], check=True)
    # Every script of the venv runs the venv's interpreter at its installed
    # path, not the build directory's.
    for script in (tmp_path / "opt/accel-agent/bin").iterdir():
        if script.is_file() and not script.is_symlink():
            first = script.read_bytes().split(b"\n", 1)[0]
            if first.startswith(b"#!"):
                assert first == b"#!/opt/accel-agent/bin/python", (script.name, first)
    unit = (tmp_path / "lib/systemd/system/accel-agent.service").read_text()
    assert unit == (REPO / "systemd/accel-agent.service").read_text()
    for key in ("ExecStart", "ExecStartPre"):
        command = re.search(rf"^{key}=(\S+)", unit, re.M).group(1)
        assert command in contents, f"{key}={command} is not in the package"
    document = re.search(r"^Documentation=file:(\S+)", unit, re.M).group(1)
    assert document in contents, f"Documentation={document} is not in the package"
    config = (tmp_path / "etc/accel-agent/accel-agent.conf").read_text()
    assert config == (REPO / "etc/accel-agent.conf").read_text()


def test_the_sample_config_is_the_only_conffile(control):
    assert (control / "conffiles").read_text().split() == ["/etc/accel-agent/accel-agent.conf"]


def test_maintainer_scripts_parse_and_never_start_or_enable_the_service(control):
    scripts = {p.name: p.read_text() for p in control.iterdir() if p.name.endswith(("inst", "rm"))}
    assert {"postinst", "prerm", "postrm"} <= set(scripts)
    for name in scripts:
        subprocess.run(["sh", "-n", str(control / name)], check=True)
    everything = "\n".join(scripts.values())
    assert "deb-systemd-invoke start" not in everything
    assert "deb-systemd-helper enable" not in everything.replace(
        # re-enabling a unit the operator had enabled, after an upgrade, is fine
        "was-enabled 'accel-agent.service'; then\n\t\t\t# Create new symlinks, if any.\n"
        "\t\t\tdeb-systemd-helper enable",
        "",
    )
    # An upgrade restarts the agent only if it runs; a remove stops it first.
    assert "deb-systemd-invoke try-restart 'accel-agent.service'" in scripts["postinst"]
    assert "deb-systemd-invoke stop accel-agent.service" in scripts["prerm"]
    assert "stop" not in scripts.get("preinst", "")  # an upgrade does not stop it first
    # A purge forgets the ledger and the cache; a remove keeps the ledger.
    purge = scripts["postrm"].split("purge)")[1].split(";;")[0]
    assert "/var/lib/accel-agent" in purge and "/var/cache/accel-agent" in purge
    remove = scripts["postrm"].split("remove)")[1].split(";;")[0]
    assert "/var/lib/accel-agent" not in remove


# --- install on a clean Debian -------------------------------------------------------


def _run(root: Path, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LC_ALL": "C.UTF-8", "HOME": "/root"}
    proc = subprocess.run(["chroot", str(root), *command], capture_output=True, text=True,
                          env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _base() -> Path:
    """The pristine chroot, made once (debootstrap from Debian's mirror)."""
    if (BASE / "etc/debian_version").exists():
        return BASE
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed (make test-package installs it)")
    partial = BASE.with_name(BASE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(partial), MIRROR],
                   check=True, capture_output=True, timeout=1200)
    partial.rename(BASE)
    return BASE


@pytest.fixture(scope="module")
def chroot(deb, tmp_path_factory) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("installing into a chroot needs root")
    root = tmp_path_factory.mktemp("bookworm") / "root"
    subprocess.run(["cp", "-a", str(_base()), str(root)], check=True)
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    shutil.copy(deb, root / "tmp" / deb.name)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        _run(root, "apt-get", "update", "-qq")
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_apt_installs_it_on_a_clean_bookworm_and_it_runs(chroot, deb):
    root = chroot
    _run(root, "apt-get", "install", "-y", "-qq", f"/tmp/{deb.name}")
    assert _run(root, "accelctl", "--help").stdout.startswith("usage: accelctl")
    assert "accel-agent" in _run(root, "accel-agent", "--help").stdout
    _run(root, "/opt/accel-agent/bin/privsep-helper", "--help")
    # The packaged venv does real work: a simulated host, a config, a listing.
    _run(root, "accelctl", "simulate", "materialise", "/tmp/sys", "--profile", "mtty")
    (root / "tmp/agent.conf").write_text(
        "[DEFAULT]\nsysfs_root = /tmp/sys\nstate_dir = /tmp/state\n"
        "[devices]\nenabled_mdev_types = mtty-1\n[libvirt]\nuri =\n"
    )
    checked = _run(root, "accelctl", "--config-file", "/tmp/agent.conf", "check-config")
    assert checked.stdout.startswith("configuration OK"), checked.stdout
    _run(root, "accel-agent", "--config-file", "/tmp/agent.conf", "--check")
    listing = _run(root, "accelctl", "--config-file", "/tmp/agent.conf", "types", "--json")
    assert '"name":"mtty"' in listing.stdout
    # Installed, not started (nothing listens), nothing enabled.
    assert not (root / "run/accel-agent/api.sock").exists()
    assert not list((root / "etc/systemd/system").rglob("accel-agent.service"))


def test_reinstall_keeps_the_operators_config_and_purge_removes_everything(chroot, deb):
    root = chroot
    if _run(root, "dpkg-query", "-W", "accel-agent", check=False).returncode != 0:
        _run(root, "apt-get", "install", "-y", "-qq", f"/tmp/{deb.name}")
    conf = root / "etc/accel-agent/accel-agent.conf"
    conf.write_text(conf.read_text() + "\n[devices]\nenabled_mdev_types = mtty-1\n")
    edited = conf.read_text()
    # The upgrade path of every maintainer script (same version again).
    _run(root, "dpkg", "--force-confold", "-i", f"/tmp/{deb.name}")
    assert conf.read_text() == edited
    (root / "var/lib/accel-agent").mkdir(exist_ok=True)
    (root / "var/lib/accel-agent/ledger.sqlite3").write_text("")
    _run(root, "apt-get", "purge", "-y", "-qq", "accel-agent")
    for gone in ("opt/accel-agent", "etc/accel-agent", "var/lib/accel-agent",
                 "usr/bin/accelctl", "lib/systemd/system/accel-agent.service"):
        assert not (root / gone).exists(), gone
