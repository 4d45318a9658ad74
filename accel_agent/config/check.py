"""The one order of checks of a configuration.

``accelctl check-config``, ``accel-agent --check``, the daemon's start and
every reload (SIGHUP, ``POST /v1/reload``) check a configuration with
:func:`check`, in this order:

1. parse: the files as files, oslo.config, the paths every command reads
   (config/load.py, which made the ConfigOpts given here);
2. every value, read once as the daemon reads it, each bad one named by
   file and line (config/values.py);
3. the files as written: unknown sections and options, indented headers,
   an option set twice (config/lint.py); a ``state_dir`` the agent cannot
   write;
4. the policy against the host: the type of every parent, the VF pools, a
   standing layout that cannot fit, and what the host says of them;
5. the start's refusals: its places (another agent, the logging files, the
   API socket, the privileged helper, Placement's auth, the metrics
   address: config/startchecks.py), the ledger's quick_check, what
   recovery would refuse in it, and a mixed-size layout a GPU cannot hold.

Each step reports whatever else is wrong: a value that cannot be read is
named once, with its file and line, and ends only the checks that need it.
So what the check passes the start and a reload take, and what it refuses
they refuse in the same words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from accel_agent import exception
from accel_agent.config import lint, startchecks, values

if TYPE_CHECKING:
    from oslo_config import cfg

    from accel_agent.devices import inventory as inventory_mod
    from accel_agent.devices.ledger import Ledger
    from accel_agent.devices.policy import DevicePolicy
    from accel_agent.wiring import HostState, LedgerView


class Checked(NamedTuple):
    """What :func:`check` found: one-line messages, and the host state it
    looked at (None when the configuration could not be resolved), so that
    a caller reporting on the host need not scan it again."""

    errors: list[str]
    warnings: list[str]
    state: HostState | None


def check(
    conf: cfg.ConfigOpts,
    strict: bool = False,
    ledger: Ledger | LedgerView | None = None,
    running: int | None = None,
) -> Checked:
    """Every check of ``conf`` (parsed by config.load.load_config: step 1),
    in the one order; with ``strict`` the warnings are errors.

    ``ledger``: the daemon passes its own open Ledger (a reload must never
    open it a second time in its process); a LedgerView is used as it is;
    None reads ``state_dir``'s ledger read-only and runs the start's
    quick_check on it.  ``running``: the pid of the agent already running
    with this configuration's socket and ports (check-config beside it, a
    reload inside it), None before a start (config/startchecks.py)."""
    found = _Found()
    # 2. Every value as the daemon reads it, named by file and line.
    found.values(conf)
    # 3. The files as written, and the state directory.
    found.files_as_written(conf)
    # 4. The policy against the host.
    state = found.policy_against_the_host(conf, ledger)
    # 5. What else the start refuses, in its words.
    found.start_refusals(conf, running, state, ledger)
    return found.checked(state, strict)


class _Found:
    """What the steps of :func:`check` found, in the order they found it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        # The values reported by step 2, so that no later step says them again.
        self.bad: list[values.BadValue] = []
        self.said: set[tuple[str, str]] = set()

    def values(self, conf: cfg.ConfigOpts) -> None:
        self.bad = values.bad_values(conf)
        self.errors += [bad.message for bad in self.bad]
        self.said = {(bad.section, bad.option) for bad in self.bad}

    def files_as_written(self, conf: cfg.ConfigOpts) -> None:
        self.warnings += lint.lint(lint.parsed_files(conf))
        if ("DEFAULT", "state_dir") not in self.said:
            state_error, state_warning = lint.state_dir_problem(conf.state_dir)
            self.errors += [state_error] if state_error else []
            self.warnings += [state_warning] if state_warning else []

    def policy_against_the_host(
        self, conf: cfg.ConfigOpts, ledger: Ledger | LedgerView | None
    ) -> HostState | None:
        """The type of every parent and what the host says of the
        configuration; None when the policy cannot be resolved (its errors
        said).  A value that cannot be read was reported by step 2."""
        from oslo_config import cfg

        from accel_agent.wiring import LedgerView, ListingConfig, host_state

        try:
            view = ledger if ledger is None or isinstance(ledger, LedgerView) else LedgerView.of(
                ledger
            )
            state = host_state(*ListingConfig.from_conf(conf), ledger=view)
        except exception.ConfigErrors as exc:
            self.errors += [e.message for e in exc.errors if _policy_option(e) not in self.said]
            return None
        except exception.LedgerError:
            raise  # not the configuration: the caller says what it is (a corrupt ledger)
        except exception.AccelAgentException as exc:
            self.errors.append(exc.message)
            return None
        except (ValueError, cfg.Error):
            if not self.bad:
                raise
            return None
        try:
            pool_errors, pool_warnings = _vf_pool_problems(conf)
        except (ValueError, cfg.Error):
            if not self.bad:
                raise
            pool_errors, pool_warnings = [], []
        self.errors += pool_errors
        self.warnings += pool_warnings
        self.warnings += _host_warnings(conf, state)
        return state

    def start_refusals(
        self,
        conf: cfg.ConfigOpts,
        running: int | None,
        state: HostState | None,
        ledger: Ledger | LedgerView | None,
    ) -> None:
        """The start's places (socket, helper, Placement, metrics...); then,
        once the policy was resolved, the ledger's quick_check (LedgerCorrupt,
        as the start) and what recovery (the start) and a reload would
        refuse in it."""
        self.errors += startchecks.start_problems(conf, running)
        if state is None:
            return
        if ledger is None:
            startchecks.verify_ledger(conf.state_dir)  # LedgerCorrupt, as the start
        # What recovery (the start) and a reload would refuse in the ledger.
        self.errors += startchecks.owner_problems(conf, state)
        # Mixed-size layouts their GPUs cannot hold, asked of NVML.
        fit_errors, fit_warnings = startchecks.layout_fit(conf, state)
        self.errors += fit_errors
        self.warnings += fit_warnings

    def checked(self, state: HostState | None, strict: bool) -> Checked:
        warnings = list(dict.fromkeys(self.warnings))
        if strict:
            return Checked(self.errors + warnings, [], state)
        return Checked(self.errors, warnings, state)


