"""Keep this host's per-GPU resource providers in OpenStack Placement.

The agent owns a subtree: one child provider per physical GPU (``Provider``
from :mod:`accel_agent.devices.inventory`) under the host's root provider, which
nova-compute normally creates.  A sync reads what Placement holds, plans the
difference and writes only that; one that would find Placement as the last
one left it sends nothing, so a steady state costs one GET (the tree) every
``[placement] refresh_interval`` and no writes (docs/operations.md, "Scale").

One job per module, in the order a sync uses them:

* :mod:`.reporter` — :class:`PlacementReporter`, what the daemon holds: one
  sync at a time, read -> plan -> apply, a provider redriven after a
  generation conflict, the whole sync failed when Placement is unavailable;
* :mod:`.subtree` — what Placement holds under the root, as
  :class:`~.plan.ProviderState`, with the generation cache;
* :mod:`.plan` — the pure plan: desired vs actual -> the writes, in order
  (ownership, takeover, no ``total: 0``, draining before deleting);
* :mod:`.writer` — one planned action sent, and logged;
* :mod:`.client` — the HTTP side: the keystoneauth session, each request at
  the pinned microversion, failures as the agent's exceptions;
* :mod:`.answers` — an answer is input: read with a bound, parsed, checked
  for the fields used before any is used;
* :mod:`.memory` — what the last exact sync knew: when a sync sends nothing;
* :mod:`.health` — the loop's state: failures, jittered back-off, the health document;
* :mod:`.result` — what one sync did.

The reporter logs to the logger it is given; by default, and for the
client's line per request always, to ``accel_agent.reporting.placement``,
the name it has always logged under.
"""

from accel_agent.reporting.placement.reporter import PlacementReporter
from accel_agent.reporting.placement.result import SyncResult

__all__ = ["PlacementReporter", "SyncResult"]
