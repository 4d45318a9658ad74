"""Run a mounted simulator and talk to it over a unix socket.

The socket lives **outside** the mounted tree, in a run directory
(``/run/accel-agent-simulator`` for root, else ``$XDG_RUNTIME_DIR`` or
``/tmp/accel-agent-simulator-<uid>``; ``ACCEL_SIM_RUNDIR`` overrides), named
after a hash of the absolute mountpoint, so any process can find the
simulator serving a directory without reading that directory.

Protocol: JSON lines.  A request is ``{"op": NAME, ...args}``; the reply is
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "message"}``.
Operations: ``ping``, ``status`` (``counters``: bool), ``reboot``
(``vfs_disabled``: bool, the vGPU 17+ GPUs come up without VFs),
``enable-vfs`` (``pf``: a PF address or ``"ALL"``; NVIDIA's ``sriov-manage
-e``; result ``{"enabled": [...], "already_enabled": [...]}``),
``driver-reload`` (``driver``, default ``"nvidia"``; result: the addresses
bound to it afterwards),
``hold`` (``uuid``: an mdev UUID or the PCI address of a function bound to a
VFIO driver, ``after_probe``)/``release`` (``uuid``),
``unregister``/``register`` (``parent``),
``fail-next-create`` (``errno`` name such as ``"ENOSPC"``, optional ``parent``,
``type_id``), ``fail-next-vgpu-write`` (``errno``, optional ``vf`` address and
``type_id``: the value written, 0 for a destroy), ``accept-held-vgpu-destroy``
(``accept``: bool; until the next reboot), ``gpu-reset`` (``pf``: an NVIDIA
vGPU GPU's address; refused while it is in use), ``nvml`` (``call``: a
method of the agent's NVML interface, ``args``: its arguments; answered by
:class:`~.nvml.SimulatedNvml` over the same state; an NVML error's reply
also carries ``nvml_error``: ``{"class": name, "kwargs": {...}}``), ``stop``.

The simulator names its control socket in the tree it serves, in
``accel-agent-simulator/control_socket`` (``accel_agent.nvml.SIMULATOR_MARKER``):
that is how the agent, given only a sysfs root, finds the NVML that belongs
to it (accel_agent/nvml/__init__.py says why a file and not an option).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from accel_agent import exception
from accel_agent.simulator.model import SimulatedHost
from accel_agent.simulator.nvml import SimulatedNvml
from accel_agent.simulator.spec import HostSpec

LOG = logging.getLogger(__name__)
RUNDIR_ENV = "ACCEL_SIM_RUNDIR"
FSNAME = "accel-agent-simulator"
SUBTYPE = "accelsim"  # mountinfo shows "fuse.accelsim": how umount recognises our mounts
FSTYPE = f"fuse.{SUBTYPE}"
_MAX_REQUEST = 1 << 16


# ------------------------------------------------------------------ locations


def run_dir() -> str:
    env = os.environ.get(RUNDIR_ENV)
    if env:
        return os.path.abspath(env)
    if os.geteuid() == 0:
        return "/run/accel-agent-simulator"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "accel-agent-simulator")
    return f"/tmp/accel-agent-simulator-{os.getuid()}"


def canonical_mountpoint(path: str) -> str:
    """Absolute path with the *parent* resolved: resolving the mountpoint itself
    would stat a possibly dead FUSE mount."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def instance_paths(mountpoint: str, rundir: str | None = None) -> dict[str, str]:
    """Socket, log and spec file of the simulator serving ``mountpoint``."""
    mp = canonical_mountpoint(mountpoint)
    stem = os.path.join(rundir or run_dir(), hashlib.sha256(mp.encode()).hexdigest()[:16])
    return {"socket": stem + ".sock", "log": stem + ".log", "spec": stem + ".spec.json"}


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_fstype(path: str) -> str | None:
    """The filesystem type mounted exactly at ``path`` (``fuse.accelsim``), from
    /proc/self/mountinfo, without touching the mount (it may be dead)."""
    target = canonical_mountpoint(path)
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) >= 5 and _unescape_mountinfo(fields[4]) == target:
                    found = right.split()[0] if right else "?"  # the last mount wins
    except OSError:
        return None
    return found


