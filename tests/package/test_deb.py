"""The Debian packages `make deb` builds (dist/accel-agent_*.deb and
dist/accel-agent-simulator_*.deb): their metadata, layout, man pages, bash
completion, lintian's verdict, the maintainer scripts, and an install,
reinstall and purge with apt on a clean Debian bookworm (a debootstrap chroot).

Run by `make test-package` (part of `make test`), which builds the package
first; skipped with the reason when there is no package or no root.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import accel_agent

REPO = Path(__file__).resolve().parents[2]
# A pristine bookworm minbase, made once per machine (~35 s) and copied per run.
BASE = Path(os.environ.get("ACCEL_CHROOT_CACHE", "/var/tmp/accel-agent-test")) / "bookworm-base"

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


@pytest.fixture(scope="module")
def simulator_deb() -> Path:
    found = sorted(glob.glob(str(REPO / "dist" / "accel-agent-simulator_*.deb")))
    if not found:
        pytest.skip("no dist/accel-agent-simulator_*.deb: run make deb (make test-package does)")
    assert len(found) == 1, f"more than one simulator package in dist/: {found}"
    return Path(found[0])


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], check=True, capture_output=True, text=True).stdout


def field(deb: Path, name: str) -> str:
    return dpkg_deb("--field", str(deb), name).strip()


def _contents(deb: Path) -> dict[str, str]:
    """path -> the line of dpkg-deb --contents (mode, owner, size, link)."""
    paths = {}
    for line in dpkg_deb("--contents", str(deb)).splitlines():
        path = line.split(None, 5)[5].split(" -> ")[0]
        paths["/" + path.lstrip("./").rstrip("/")] = line
    return paths


@pytest.fixture(scope="module")
def contents(deb) -> dict[str, str]:
    return _contents(deb)


@pytest.fixture(scope="module")
def extracted(deb, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("extracted")
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(directory)], check=True)
    return directory


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
    assert re.search(r"\badduser\b", depends), depends  # the postinst's addgroup
    # FUSE is the simulator's, which is not in this package.
    assert "fuse" not in field(deb, "Recommends") + depends
    # accelctl explain names devices from the system's pci.ids.
    assert re.search(r"\bpci\.ids\b", field(deb, "Recommends")), field(deb, "Recommends")
    assert debian_version("1.2.0rc1") == "1.2.0~rc1"


def test_the_maintainer_is_a_deliverable_looking_address(deb):
    maintainer = field(deb, "Maintainer")
    name, address = re.fullmatch(r"(.+) <([^<>@\s]+@[^<>@\s]+)>", maintainer).groups()
    host = address.split("@")[1]
    # lintian's bogus-mail-host: a host name of one label (localhost) is no mail domain.
    assert "." in host and not host.endswith((".localdomain", ".invalid")), maintainer
    assert host != "localhost" and name.strip()


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
        # The alerting rules metrics.md points at, for the fleet's Prometheus.
        "/usr/share/doc/accel-agent/docs/prometheus-alerts.yml",
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
    # Nor the simulator and its FUSE binding: accel-agent-simulator has them.
    assert not [p for p in contents if "/accel_agent/simulator" in p or "mfusepy" in p]
    assert [p for p in contents if p.endswith("/site-packages/accel_agent/cmd/ctl.py")]


def test_the_simulator_package_holds_the_simulator_and_nothing_else(deb, simulator_deb):
    assert field(simulator_deb, "Version") == field(deb, "Version")
    assert f"accel-agent (= {field(deb, 'Version')})" in field(simulator_deb, "Depends")
    assert field(simulator_deb, "Recommends") == "fuse3"
    paths = [p for p in _contents(simulator_deb) if "." in p.rsplit("/", 1)[-1]]
    site = [p for p in paths if "/site-packages/" in p]
    assert any(p.endswith("/site-packages/accel_agent/simulator/cli.py") for p in site)
    assert any(p.endswith("/site-packages/mfusepy.py") for p in site)
    # Into the agent's venv, beside what accel-agent installs there, and no more.
    for path in site:
        assert path.startswith("/opt/accel-agent/lib/python3"), path
        rest = path.split("/site-packages/", 1)[1]
        assert rest.startswith(("accel_agent/simulator/", "mfusepy")), path
    assert not [p for p in paths if not p.startswith(("/opt/", "/usr/share/doc/"))]


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


# --- man pages, completion, lintian --------------------------------------------------


def _genman():
    """tools/genman.py, whose parsers the package's pages were made from."""
    spec = importlib.util.spec_from_file_location("genman", REPO / "tools" / "genman.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path of words, parser) of every subcommand, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _roff(text: str) -> str:
    return text.replace("-", "\\-")


def _manpage(extracted: Path, name: str) -> str:
    page = extracted / "usr/share/man/man8" / f"{name}.8.gz"
    assert page.is_file(), f"{name}(8) is not in the package"
    return gzip.decompress(page.read_bytes()).decode()


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]


