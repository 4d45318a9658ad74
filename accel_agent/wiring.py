"""What the daemon and accelctl both do to turn the configuration files into a
working host: load the config, validate it against the host (saying clearly
what is wrong), read the ledger for listings, build the lifecycle manager.

A room of its own so that the daemon (service.py) does not reach into the
console scripts' room (cmd/) for its wiring."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accel_agent import config_cache, exception, startchecks
from accel_agent.config_cache import config_sources
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.policy import MdevPolicy, PolicyInputs, read_policy_inputs, resolve_policy
from accel_agent.sysfs.model import HostSnapshot

# oslo.config is imported where a command loads the configuration: the
# read-only listings usually get by without it (config_cache.py).  The
# inventory is imported where used: accelctl's plain listings
# (cmd/plain_listing.py) do not need it.
if TYPE_CHECKING:
    from collections.abc import Iterable

    from oslo_config import cfg

    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.ledger import DeviceRecord, Ledger


@dataclass(frozen=True)
class ListingConfig:
    """The configuration as the read-only listings see it: what config_cache
    keeps between runs (as :meth:`to_dict`)."""

    sysfs_root: str
    host: str
    state_dir: str
    api_socket_path: str
    policy_inputs: PolicyInputs
    libvirt_uri: str = ""  # [libvirt] uri: the mdev listing's "libvirt" keys

    @classmethod
    def from_conf(
        cls, conf: cfg.ConfigOpts
    ) -> tuple[ListingConfig, list[exception.AccelAgentException]]:
        """From a loaded oslo.config object; also the option values it
        refused, for :func:`resolve_policy` to report with the rest."""
        inputs, errors = read_policy_inputs(conf)
        return (
            cls(
                sysfs_root=conf.sysfs_root,
                host=conf.host,
                state_dir=conf.state_dir,
                api_socket_path=conf.api.socket_path,
                policy_inputs=inputs,
                libvirt_uri=conf.libvirt.uri,
            ),
            errors,
        )

    def policy(self, errors: list[exception.AccelAgentException] | None = None) -> MdevPolicy:
        return resolve_policy(self.policy_inputs, self.sysfs_root, errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sysfs_root": self.sysfs_root,
            "host": self.host,
            "state_dir": self.state_dir,
            "api_socket_path": self.api_socket_path,
            "policy_inputs": self.policy_inputs.to_dict(),
            "libvirt_uri": self.libvirt_uri,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ListingConfig:
        return cls(
            sysfs_root=str(data["sysfs_root"]),
            host=str(data["host"]),
            state_dir=str(data["state_dir"]),
            api_socket_path=str(data["api_socket_path"]),
            policy_inputs=PolicyInputs.from_dict(data["policy_inputs"]),
            libvirt_uri=str(data.get("libvirt_uri", "")),
        )


def load_config(
    config_files: list[str],
    config_dirs: list[str],
    prog: str,
    conf: cfg.ConfigOpts | None = None,
) -> cfg.ConfigOpts:
    """Parse the oslo.config files into ``conf`` (the global CONF by default).

    Without ``--config-file`` the packaged location is read when present, so
    an operator on a configured host can just run ``accelctl types``
    (config_cache.config_sources says which files and directories).

    The files are checked before oslo.config is given them
    (config_lint.check_files: regular files of a bounded size that no one but
    root can change, UTF-8; the files their options name, such as
    ``log_config_append``, likewise), and are still the same files after it
    parsed them (config_lint.check_unchanged): oslo.config opens them again by
    path, which only root can have changed in between.
    """
    from oslo_config import cfg

    from accel_agent import conf as agent_conf
    from accel_agent import config_lint  # difflib: not for the plain listings

    conf = conf or agent_conf.CONF
    files, dirs = config_sources(config_files, config_dirs)
    argv: list[str] = []
    for path in config_files:
        argv += ["--config-file", path]
    # Every directory as --config-dir, after the files: oslo.config parses
    # its default_config_dirs before the --config-file arguments, so the
    # packaged directory given that way came first and the unit's explicit
    # accel-agent.conf overrode its drop-ins (while accelctl, with no
    # --config-file, read them last): the files, then the directories.
    for path in dirs:
        argv += ["--config-dir", path]
    checked = config_lint.check_files(config_files or files, dirs)
    named = config_lint.named_file_errors(checked)
    if named:
        raise exception.ConfigErrors([exception.InvalidConfig(message=m) for m in named])
    try:
        conf(
            argv,
            project="accel-agent",
            prog=prog,
            default_config_files=[] if config_files else files,
            default_config_dirs=[],
        )
    except cfg.ConfigFilesNotFoundError as exc:
        raise exception.InvalidConfig(reason=f"config file not found: {exc.config_files}") from exc
    except (cfg.ConfigFileParseError, cfg.Error) as exc:
        raise exception.InvalidConfig(reason=str(exc)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        # check_files ran first; a file changed in between.
        raise exception.InvalidConfig(reason=f"cannot read the config files: {exc}") from exc
    config_lint.check_unchanged(checked)
    config_lint.check_paths(conf)
    return conf


def build_vf_pools(conf: cfg.ConfigOpts, writer, net=None):
    """The configured SR-IOV VF pools (None when ``[devices] enabled_vf_pools``
    is empty): PCI writes through ``writer``, network settings through the
    CAP_NET_ADMIN privsep daemon unless ``net`` says otherwise (tests)."""
    from accel_agent.sriov.pools import build_pools

    pools = build_pools(conf)  # InvalidVfPoolConfig
    if not pools:
        return None
    from accel_agent.sriov.vfpool import PrivsepNet, VfPools

    return VfPools(conf.sysfs_root, pools, pci=writer, net=net or PrivsepNet(), host=conf.host)


def attach_requests(manager, raw: Any) -> list:
    """An attach call's requests checked against the pools ``manager`` serves
    (InvalidAttachRequest naming the field); nothing is done.  The pools are
    the ones its SR-IOV backend was built with: a reloaded config's pools
    apply at the next start, so requests are not checked against them."""
    from accel_agent import attach_requests as parser
    from accel_agent.backends.sriov_vf import BACKEND

    vf_pools = getattr(manager.backends.get(BACKEND), "pools", None)
    return parser.parse(raw, vf_pools.pools if vf_pools is not None else {})


def build_manager(
    conf: cfg.ConfigOpts, writer=None, on_step=None, net=None, upgrade_ledger: bool = True
):
    """The lifecycle manager for this host: ledger in ``state_dir``, writes
    through the privsep daemon (started with the same config files).

    ``upgrade_ledger``: migrate a ledger of an older schema (after a backup
    copy), as the daemon does at its start; accelctl's offline commands pass
    False and get LedgerSchemaOld naming ``accelctl ledger upgrade``."""
    from accel_agent.devices import domains, ledger, manager, writers

    policy = policy_mod.build_policy(conf)
    writer = writer or writers.PrivsepWriter(conf.sysfs_root, conf.vfio_dev_dir)
    book = ledger.Ledger(conf.state_dir, upgrade=upgrade_ledger)
    try:
        return manager.DeviceManager(
            sysfs_root=conf.sysfs_root,
            policy=policy,
            host=conf.host,
            ledger=book,
            writer=writer,
            domains=domains.for_conf(conf),
            remove_timeout=conf.remove_timeout,
            on_step=on_step,
            backends=_backends(build_vf_pools(conf, writer, net)),
            define_mdevs=conf.libvirt.define_mdevs,
        )
    except BaseException:
        book.close()
        raise


def _backends(vf_pools):
    """The built-in backends, the SR-IOV VF one with the host's pool service."""
    from types import MappingProxyType

    from accel_agent import backends
    from accel_agent.backends.sriov_vf import BACKEND, SriovVfBackend

    return MappingProxyType({**backends.builtin(), BACKEND: SriovVfBackend(vf_pools)})


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says, for read-only listings: empty when the agent
    has never run here (a read must not create state)."""

    # uuid -> the instance (or migration claim) holding it, None when none
    # does: free, or a standing layout's.
    owners: dict[str, str | None] = field(default_factory=dict)
    # Room, not use: free devices and those a standing layout holds.
    free: frozenset[str] = frozenset()
    # Held by a standing layout ([mdev_<type>] standing), no instance.
    layout_held: frozenset[str] = frozenset()
    # A standing layout's devices, also those an instance holds now.
    layout_members: frozenset[str] = frozenset()
    # The rows themselves, for the start's checks (startchecks.owner_problems);
    # empty in a view made from what the running daemon said.
    records: tuple[DeviceRecord, ...] = ()

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self.owners)

    @classmethod
    def of(cls, book: Ledger) -> LedgerView:
        """The view of an open ledger: the daemon's own (never a second
        connection to it in its process, DESIGN.md §5)."""
        return cls.of_records(book.all())

    @classmethod
    def of_records(cls, records: Iterable[DeviceRecord]) -> LedgerView:
        from accel_agent.devices.ledger import OwnerKind

        records = list(records)
        held = frozenset(
            r.uuid for r in records if r.owner_kind is OwnerKind.STANDING
        )
        return cls(
            owners={r.uuid: None if r.uuid in held else r.owner for r in records},
            free=frozenset(r.uuid for r in records if r.free or (
                r.uuid in held and r.intent_id is None)),
            layout_held=held,
            layout_members=frozenset(r.uuid for r in records if r.in_layout),
            records=tuple(records),
        )


LEDGER_FILENAME = "ledger.sqlite3"  # accel_agent.devices.ledger.LEDGER_FILENAME


def read_ledger(state_dir: str) -> LedgerView:
    """The ledger of ``state_dir`` read by another process than the daemon's:
    read-only (never created, migrated or checkpointed); a schema older or
    newer than this code's raises LedgerSchemaOld / LedgerSchemaTooNew, whose
    one line says what to do."""
    # Checked before importing the ledger (and sqlite3): most read-only runs
    # on a host the agent never managed have no ledger at all.
    if not os.path.exists(os.path.join(state_dir, LEDGER_FILENAME)):
        return LedgerView()
    from accel_agent.devices import ledger

    with ledger.Ledger(state_dir, read_only=True) as book:
        if book.schema_version == 0:
            return LedgerView()  # made, not yet given its tables: nothing recorded
        return LedgerView.of(book)


@dataclass(frozen=True)
class HostState:
    policy: policy_mod.MdevPolicy
    snapshot: HostSnapshot
    host: str
    ledger: LedgerView = field(default_factory=LedgerView)
    # What the backends say about host preparation (VFs not enabled, ...).
    notes: tuple[str, ...] = ()
    libvirt_uri: str = ""

    def inventory(self) -> inventory_mod.Inventory:
        from accel_agent.devices import inventory as inventory_mod

        return inventory_mod.compute_inventory(
            self.snapshot, self.policy, self.host, self.ledger.free
        )

    def reported_inventory(self) -> inventory_mod.Inventory:
        """The GPUs' providers the agent reports (``accelctl inventory``,
        Placement): those of a type Nova reports (``reported_by = nova``) left
        out, as DeviceManager.reported_inventory does (inventory.reported)."""
        from accel_agent.devices import inventory as inventory_mod

        return inventory_mod.reported(self.inventory(), self.policy)


def listing_config(
    config_files: list[str], config_dirs: list[str], prog: str
) -> tuple[ListingConfig, list[exception.AccelAgentException]]:
    """The configuration of a read-only listing: from the cache when none of
    its inputs changed, else loaded by oslo.config (and then cached).  Also
    the option values oslo.config refused, for host_state to report."""
    files, dirs = config_sources(config_files, config_dirs)
    cached = config_cache.load(files, dirs)
    if cached is not None:
        try:
            return ListingConfig.from_dict(cached), []
        except (KeyError, TypeError, ValueError):
            pass  # an entry of another shape: load the files as on a miss
    key = config_cache.inputs_key(files, dirs)
    conf = load_config(config_files, config_dirs, prog)
    listing, errors = ListingConfig.from_conf(conf)
    if not errors and not conf.config_source:
        config_cache.store(files, dirs, key, listing.to_dict())
    return listing, errors


def host_state(
    listing: ListingConfig,
    errors: list[exception.AccelAgentException] | None = None,
    with_ledger: bool = True,
    scan_workers: int = 1,
    ledger: LedgerView | None = None,
) -> HostState:
    """Policy (raises ConfigErrors with ``errors`` and its own), a fresh scan
    of ``sysfs_root`` and the ledger: ``ledger`` when given (the daemon's
    own, or what the running daemon said), else read from ``state_dir``
    read-only."""
    from accel_agent import backends
    from accel_agent.backends.host import scan_host

    policy = listing.policy(errors)
    notes: list[str] = []
    snapshot = scan_host(
        listing.sysfs_root,
        backends.builtin(),
        workers=scan_workers,
        notes=notes,
        state_dir=listing.state_dir,
    )
    if ledger is not None:
        view = ledger
    else:
        view = read_ledger(listing.state_dir) if with_ledger else LedgerView()
    return HostState(
        policy=policy, snapshot=snapshot, host=listing.host, ledger=view, notes=tuple(notes),
        libvirt_uri=listing.libvirt_uri,
    )


def validate(
    conf: cfg.ConfigOpts,
    strict: bool = False,
    ledger: Ledger | LedgerView | None = None,
    running: int | None = None,
) -> tuple[list[str], list[str]]:
    """Everything ``check-config``, ``accel-agent --check`` (the start) and a
    reload check: (errors, warnings), each a list of one-line messages.  The
    errors include :func:`accel_agent.config_values.value_errors` (every
    option's value, read once as the daemon reads it), so that a reload that
    passed this check reads no value that can raise, and everything else the
    start can refuse (accel_agent.startchecks), in the start's words.
    ``ledger``, ``running``: see :func:`check`."""
    errors, warnings, _state = check(conf, strict, ledger=ledger, running=running)
    return errors, warnings


def check(
    conf: cfg.ConfigOpts,
    strict: bool = False,
    ledger: Ledger | LedgerView | None = None,
    running: int | None = None,
) -> tuple[list[str], list[str], HostState | None]:
    """:func:`validate`, and the host state it looked at (None when the
    configuration could not be resolved), so that a caller reporting on the
    host need not scan it again.

    ``ledger``: the daemon passes its own open Ledger (a reload must never
    open it a second time in its process); a LedgerView is used as it is;
    None reads ``state_dir``'s ledger read-only and runs the start's
    quick_check on it.  ``running``: the pid of the agent already running
    with this configuration's socket and ports (check-config beside it, a
    reload inside it), None before a start (startchecks.py)."""
    from oslo_config import cfg

    from accel_agent import (
        config_lint,  # difflib: not for the plain listings
        config_values,
    )

    # The files as written (unknown options, indented headers), every value
    # as the daemon reads it, and the state directory: reported whatever
    # else is wrong.
    warnings: list[str] = config_lint.lint(config_lint.parsed_files(conf))
    bad_values = config_values.bad_values(conf)
    errors: list[str] = [bad.message for bad in bad_values]
    said = {(bad.section, bad.option) for bad in bad_values}
    if ("DEFAULT", "state_dir") not in said:
        state_error, state_warning = config_lint.state_dir_problem(conf.state_dir)
        errors += [state_error] if state_error else []
        warnings += [state_warning] if state_warning else []
    # What else the start refuses before it looks at the devices (the API
    # socket, the privileged helper, Placement's auth, the metrics address).
    errors += startchecks.start_problems(conf, running)
    # The checks below read values too; one that cannot be read was reported
    # above, naming its file and line, and ends the checks that need it.
    try:
        view = ledger if ledger is None or isinstance(ledger, LedgerView) else LedgerView.of(ledger)
        state = host_state(*ListingConfig.from_conf(conf), ledger=view)
    except exception.ConfigErrors as exc:
        return (
            errors + [e.message for e in exc.errors if _policy_option(e) not in said],
            warnings,
            None,
        )
    except exception.LedgerError:
        raise  # not the configuration: the caller says what it is (a corrupt ledger)
    except exception.AccelAgentException as exc:
        return [*errors, exc.message], warnings, None
    except (ValueError, cfg.Error):
        if not bad_values:
            raise
        return errors, warnings, None
    if ledger is None:
        startchecks.verify_ledger(conf.state_dir)  # LedgerCorrupt, as the start
    # What recovery (the start) and a reload would refuse in the ledger.
    errors += startchecks.owner_problems(conf, state)
    try:
        pool_errors, pool_warnings = _check_vf_pools(conf)
    except (ValueError, cfg.Error):
        if not bad_values:
            raise
        pool_errors, pool_warnings = [], []
    errors += pool_errors
    warnings += pool_warnings
    warnings += list(state.policy.warnings)
    warnings += policy_mod.host_warnings(state.policy, state.snapshot)
    warnings += list(state.notes)
    inventory = state.inventory()
    warnings += list(inventory.warnings)
    warnings += standing_warnings(state.policy, inventory)
    warnings += [f"sysfs: {w}" for w in state.snapshot.warnings]
    if conf.libvirt.define_mdevs and not conf.libvirt.uri:
        warnings.append(
            "[libvirt] define_mdevs is true but [libvirt] uri is empty: there is no libvirt "
            "to define the agent's mdevs in; nothing is defined"
        )
    warnings = list(dict.fromkeys(warnings))
    if strict:
        errors += warnings
        warnings = []
    return errors, warnings, state


def standing_warnings(policy: MdevPolicy, inventory: inventory_mod.Inventory) -> list[str]:
    """Standing layouts a GPU cannot hold (its capacity for the type is less
    than N): the layout keeps what fits, health says it is short."""
    found = []
    for provider in inventory.providers:
        config = policy.config_of(provider.mdev_type)
        if config is not None and config.standing > provider.total:
            found.append(
                f"[mdev_{provider.mdev_type}] standing = {config.standing} cannot fit GPU "
                f"{provider.physical_gpu}: it holds at most {provider.total} "
                f"{provider.mdev_type}; its layout keeps {provider.total}"
            )
    return found


def _policy_option(error: exception.AccelAgentException) -> tuple[str, str] | None:
    """The [mdev_<type>] option of a value the policy refused while reading
    it (value_errors names it with its file and line already)."""
    if isinstance(error, exception.InvalidMdevClass):
        return f"mdev_{error.kwargs.get('mdev_type')}", "mdev_class"
    reason = str(error.kwargs.get("reason", ""))
    for option in ("max_instances", "standing", "reported_by"):
        if isinstance(error, exception.InvalidMdevConfig) and reason.startswith(option + " "):
            mdev_type = reason.partition(" of type ")[2].partition(" ")[0]
            return f"mdev_{mdev_type}", option
    return None


def _check_vf_pools(conf: cfg.ConfigOpts) -> tuple[list[str], list[str]]:
    """The VF pools' configuration (errors) and each configured PF that is not
    a usable SR-IOV PF on this host (warnings: a card may be added later)."""
    from accel_agent.sriov.pools import build_pools
    from accel_agent.sysfs import sriov as sriov_sysfs

    try:
        pools = build_pools(conf)
    except exception.InvalidConfig as exc:
        return [exc.message], []
    warnings = []
    for pool in pools.values():
        for pf in pool.device_addresses:
            try:
                sriov_sysfs.read_pf(conf.sysfs_root, pf)
            except sriov_sysfs.NotAPf as why:
                warnings.append(f"[vf_pool_{pool.name}] device_addresses: {pf}: {why}")
    return [], warnings
