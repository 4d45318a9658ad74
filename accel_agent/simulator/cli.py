"""``accelctl simulate ...``: give any machine a simulated GPU host.

``register(subparsers)`` adds the ``simulate`` command to accelctl's argparse
parser; ``main()`` runs the same commands standalone (``python -m
accel_agent.simulator``, which is also how ``mount`` starts its server).

  simulate mount DIR [--profile P ...] [--gpus N] [--vfs N] [--nics N] [--parents N]
                     [--types M] [--spec FILE.json] [--foreground] [--remove-timeout S]
                     [--timeout S]
  simulate umount DIR | reboot DIR [--vfs-disabled] | status DIR [--json]
  simulate enable-vfs DIR PF|ALL | driver-reload DIR [--driver NAME]
  simulate hold DIR UUID|ADDR | release DIR UUID|ADDR
  simulate unregister DIR PARENT | register DIR PARENT
  simulate fail-next-create DIR ERRNO [--parent P] [--type T]
  simulate fail-next-vgpu-write DIR ERRNO [--vf ADDR] [--type-id N]
  simulate accept-held-vgpu-destroy DIR [--refuse]
  simulate gpu-reset DIR PF
  simulate materialise DIR [profile options]      (static tree, no process)
  simulate spec [profile options]                 (print the JSON spec)
  simulate profiles                               (list profiles and their options)

Without ``--profile`` or ``--spec`` the host is the ``nvidia-pf`` profile.
Exit status: 0 ok, 1 error (message on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from accel_agent import exception
from accel_agent.simulator import control
from accel_agent.simulator.profiles import PROFILES, build_spec, profile_options
from accel_agent.simulator.spec import HostSpec

DEFAULT_PROFILE = "nvidia-pf"


def _fail(message: str) -> int:
    print(f"accelctl simulate: error: {message}", file=sys.stderr)
    return 1


def _spec(args: argparse.Namespace) -> HostSpec:
    options = {"gpus": args.gpus, "vfs": args.vfs, "nics": args.nics, "parents": args.parents,
               "types": args.types}
    profiles = list(args.profile or [])
    specs: list[HostSpec] = []
    if args.spec:
        specs.append(HostSpec.load(args.spec))
    if not profiles and (not args.spec or any(v is not None for v in options.values())):
        profiles = [DEFAULT_PROFILE]
    if profiles:
        specs.append(build_spec(profiles, **options))
    return HostSpec.merge(specs)


def _handled(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Every expected failure becomes one line on stderr and exit status 1."""
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except exception.AccelAgentException as exc:
            return _fail(exc.message)
        except OSError as exc:
            return _fail(f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror}")
    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


# ------------------------------------------------------------------ commands


@_handled
def cmd_mount(args: argparse.Namespace) -> int:
    """Mount a simulated host; returns once the mount is live (or serves in the
    foreground until stopped)."""
    reason = control.fuse_unavailable_reason()
    if reason:
        return _fail(f"FUSE is not available: {reason}")
    spec = _spec(args)
    mp = control.canonical_mountpoint(args.directory)
    if control.is_mounted(mp):
        return _fail(f"{mp} is already a mountpoint")
    if os.path.lexists(mp) and not os.path.isdir(mp):
        return _fail(f"mountpoint {mp} is not a directory")
    os.makedirs(mp, exist_ok=True)
    if args.foreground:
        # accelctl may have configured logging already (basicConfig is then a no-op):
        # our logger's own level still lets the start/stop lines through.
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("accel_agent.simulator").setLevel(
            logging.DEBUG if args.debug else logging.INFO)
        control.serve(spec, mp, remove_block_timeout=args.remove_timeout, debug=args.debug)
        return 0
    from accel_agent.simulator import daemon

    proc = daemon.spawn(spec, mp, remove_block_timeout=args.remove_timeout)
    status = daemon.wait_mounted(proc, mp, timeout=args.timeout)
    paths = control.instance_paths(mp)
    print(f"mounted {', '.join(spec.profiles) or 'custom spec'} at {mp} "
          f"(pid {status['pid']}, control {paths['socket']}, log {paths['log']})")
    return 0


@_handled
def cmd_umount(args: argparse.Namespace) -> int:
    from accel_agent.simulator import daemon

    daemon.stop(args.directory, timeout=args.timeout)
    return 0


def _client(args: argparse.Namespace) -> control.SimulatorClient:
    return control.SimulatorClient.for_mountpoint(args.directory)


@_handled
def cmd_reboot(args: argparse.Namespace) -> int:
    _client(args).reboot(vfs_disabled=args.vfs_disabled)
    return 0


