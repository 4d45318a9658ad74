"""Agent errors -> HTTP statuses: the one table (docs/design.md §6.3).

Bad input is 400, an unknown thing 404, a state that refuses the request 409,
a host or ledger that cannot answer now 503.  Anything else, an
AccelAgentException not in the table or a bug, is 500: never for input, so
the fuzz tests treat any 5xx other than 503 as a failure.

The error ``code`` in ``{"error": {"code", "message"}}`` is the exception's
class name: stable, greppable, and the same word the logs use.
"""

from __future__ import annotations

from typing import Any

from accel_agent import exception

# Looked up along the exception's MRO, so a subclass inherits its base's
# status unless it is listed itself (MdevAlreadyAssigned via LedgerConflict,
# MdevInUse and VfInUse via DeviceInUse).
STATUS_BY_ERROR: dict[type[exception.AccelAgentException], int] = {
    # 400: the request is wrong
    exception.ApiRequestInvalid: 400,
    exception.InvalidInstanceId: 400,
    exception.InvalidAllocationRequest: 400,
    exception.InvalidMdevUUID: 400,
    exception.InvalidPciAddress: 400,
    exception.PrivilegedInputRejected: 400,
    exception.InvalidDomainXML: 400,
    exception.UnmappedMdevUUID: 400,
    exception.UnmappedVf: 400,
    exception.NonInjectiveMapping: 400,
    exception.InvalidMigrationRequest: 400,
    exception.MigrationPostCopyRefused: 400,
    exception.UnknownVfPool: 400,
    exception.VfNotInPool: 400,
    # 404: it does not exist
    exception.ApiNotFound: 404,
    exception.MdevNotFound: 404,
    exception.ParentNotFound: 404,
    exception.MigrationClaimNotFound: 404,
    # 405
    exception.ApiMethodNotAllowed: 405,
    # 409: the host's state refuses it
    exception.InsufficientCapacity: 409,
    exception.ReportedByNova: 409,
    exception.InstanceAlreadyAllocated: 409,
    exception.DeviceInUse: 409,  # MdevInUse, VfInUse: every kind alike
    exception.LedgerConflict: 409,
    exception.ForeignMdev: 409,
    exception.ForeignVf: 409,
    exception.MdevAlreadyExists: 409,
    exception.MdevTypeNotSupported: 409,
    exception.MdevRemoveTimeout: 409,
    exception.ParentGone: 409,
    exception.RecoveryTypeNotConfigured: 409,
    exception.ConfigErrors: 409,
    exception.ReloadRefused: 409,
    exception.MigrationVersionTooOld: 409,
    exception.MigrationTypesUnsupported: 409,
    exception.MigrationVgpuManagerMismatch: 409,
    exception.MigrationVgpuManagerUnknown: 409,
    exception.MigrationNotPossible: 409,
    exception.TakeoverRefused: 409,
    exception.NoFreeVf: 409,
    exception.VfSettingRefused: 409,
    exception.VfSettingNotApplied: 409,
    exception.PfNetdevNotFound: 409,
    # 503: cannot answer now, retry later
    exception.LedgerError: 503,
    # Once LedgerErrors, answered as they were: a device whose backend is
    # not installed (install it), a VF's device asked for under a UUID the
    # VF does not fix.
    exception.BackendNotInstalled: 503,
    exception.VfUuidMismatch: 503,
    exception.SysfsRootNotFound: 503,
    exception.LibvirtUnavailable: 503,
    exception.NodeDevicesUnavailable: 503,
    exception.NodeDeviceWriteFailed: 503,
    exception.PrivilegedHelperUnavailable: 503,
    exception.AgentStarting: 503,
}

INTERNAL = 500


def status_for(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        status = STATUS_BY_ERROR.get(cls)  # type: ignore[call-overload]
        if status is not None:
            return status
    return INTERNAL


def code_for(exc: BaseException) -> str:
    if isinstance(exc, exception.AccelAgentException):
        return type(exc).__name__
    return "InternalError"


def error_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, exception.AccelAgentException):
        message = exc.message
    else:
        # A bug: say so without leaking internals into a client's logs.
        message = f"internal error ({type(exc).__name__}); see the agent's log"
    return {"error": {"code": code_for(exc), "message": message}}
