"""The daemon's agent, without threads: what the API serves and the service's
threads drive (accel_agent.service runs them: the API server, the rescan
scheduler, the Placement loop, the udev watcher, signals and sd_notify).

* :mod:`~accel_agent.daemon.core`: :class:`~accel_agent.daemon.core.AgentCore`,
  the API's backend, composed of the parts below and the device manager (the
  use cases: ``core.devices``);
* :mod:`~accel_agent.daemon.listings`: the listings' encoded bodies, kept while
  the host does not change;
* :mod:`~accel_agent.daemon.rescans`: a rescan (sysfs + ledger -> inventory,
  metrics, recovery of vanished devices and of interrupted work, expired
  claims) and the recovery's bookkeeping;
* :mod:`~accel_agent.daemon.reloads`: a configuration reload, checked whole and
  applied under the manager's lock, or refused;
* :mod:`~accel_agent.daemon.health`: the health document;
* :mod:`~accel_agent.daemon.counts`: what the last rescan saw, and the counts
  and series the metrics publish;
* :mod:`~accel_agent.daemon.logs`: oslo.log's set-up, and the logging options a
  reload applies (``debug``, ``log_config_append``).
"""