def is_mounted(path: str) -> bool:
    return mount_fstype(path) is not None


def fuse_unavailable_reason() -> str | None:
    """Why a FUSE simulator cannot run here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (load the fuse module or run the container with it)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc.strerror}"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse3 at import)
    except (ImportError, OSError) as exc:
        return f"mfusepy/libfuse3 cannot be loaded: {exc}"
    return None


def fusermount_unmount(path: str, lazy: bool = False) -> bool:
    cmd = ["fusermount3", "-u", *(["-z"] if lazy else []), path]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


# ------------------------------------------------------------------ client


class SimulatorClient:
    """Talks to a running simulator.  One connection per call keeps it usable
    from any thread and across simulator restarts."""

    def __init__(self, socket_path: str, mountpoint: str | None = None,
                 timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.mountpoint = mountpoint
        self.timeout = timeout

    @classmethod
    def for_mountpoint(cls, mountpoint: str, rundir: str | None = None) -> SimulatorClient:
        return cls(instance_paths(mountpoint, rundir)["socket"], canonical_mountpoint(mountpoint))

    def call(self, op: str, **args: Any) -> Any:
        request = json.dumps({"op": op, **args}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
                sock.sendall(request)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            raise exception.SimulatorNotRunning(
                mountpoint=self.mountpoint or "?", socket=self.socket_path,
                reason=exc.strerror or str(exc)) from None
        try:
            reply = json.loads(data)
        except json.JSONDecodeError:
            raise exception.SimulatorError(reason=f"bad reply to {op}: {data[:200]!r}") from None
        if not reply.get("ok"):
            raise exception.SimulatorError(reason=reply.get("error", "unknown error"))
        return reply.get("result")

    def ping(self) -> bool:
        return self.call("ping") == "pong"

    def status(self, counters: bool = True) -> dict[str, Any]:
        return self.call("status", counters=counters)

    def reboot(self, vfs_disabled: bool = False) -> None:
        self.call("reboot", vfs_disabled=vfs_disabled)

    def enable_vfs(self, pf: str = "ALL") -> dict[str, list[str]]:
        """NVIDIA's ``sriov-manage -e PF|ALL`` on the simulated host."""
        return dict(self.call("enable-vfs", pf=pf))

    def driver_reload(self, driver: str = "nvidia") -> list[str]:
        """``rmmod`` and ``modprobe`` of ``driver``: its PFs lose their VFs."""
        return list(self.call("driver-reload", driver=driver))

    def hold(self, uuid: str, after_probe: bool = False) -> None:
        self.call("hold", uuid=uuid, after_probe=after_probe)

    def release(self, uuid: str) -> None:
        self.call("release", uuid=uuid)

    def unregister(self, parent: str) -> None:
        self.call("unregister", parent=parent)

    def register(self, parent: str) -> None:
        self.call("register", parent=parent)

    def fail_next_create(self, errno_name: str, parent: str | None = None,
                         type_id: str | None = None) -> None:
        self.call("fail-next-create", errno=errno_name, parent=parent, type_id=type_id)

    def fail_next_vgpu_write(self, errno_name: str, vf: str | None = None,
                             type_id: int | None = None) -> None:
        self.call("fail-next-vgpu-write", errno=errno_name, vf=vf, type_id=type_id)

    def accept_held_vgpu_destroy(self, accept: bool = True) -> None:
        self.call("accept-held-vgpu-destroy", accept=accept)

    def gpu_reset(self, pf: str) -> None:
        """A reset of NVIDIA GPU ``pf`` (``nvidia-smi -r``; accel_agent/simulator/nvidia_gpu.py)."""
        self.call("gpu-reset", pf=pf)

    def stall_reads(self, match: str, seconds: float | None = None) -> None:
        """Reads of paths containing ``match`` wait ``seconds`` (None: until
        :meth:`unstall_reads`): a slow driver, for tests."""
        self.call("stall-reads", match=match, seconds=seconds)

    def unstall_reads(self) -> None:
        self.call("unstall-reads")

    def stop(self) -> None:
        self.call("stop")