def test_accelctl_man_page_documents_every_subcommand_and_option_of_its_parser(extracted):
    page = _manpage(extracted, "accelctl")
    assert page.startswith('.TH ACCELCTL "8"'), page[:80]
    parser = _genman().accelctl_parser()
    commands = list(_commands(parser))
    assert {"types", "allocate", "ledger upgrade", "migration claim"} <= {
        " ".join(path) for path, _ in commands
    }
    for path, sub in commands:
        heading = _roff(f"'accelctl {' '.join(path)}'")
        assert f".SH COMMAND \\fI\\,{heading}\\/\\fR" in page, f"accelctl {' '.join(path)}"
        for option in _long_options(sub):
            assert f"\\fB{_roff(option)}\\fR" in page, (path, option)
    for option in _long_options(parser):
        assert f"\\fB{_roff(option)}\\fR" in page, option
    assert ".SH EXIT STATUS" in page and ".SH FILES" in page


def test_accel_agent_man_page_documents_every_option_of_its_parser(extracted):
    page = _manpage(extracted, "accel-agent")
    assert page.startswith('.TH ACCEL\\-AGENT "8"'), page[:80]
    options = _long_options(_genman().agent_parser())
    assert "--check" in options
    for option in options:
        assert f"\\fB{_roff(option)}\\fR" in page, option
    # Whether man(1) renders both without a warning: lintian's manpage checks.