@_handled
def cmd_enable_vfs(args: argparse.Namespace) -> int:
    # Worded like NVIDIA's sriov-manage, whose output operators know.
    result = _client(args).enable_vfs(args.pf)
    for pf in result.get("enabled", []):
        print(f"Enabled VFs on {pf}")
    for pf in result.get("already_enabled", []):
        print(f"GPU at {pf} already has VFs enabled.")
    return 0


@_handled
def cmd_driver_reload(args: argparse.Namespace) -> int:
    bound = _client(args).driver_reload(args.driver)
    print(f"reloaded {args.driver}: {len(bound)} device(s) bound again"
          f"{' (' + ', '.join(bound) + ')' if bound else ''}")
    return 0


@_handled
def cmd_hold(args: argparse.Namespace) -> int:
    _client(args).hold(args.uuid, after_probe=args.after_probe)
    return 0


@_handled
def cmd_release(args: argparse.Namespace) -> int:
    _client(args).release(args.uuid)
    return 0


@_handled
def cmd_unregister(args: argparse.Namespace) -> int:
    _client(args).unregister(args.parent)
    return 0


@_handled
def cmd_register(args: argparse.Namespace) -> int:
    _client(args).register(args.parent)
    return 0


@_handled
def cmd_fail_next_create(args: argparse.Namespace) -> int:
    _client(args).fail_next_create(args.errno, args.parent, args.type_id)
    return 0


@_handled
def cmd_fail_next_vgpu_write(args: argparse.Namespace) -> int:
    _client(args).fail_next_vgpu_write(args.errno, args.vf, args.type_id)
    return 0


@_handled
def cmd_accept_held_vgpu_destroy(args: argparse.Namespace) -> int:
    _client(args).accept_held_vgpu_destroy(not args.refuse)
    return 0


@_handled
def cmd_gpu_reset(args: argparse.Namespace) -> int:
    _client(args).gpu_reset(args.pf)
    print(f"reset GPU {args.pf}")
    return 0


@_handled
def cmd_status(args: argparse.Namespace) -> int:
    status = _client(args).status(counters=True)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    print(f"mountpoint {status['mountpoint']}  pid {status['pid']}  "
          f"mounted {'yes' if status['mounted'] else 'no'}  boot {status['boot_count']}  "
          f"profiles {', '.join(status['profiles']) or '-'}")
    for p in status["parents"]:
        avail = " ".join(f"{t}={n}" for t, n in p.get("available", {}).items())
        state = "" if p["registered"] else "  (unregistered)"
        print(f"  {p['name']:<14} {p['policy']:<18} mdevs {p['mdevs']:<3} {avail}{state}")
    for m in status["mdevs"]:
        print(f"  mdev {m['uuid']} {m['parent']} {m['type_id']} group {m['iommu_group']}"
              f"{'  held' if m['held'] else ''}")
    for b in status["blocked_removes"]:
        print(f"  blocked remove of {b['uuid']}: {b['outcome']}")
    _print_pci(status)
    return 0


def _print_pci(status: dict[str, Any]) -> None:
    """SR-IOV PFs, typed VFs, and functions off their own driver (the rest is quiet)."""
    vgpus_of: dict[str, int] = {}
    for v in status.get("vgpus", []):
        vgpus_of[v["physfn"]] = vgpus_of.get(v["physfn"], 0) + 1
    for pf in status.get("sriov_pfs", []):
        extra = f"  netdev {pf['netdev']}" if pf["netdev"] else ""
        if pf.get("vgpu") and not pf.get("vfs_enabled", True):
            extra += "  VFs disabled (simulate enable-vfs)"
        vgpus = f"  vgpus {vgpus_of[pf['address']]}" if pf["address"] in vgpus_of else ""
        print(f"  pf {pf['address']} {pf['driver'] or '(unbound)'}  vfs "
              f"{pf['num_vfs']}/{pf['total_vfs']}{vgpus}{extra}")
    for v in status.get("vgpus", []):
        print(f"  vgpu {v['address']} {v['type_id']} {v['name']} group {v['iommu_group']}"
              f"{'  held' if v['held'] else ''}")
    _print_nvidia(status)
    for f in status.get("vfs", []) + status.get("pci_functions", []):
        if (f["driver"] == f["default_driver"] and f["driver_override"] is None
                and not f["held"]):
            continue
        override = f"  override {f['driver_override']}" if f["driver_override"] is not None else ""
        print(f"  pci {f['address']} {f['driver'] or '(unbound)'} group {f['iommu_group']}"
              f"{override}{'  held' if f['held'] else ''}")


