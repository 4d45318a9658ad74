"""Run by the Nova-code tier's python (Nova 34.0.0's venv), never by the agent's.

Builds the ``GET /allocation_candidates`` query strings of Nova 34's own
scheduler code for test_owner_nova.py's flavors: a ``RequestSpec``, the
request filters ``compute_status_filter`` and ``owner_nova_filter`` (with the
minimum nova-compute service version below and at 73), then
``resources_from_request_spec(...).to_querystring()``.  Prints one JSON
object, ``{"<case> <filtered>": "<query string>"}``, on stdout.
"""

from __future__ import annotations

import json
import sys
import uuid
import warnings
from typing import Any
from unittest import mock

warnings.simplefilter("ignore")  # eventlet's deprecation, on stderr, is noise here

import nova.conf  # noqa: E402
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402

objects.register_all()
CONF = nova.conf.CONF
CONF([], project="nova", default_config_files=[])

from nova.scheduler import request_filter, utils  # noqa: E402

# test_owner_nova.PCI_GROUP without its "-0": the PCI request's id.
PCI_REQUEST_ID = str(uuid.UUID(int=0x24))


def request_spec(extra_specs: dict[str, str], pci: bool = False) -> Any:
    """A boot request: 2 vCPUs, 4096 MB, 20 GB root disk, and ``extra_specs``."""
    flavor = objects.Flavor(
        vcpus=2, memory_mb=4096, root_gb=20, ephemeral_gb=0, swap=0, extra_specs=extra_specs
    )
    spec = objects.RequestSpec(
        flavor=flavor,
        is_bfv=False,
        image=objects.ImageMeta(properties=objects.ImageMetaProps()),
        requested_resources=[],
        request_level_params=objects.RequestLevelParams(),
        project_id="project",
        scheduler_hints={},
    )
    if pci:
        # What pci_passthrough:alias of an alias with resource_class
        # CUSTOM_L40S_4Q becomes (nova.pci.request), one device.
        spec.pci_requests = objects.InstancePCIRequests(
            requests=[
                objects.InstancePCIRequest(
                    count=1,
                    spec=[{"resource_class": "CUSTOM_L40S_4Q"}],
                    request_id=PCI_REQUEST_ID,
                    alias_name="l40s",
                )
            ]
        )
        spec.generate_request_groups_from_pci_requests()
    return spec


def query(spec: Any, filtered: bool) -> str:
    ctx = nova_context.get_admin_context()
    request_filter.compute_status_filter(ctx, spec)
    version = request_filter.MIN_COMPUTE_VERSION_OWNER_TRAIT - (0 if filtered else 1)
    with mock.patch.object(
        objects.service, "get_minimum_version_all_cells", return_value=version
    ):
        request_filter.owner_nova_filter(ctx, spec)
    return str(utils.resources_from_request_spec(ctx, spec, mock.Mock()).to_querystring())


def main() -> None:
    out = {}
    for filtered in (False, True):
        out[f"vgpu {filtered}"] = query(request_spec({"resources:VGPU": "1"}), filtered)
        out[f"two-gpus {filtered}"] = query(
            request_spec(
                {
                    "resources1:CUSTOM_L40S_4Q": "1",
                    "resources2:CUSTOM_L40S_4Q": "1",
                    "group_policy": "isolate",
                }
            ),
            filtered,
        )
        CONF.set_override("pci_in_placement", True, "filter_scheduler")
        out[f"pci-alias {filtered}"] = query(request_spec({}, pci=True), filtered)
        CONF.clear_override("pci_in_placement", "filter_scheduler")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
