"""What the daemon and accelctl both build from a configuration: the
listings' view of it (cached between runs by config/cache.py), the host
state (policy, scan, ledger) the listings and the check read, the ledger's
read-only views, the device backends and the device manager.

It names no backend: every registered one is loaded (accel_agent.backends)
and builds what it needs from the configuration itself
(``DeviceBackend.from_conf``: the ``sriov_vf`` backend its VF pools);
tests/unit/test_house.py holds it to that.

The configuration itself (its options, loading, values, lint and the one
order of checks) is the configuration room's, accel_agent/config/, whose
check reads the host state from here.  A room of its own so that the daemon
(service.py) does not reach into the console scripts' room (cmd/) for its
wiring."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accel_agent import exception
from accel_agent.config import cache as config_cache
from accel_agent.config.files import config_sources
from accel_agent.devices import policy as policy_mod
from accel_agent.devices.policy import (
    DevicePolicy,
    PolicyInputs,
    read_policy_inputs,
    resolve_policy,
)
from accel_agent.sysfs.model import HostSnapshot

# oslo.config is imported where a command loads the configuration: the
# read-only listings usually get by without it (config/cache.py).  The
# inventory is imported where used: accelctl's plain listings
# (cmd/plain_listing.py) do not need it.
if TYPE_CHECKING:
    from collections.abc import Iterable

    from oslo_config import cfg

    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.ledger import DeviceRecord, Ledger


@dataclass(frozen=True)
class ListingConfig:
    """The configuration as the read-only listings see it: what config/cache.py
    keeps between runs (as :meth:`to_dict`).  Kept here, not there: it is made
    of the policy's inputs (the devices room), which the plain listings'
    path through the cache must not import."""

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

    def policy(self, errors: list[exception.AccelAgentException] | None = None) -> DevicePolicy:
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


def build_backends(conf: cfg.ConfigOpts, writer=None, net=None):
    """Every registered device backend (accel_agent.backends.classes:
    stevedore, the accel_agent.backends entry points, whatever package
    registers them), built from ``conf``: the backend's options registered
    on it first (config/registry.py's hook, ``DeviceBackend.opts``: accelctl
    acting directly has registered only the core's), then
    ``DeviceBackend.from_conf``, writing through ``writer`` and, for a VF's
    network settings, ``net`` (the CAP_NET_ADMIN privsep helper when None;
    tests give a stand-in).  BackendNotLoaded, or a backend's own
    configuration error (InvalidVfPoolConfig), refuses."""
    from types import MappingProxyType

    from accel_agent import backends
    from accel_agent.config import registry

    found = backends.classes()
    for backend in found.values():
        registry.register_backend(conf, backend)
    return MappingProxyType(
        {name: backend.from_conf(conf, writer, net) for name, backend in found.items()}
    )


def attach_requests(manager, raw: Any) -> list:
    """An attach call's requests checked against the pools ``manager``'s
    backends serve (InvalidAttachRequest naming the field); nothing is
    done.  The pools are the ones the backends were built with: a reloaded
    config's pools apply at the next start, so requests are not checked
    against them."""
    from accel_agent import attach_requests as parser

    pools = {
        name: pool
        for backend in manager.backends.values()
        for name, pool in backend.served_pools().items()
    }
    return parser.parse(raw, pools)


def build_manager(
    conf: cfg.ConfigOpts, writer=None, on_step=None, net=None, upgrade_ledger: bool = True
):
    """The lifecycle manager for this host: ledger in ``state_dir``, writes
    through the privsep daemon (started with the same config files).

    ``upgrade_ledger``: migrate a ledger of an older schema (after a backup
    copy), as the daemon does at its start; accelctl's offline commands pass
    False and get LedgerSchemaOld naming ``accelctl ledger upgrade``."""
    from accel_agent.config import registry
    from accel_agent.devices import domains, ledger, manager, writers
    from accel_agent.nvml import opts as nvml_opts

    # The manager reads [nvml] call_timeout (a mixed-size layout's GPUs):
    # accelctl registers no room it does not need, so this one is registered
    # here, as each backend's is in build_backends.
    registry.register_room(conf, nvml_opts)
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
            backends=build_backends(conf, writer, net),
            define_mdevs=conf.libvirt.define_mdevs,
            nvml_conf=conf,
        )
    except BaseException:
        book.close()
        raise


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
        connection to it in its process, docs/design.md §5.2)."""
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
    policy: policy_mod.DevicePolicy
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
    from accel_agent.config.load import load_config

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
    read-only.  The scan is every backend's as a read-only command sees
    them (accel_agent.backends.for_reading: the built-in ones, or every
    registered one when another package registers one)."""
    from accel_agent import backends
    from accel_agent.backends.host import scan_host

    policy = listing.policy(errors)
    notes: list[str] = []
    snapshot = scan_host(
        listing.sysfs_root,
        backends.for_reading(),
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