def _host_warnings(conf: cfg.ConfigOpts, state: HostState) -> list[str]:
    """What the policy, the host and its inventory say of the configuration."""
    from accel_agent.devices import policy as policy_mod

    warnings = list(state.policy.warnings)
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
    return warnings


def standing_warnings(policy: DevicePolicy, inventory: inventory_mod.Inventory) -> list[str]:
    """Standing layouts a GPU cannot hold (its capacity for the type is less
    than N): the layout keeps what fits, health says it is short."""
    found = []
    for provider in inventory.providers:
        if policy.gpu_layout_for(provider.physical_gpu) is not None:
            continue  # a mixed-size layout's: its fit is checked by startchecks.layout_fit
        config = policy.config_of(provider.device_type)
        if config is not None and config.standing > provider.total:
            found.append(
                f"[mdev_{provider.device_type}] standing = {config.standing} cannot fit GPU "
                f"{provider.physical_gpu}: it holds at most {provider.total} "
                f"{provider.device_type}; its layout keeps {provider.total}"
            )
    return found


def _policy_option(error: exception.AccelAgentException) -> tuple[str, str] | None:
    """The [mdev_<type>] option of a value the policy refused while reading
    it (step 2 named it with its file and line already)."""
    if isinstance(error, exception.InvalidMdevClass):
        return f"mdev_{error.kwargs.get('mdev_type')}", "mdev_class"
    reason = str(error.kwargs.get("reason", ""))
    if reason.startswith("[gpu_layout_") and reason.endswith("] reported_by must be agent or nova"):
        return reason[1:].partition("]")[0], "reported_by"
    for option in ("max_instances", "standing", "reported_by"):
        if isinstance(error, exception.InvalidMdevConfig) and reason.startswith(option + " "):
            mdev_type = reason.partition(" of type ")[2].partition(" ")[0]
            return f"mdev_{mdev_type}", option
    return None


def _vf_pool_problems(conf: cfg.ConfigOpts) -> tuple[list[str], list[str]]:
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