def _print_nvidia(status: dict[str, Any]) -> None:
    """What NVML would say of each vGPU 17+ GPU: mixed-size mode, MIG, GPU instances."""
    for gpu in status.get("nvidia_gpus", []):
        mig, mig_text = gpu["mig"], ""
        if mig is not None:
            mig_text = f"  mig {'on' if mig['current'] else 'off'}"
            if mig["pending"] != mig["current"]:
                mig_text += f" (pending {'on' if mig['pending'] else 'off'})"
        print(f"  gpu {gpu['address']} mixed-size {'on' if gpu['heterogeneous'] else 'off'}"
              f"{'' if gpu['heterogeneous_capable'] else ' (not capable)'}{mig_text}")
        for gi in gpu["gpu_instances"]:
            start, size = gi["placement"]
            print(f"  gpu-instance {gpu['address']} {gi['gpu_instance_id']} {gi['name']} "
                  f"at {start}:{size}")
        for v in gpu["vgpus"]:
            where = (f"gpu-instance {v['gpu_instance_id']}" if v["gpu_instance_id"] is not None
                     else f"placement {v['placement_id']}")
            print(f"  placed {v['vf']} {v['type_id']} {where}")
    for failed in status.get("vgpu_boot_failures", []):
        print(f"  boot failed on {failed['vf']}: {failed['reason']}")


@_handled
def cmd_materialise(args: argparse.Namespace) -> int:
    from accel_agent.simulator.static import materialise

    root = materialise(_spec(args), args.directory)
    print(root)
    return 0


@_handled
def cmd_spec(args: argparse.Namespace) -> int:
    print(_spec(args).to_json())
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    for name, builder in PROFILES.items():
        opts = ", ".join(f"--{o}" for o in profile_options(name)) or "no options"
        doc = (builder.__doc__ or "").strip().splitlines()[0]
        print(f"{name:<13} {opts:<22} {doc}")
    return 0


# ------------------------------------------------------------------ parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value}")
    return value


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="append", choices=sorted(PROFILES), metavar="PROFILE",
                   help=f"host profile, repeatable ({', '.join(PROFILES)}); "
                        f"default {DEFAULT_PROFILE}")
    p.add_argument("--gpus", type=_positive,
                   help="GPUs (nvidia-pf, nvidia-sriov, nvidia-vfio; nvidia-l4, nvidia-h200, "
                        "nvidia-a100-mig: <= 8)")
    p.add_argument("--vfs", type=_positive,
                   help="VFs per GPU (nvidia-sriov; nvidia-vfio, nvidia-l4, nvidia-h200: "
                        "enabled at boot, <= 32; nvidia-a100-mig: <= 16)")
    p.add_argument("--nics", type=_positive, help="SR-IOV NIC ports (igb-sriov)")
    p.add_argument("--parents", type=_positive, help="parents (synthetic)")
    p.add_argument("--types", type=_positive, help="types per parent (synthetic)")
    p.add_argument("--spec", metavar="FILE.json", help="a HostSpec JSON file (added to profiles)")


