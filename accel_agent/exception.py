"""One exception base and one small class per failure (the os-vif pattern).

Every class carries a ``msg_fmt`` rendered with the keyword arguments given
at raise time, so a message always names the offending value and callers can
still read the values back from ``exc.kwargs``.  Classes are grouped by the
layer that raises them; add new ones at the end of their group.

Why one module of ~750 lines: one class per failure, each a few lines, and
their names are the API's error codes (``{"error": {"code": ...}}``) and the
words of the logs: one table an operator or a client author reads in one
place, as os-vif keeps its own.
"""

from __future__ import annotations

from typing import Any


def printable(value: str) -> str:
    """``value`` with every non-printable character (newline, escape, NUL)
    written as its Python escape: text quoted from a caller or a file cannot
    forge a second log line or drive a terminal."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


class AccelAgentException(Exception):
    """Base of every error the agent raises on purpose."""

    msg_fmt = "An unknown error occurred."
    # The values quoted in a message come from callers, files and sysfs;
    # their control characters are escaped (exc.kwargs keeps them as given).
    escape_kwargs = True

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
        if message is None:
            shown = kwargs
            if self.escape_kwargs:
                shown = {k: printable(v) if isinstance(v, str) else v for k, v in kwargs.items()}
            try:
                message = self.msg_fmt % shown
            except (KeyError, TypeError, ValueError):
                # A wrong kwarg set is a programming error; keep the template
                # so the failure is still visible instead of masking it.
                message = f"{self.msg_fmt} ({kwargs!r})"
        self.message = message
        super().__init__(message)


# --- configuration -----------------------------------------------------------------


class InvalidConfig(AccelAgentException):
    msg_fmt = "Invalid configuration: %(reason)s"


class InvalidMdevConfig(InvalidConfig):
    # Nova's wording ("Invalid configuration for mdev-capable devices: ...")
    # is kept so that operators' log searches keep working.
    msg_fmt = "Invalid configuration for mdev-capable devices: %(reason)s"


class DuplicateDeviceAddress(InvalidMdevConfig):
    msg_fmt = (
        "Invalid configuration for mdev-capable devices: duplicate types for PCI ID "
        "%(address)s: configured for %(first_type)s and for %(second_type)s"
    )


class DuplicateLayoutAddress(DuplicateDeviceAddress):
    """A GPU a mixed-size layout names that another layout, or an
    ``[mdev_<type>] device_addresses``, names too: one GPU, one layout."""

    msg_fmt = (
        "Invalid configuration for mdev-capable devices: duplicate layouts for PCI ID "
        "%(address)s: in %(first)s and in %(second)s%(why)s"
    )


class InvalidDeviceAddress(InvalidMdevConfig):
    msg_fmt = (
        "Invalid configuration for mdev-capable devices: incorrect device address: "
        "%(address)s%(where)s"
    )


class DuplicateMdevType(InvalidMdevConfig):
    # Nova refuses this too (its duplicate-address check trips over the
    # repeated type's addresses); the agent names the type instead.
    msg_fmt = (
        "Invalid configuration for mdev-capable devices: type %(mdev_type)s is listed "
        "%(count)d times in [devices] enabled_mdev_types; list each type once"
    )


class InvalidMdevClass(InvalidMdevConfig):
    msg_fmt = (
        "Invalid configuration for mdev-capable devices: mdev_class %(mdev_class)s of "
        "type %(mdev_type)s must match ^(VGPU|CUSTOM_[A-Z0-9_]+)$"
    )


class ConfigErrors(InvalidConfig):
    """Every configuration error found in one pass, so that an operator fixes
    them all at once instead of one restart per mistake."""

    msg_fmt = "%(summary)s"
    escape_kwargs = False  # one line per error, each escaped already

    def __init__(self, errors: list[AccelAgentException]) -> None:
        self.errors = list(errors)
        super().__init__(summary="\n".join(e.message for e in self.errors))


class ConfigWarningAsError(InvalidMdevConfig):
    """A policy warning promoted to an error by ``--strict``."""

    msg_fmt = "%(warning)s"


# --- sysfs / device model -------------------------------------------------------


class InvalidPciAddress(AccelAgentException):
    msg_fmt = "Invalid PCI address %(address)r: expected DDDD:BB:SS.F or BB:SS.F"


class SysfsRootNotFound(AccelAgentException):
    msg_fmt = "sysfs root %(root)s does not exist or is not a directory"


class ParentNotFound(AccelAgentException):
    msg_fmt = "mdev parent %(parent)s not found under %(root)s"


class DeviceNotOnHost(ParentNotFound):
    """``accelctl explain ADDRESS`` / ``GET /v1/explain?address=``: 404, exit 1."""

    msg_fmt = "no PCI device or mdev parent %(address)s on this host (under %(root)s)"


class MdevTypeNotSupported(AccelAgentException):
    msg_fmt = "mdev parent %(parent)s does not offer type %(mdev_type)s"


class MdevNotFound(AccelAgentException):
    msg_fmt = "mediated device %(uuid)s not found"


class BackendNotLoaded(AccelAgentException):
    """A device backend registered under the ``accel_agent.backends`` entry
    points (by this package or another) that cannot be loaded: the daemon
    does not start, a command that loads the backends fails."""

    msg_fmt = (
        "device backend %(name)s (%(target)s, registered under the accel_agent.backends "
        "entry points) cannot be loaded: %(reason)s; fix or uninstall the package that "
        "registers it"
    )


class BackendNotInstalled(AccelAgentException):
    """A device the ledger holds names a backend no installed package
    registers (one uninstalled since it made the device): the agent cannot
    make, unmake or describe it until the backend is installed again."""

    msg_fmt = (
        "device backend %(name)s is not installed (the accel_agent.backends entry points "
        "name %(installed)s); install the package that provides it"
    )


class VfUuidMismatch(AccelAgentException):
    """A VF's device is known by a UUID derived from the VF's address
    (``DeviceBackend.device_uuid_is_fixed``): a device asked for under
    another UUID is one recovery could never find again, so none is made."""

    msg_fmt = (
        "device %(uuid)s is not the device of %(kind)s %(vf)s, whose UUID is %(expected)s "
        "(derived from the VF's address)"
    )


# --- privileged sysfs writes (errno mapping) -------------------------------------


class PrivilegedInputRejected(AccelAgentException):
    msg_fmt = "Refused privileged request: %(reason)s"


class MdevAlreadyExists(AccelAgentException):
    msg_fmt = "mediated device %(uuid)s already exists (EEXIST)"


class MdevCreateInvalid(AccelAgentException):
    msg_fmt = "kernel refused to create %(uuid)s of type %(mdev_type)s on %(parent)s (EINVAL)"


class InsufficientCapacity(AccelAgentException):
    msg_fmt = "insufficient capacity for type %(mdev_type)s on %(parents)s: %(reason)s"


class OnlyNovaTypes(InsufficientCapacity):
    """A request by class or for any type that only types Nova hands out
    (``reported_by = nova``) could serve."""

    msg_fmt = (
        "no device of %(asked)s for the agent to hand out: the configured type(s) that "
        "would serve it (%(types)s) are reported_by = nova, so Nova's PCI tracker assigns "
        "their devices and the agent hands none out; ask Nova for them, or configure a type "
        "the agent reports (reported_by = agent)"
    )


class ReportedByNova(InsufficientCapacity):
    """A subclass so that callers handling "no room" (HTTP 409, attach's
    rollback) handle it alike; its message says why there is none."""

    msg_fmt = (
        "type %(mdev_type)s is reported by Nova ([mdev_%(mdev_type)s] reported_by = nova): "
        "Nova's PCI tracker assigns its standing devices, so the agent hands none out "
        "(a device given by both would be given twice)"
    )


class ParentGone(AccelAgentException):
    msg_fmt = "mdev parent %(parent)s is going away or gone (ENODEV)"


class MdevRemoveTimeout(AccelAgentException):
    msg_fmt = (
        "removing mediated device %(uuid)s did not finish within %(timeout)s s; "
        "a VM probably still holds it"
    )


class SysfsWriteFailed(AccelAgentException):
    msg_fmt = "writing %(path)s failed: %(error)s"


class PrivilegedHelperUnavailable(AccelAgentException):
    # The helper missed its deadline or died (accel_agent.privileged.guard): it
    # was killed and a new one is starting.  The write may or may not have
    # happened; the operation's intent stays for recovery.
    msg_fmt = (
        "the privileged helper (%(helper)s) is unavailable: %(reason)s; a new one is "
        "started, retry later"
    )


# --- lifecycle / ledger ------------------------------------------------------------


class LedgerError(AccelAgentException):
    msg_fmt = "mdev ledger error: %(reason)s"


class LedgerSchemaTooNew(LedgerError):
    msg_fmt = (
        "mdev ledger %(path)s has schema version %(found)s, newer than this agent "
        "understands (%(supported)s); refusing to touch it"
    )


class LedgerCorrupt(LedgerError):
    msg_fmt = (
        "the mdev ledger %(path)s is corrupt (%(detail)s); the agent will not allocate over "
        "it: restore it from a backup, or move it aside and let the agent start with a new "
        "one (then adopt the mdevs it no longer knows: accelctl adopt UUID)"
    )


class LedgerReplaced(LedgerError):
    msg_fmt = (
        "the mdev ledger %(path)s was deleted or replaced while the agent had it open "
        "(%(detail)s); refusing to change anything: restart the agent, which reports what "
        "it finds"
    )


class LedgerWriteFailed(LedgerError):
    msg_fmt = "the mdev ledger %(path)s cannot be written: %(detail)s"


class DeviceInUse(AccelAgentException):
    """Something holds the device (a libvirt domain, a VM's VFIO group):
    nothing was done to it.  The base of each kind's own class (an mdev's,
    a VF's): whoever keeps a device that is in use catches this one, and the
    API answers 409 for every kind; raised itself for devices of several
    kinds at once, or of a backend with no class of its own."""

    msg_fmt = "device %(uuid)s is in use: %(reason)s"


class MdevInUse(DeviceInUse):
    msg_fmt = "mediated device %(uuid)s is in use: %(reason)s"


class VfInUse(DeviceInUse):
    """A VF a VM holds (a vGPU VF, a pool VF).  ``kind`` names it where the
    raiser knows which (its backend's name of its devices); the privileged
    writers act on a PCI function whatever it carries and leave "VF"."""

    msg_fmt = "%(kind)s %(vf)s is in use: %(reason)s"

    def __init__(self, message: str | None = None, *, kind: str = "VF", **kwargs: Any) -> None:
        super().__init__(message, kind=kind, **kwargs)


class VfAlreadyTyped(AccelAgentException):
    msg_fmt = "VF %(vf)s already holds a vGPU of type %(found)s; not typed again"


class VgpuTypeWriteFailed(AccelAgentException):
    msg_fmt = "typing VF %(vf)s as %(mdev_type)s failed: %(answer)s"


class VgpuTypeMismatch(AccelAgentException):
    msg_fmt = (
        "VF %(vf)s does not read back as %(mdev_type)s after the write (%(found)s); "
        "set back to 0"
    )


class VgpuPlacementWriteFailed(AccelAgentException):
    msg_fmt = "placing the vGPU of VF %(vf)s at placement %(placement_id)s failed: %(answer)s"


class VgpuPlacementMismatch(AccelAgentException):
    msg_fmt = (
        "the vGPU of VF %(vf)s does not read back at placement %(placement_id)s after the "
        "write (%(found)s)"
    )


class ForeignMdev(AccelAgentException):
    msg_fmt = (
        "mediated device %(uuid)s was not created by the agent; adopt it first "
        "(accelctl adopt %(uuid)s)"
    )


class RecoveryTypeNotConfigured(AccelAgentException):
    msg_fmt = (
        "cannot recreate mdev %(uuid)s of instance %(instance)s: type %(mdev_type)s is no "
        "longer configured for parent %(parent)s"
    )


class AssignedDeviceRetyped(AccelAgentException):
    # A configuration (reload, start, check-config) that would give the parent
    # of a device an instance holds another type, another layout or none.
    msg_fmt = (
        "mdev %(uuid)s of %(kind)s %(owner)s is %(mdev_type)s on parent %(parent)s, which "
        "would get %(becomes)s"
    )


class AssignedDeviceToNova(AccelAgentException):
    # reported_by = nova for the type of a device the agent gave an instance:
    # nova-pci-config would list it for Nova, which could give it to another.
    msg_fmt = (
        "mdev %(uuid)s of %(kind)s %(owner)s is %(mdev_type)s on parent %(parent)s, and "
        "[mdev_%(mdev_type)s] reported_by = nova would hand it to Nova too (nova-pci-config "
        "lists it): release it first, or keep reported_by = agent"
    )


class InvalidAllocationRequest(AccelAgentException):
    msg_fmt = "Invalid allocation request: %(reason)s"


class InvalidAttachRequest(InvalidAllocationRequest):
    # ``field`` is the request's path to the bad value (``requests[1].vlan``).
    msg_fmt = "Invalid attach request: %(field)s: %(reason)s"


class InstanceAlreadyAllocated(AccelAgentException):
    msg_fmt = (
        "instance %(instance)s already holds %(count)s mdev(s); release it first to "
        "allocate a different set"
    )


class InvalidInstanceId(AccelAgentException):
    msg_fmt = "Invalid instance id %(instance)r: %(reason)s"


# --- libvirt XML / migration -----------------------------------------------------------


class InvalidDomainXML(AccelAgentException):
    msg_fmt = "Invalid domain XML: %(reason)s"


class UnmappedMdevUUID(AccelAgentException):
    # Nova's message text, so that existing alerting keeps matching.
    msg_fmt = (
        "Unable to find the destination mediated device UUID to use for this source "
        "mdev UUID : %(uuid)s"
    )


class NonInjectiveMapping(AccelAgentException):
    msg_fmt = "mdev UUID mapping is not injective: %(target)s is the target of %(sources)s"


class MigrationVersionTooOld(AccelAgentException):
    msg_fmt = (
        "%(side)s host cannot live-migrate mediated devices: %(component)s %(found)s is "
        "older than the required %(required)s"
    )


class MigrationTypesUnsupported(AccelAgentException):
    msg_fmt = (
        "destination host does not support mdev types: %(types)s (it offers: %(supported)s)"
    )


class MigrationPostCopyRefused(AccelAgentException):
    # QEMU rejects post-copy with VFIO devices; fail before libvirt does.
    msg_fmt = (
        "post-copy live migration is not possible for a domain with mediated devices "
        "(%(uuids)s): drop VIR_MIGRATE_POSTCOPY"
    )


class MigrationVgpuManagerMismatch(AccelAgentException):
    # Red Hat: a vGPU live migration fails when the vGPU driver versions differ.
    msg_fmt = (
        "the NVIDIA vGPU manager versions differ: source host %(source)s, destination host "
        "%(destination)s; vGPUs (%(types)s) live-migrate only between hosts with the same "
        "version: install %(source)s on the destination or pick another destination"
    )


class MigrationVgpuManagerUnknown(AccelAgentException):
    msg_fmt = (
        "the NVIDIA vGPU manager version of the %(sides)s host is unknown (source host "
        "%(source)s, destination host %(destination)s): vGPUs (%(types)s) live-migrate only "
        "between hosts with the same version, and an unknown version cannot be shown equal "
        "(the source sends its own as source_versions nvidia_vgpu_manager; a host reads its "
        "own from NVML or /proc/driver/nvidia/version)"
    )


class MigrationNotPossible(AccelAgentException):
    # The request is fine; this host cannot take part (no libvirt to ask for versions).
    msg_fmt = "this host cannot take part in a live migration: %(reason)s"


class InvalidMigrationRequest(AccelAgentException):
    msg_fmt = "Invalid migration request: %(reason)s"


class MigrationClaimNotFound(AccelAgentException):
    msg_fmt = "no migration claim for instance %(instance)s"


class MigrationFailed(AccelAgentException):
    # libvirt reported the failure: the guest still runs on the source, on its mdevs.
    msg_fmt = (
        "live migration of %(instance)s to %(destination)s failed on the %(side)s host: "
        "%(reason)s; the source keeps the domain and its mdevs (libvirt: %(libvirt_message)s)"
    )


# --- API / reporting ------------------------------------------------------------------


class ApiError(AccelAgentException):
    msg_fmt = "API error %(status)s: %(message)s"


class AgentNotRunning(AccelAgentException):
    msg_fmt = "accel-agent is not running (no API socket at %(socket)s)"


class PlacementError(AccelAgentException):
    msg_fmt = "Placement error: %(reason)s"


# --- libvirt XML (appended) -------------------------------------------------------------


class InvalidMdevUUID(AccelAgentException):
    # ``where`` says which input held it (" in the mapping", ...), ``reason`` what is wrong.
    msg_fmt = "Invalid mdev UUID %(uuid)r%(where)s: %(reason)s"


class InvalidPciDeviceAddress(InvalidPciAddress):
    # A VF or mapping address that is not the canonical DDDD:BB:SS.F; a subclass so
    # that whoever handles InvalidPciAddress (the API's 400) handles it too.
    msg_fmt = "Invalid PCI device address %(address)r%(where)s: %(reason)s"


class InvalidMacAddress(AccelAgentException):
    msg_fmt = "Invalid MAC address %(mac)r%(where)s: %(reason)s"


class InvalidVlanId(AccelAgentException):
    msg_fmt = "Invalid VLAN id %(vlan)r%(where)s: %(reason)s"


class NonInjectivePciMapping(NonInjectiveMapping):
    msg_fmt = "PCI address mapping is not injective: %(target)s is the target of %(sources)s"


class UnmappedVf(AccelAgentException):
    # The PCI twin of UnmappedMdevUUID: the guest would arrive without its vGPU,
    # or, worse, on the VF of the same address that is someone else's there.
    msg_fmt = (
        "the domain's VF %(address)s (the agent's vGPU %(uuid)s) has no destination "
        "address in the claim's pci_addresses"
    )


class ForeignVf(AccelAgentException):
    # A typed vGPU VF the ledger does not own: the destination could not be told
    # its type from the agent's records, and releasing it is not the agent's to do.
    msg_fmt = (
        "the domain's VF %(address)s holds a vGPU (%(uuid)s) the agent did not make; "
        "adopt it first (accelctl adopt %(uuid)s) to migrate it"
    )


# --- simulator (appended) -----------------------------------------------------------------


class SimulatorSpecInvalid(AccelAgentException):
    msg_fmt = "Invalid simulated host spec: %(reason)s"


class SimulatorError(AccelAgentException):
    msg_fmt = "Simulator error: %(reason)s"


class FuseUnavailable(SimulatorError):
    msg_fmt = "FUSE is not available: %(reason)s"


class SimulatorNotRunning(SimulatorError):
    msg_fmt = "no simulator is serving %(mountpoint)s (control socket %(socket)s): %(reason)s"


# --- ledger (appended) --------------------------------------------------------------------


class LedgerConflict(LedgerError):
    # A state transition the ledger refuses (settle a row that is not being
    # created, remove an assigned mdev, record a UUID twice, ...).
    msg_fmt = "mdev ledger refuses to %(action)s %(uuid)s: %(reason)s"


class MdevAlreadyAssigned(LedgerConflict):
    msg_fmt = "mediated device %(uuid)s is already assigned to %(owner_kind)s %(owner)s"


# --- Placement reporting (appended) -------------------------------------------------------


class PlacementUnavailable(PlacementError):
    # Nothing can be synchronised: connection refused, timeout, 5xx, auth refused.
    msg_fmt = "Placement unavailable: %(reason)s"


class PlacementRootProviderNotFound(PlacementError):
    msg_fmt = (
        "root provider %(host)s not found in Placement; it is created by nova-compute, "
        "or by the agent with [placement] create_root_provider = true"
    )


class PlacementRequestFailed(PlacementError):
    msg_fmt = (
        "Placement %(method)s %(url)s returned %(status)s %(code)s: %(detail)s "
        "(request %(request_id)s)"
    )


class PlacementGenerationConflict(PlacementRequestFailed):
    # Someone else changed the provider between our read and our write
    # (placement.concurrent_update, and the *.inuse races): refetch and redrive.
    pass


class PlacementAnswerRejected(PlacementUnavailable):
    # An answer the reporter cannot use (reporting/placement/answers.py says why): a
    # Placement sending it is as good as down for this sync, which fails as a
    # whole and is retried after the back-off, like any outage.
    msg_fmt = (
        "Placement's answer to %(method)s %(url)s rejected: %(reason)s (request %(request_id)s)"
    )


# --- daemon and API (appended) ----------------------------------------------------------


class ApiSocketUnsafe(AccelAgentException):
    # Refuse to start rather than serve mdev control to whoever can replace the socket.
    msg_fmt = "refusing to serve the API on %(path)s: %(reason)s"


class AgentAlreadyRunning(AccelAgentException):
    msg_fmt = "another accel-agent already serves the API on %(path)s"


class AgentLockHeld(AccelAgentException):
    # One agent per host (accel_agent.host_lock): refused before the
    # second one touches anything.
    msg_fmt = (
        "refusing to start: another accel-agent (%(holder)s) already uses %(what)s "
        "(lock %(lock)s); one agent per host: stop it first"
    )


class AgentLockUnusable(AccelAgentException):
    msg_fmt = "refusing to start: cannot take the agent's lock %(lock)s: %(reason)s"


class AgentStarting(AccelAgentException):
    # The API answers while the agent starts (recovery, the wait for a standing
    # layout's VFs): health and the listings, and this (503) to the rest.
    msg_fmt = "starting: %(waiting)s; the agent accepts changes once it is ready, retry then"


class AgentUnreachable(AccelAgentException):
    # The socket exists but talking to the daemon failed: not a reason to
    # fall back to direct mode (a second writer), an error.
    msg_fmt = "cannot talk to accel-agent at %(socket)s: %(reason)s"


class ApiRequestInvalid(AccelAgentException):
    msg_fmt = "Invalid request: %(reason)s"


class ApiNotFound(AccelAgentException):
    msg_fmt = "no such resource: %(path)s"


class ApiMethodNotAllowed(AccelAgentException):
    msg_fmt = "method %(method)s not allowed on %(path)s (allowed: %(allowed)s)"


class ReloadRefused(AccelAgentException):
    msg_fmt = "configuration reload refused, the running configuration is kept: %(reason)s"


# --- takeover from Nova (appended) ----------------------------------------------------------


class LibvirtUnavailable(AccelAgentException):
    msg_fmt = "cannot list the libvirt domains at %(uri)s: %(reason)s"


class TakeoverRefused(AccelAgentException):
    msg_fmt = "takeover from libvirt refused, nothing changed: %(reason)s"


class NodeDevicesUnavailable(AccelAgentException):
    # libvirt's node devices (its mdev definitions) cannot be read or written now.
    msg_fmt = "cannot reach libvirt's node devices at %(uri)s: %(reason)s"


class NodeDeviceWriteFailed(AccelAgentException):
    # libvirt answered but refused a define, undefine or autostart change.
    msg_fmt = "libvirt at %(uri)s refused to %(action)s mdev %(uuid)s: %(reason)s"


class LibvirtStalled(NodeDevicesUnavailable, LibvirtUnavailable):
    # A call missed [libvirt] call_timeout, or libvirt has not answered since one
    # did (devices/libvirt_calls.py).  Both classes above, so that whoever
    # handles "libvirt cannot be asked now" handles this too.
    msg_fmt = "libvirt at %(uri)s is not answering: %(reason)s"


# --- SR-IOV VFs: network settings and PCI hand-over (appended) ----------------------------


class InvalidVfSetting(PrivilegedInputRejected):
    # ``field`` names the request's field, for an API's 400 (issue 15).
    msg_fmt = "Refused privileged request: VF setting %(field)s=%(value)s: %(reason)s"


class PciDeviceNotFound(AccelAgentException):
    msg_fmt = "PCI device %(address)s not found under %(root)s"


class NotSriovPf(AccelAgentException):
    msg_fmt = "PCI device %(address)s is not an SR-IOV physical function: %(reason)s"


class NotSriovVf(AccelAgentException):
    msg_fmt = "PCI device %(address)s is not an SR-IOV virtual function (no physfn link)"


class PfNetdevNotFound(AccelAgentException):
    msg_fmt = "SR-IOV PF %(pf)s has no usable network interface: %(reason)s"


class VfIndexOutOfRange(AccelAgentException):
    msg_fmt = "PF %(pf)s has %(num_vfs)s VF(s) enabled (sriov_numvfs): there is no VF %(vf)s"


class VfNotReported(AccelAgentException):
    msg_fmt = (
        "PF %(pf)s does not report VF %(vf)s over rtnetlink (IFLA_NUM_VF: %(num_vfs)s): "
        "its driver has no VF settings"
    )


class NetlinkRequestFailed(AccelAgentException):
    msg_fmt = "rtnetlink %(operation)s of %(netdev)s failed: %(errno)s (%(error)s)"


class VfSettingRefused(AccelAgentException):
    # The driver's answer to one setting; ``rollback`` says what was undone.
    msg_fmt = (
        "PF %(pf)s VF %(vf)s: the driver refused %(setting)s %(value)s with %(errno)s "
        "(%(error)s); %(rollback)s"
    )


class VfRollbackFailed(VfSettingRefused):
    # A subclass: callers of apply catch VfSettingRefused, and can tell a VF
    # left half-configured (reset it, or keep it out of the pool) from a clean one.
    msg_fmt = (
        "PF %(pf)s VF %(vf)s: the driver refused %(setting)s %(value)s with %(errno)s "
        "(%(error)s); %(rollback)s: the VF is left half-configured"
    )


class VfSettingNotApplied(AccelAgentException):
    msg_fmt = (
        "PF %(pf)s VF %(vf)s: %(setting)s reads back as %(found)s after writing %(wanted)s; "
        "%(rollback)s"
    )


class SriovNumVfsRefused(AccelAgentException):
    msg_fmt = "setting sriov_numvfs of %(pf)s to %(count)s failed: %(errno)s (%(error)s)"


class VfsHandedOver(AccelAgentException):
    msg_fmt = (
        "PF %(pf)s: not changing the number of VFs while %(vfs)s are bound to vfio-pci "
        "(hand them back first)"
    )


class PciDriverNotLoaded(AccelAgentException):
    msg_fmt = "PCI driver %(driver)s is not loaded (no %(path)s): modprobe %(driver)s"


class PciRebindFailed(AccelAgentException):
    msg_fmt = "%(action)s of %(address)s failed at %(step)s: %(errno)s (%(error)s)"



class InvalidVfPoolConfig(InvalidConfig):
    msg_fmt = "Invalid configuration of VF pool %(pool)s: %(reason)s"


class UnknownVfPool(AccelAgentException):
    # ``field`` for an API's 400 (issue 15: "an unknown pool").
    msg_fmt = "no VF pool %(pool)s (enabled: %(enabled)s)"
    field = "pool"


class NoFreeVf(AccelAgentException):
    msg_fmt = "VF pool %(pool)s has no free VF (%(reason)s)"


class VfNotInPool(AccelAgentException):
    msg_fmt = "%(vf)s is not a VF of a PF of a configured pool (%(reason)s)"


class LedgerSchemaOld(LedgerError):
    """A ledger of an older schema, opened by a reader or by a writer that
    may not migrate it (only the daemon and ``accelctl ledger upgrade`` do,
    after a backup)."""

    msg_fmt = (
        "the mdev ledger %(path)s has schema version %(found)s, older than this agent's "
        "(%(supported)s); left unchanged: run 'accelctl ledger upgrade' (it keeps a backup "
        "copy), or restart accel-agent, which upgrades it the same way"
    )



# --- NVIDIA's management library, NVML (appended) ------------------------------------------

# nvml.h's nvmlReturn_t by number, named without NVML_ERROR_: a message says what NVML said.
NVML_RETURN_NAMES = {
    1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
    6: "NOT_FOUND", 9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED", 17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 23: "INSUFFICIENT_RESOURCES",
    28: "GPU_NOT_FOUND", 29: "INVALID_STATE", 999: "UNKNOWN",
}


class NvmlError(AccelAgentException):
    """NVML's answer to one call; the subclass keeps NVML's return code (for_code)."""

    msg_fmt = "NVML %(operation)s on %(gpu)s failed: %(nvml)s (%(reason)s)"
    nvml_codes: tuple[int, ...] = ()

    @classmethod
    def for_code(cls, code: int, *, operation: str, gpu: str, reason: str = "") -> NvmlError:
        chosen = next((sub for sub in _NVML_CLASSES if code in sub.nvml_codes), NvmlError)
        name = NVML_RETURN_NAMES.get(code, f"return code {code}")
        return chosen(operation=operation, gpu=gpu, nvml=f"NVML_ERROR_{name}",
                      reason=reason or name.lower().replace("_", " "))


class NvmlInUse(NvmlError):
    nvml_codes = (19,)  # e.g. mixed-size mode set while a vGPU exists


class NvmlNotSupported(NvmlError):
    nvml_codes = (3,)  # e.g. mixed-size mode with MIG enabled


class NvmlResetRequired(NvmlError):
    nvml_codes = (16,)  # a MIG mode change waits for a GPU reset


class NvmlNoPermission(NvmlError):
    nvml_codes = (4,)


class NvmlInvalidArgument(NvmlError):
    nvml_codes = (2,)  # e.g. a placement the profile does not have


class NvmlNotFound(NvmlError):
    nvml_codes = (6, 28)


class NvmlInsufficientResources(NvmlError):
    nvml_codes = (23,)  # e.g. a GPU instance on a taken placement


class NvmlNotAvailable(NvmlError):
    # No library, no driver, or a sysfs root that is neither /sys nor a simulated host.
    msg_fmt = "NVML is not available for %(gpu)s: %(reason)s"
    nvml_codes = (9, 12, 13, 18)


class NvmlCallTimeout(NvmlError):
    # A read that missed [nvml] call_timeout (a wedged driver); later reads fail at once.
    msg_fmt = "NVML %(operation)s on %(gpu)s did not answer within %(timeout)s s"


_NVML_CLASSES = (NvmlInUse, NvmlNotSupported, NvmlResetRequired, NvmlNoPermission,
                 NvmlInvalidArgument, NvmlNotFound, NvmlInsufficientResources, NvmlNotAvailable)


# --- layouts of today's NVIDIA GPUs ------------------------------------------------------


class LayoutCannotFit(AccelAgentException):
    """A mixed-size layout's GPU that cannot hold it whatever the placements:
    no mixed-size capability, or a type it does not support
    (devices/gpu_layout_fit.py)."""

    msg_fmt = "%(where)s cannot hold its layout: %(reason)s"


class PlacementsDoNotFit(AccelAgentException):
    """A mixed-size layout that no arrangement of placements holds
    (devices/placements.py)."""

    msg_fmt = "GPU %(gpu)s cannot hold %(asked)s in mixed-size mode: %(needs)s; %(fits)s"


class MigLayoutInvalid(AccelAgentException):
    """A MIG-backed vGPU layout whose types and GPU instances disagree, or
    that names what the GPU does not have (devices/mig_plan.py)."""

    msg_fmt = "GPU %(gpu)s cannot carry the MIG layout: %(reason)s"


class MigPlacementsDoNotFit(AccelAgentException):
    """GPU instances that no arrangement of their profiles' placements holds
    (devices/mig_plan.py)."""

    msg_fmt = "GPU %(gpu)s cannot hold the GPU instances %(asked)s: %(needs)s; %(free)s"
