"""The core's oslo.config options: what every command of the agent reads.

Option names follow Nova's (``[devices] enabled_mdev_types``, ``[mdev_<type>]``
groups) so that an operator's existing ``nova.conf`` fragment works unchanged.
The per-type groups are dynamic: they exist only for enabled types and are
registered by :func:`register_dynamic_opts` once the enabled list is known.

Mixed-size GPU layouts, ``[devices] enabled_gpu_layouts`` and one
``[gpu_layout_<name>]`` section each (devices/gpu_layouts.py), follow the VF
pools' precedent: an enabled list names the sections, so a section can be
kept in the files while it is off, and oslo.config registers a group only
for a name it was given (its options are found through :func:`named_opts`,
the registry's hook for per-name groups).

A device backend declares its own options (the ``sriov_vf`` backend's VF
pools, ``[devices] enabled_vf_pools`` and ``[vf_pool_<name>]``:
accel_agent/sriov/opts.py), registered through config/registry.py's hook.

The other rooms' options (the privileged helpers', ``[placement]``, oslo.log's)
are registered with these by config/registry.py, the one table of every
room's options; this module imports no other room's but ``[migration]``'s
(which every command reads), so that the ledger, the manager and the
privileged helper can read it without loading the reporter or privsep
(tests/unit/test_house.py).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable

from oslo_config import cfg, types

from accel_agent.config.types import FiniteFloatOpt, ListenAddress

CONF = cfg.CONF

MDEV_CLASS_REGEX = r"^(VGPU|CUSTOM_[A-Z0-9_]+)$"
# QEMU's -global DRIVER.PROPERTY=VALUE; no blanks (each becomes one argument).
QEMU_GLOBAL_REGEX = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+=\S+$"

default_opts = [
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<hostname>",
        help="Name of this compute host. It is the name of the root resource provider "
        "and the prefix of every per-GPU provider name (<host>_pci_0000_84_00_0).",
    ),
    cfg.StrOpt(
        "sysfs_root",
        default="/sys",
        help="Directory shaped like /sys that holds class/mdev_bus and bus/mdev. Point "
        "it at a simulated host (accelctl simulate mount DIR) for demos and tests.",
    ),
    cfg.StrOpt(
        "state_dir",
        default="/var/lib/accel-agent",
        help="Directory for the agent's crash-safe state (the mdev ledger).",
    ),
    cfg.StrOpt(
        "vfio_dev_dir",
        default="",
        sample_default="",
        help="Directory of the VFIO group device nodes (/dev/vfio/<group>). Before "
        "every mdev remove the agent opens the mdev's group node read-only, as libvirt "
        "does: EBUSY means a VM or another process holds the device, and the mdev is "
        "kept instead of removed (the kernel's remove would block until the holder "
        "lets go). Empty: /dev/vfio when sysfs_root is the real /sys, else "
        "<sysfs_root>/vfio, where the simulator serves its stand-ins. A group node the "
        "agent cannot check (no such directory, permission denied) also keeps the mdev.",
    ),
    FiniteFloatOpt(
        "remove_timeout",
        default=30.0,
        min=0.1,
        max=3600.0,
        help="Seconds to wait for an mdev remove. The kernel blocks the write while a VM "
        "holds the device; past this the mdev is kept (free) and the error reported.",
    ),
    FiniteFloatOpt(
        "privileged_call_timeout",
        default=30.0,
        min=1.0,
        max=3600.0,
        help="Seconds every call of a privileged helper (the sysfs writer, the VF network "
        "writer) may take, on top of what the call itself waits for (a remove's "
        "remove_timeout). A helper that misses it, or dies, is killed and started again; "
        "the request gets 503 PrivilegedHelperUnavailable, the operation's intent stays in "
        "the ledger and the daemon's recovery settles it from sysfs. /v1/health is "
        "degraded until a new helper answers.",
    ),
    FiniteFloatOpt(
        "rescan_interval",
        default=60.0,
        min=0.1,
        max=86400.0,
        help="Seconds between two periodic rescans of sysfs by the daemon: the safety net "
        "behind udev events and the agent's own writes. A rescan refreshes the inventory "
        "(and Placement), re-creates recorded mdevs that vanished (parent re-registered, "
        "host reboot) and frees expired migration claims.",
    ),
    cfg.BoolOpt(
        "udev_events",
        default=True,
        help="Listen to kernel uevents (subsystem mdev, and mdev parents announcing "
        "MDEV_STATE) and rescan at once. Only used when sysfs_root is the real /sys; a "
        "simulated tree relies on the agent's own writes and the periodic rescan.",
    ),
    FiniteFloatOpt(
        "event_debounce",
        default=0.2,
        min=0.0,
        max=10.0,
        help="Seconds to wait after an event before rescanning, so that a burst of "
        "events (a driver registering 16 VFs) causes one rescan, not 16.",
    ),
]

devices_opts = [
    cfg.ListOpt(
        "enabled_mdev_types",
        default=[],
        deprecated_name="enabled_vgpu_types",
        help="""