def add_commands(parser: argparse.ArgumentParser) -> None:
    """The simulate actions, on ``parser`` (accelctl's ``simulate`` or main())."""
    sub = parser.add_subparsers(dest="simulate_command", metavar="ACTION")

    def usage(args: argparse.Namespace) -> int:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: an action is required", file=sys.stderr)
        return 2

    parser.set_defaults(func=usage)

    def action(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
               directory: str | None = "mountpoint") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if directory:
            p.add_argument("directory", metavar="DIR", help=directory)
        p.set_defaults(func=func)
        return p

    p = action("mount", cmd_mount, "mount a simulated host (FUSE) and return once it is live")
    _spec_args(p)
    p.add_argument("--foreground", action="store_true", help="serve in this process")
    p.add_argument("--remove-timeout", type=_seconds, default=None,
                   help="give up a remove blocked on a held mdev after S seconds "
                        "(EINTR; default 60)")
    p.add_argument("--timeout", type=_seconds, default=30.0,
                   help="seconds to wait for the mount (default 30)")
    p.add_argument("--debug", action="store_true", help="log every FUSE request (foreground)")
    p = action("umount", cmd_umount, "stop the simulator and unmount")
    p.add_argument("--timeout", type=_seconds, default=15.0)
    p = action("reboot", cmd_reboot, "simulate a host reboot: every mdev vanishes; VFs, "
               "drivers and driver_override return to the boot state (the VFs the host "
               "booted with are enabled again unless --vfs-disabled); every vGPU type is 0")
    p.add_argument("--vfs-disabled", action="store_true",
                   help="the NVIDIA vGPU 17+ GPUs come back without VFs, as after a real "
                        "reboot before nvidia-sriov.service ran (sriov_numvfs 0, no virtfn "
                        "links); 'enable-vfs' brings them back")
    p = action("enable-vfs", cmd_enable_vfs,
               "what NVIDIA's 'sriov-manage -e PF|ALL' does: give a vGPU 17+ GPU without VFs "
               "all the VFs it supports (sriov_totalvfs), bound to nvidia and untyped, with "
               "their udev add events; a GPU that has VFs already is left alone")
    p.add_argument("pf", metavar="PF|ALL",
                   help="the GPU's PCI address, or ALL for every vGPU 17+ GPU")
    p = action("driver-reload", cmd_driver_reload,
               "simulate 'rmmod' and 'modprobe' of a PCI driver: every device bound to it is "
               "unbound and probed again; its GPUs' VFs (and their vGPUs) are gone until "
               "'enable-vfs', mdevs on its devices vanish, other drivers' devices are "
               "untouched; refused while any of them is in use")
    p.add_argument("--driver", default="nvidia", help="the driver to reload (default nvidia)")
    p = action("status", cmd_status, "show parents, counters, mdevs, SR-IOV PFs, typed VFs "
               "and functions off their own driver")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    hold = action("hold", cmd_hold, "mark an mdev (UUID) or a VFIO-bound PCI function "
                  "(address) as held by a VM (its vfio/<group> node answers EBUSY, a remove "
                  "write blocks, a vGPU cannot be destroyed)")
    hold.add_argument("uuid", metavar="UUID|ADDR")
    hold.add_argument("--after-probe", action="store_true",
                      help="the VM arrives only after the next open of the group node is "
                      "closed: between the agent's in-use probe and its remove write")
    action("release", cmd_release, "the VM releases the mdev or PCI function").add_argument(
        "uuid", metavar="UUID|ADDR")
    action("unregister", cmd_unregister,
           "unregister a parent (its mdevs vanish)").add_argument("parent")
    action("register", cmd_register, "register a parent again").add_argument("parent")
    p = action("fail-next-create", cmd_fail_next_create,
               "make the next matching create fail with ERRNO (e.g. ENOSPC)")
    p.add_argument("errno")
    p.add_argument("--parent")
    p.add_argument("--type", dest="type_id")
    p = action("fail-next-vgpu-write", cmd_fail_next_vgpu_write,
               "make the next matching nvidia/current_vgpu_type write fail with ERRNO")
    p.add_argument("errno")
    p.add_argument("--vf", help="only a write to this VF (PCI address)")
    p.add_argument("--type-id", type=int, help="only a write of this value (0: a destroy)")
    p = action("accept-held-vgpu-destroy", cmd_accept_held_vgpu_destroy,
               "until the next reboot, a 0 written to the current_vgpu_type of a VF a VM "
               "holds destroys its vGPU instead of failing with EBUSY (a driver that does "
               "not refuse)")
    p.add_argument("--refuse", action="store_true", help="back to EBUSY")
    p = action("gpu-reset", cmd_gpu_reset,
               "reset an NVIDIA vGPU 17+ GPU as 'nvidia-smi -r' does: a pending MIG mode "
               "applies, mixed-size mode and every GPU instance are gone; refused while a "
               "vGPU exists on it or a VM holds one of its VFs")
    p.add_argument("pf", metavar="PF", help="the GPU's PCI address")
    p = action("materialise", cmd_materialise, "write a static tree (no process, no FUSE)",
               directory="empty or new directory")
    _spec_args(p)
    _spec_args(action("spec", cmd_spec, "print the JSON spec of a host", directory=None))
    action("profiles", cmd_profiles, "list the profiles", directory=None)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to accelctl's subparsers (``func(args) -> exit code``)."""
    parser = subparsers.add_parser(
        "simulate", help="run a simulated mdev host (FUSE sysfs) for demos and tests",
        description="Give any machine a simulated GPU host: a kernel-faithful sysfs (mdev "
                    "types, SR-IOV VFs from sriov_numvfs, PCI driver binding, NVIDIA vGPU 17+ "
                    "VFs typed through nvidia/current_vgpu_type), mounted with FUSE (writes "
                    "act like the kernel's) or written as a static tree.")
    add_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accel-agent-simulator",
                                     description="Simulated mdev host (sysfs model).")
    add_commands(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))