def _complete(completion: Path, line: str) -> list[str]:
    """What bash offers for the last word of ``line`` with the shipped
    completion sourced (as bash-completion loads it for accelctl)."""
    script = f"""
        source {completion}
        spec=$(complete -p accelctl) || exit 3
        function=$(sed -E 's/.* -F ([^ ]+) .*/\\1/' <<<"$spec")
        COMP_LINE={line!r}
        COMP_POINT=${{#COMP_LINE}}
        read -ra COMP_WORDS <<<"$COMP_LINE"
        case $COMP_LINE in *" ") COMP_WORDS+=("");; esac
        COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
        "$function" accelctl "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    done = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return sorted(word.strip() for word in done.stdout.split("\n") if word.strip())


def test_bash_completion_completes_accelctls_subcommands(extracted):
    completion = extracted / "usr/share/bash-completion/completions/accelctl"
    assert completion.is_file()
    assert _complete(completion, "accelctl ty") == ["types"]
    assert _complete(completion, "accelctl migration c") == ["claim", "commit"]
    assert "--json" in _complete(completion, "accelctl inventory --")
    names = {path[0] for path, _ in _commands(_genman().accelctl_parser())}
    assert set(_complete(completion, "accelctl ")) >= names


def test_lintian_finds_nothing_but_what_is_overridden_and_explained(deb, simulator_deb, extracted):
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed (make test-package installs it)")
    overrides = extracted / "usr/share/lintian/overrides/accel-agent"
    # Every override has a comment saying why.
    text = overrides.read_text()
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        assert lines[0].startswith("#") or not any(not x.startswith("#") for x in lines), block
    done = subprocess.run(
        ["lintian", "--fail-on", "none", "--display-info", str(deb), str(simulator_deb)],
        capture_output=True, text=True, timeout=900,
    )
    findings = [line for line in done.stdout.splitlines() if line.startswith(("E:", "W:"))]
    assert not findings, "\n".join(findings)
    # The overrides are all in use (lintian says when one matched nothing).
    assert "unused-override" not in done.stdout


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


def archive_mirror() -> str:
    """The Debian archive this machine's APT uses for its own release's main
    component, as tests/realkernel/lab.sh finds it (``apt-get indextargets``):
    a host behind a local mirror or a proxy's address builds the chroot from
    the same place as its own packages."""
    codename = ""
    with open("/etc/os-release", encoding="utf-8") as release:
        for line in release:
            key, _, value = line.strip().partition("=")
            if key == "VERSION_CODENAME":
                codename = value.strip('"')
    proc = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(SITE) $(RELEASE) $(COMPONENT)"],
        capture_output=True, text=True, check=False,
    )
    for line in proc.stdout.splitlines():
        site, _, rest = line.partition(" ")
        if rest.split() == [codename, "main"]:
            return site
    pytest.fail(f"cannot tell this machine's Debian mirror for {codename or 'its release'} "
                "(apt-get indextargets lists none; apt-get update first)")


def _base() -> Path:
    """The pristine chroot, made once (debootstrap from the machine's mirror)."""
    if (BASE / "etc/debian_version").exists():
        return BASE
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed (make test-package installs it)")
    partial = BASE.with_name(BASE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(partial),
                    archive_mirror()],
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
    # The compiled modules of the venv load after dh_strip stripped them.
    _run(root, "/opt/accel-agent/bin/python", "-c",
         "import lxml.etree, libvirt, yaml._yaml, rpds, psutil, greenlet, _cffi_backend")
    # The group for [api] socket_group, a system group.
    group = _run(root, "getent", "group", "accelops").stdout.split(":")
    assert int(group[2]) < 1000, group
    # The packaged venv does real work, without the simulator (not in this
    # package): a static sysfs tree written by this checkout's simulator, a
    # config, a listing.
    subprocess.run([sys.executable, "-m", "accel_agent.cmd.ctl", "simulate", "materialise",
                    str(root / "tmp/sys"), "--profile", "mtty"], check=True, cwd=REPO)
    missing = _run(root, "accelctl", "simulate", "profiles", check=False)
    assert missing.returncode == 1 and "accel-agent-simulator" in missing.stderr, missing
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


def test_the_simulator_package_installs_beside_it_and_simulates(chroot, deb, simulator_deb):
    root = chroot
    if _run(root, "dpkg-query", "-W", "accel-agent", check=False).returncode != 0:
        _run(root, "apt-get", "install", "-y", "-qq", f"/tmp/{deb.name}")
    shutil.copy(simulator_deb, root / "tmp" / simulator_deb.name)
    # --no-install-recommends: FUSE is for mounting; a static tree needs none.
    _run(root, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
         f"/tmp/{simulator_deb.name}")
    _run(root, "accelctl", "simulate", "materialise", "/tmp/sys2", "--profile", "mtty")
    assert (root / "tmp/sys2/class/mdev_bus").is_dir()
    # Removing it leaves the agent whole.
    _run(root, "apt-get", "purge", "-y", "-qq", "accel-agent-simulator")
    venv = root / "opt/accel-agent/lib"
    assert not list(venv.glob("python3*/site-packages/accel_agent/simulator"))
    assert not list(venv.glob("python3*/site-packages/mfusepy*"))
    assert list(venv.glob("python3*/site-packages/accel_agent/cmd/ctl.py"))
    _run(root, "accelctl", "--config-file", "/tmp/agent.conf", "check-config")
    assert _run(root, "accelctl", "simulate", "profiles", check=False).returncode == 1


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


# --- purge and the ledger -------------------------------------------------------------


def _write_ledger(path: Path, devices: list[str]) -> None:
    """A ledger of this version's schema recording ``devices`` (UUIDs) as
    present mdevs, written as the agent's migrations write it."""
    from accel_agent.devices.ledger import schema

    path.parent.mkdir(mode=0o700, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        with conn:
            for migrate in schema.MIGRATIONS:
                migrate(conn)
            conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")
            for uuid in devices:
                conn.execute(
                    "INSERT INTO mdevs (uuid, parent, mdev_type, state, created_at, updated_at)"
                    " VALUES (?, 'mtty', 'mtty-1', 'present', 0, 0)",
                    (uuid,),
                )
    finally:
        conn.close()


def _purge_with(root: Path, deb: Path, ledger: bytes | list[str]) -> subprocess.CompletedProcess:
    if _run(root, "dpkg-query", "-W", "accel-agent", check=False).returncode != 0:
        _run(root, "dpkg", "-i", f"/tmp/{deb.name}")
    state = root / "var/lib/accel-agent"
    shutil.rmtree(state, ignore_errors=True)
    if isinstance(ledger, bytes):
        state.mkdir(mode=0o700)
        (state / "ledger.sqlite3").write_bytes(ledger)
    else:
        _write_ledger(state / "ledger.sqlite3", ledger)
    (root / "var/cache/accel-agent").mkdir(exist_ok=True)
    return _run(root, "dpkg", "--purge", "accel-agent")


def test_purge_keeps_a_ledger_that_records_devices_and_says_so(chroot, deb):
    root = chroot
    uuid = "4b2f7d3e-0000-4000-8000-000000000001"
    purged = _purge_with(root, deb, [uuid])
    ledger = root / "var/lib/accel-agent/ledger.sqlite3"
    assert ledger.is_file()
    conn = sqlite3.connect(f"{ledger.as_uri()}?mode=ro", uri=True)
    assert conn.execute("SELECT uuid FROM mdevs").fetchall() == [(uuid,)]
    conn.close()
    assert "still records 1 device(s)" in purged.stderr, purged.stderr
    # The rest goes as before.
    for gone in ("opt/accel-agent", "etc/accel-agent", "var/cache/accel-agent"):
        assert not (root / gone).exists(), gone


def test_purge_keeps_a_ledger_it_cannot_read(chroot, deb):
    root = chroot
    purged = _purge_with(root, deb, b"not an SQLite database, " * 100)
    assert (root / "var/lib/accel-agent/ledger.sqlite3").is_file()
    assert "cannot read its ledger" in purged.stderr, purged.stderr


def test_purge_removes_a_ledger_that_records_no_device(chroot, deb):
    root = chroot
    _purge_with(root, deb, [])
    assert not (root / "var/lib/accel-agent").exists()