The mdev types the agent manages, in order of preference.

Empty: manage nothing and report no inventory. One type without a
[mdev_<type>] section: that type on every parent that offers it. Several
types: give each a [mdev_<type>] section with device_addresses; the first
type whose section has no device_addresses becomes the default for every
parent not listed elsewhere, and any later address-less type is ignored
with a warning. The same address given to two types (or twice to one)
refuses to start.
""",
    ),
]

devices_opts.append(
    cfg.IntOpt(
        "standing_vf_wait",
        default=120,
        min=0,
        max=3600,
        help="Seconds the start-up waits, before READY, for the GPUs a standing layout "
        "names ([mdev_<type>] standing with device_addresses) to appear: after a reboot "
        "or a driver reload NVIDIA's VFs exist only once nvidia-sriov.service (sriov-manage "
        "-e) enabled them. A GPU still missing then is named in health, and its layout is "
        "placed when it appears. 0: do not wait.",
    )
)

api_opts = [
    cfg.StrOpt(
        "socket_path",
        default="/run/accel-agent/api.sock",
        help="Unix socket of the local HTTP/JSON API.",
    ),
    cfg.StrOpt(
        "socket_group",
        default="",
        help="Group that owns the API socket (mode 0660). Empty: the agent's own group.",
    ),
    cfg.IntOpt(
        "threads",
        default=16,
        min=1,
        # Every worker is a thread started with the daemon (cheroot's pool):
        # 4096 took 4.5 s to start on 2 cores, 7500 took 16 s, and past the
        # kernel's task limit (pid_max, 32768 here, shared by the whole host)
        # the start fails with "can't start new thread".  256 serves far more
        # clients than 2 cores can answer.
        max=256,
        help="Worker threads of the API server: how many requests are served at once. "
        "Reads run concurrently; mutations are serialised by the mdev manager anyway. "
        "A client that sends its request slowly holds one for at most request_timeout "
        "seconds; one that connects and sends nothing holds none.",
    ),
    FiniteFloatOpt(
        "request_timeout",
        default=3.0,
        min=0.1,
        max=600.0,
        help="Seconds a client has to send a whole request (request line, headers and "
        "body) once it has started; past that it gets 408 and is disconnected, however "
        "slowly its bytes trickle in. Idle connections are closed after 10 seconds. "
        "Request headers are limited to 64 KiB (413 beyond).",
    ),
    FiniteFloatOpt(
        "shutdown_timeout",
        default=30.0,
        min=0.0,
        max=3600.0,
        help="On SIGTERM, seconds to let in-flight API requests finish before their "
        "connections are closed.",
    ),
]

libvirt_opts = [
    cfg.StrOpt(
        "uri",
        default="qemu:///system",
        help="libvirt connection URI, used to check that no domain references an mdev "
        "before it is removed and for live migration. Empty: no libvirt on this host.",
    ),
    cfg.ListOpt(
        "qemu_globals",
        default=[],
        item_type=types.String(regex=QEMU_GLOBAL_REGEX),
        sample_default="",
        help="QEMU -global settings (DRIVER.PROPERTY=VALUE) that domains with this host's "
        "mdevs need; `accelctl domain-xml` adds them after the <hostdev> elements as one "
        "<qemu:commandline> element, which goes into <domain> itself. A kernel without "
        "IOMMUFD (Debian's) live-migrates an mdev only with "
        "vfio-pci.x-device-dirty-page-tracking=off, vfio-pci.enable-migration=on (QEMU "
        "otherwise fails the migration: 'Failed to get DMA logging report ... Operation "
        "not supported'). Empty: nothing is added.",
    ),
    cfg.BoolOpt(
        "define_mdevs",
        default=False,
        help="Define every mdev the agent creates in libvirt (a persistent node device, "
        "kept by mdevctl), with autostart off: the agent re-creates its mdevs at boot, "
        "not libvirt. Then `virsh nodedev-list --cap mdev --inactive` and `mdevctl list "
        "-d` show them, as they show Nova's. Removing an mdev undefines it, whatever this "
        "option says; recovery defines what a crash left undefined. Needs [libvirt] uri.",
    ),
    FiniteFloatOpt(
        "call_timeout",
        default=20.0,
        min=1.0,
        max=3600.0,
        help="Seconds every call to libvirt may take (a domain or node-device listing, an "
        "undefine, a define). libvirt's own calls have no timeout: a libvirtd that accepts "
        "and never answers would hold the caller for ever. A call past it is abandoned and "
        "libvirt is 'stalled' in /v1/health (degraded): every later call fails at once until "
        "libvirt answers again (probed once per this many seconds). Meanwhile the mdev "
        "listing shows its libvirt fields null with libvirt_error saying why, a release "
        "that removes mdevs leaves their undefine to recovery, and a takeover (accelctl "
        "adopt --from-libvirt) is refused.",
    ),
]


metrics_opts = [
    cfg.Opt(
        "listen",
        type=ListenAddress(),
        default="",
        help="Also serve GET /metrics over HTTP here, for a Prometheus that cannot scrape "
        "the API's unix socket: PORT (on 127.0.0.1), ADDRESS:PORT or [IPV6]:PORT, with an IP "
        "address, not a name. A non-loopback address (the node's, 0.0.0.0, [::]) is served "
        "as written: the endpoint answers GET /metrics only and changes nothing. Empty: no "
        "HTTP endpoint (the metrics stay on the unix socket). Read at start: a reload that "
        "changes it applies at the next restart.",
    ),
]


def _dynamic_opts(mdev_type: str) -> list[cfg.Opt]:
    return [
        cfg.ListOpt(
            "device_addresses",
            default=[],
            deprecated_group=f"vgpu_{mdev_type}",
            help=f"Parents (PCI addresses such as 0000:84:00.0 or 84:00.0, or a virtual "
            f"parent name such as mtty) that offer {mdev_type}. Empty: {mdev_type} is the "
            "default type when it is the first such type in enabled_mdev_types.",
        ),
        cfg.StrOpt(
            "mdev_class",
            default="VGPU",
            regex=MDEV_CLASS_REGEX,
            max_length=255,
            help="Placement resource class of the inventory of these parents.",
        ),
        cfg.IntOpt(
            "max_instances",
            min=1,
            max=65535,
            help="Most mdevs of this type per physical GPU (SR-IOV VFs of one card "
            "share it). Unset: what the hardware offers.",
        ),
        cfg.IntOpt(
            "standing",
            default=0,
            min=0,
            max=65535,
            help="Devices of this type each physical GPU of it carries at all times, used "
            "or not (a standing layout): N typed VFs on a vendor-VFIO GPU, N mdevs on an "
            "mdev GPU, made after recovery and before the agent reports READY, restored "
            "after a reboot, kept on release (even --remove). Capped by the GPU's "
            "capacity (check-config says when it cannot fit). A lower value or another "
            "type never removes a device in use: it drains. 0: devices exist only while "
            "an instance holds them.",
        ),
        cfg.StrOpt(
            "reported_by",
            default="agent",
            choices=[
                ("agent", "the agent reports these GPUs to Placement and hands their "
                 "devices out (allocate, attach)"),
                ("nova", "Nova's PCI tracker reports and assigns the standing devices "
                 "([pci] device_spec from accelctl nova-pci-config): the agent makes "
                 "them, reports no provider for them and refuses to hand them out"),
            ],
            help="Who counts and assigns this type's devices, so that a GPU is never "
            "reported or handed out twice.",
        ),
    ]


# A layout's name, as it appears in [gpu_layout_<name>] (lower-case, like a VF pool's).
GPU_LAYOUT_NAME_REGEX = r"^[a-z0-9][a-z0-9_-]{0,31}$"
GPU_LAYOUT_PREFIX = "gpu_layout_"

devices_opts.append(
    cfg.ListOpt(
        "enabled_gpu_layouts",
        default=[],
        help="""