# ------------------------------------------------------------------ server


def errno_from_name(name: Any) -> int:
    code = getattr(errno, str(name), None) if isinstance(name, str) else None
    if not isinstance(code, int) or not str(name).startswith("E"):
        raise exception.SimulatorError(reason=f"unknown errno name {name!r}")
    return code


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        for line in self.rfile:
            if len(line) > _MAX_REQUEST:
                self._reply({"ok": False, "error": "request too long"})
                return
            if not line.strip():
                continue
            op = None
            try:
                request = json.loads(line)
                if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                    raise ValueError("a request is an object with an 'op'")
                op = request["op"]
                reply = {"ok": True, "result": self.server.dispatch(request)}
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            except exception.AccelAgentException as exc:
                reply = {"ok": False, "error": exc.message}
                if isinstance(exc, exception.NvmlError):
                    # The class keeps NVML's meaning (IN_USE, NOT_SUPPORTED, ...).
                    reply["nvml_error"] = {"class": type(exc).__name__, "kwargs": {
                        k: v if isinstance(v, bool | int | float | str) or v is None
                        else str(v) for k, v in exc.kwargs.items()}}
            except OSError as exc:
                reply = {"ok": False, "error": f"{errno.errorcode.get(exc.errno or 0, '?')}: {exc}"}
            self._reply(reply)
            if op == "stop":
                # Reply first: the stop tears down the mount and this server.
                self.server.on_stop()
                return

    def _reply(self, reply: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(reply).encode() + b"\n")
        self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, path: str, host: SimulatedHost, mountpoint: str,
                 mounted: threading.Event, on_stop: Callable[[], None]) -> None:
        self.host = host
        self.nvml = SimulatedNvml(host)
        self.mountpoint = mountpoint
        self.mounted = mounted
        self.on_stop = on_stop
        super().__init__(path, _Handler)

    def dispatch(self, req: dict[str, Any]) -> Any:
        host, op = self.host, req["op"]
        if op == "ping":
            return "pong"
        if op == "status":
            out = host.status(with_counters=bool(req.get("counters", True)))
            out.update(pid=os.getpid(), mountpoint=self.mountpoint,
                       mounted=self.mounted.is_set() and is_mounted(self.mountpoint),
                       profiles=list(host.spec.profiles))
            return out
        if op == "reboot":
            host.reboot(vfs_disabled=_flag(req, "vfs_disabled", False))
        elif op == "enable-vfs":
            return host.enable_vfs(_text(req, "pf"))
        elif op == "driver-reload":
            return host.driver_reload(_text(req, "driver", "nvidia"))
        elif op == "hold":
            host.hold(str(req["uuid"]), after_probe=bool(req.get("after_probe", False)))
        elif op == "release":
            host.release(str(req["uuid"]))
        elif op == "unregister":
            host.unregister_parent(str(req["parent"]))
        elif op == "register":
            host.register_parent(str(req["parent"]))
        elif op == "fail-next-create":
            host.fail_next_create(errno_from_name(req["errno"]), req.get("parent"),
                                  req.get("type_id"))
        elif op == "fail-next-vgpu-write":
            type_id = req.get("type_id")
            if type_id is not None and (isinstance(type_id, bool) or not isinstance(type_id, int)):
                raise ValueError(f"type_id must be an integer, got {type_id!r}")
            vf = req.get("vf")
            host.fail_next_vgpu_write(errno_from_name(req["errno"]),
                                      None if vf is None else str(vf), type_id)
        elif op == "accept-held-vgpu-destroy":
            host.accept_held_vgpu_destroy(_flag(req, "accept", True))
        elif op == "gpu-reset":
            host.gpu_reset(_text(req, "pf"))
        elif op == "nvml":
            args = req.get("args", {})
            if not isinstance(args, dict):
                raise ValueError("args must be an object")
            return self.nvml.serve(_text(req, "call"), args)

        elif op == "stall-reads":
            seconds = req.get("seconds")
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, int | float)
            ):
                raise ValueError(f"seconds must be a number, got {seconds!r}")
            host.stall_reads(str(req["match"]), seconds)
        elif op == "unstall-reads":
            host.unstall_reads()
        elif op == "stop":
            return "stopping"
        else:
            raise ValueError(f"unknown op {op!r}")
        return None


