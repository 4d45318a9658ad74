"""What both console scripts do first: load the config, validate it against
the host, and say clearly what is wrong."""

from __future__ import annotations

import os
from dataclasses import dataclass

from oslo_config import cfg

from accel_agent import conf as agent_conf
from accel_agent import exception
from accel_agent.mdev import inventory as inventory_mod
from accel_agent.mdev import policy as policy_mod
from accel_agent.sysfs import scanner
from accel_agent.sysfs.model import HostSnapshot

DEFAULT_CONFIG_FILE = "/etc/accel-agent/accel-agent.conf"


def load_config(
    config_files: list[str],
    config_dirs: list[str],
    prog: str,
    conf: cfg.ConfigOpts | None = None,
) -> cfg.ConfigOpts:
    """Parse the oslo.config files into ``conf`` (the global CONF by default).

    Without ``--config-file`` the packaged location is read when present, so
    an operator on a configured host can just run ``accelctl types``.
    """
    conf = conf or agent_conf.CONF
    argv: list[str] = []
    for path in config_files:
        argv += ["--config-file", path]
    for path in config_dirs:
        argv += ["--config-dir", path]
    defaults = [DEFAULT_CONFIG_FILE] if not argv and os.path.exists(DEFAULT_CONFIG_FILE) else []
    try:
        conf(argv, project="accel-agent", prog=prog, default_config_files=defaults)
    except cfg.ConfigFilesNotFoundError as exc:
        raise exception.InvalidConfig(reason=f"config file not found: {exc.config_files}") from exc
    except (cfg.ConfigFileParseError, cfg.Error) as exc:
        raise exception.InvalidConfig(reason=str(exc)) from exc
    return conf


@dataclass(frozen=True)
class HostState:
    policy: policy_mod.MdevPolicy
    snapshot: HostSnapshot
    host: str

    def inventory(self, free_uuids: frozenset[str] = frozenset()) -> inventory_mod.Inventory:
        return inventory_mod.compute_inventory(self.snapshot, self.policy, self.host, free_uuids)


def host_state(conf: cfg.ConfigOpts) -> HostState:
    """Policy (raises ConfigErrors) and a fresh scan of ``sysfs_root``."""
    policy = policy_mod.build_policy(conf)
    snapshot = scanner.scan(conf.sysfs_root)
    return HostState(policy=policy, snapshot=snapshot, host=conf.host)


def validate(conf: cfg.ConfigOpts, strict: bool = False) -> tuple[list[str], list[str]]:
    """Everything ``check-config`` and the daemon's start-up check:
    (errors, warnings), each a list of one-line messages."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        state = host_state(conf)
    except exception.ConfigErrors as exc:
        return [e.message for e in exc.errors], warnings
    except exception.AccelAgentException as exc:
        return [exc.message], warnings
    warnings += list(state.policy.warnings)
    warnings += policy_mod.host_warnings(state.policy, state.snapshot)
    warnings += list(state.inventory().warnings)
    warnings += [f"sysfs: {w}" for w in state.snapshot.warnings]
    warnings = list(dict.fromkeys(warnings))
    if strict:
        errors += warnings
        warnings = []
    return errors, warnings
