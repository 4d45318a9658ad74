"""How every privileged writer writes a sysfs file, and waits for one that blocks.

:func:`write_once` is the only write(2) of the sysfs context: an existing
file (never created), not a symlink, one link, one write.  A write that
unmakes a device (an mdev's ``remove``, a vGPU VF's ``0``) may block in the
kernel while a VM holds it: :class:`RemoveWriter` runs it in a thread of its
own, at most one per device (:data:`pending_removes`), and its caller waits
with a timeout.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from accel_agent import exception
from accel_agent.privileged.validate import reject


def errno_text(err: OSError) -> tuple[str, str]:
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    return name, f"{name} ({os.strerror(err.errno)})" if err.errno else str(err)


def _refuse_hard_link(fd: int, path: str) -> None:
    """A ``create``/``remove`` has one link, like every sysfs attribute.  A
    second one means the name under the root is a hard link to some other
    file (resolving the path cannot see that: there is no link to resolve),
    and writing a UUID there would write it outside the tree."""
    links = os.fstat(fd).st_nlink
    if links > 1:
        raise reject(f"{path} has {links} links (a sysfs file has one); not written")


def write_once(path: str, data: bytes) -> None:
    """Open an existing file (never create one), write once, close.

    A ``create`` is opened with O_NONBLOCK: a FIFO in its place fails (ENXIO)
    instead of blocking a call that has no timeout (kernfs ignores the flag).
    A ``remove`` may block anyway (the kernel holds it while a VM uses the
    device), so it runs under a timeout in its own thread (RemoveWriter).
    """
    # No O_CREAT: a missing file must fail, never appear.  O_NOFOLLOW: the
    # path was resolved already, so a symlink here means it changed under us.
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if os.path.basename(path) != "remove":
        flags |= os.O_NONBLOCK
    fd = os.open(path, flags)
    try:
        _refuse_hard_link(fd, path)
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        # sysfs stores consume the whole buffer or fail; anything else is not
        # the kernel ABI we know, so do not pretend it worked.
        raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")


class RemoveWriter:
    """One blocking write that unmakes a device, run in its own thread.

    A write to ``remove`` of an mdev that a VM holds blocks in the kernel
    (vfio_unregister_group_dev) until QEMU lets go, uninterruptibly after the
    first signal (a vendor driver's ``current_vgpu_type`` ``0`` may do the
    same).  The thread cannot be cancelled, so the caller waits with a
    timeout and the thread is left to finish whenever the kernel allows; at
    most one such thread exists per device (a retry waits on the same writer
    rather than piling up threads and writes).
    """

    def __init__(
        self,
        key: str,
        path: str,
        data: bytes,
        map_error: Callable[[OSError], exception.AccelAgentException],
    ) -> None:
        self.key = key
        self.path = path
        self.data = data
        self._map_error = map_error
        self.done = threading.Event()
        self.error: exception.AccelAgentException | None = None
        self.thread = threading.Thread(target=self._run, name=f"remove-{key}", daemon=True)

    def _run(self) -> None:
        try:
            write_once(self.path, self.data)
        except OSError as err:
            self.error = self._map_error(err)
        except exception.AccelAgentException as err:  # refused (_refuse_hard_link)
            self.error = err
        except Exception as err:  # a bug must still release the waiters
            self.error = exception.SysfsWriteFailed(path=self.path, error=repr(err), errno="")
        finally:
            with pending_lock:
                if pending_removes.get(self.key) is self:
                    del pending_removes[self.key]
            self.done.set()


# The writes still blocked in the kernel, by device (an mdev's UUID, "vf:<address>").
pending_lock = threading.Lock()
pending_removes: dict[str, RemoveWriter] = {}
