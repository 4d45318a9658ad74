"""``[placement]`` options: the reporter's own knobs plus keystoneauth1's.

keystoneauth1's session, auth and adapter options live in the same group, as
in Nova's ``[placement]``, so an operator can copy Nova's section verbatim.
For a Placement running with ``auth_strategy = noauth2`` (tests, labs) use::

    [placement]
    enabled = true
    auth_type = admin_token
    endpoint = http://127.0.0.1:8778
    token = admin

``admin_token`` is keystoneauth1's built-in ``token_endpoint.Token`` plugin:
it sends ``X-Auth-Token`` and uses ``endpoint`` for every request without a
service catalog.  ``auth_type = none`` is no substitute: it sends no token,
and noauth2 Placement answers 401 to that.

keystoneauth1.loading costs about 0.1 s to import, so it is imported inside
the functions that need it, never at module import.

Declared here, registered by config/registry.py (the one table of every
room's options).
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg, types

from accel_agent.config.types import FiniteFloat

GROUP = "placement"

# Nova's defaults for the adapter: look Placement up in the catalog under this
# service type, preferring the internal endpoint.
_ADAPTER_DEFAULTS: dict[str, Any] = {
    "service_type": "placement",
    "valid_interfaces": ["internal", "public"],
}
# keystoneauth's own default is no timeout at all, which would let a hung
# Placement stall the agent's periodic task forever.
_SESSION_DEFAULTS: dict[str, Any] = {"timeout": 30}
# The agent's ranges for keystoneauth's numeric session and adapter options
# (keystoneauth gives none: "timeout = nan" or "connect_retries = -5" would
# be read at the first sync).  (min, max) by option.
KEYSTONEAUTH_BOUNDS: dict[str, tuple[float, float]] = {
    "timeout": (0.1, 3600.0),
    "connect_retries": (0, 100),
    "connect_retry_delay": (0.0, 3600.0),
    "status_code_retries": (0, 100),
    "status_code_retry_delay": (0.0, 3600.0),
    "retriable_status_codes": (100, 599),  # each item: an HTTP status code
}

placement_opts = [
    cfg.BoolOpt(
        "enabled",
        default=False,
        help="Report one resource provider per physical GPU to OpenStack Placement.",
    ),
    cfg.BoolOpt(
        "create_root_provider",
        default=False,
        help="Create the root provider (named [DEFAULT] host) when it does not exist. "
        "Leave false when nova-compute runs on this host: it owns the root provider, "
        "and the agent waits (and reports 'root provider <host> not found') until "
        "Nova has created it.",
    ),
    cfg.BoolOpt(
        "take_over_providers",
        default=False,
        help="Manage the per-GPU providers under the root that carry the names the agent "
        "gives (Nova's: <host>_pci_0000_84_00_0) though the agent did not create them: "
        "it adds its owner trait and keeps their UUIDs, so the allocations Nova made "
        "against them stay valid. Set it when taking a host over from Nova (accelctl "
        "adopt --from-libvirt), once Nova no longer reports vGPU inventory (its [devices] "
        "enabled_mdev_types emptied). Left false, such a provider is reported as not the "
        "agent's and never touched.",
    ),
    cfg.IntOpt(
        "sync_interval",
        default=60,
        min=1,
        max=86400,
        help="Seconds between two Placement synchronisations. Inventory changes "
        "(mdevs created or removed, GPUs appearing) also trigger a sync.",
    ),
    cfg.IntOpt(
        "refresh_interval",
        default=300,
        min=0,
        max=86400,
        help="At most this many seconds (each wait drawn between half of it and all of it, so "
        "that a fleet's agents do not read together) between two reads of the providers in "
        "Placement while the host's inventory does not change. A sync every sync_interval "
        "sends nothing in between: the agent remembers what it last made exact (as Nova's "
        "[compute] resource_provider_association_refresh, 300 s). A change someone else makes "
        "to the agent's providers is undone at the next read. An inventory change, a failed "
        "sync or a provider waiting on its allocations (drained) is synchronised at once and "
        "at every sync_interval. 0: read Placement at every sync.",
    ),
    cfg.IntOpt(
        "max_conflict_retries",
        default=4,
        min=0,
        max=100,
        help="How many times one provider's update is redriven from fresh data after "
        "a generation conflict (409 placement.concurrent_update) within one sync. "
        "After that the provider is reported as failed and retried at the next sync; "
        "the other providers are synchronised regardless.",
    ),
    cfg.IntOpt(
        "max_backoff",
        default=600,
        min=1,
        max=86400,
        help="Upper bound, in seconds, of the exponential back-off between attempts "
        "while Placement keeps failing (the first retry waits sync_interval).",
    ),
]


def _keystoneauth_opts() -> list[cfg.Opt]:
    """keystoneauth1's session and adapter options with the agent's defaults."""
    from keystoneauth1 import loading as ks_loading

    session = ks_loading.get_session_conf_options()
    adapter = ks_loading.get_adapter_conf_options(include_deprecated=False)
    # The get_* functions build new Opt objects on each call, so changing their
    # defaults here cannot leak into another service's registration.
    cfg.set_defaults(session, **_SESSION_DEFAULTS)
    cfg.set_defaults(adapter, **_ADAPTER_DEFAULTS)
    opts = session + adapter
    for opt in opts:
        if opt.dest in KEYSTONEAUTH_BOUNDS:
            _bound(opt, *KEYSTONEAUTH_BOUNDS[opt.dest])
    return opts


def _bound(opt: cfg.Opt, low: float, high: float) -> None:
    """Give one of keystoneauth's numeric options the agent's range (for a
    float, a type that refuses nan and inf; for a list, to each item)."""
    if isinstance(opt.type, types.List):
        opt.type = types.List(item_type=types.Integer(min=int(low), max=int(high)))
        return
    opt.type = (FiniteFloat if isinstance(opt.type, types.Float) else types.Integer)(
        min=low, max=high
    )


def registered_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """What a process registers of ``[placement]`` (config/registry.py): the
    reporter's own options and keystoneauth1's session and adapter options.
    keystoneauth registers ``auth_type``/``auth_section`` itself (following
    ``auth_section``), and a plugin's own options (endpoint, token, username,
    ...) when the plugin is loaded; the sample lists those of two plugins
    (:func:`list_opts`)."""
    return [(GROUP, [*placement_opts, *_keystoneauth_opts()])]


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """The sample's ``[placement]`` (config/registry.py's list_opts, which
    oslo-config-generator reads).

    Shows the options of the two auth plugins an operator is expected to use:
    ``password`` (Keystone) and ``admin_token`` (noauth2 Placement).
    """
    from keystoneauth1 import loading as ks_loading

    opts: list[cfg.Opt] = [*placement_opts, *_keystoneauth_opts()]
    opts += ks_loading.get_auth_common_conf_options()
    for plugin in ("password", "admin_token"):
        opts += ks_loading.get_auth_plugin_conf_options(plugin)
    unique: dict[str, cfg.Opt] = {}
    for opt in opts:
        # Plugins share option names (auth-url, ...); the generator wants each once.
        unique.setdefault(opt.dest, opt)
    return [(GROUP, list(unique.values()))]
