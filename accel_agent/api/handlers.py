"""Handlers of the /v1 API and the route table.

Each handler gets a :class:`~accel_agent.api.app.Request` whose parameters and
body already passed the OpenAPI validation, calls the backend (the agent),
and returns a :class:`~accel_agent.api.app.Response`.  Errors are raised as
AccelAgentException subclasses and become ``{"error": {...}}`` with the
status of :mod:`accel_agent.api.errors`.

Live migration (accel_agent.migration): the destination's claim, commit and
abort, and the source's XML rewrite.
"""

from __future__ import annotations

from accel_agent import exception
from accel_agent.api.app import Request, Response, Route


def health(req: Request) -> Response:
    return Response.json(req.backend.health())


# The listings come encoded from the backend, which keeps the bytes while
# the host does not change (accel_agent.daemon.listings).


def types(req: Request) -> Response:
    return Response(200, req.backend.listings.types_json())


def mdevs(req: Request) -> Response:
    return Response(200, req.backend.listings.mdevs_json())


def inventory(req: Request) -> Response:
    return Response(200, req.backend.listings.inventory_json())


# The device use cases are the device manager's (backend.devices); each
# change made through it asks the daemon for a rescan itself.


def get_allocation(req: Request) -> Response:
    return Response.json(req.backend.devices.allocation(req.params["instance"]).to_dict())


def put_allocation(req: Request) -> Response:
    body = req.body
    allocation = req.backend.devices.allocate(
        req.params["instance"], body["count"], body.get("parent"), body.get("mdev_type")
    )
    req.backend.metrics.allocations.inc()
    return Response.json(allocation.to_dict())


def _remove_flag(req: Request) -> bool:
    """``remove`` from the query or the body (the same value if both)."""
    from_query = req.query.get("remove")
    from_body = (req.body or {}).get("remove")
    if from_query is not None and from_body is not None and from_query != from_body:
        raise exception.ApiRequestInvalid(
            reason="remove given in the query and in the body with different values"
        )
    return bool(from_query if from_query is not None else from_body)


def _released(req: Request, remove: bool) -> Response:
    instance = req.params["instance"]
    released = req.backend.devices.release(instance, remove)
    req.backend.metrics.releases.labels(remove=str(bool(remove)).lower()).inc()
    return Response.json({"instance": instance, "released": released, "removed": remove})


def delete_allocation(req: Request) -> Response:
    return _released(req, _remove_flag(req))


# Attach (os-acc, docs/design.md §11): every accelerator of an instance in one call.


def get_attachments(req: Request) -> Response:
    return Response.json(req.backend.devices.attachment(req.params["instance"]).to_dict())


def post_attachments(req: Request) -> Response:
    from accel_agent import wiring

    body = req.body
    devices = req.backend.devices
    # Checked whole, every field, before anything is prepared (400 naming it).
    requests = wiring.attach_requests(devices, body["requests"] if isinstance(body, dict) else body)
    attachment = devices.attach(req.params["instance"], requests)
    req.backend.metrics.allocations.inc()
    return Response.json(attachment.to_dict())


def delete_attachments(req: Request) -> Response:
    return _released(req, bool(req.query.get("remove", False)))


def domain_xml(req: Request) -> Response:
    from accel_agent.libvirt_xml import instance_devices_xml

    instance = req.params["instance"]
    allocation = req.backend.devices.allocation(instance)
    if not allocation.mdevs:
        raise exception.MdevNotFound(uuid=f"(any, for instance {instance})")
    # Each device as its backend gives it to a guest: <hostdev type='mdev'> by
    # UUID, a vGPU VF as <hostdev type='pci' managed='no'> by address.
    devices = req.backend.devices.guest_devices(allocation.mdevs)
    xml = instance_devices_xml(devices, req.backend.qemu_globals)
    return Response.text(xml + "\n", "application/xml")


def adopt(req: Request) -> Response:
    record = req.backend.devices.adopt(req.params["uuid"])
    return Response.json(
        {
            "uuid": record.uuid,
            "parent": record.parent,
            "mdev_type": record.device_type,
            "owned": True,
            "instance": record.owner,
        }
    )


