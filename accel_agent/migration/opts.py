"""``[migration]`` options: claim lifetime and the version floors of mdev live migration.

Declared here, registered with the core's (config/options.py: every command
reads them) and listed in config/registry.py's table of every room's options.
"""

from __future__ import annotations

from oslo_config import cfg

GROUP = "migration"

migration_opts = [
    cfg.IntOpt(
        "claim_timeout",
        default=600,
        min=1,
        max=86400,
        help="Seconds a destination claim of mdevs lives without commit or abort; then the "
        "periodic task frees the mdevs (a migration that never finished must not hold them).",
    ),
    cfg.StrOpt(
        "min_libvirt_version",
        default="8.6.0",
        help="Oldest libvirt that can live-migrate mdevs (Nova's floor). Lower it only for a "
        "distribution that backported the support.",
    ),
    cfg.StrOpt(
        "min_qemu_version",
        default="8.1.0",
        help="Oldest QEMU that can live-migrate VFIO mdevs (Nova's floor).",
    ),
    cfg.StrOpt(
        "min_kernel_version",
        default="5.18.0",
        help="Oldest kernel with the VFIO migration uAPI v2 that vGPU migration needs.",
    ),
]


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, migration_opts)]
