"""Every option of the agent, for ``oslo-config-generator`` (namespace
accel_agent) and the generated config reference.

Kept out of conf.py so that the core's options module imports no other
room's: the ledger and the manager read conf.py, and must not pull in the
privileged writer, the migration code or the Placement reporter through it.
"""

from __future__ import annotations

from oslo_config import cfg


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    # Imported here: privileged pulls in oslo.privsep, the reporter
    # keystoneauth1; the generator is the only caller that needs them all.
    from accel_agent import conf, privileged
    from accel_agent.migration import opts as migration_opts
    from accel_agent.reporting import placement_opts

    return [
        *conf.list_opts(),
        *privileged.list_opts(),
        *migration_opts.list_opts(),
        *placement_opts.list_opts(),
    ]