def takeover(req: Request) -> Response:
    plan = req.backend.devices.takeover(
        adopt_unused=bool(req.query.get("all", False)),
        dry_run=bool(req.query.get("dry_run", False)),
    )
    return Response.json(plan.to_dict())


def recover(req: Request) -> Response:
    if req.query.get("check"):
        return Response.json(req.backend.recover(check=True).to_dict())
    return Response.json(req.backend.recover().to_dict())


def migration_claim(req: Request) -> Response:
    body = req.body
    return Response.json(
        req.backend.migration_claim(
            req.params["instance"], body["mdevs"], body.get("source_versions")
        )
    )


def migration_commit(req: Request) -> Response:
    return Response.json(req.backend.migration_commit(req.params["instance"]).to_dict())


def migration_abort(req: Request) -> Response:
    instance = req.params["instance"]
    remove = bool(req.query.get("remove", False))
    released = req.backend.migration_abort(instance, remove)
    return Response.json({"instance": instance, "released": released, "removed": remove})


def rewrite_domain_xml(req: Request) -> Response:
    # Through the agent, not the XML alone: its ledger says which of the domain's
    # PCI devices are its VFs, each of which needs a destination address.
    body = req.body
    result = req.backend.migration_rewrite(
        body["xml"], body["mapping"], body.get("pci_addresses") or {}
    )
    return Response.json(
        {
            "xml": result.xml,
            "replaced": [list(pair) for pair in result.replaced_uuids],
            "unused_keys": list(result.unused_uuids),
            "replaced_pci": [list(pair) for pair in result.replaced_pci],
        }
    )


def explain(req: Request) -> Response:
    """``accelctl explain --json``: read now, from sysfs and /proc, with the
    running policy and VF pools (a reload's apply at once)."""
    from accel_agent import explain as explain_mod

    address = req.query.get("address")
    document = explain_mod.from_manager(
        req.backend.devices, None if address is None else explain_mod.normalise_address(address)
    )
    return Response.json(document)


def reload(req: Request) -> Response:
    return Response.json(req.backend.request_reload().to_dict())


def openapi(req: Request) -> Response:
    return Response.json(req.openapi)


def metrics(req: Request) -> Response:
    body, content_type = req.backend.metrics.render()
    return Response.text(body, content_type)


INSTANCE = "/v1/instances/{instance}"

# while_starting: served while the agent starts (health, the listings, the
# document, the metrics); the others answer 503 AgentStarting until it is ready.

ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/health", health, while_starting=True),
    Route("GET", "/v1/types", types, while_starting=True),
    Route("GET", "/v1/mdevs", mdevs, while_starting=True),
    Route("GET", "/v1/inventory", inventory, while_starting=True),
    Route("GET", "/v1/explain", explain, while_starting=True),
    Route("GET", f"{INSTANCE}/allocation", get_allocation),
    Route("PUT", f"{INSTANCE}/allocation", put_allocation),
    Route("DELETE", f"{INSTANCE}/allocation", delete_allocation),
    Route("GET", f"{INSTANCE}/domain-xml", domain_xml),
    Route("GET", f"{INSTANCE}/attachments", get_attachments),
    Route("POST", f"{INSTANCE}/attachments", post_attachments),
    Route("DELETE", f"{INSTANCE}/attachments", delete_attachments),
    Route("POST", "/v1/mdevs/{uuid}/adopt", adopt),
    Route("POST", "/v1/recover", recover),
    Route("POST", "/v1/reload", reload),
    Route("POST", "/v1/takeover/libvirt", takeover),
    Route("POST", "/v1/migrations/{instance}/claim", migration_claim),
    Route("POST", "/v1/migrations/{instance}/commit", migration_commit),
    Route("DELETE", "/v1/migrations/{instance}", migration_abort),
    Route("POST", "/v1/domain-xml/rewrite", rewrite_domain_xml),
    Route("GET", "/v1/openapi.json", openapi, while_starting=True),
    Route("GET", "/metrics", metrics, while_starting=True),
)