def _flag(req: dict[str, Any], name: str, default: bool) -> bool:
    value = req.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _text(req: dict[str, Any], name: str, default: str | None = None) -> str:
    value = req.get(name, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _claim_socket(path: str) -> None:
    """Refuse to start twice for one mountpoint; clear a stale socket file."""
    if not os.path.exists(path):
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(path)
    except OSError:
        os.unlink(path)
        return
    raise exception.SimulatorError(reason=f"a simulator already answers on {path}")


def serve(spec: HostSpec, mountpoint: str, *, rundir: str | None = None,
          remove_block_timeout: float | None = None, debug: bool = False) -> None:
    """Mount ``spec`` at ``mountpoint`` and serve it (and the control socket)
    until ``stop``, SIGTERM or SIGINT.  Blocks; must run in the main thread."""
    # Imported here: loading libfuse is only needed (and only possible) when serving.
    from accel_agent.simulator import fusefs

    reason = fuse_unavailable_reason()
    if reason:
        raise exception.FuseUnavailable(reason=reason)
    mp = canonical_mountpoint(mountpoint)
    if not os.path.isdir(mp):
        raise exception.SimulatorError(reason=f"mountpoint {mp} is not a directory")
    if is_mounted(mp):
        raise exception.SimulatorError(reason=f"{mp} is already a mountpoint")
    paths = instance_paths(mp, rundir)
    os.makedirs(os.path.dirname(paths["socket"]), mode=0o700, exist_ok=True)
    _claim_socket(paths["socket"])

    kwargs = {} if remove_block_timeout is None else {"remove_block_timeout": remove_block_timeout}
    host = SimulatedHost(spec, **kwargs)
    host.announce_control_socket(paths["socket"])
    mounted = threading.Event()
    main_thread = threading.main_thread().ident

    def stop() -> None:
        host.close()  # blocked removes complete instead of pinning FUSE threads
        # libfuse's SIGTERM handler ends the loop and unmounts; it must reach the
        # main thread, which sleeps in the loop (worker threads block signals).
        mounted.wait(10)
        if main_thread is not None:
            signal.pthread_kill(main_thread, signal.SIGTERM)

    old_umask = os.umask(0o077)
    try:
        server = _Server(paths["socket"], host, mp, mounted, stop)
    finally:
        os.umask(old_umask)
    thread = threading.Thread(target=server.serve_forever, name="sim-control", daemon=True)
    thread.start()
    LOG.info("simulating %s at %s (control socket %s)",
             ", ".join(spec.profiles) or "a custom spec", mp, paths["socket"])
    try:
        fusefs.mount(host, mp, on_init=mounted.set, debug=debug)
    except RuntimeError:
        # mfusepy raises when fuse_main returns non-zero, which includes "ended by a
        # signal"; only a failure before any mount is an error.
        if not mounted.is_set():
            raise exception.SimulatorError(reason=f"FUSE mount of {mp} failed") from None
    finally:
        host.close()
        server.shutdown()
        server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(paths["socket"])
    LOG.info("simulator at %s stopped", mp)