Mixed-size vGPU layouts (NVIDIA vGPU 17+ vendor-VFIO GPUs in mixed-size,
"heterogeneous", mode), one [gpu_layout_<name>] section each: vGPUs of
several types on each GPU a layout names, every one on a placement the agent
plans. A layout name is lower-case letters, digits, '_' and '-'. Empty: no
mixed-size layout.
""",
    )
)


def _gpu_layout_opts(name: str) -> list[cfg.Opt]:
    """The options of ``[gpu_layout_<name>]`` (new objects each call:
    oslo.config keeps one per group it is registered in)."""
    return [
        cfg.ListOpt(
            "gpus",
            default=[],
            help=f"The GPUs of layout {name}: their PFs' PCI addresses (0000:21:00.0 or "
            "21:00.0). A GPU belongs to one layout and to no [mdev_<type>] device_addresses.",
        ),
        cfg.ListOpt(
            "vgpus",
            default=[],
            help="The vGPUs each GPU of the layout carries at all times, <type>:<count>, "
            "largest or smallest first as you like (e.g. nvidia-1188:1, nvidia-1186:1, "
            "nvidia-1184:2). Each type is an nvidia-<id> vGPU type of the GPU's VFs, listed "
            "in [devices] enabled_mdev_types. check-config says when the sizes cannot fit "
            "a GPU's placements, and what would.",
        ),
        cfg.ListOpt(
            "mig",
            default=[],
            help="The GPU instances each GPU of a MIG-backed layout is cut into, "
            "<profile>:<count>, profiles as nvidia-smi mig -lgip names them (e.g. "
            "1g.18gb:3, 3g.71gb:1). Required for a layout of MIG-backed vGPU types (each "
            "vGPU on a GPU instance of its type's profile, one per instance; the counts "
            "must match vgpus), empty for a time-sliced mixed-size layout. The agent turns "
            "MIG mode on (only while nothing is in use on the GPU), creates the instances "
            "at planned placements, then types the VFs; check-config says when they cannot "
            "fit the GPU's placements.",
        ),
        cfg.StrOpt(
            "reported_by",
            default="agent",
            choices=[
                ("agent", "the agent reports each type of the layout to Placement, per GPU "
                 "and type, with the layout's count as its total, and hands the devices out"),
                ("nova", "Nova's PCI tracker reports and assigns them ([pci] device_spec "
                 "from accelctl nova-pci-config, each VF under its own type's resource "
                 "class): the agent makes them and reports no provider for them"),
            ],
            help="Who counts and assigns the layout's devices, as [mdev_<type>] reported_by "
            "for a standing layout.",
        ),
    ]


def layout_names(conf: cfg.ConfigOpts) -> list[str]:
    """The enabled layouts whose name a layout may have (a bad name is
    refused by the policy, naming it, and has no section)."""
    return [n for n in dict.fromkeys(conf.devices.enabled_gpu_layouts or [])
            if re.fullmatch(GPU_LAYOUT_NAME_REGEX, n)]


def register_layout_opts(conf: cfg.ConfigOpts, names: Iterable[str] | None = None) -> None:
    """Register ``[gpu_layout_<name>]`` for each enabled layout (idempotent)."""
    for name in names if names is not None else layout_names(conf):
        group = GPU_LAYOUT_PREFIX + name
        for opt in _gpu_layout_opts(name):
            if group not in conf or opt.dest not in conf[group]:
                conf.register_opt(opt, group=group)


def named_opts(conf: cfg.ConfigOpts) -> list[tuple[str, list[cfg.Opt]]]:
    """The per-name groups of this room that ``conf`` enables (the
    registry's hook): ``[gpu_layout_<name>]`` of each enabled layout.  The
    ``[mdev_<type>]`` groups are registered by :func:`register_dynamic_opts`."""
    return [(GPU_LAYOUT_PREFIX + n, _gpu_layout_opts(n)) for n in layout_names(conf)]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the core's options and ``[migration]``'s on ``conf`` (every
    command reads them; idempotent).  Everything a process of the agent
    reads: config.registry.register."""
    from accel_agent.migration import opts as migration_opts

    for group, opts in migration_opts.list_opts():
        conf.register_opts(opts, group=group)
    conf.register_opts(default_opts)
    conf.register_opts(devices_opts, group="devices")
    conf.register_opts(api_opts, group="api")
    conf.register_opts(libvirt_opts, group="libvirt")
    conf.register_opts(metrics_opts, group="metrics")


def register_dynamic_opts(conf: cfg.ConfigOpts, types: Iterable[str] | None = None) -> None:
    """Register ``[mdev_<type>]`` for each enabled type (idempotent)."""
    for mdev_type in types if types is not None else conf.devices.enabled_mdev_types:
        group = f"mdev_{mdev_type}"
        for opt in _dynamic_opts(mdev_type):
            if group not in conf or opt.dest not in conf[group]:
                conf.register_opt(opt, group=group)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """The options this module declares (the generator's whole list, which
    adds the other rooms' options, is config.registry.list_opts).

    The per-type group is shown once, as ``mdev_$(mdev_type)`` (Nova writes
    ``mdev_$(MDEV_TYPE)``; the generator lower-cases group names).
    """
    return [
        ("DEFAULT", default_opts),
        ("devices", devices_opts),
        ("mdev_$(mdev_type)", _dynamic_opts("$(mdev_type)")),
        ("gpu_layout_$(layout)", _gpu_layout_opts("$(layout)")),
        ("api", api_opts),
        ("libvirt", libvirt_opts),
        ("metrics", metrics_opts),
    ]


register_opts(CONF)
