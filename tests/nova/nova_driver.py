"""Feed attach handles to Nova 34's own libvirt driver code; run with the
Python of Nova's venv (tests/nova/novavenv.py), never the agent's.

stdin: {"sysfs_root": the simulated sysfs, "cases": {name: [bound ARQs]}}.
stdout: {name: {"mdevs": what ``_allocate_cyborg_mdevs`` returned, "created"
and "defined": every node device Nova asked libvirt to create or define,
"guest_xml": the guest config ``_get_guest_config`` built, "error": null or
{"type", "message"} of what Nova raised, "sysfs_mdevs": the mdev UUIDs in
sysfs afterwards}}, the cases run in order, each on the host as the ones
before left it (one process: Nova's imports take seconds).

libvirt is Nova's own fakelibvirt (nova.tests.fixtures.libvirt, shipped in
the wheel), told the host state a real libvirt would report: every mdev of
the simulated sysfs as a node device named the way libvirt (>= 7.7) names
them, ``mdev_<uuid with _>_<parent address with _>``.  A node device Nova
creates is written to the simulated sysfs (what libvirt's mdevctl does), so
the caller can count the mdevs there.  Nothing here knows the agent's
handle format: the names come from sysfs, the lookups from Nova.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Any

from lxml import etree

_PCI = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def libvirt_name(sysfs_name: str) -> str:
    """libvirt's node-device name of a device whose sysfs name is given."""
    if _PCI.fullmatch(sysfs_name):
        return "pci_" + re.sub(r"[:.]", "_", sysfs_name)
    return sysfs_name


def sysfs_mdevs(root: str) -> dict[str, tuple[str, str]]:
    """{uuid: (parent's sysfs name, mdev type)} of every mdev in sysfs."""
    found = {}
    base = os.path.join(root, "bus", "mdev", "devices")
    for uuid in sorted(os.listdir(base)):
        device = os.path.realpath(os.path.join(base, uuid))
        mdev_type = os.path.basename(os.path.realpath(os.path.join(device, "mdev_type")))
        found[uuid] = (os.path.basename(os.path.dirname(device)), mdev_type)
    return found


def mdev_node_name(uuid: str, parent: str) -> str:
    suffix = parent[4:] if parent.startswith("pci_") else parent
    return f"mdev_{uuid.replace('-', '_')}_{suffix}"


def run_all(spec: dict[str, Any]) -> dict[str, Any]:
    answers = {}
    for name, accel_info in spec["cases"].items():
        answers[name] = run(spec["sysfs_root"], accel_info)
        answers[name]["sysfs_mdevs"] = sorted(sysfs_mdevs(spec["sysfs_root"]))
    return answers


def run(root: str, accel_info: list[dict[str, Any]]) -> dict[str, Any]:
    import fixtures
    from nova import conf, objects
    from nova.tests.fixtures import conf as conf_fixtures
    from nova.tests.fixtures import libvirt as fakelibvirt
    from nova.virt import fake
    from nova.virt.libvirt import driver as libvirt_driver
    from nova.virt.libvirt import host as libvirt_host

    created: list[dict[str, str]] = []
    defined: list[dict[str, str]] = []

    def parse_mdev_xml(xml: str) -> dict[str, str]:
        tree = etree.fromstring(xml)
        return {
            "parent": tree.findtext("parent"),
            "type": tree.find("capability/type").get("id"),
            "uuid": tree.findtext("capability/uuid"),
        }

    class HostConnection(fakelibvirt.Connection):
        """fakelibvirt with the simulated host's mdevs as node devices."""

        def __init__(self) -> None:
            devices = {}
            for uuid, (parent, mdev_type) in sysfs_mdevs(root).items():
                name = mdev_node_name(uuid, libvirt_name(parent))
                devices[name] = fakelibvirt.FakeMdevDevice(name, mdev_type, libvirt_name(parent))
            super().__init__(
                "qemu:///system",
                False,
                mdev_info=fakelibvirt.HostMdevDevicesInfo(devices=devices),
            )

        def nodeDeviceLookupByName(self, name: str) -> Any:
            # fakelibvirt answers an unknown mdev name with a KeyError; libvirt
            # with VIR_ERR_NO_NODE_DEVICE, which Nova takes as "create it".
            if name.startswith("mdev") and name not in self.mdev_info.devices:
                raise fakelibvirt.make_libvirtError(
                    fakelibvirt.libvirtError,
                    f"Node device not found: no node device with matching name '{name}'",
                    error_code=fakelibvirt.VIR_ERR_NO_NODE_DEVICE,
                    error_domain=fakelibvirt.VIR_FROM_NODEDEV,
                )
            return super().nodeDeviceLookupByName(name)

        def nodeDeviceCreateXML(self, xml: str, flags: int) -> Any:
            # As libvirt does through mdevctl: the parent must be a node
            # device of the host; the mdev is written to its type's create.
            mdev = parse_mdev_xml(xml)
            created.append(mdev)
            parents = {
                libvirt_name(a): a for a in os.listdir(os.path.join(root, "bus", "pci", "devices"))
            }
            if mdev["parent"] not in parents:
                raise fakelibvirt.make_libvirtError(
                    fakelibvirt.libvirtError,
                    f"Node device not found: no node device with matching name '{mdev['parent']}'",
                    error_code=fakelibvirt.VIR_ERR_NO_NODE_DEVICE,
                    error_domain=fakelibvirt.VIR_FROM_NODEDEV,
                )
            path = os.path.join(
                root, "bus", "pci", "devices", parents[mdev["parent"]],
                "mdev_supported_types", mdev["type"], "create",
            )
            try:
                with open(path, "w") as handle:
                    handle.write(mdev["uuid"])
            except OSError as e:
                raise fakelibvirt.make_libvirtError(
                    fakelibvirt.libvirtError,
                    f"internal error: creating mdev {mdev['uuid']}: {e}",
                    error_code=fakelibvirt.VIR_ERR_INTERNAL_ERROR,
                ) from None
            name = mdev_node_name(mdev["uuid"], mdev["parent"])
            return fakelibvirt.NodeDevice(
                self, fakelibvirt.FakeMdevDevice(name, mdev["type"], mdev["parent"]).xml
            )

        def nodeDeviceDefineXML(self, xml: str, flags: int) -> Any:
            mdev = parse_mdev_xml(xml)
            defined.append(mdev)
            name = mdev_node_name(mdev["uuid"], mdev["parent"])
            return fakelibvirt.NodeDevice(
                self, fakelibvirt.FakeMdevDevice(name, mdev["type"], mdev["parent"]).xml
            )

    objects.register_all()
    CONF = conf.CONF
    conf_fixture = conf_fixtures.ConfFixture(CONF)  # Nova's own tests' config
    conf_fixture.setUp()
    workdir = tempfile.mkdtemp(prefix="nova-tier-")
    CONF.set_override("instances_path", workdir)
    CONF.set_override("state_path", workdir)
    CONF.set_override("lock_path", workdir, group="oslo_concurrency")
    CONF.set_override("virt_type", "kvm", group="libvirt")
    connection = HostConnection()
    libvirt_fixture = fakelibvirt.LibvirtFixture()
    libvirt_fixture.setUp()
    answer: dict[str, Any] = {"mdevs": None, "guest_xml": None, "error": None}
    try:
        with fixtures.MonkeyPatch(
            "nova.virt.libvirt.host.Host.get_connection", lambda self: connection
        ):
            assert libvirt_host.libvirt is fakelibvirt  # the fixture's doing
            driver = libvirt_driver.LibvirtDriver(fake.FakeVirtAPI(), False)
            try:
                # What spawn() does with the ARQs before building the XML.
                mdevs = driver._allocate_cyborg_mdevs(accel_info)
                answer["mdevs"] = mdevs
                guest = driver._get_guest_config(
                    _instance(objects),
                    network_info=[],
                    image_meta=objects.ImageMeta.from_dict({"disk_format": "raw"}),
                    disk_info={"mapping": {}},
                    mdevs=mdevs,
                    accel_info=accel_info,
                )
                answer["guest_xml"] = guest.to_xml()
            except Exception as e:  # what Nova raised: the caller judges it
                answer["error"] = {"type": type(e).__name__, "message": str(e),
                                   "traceback": traceback.format_exc()}
    finally:
        libvirt_fixture.cleanUp()
        conf_fixture.cleanUp()
        shutil.rmtree(workdir, ignore_errors=True)
    answer["created"], answer["defined"] = created, defined
    return answer


def _instance(objects: Any) -> Any:
    flavor = objects.Flavor(
        memory_mb=2048, swap=0, vcpu_weight=None, root_gb=10, id=2, name="m1.small",
        ephemeral_gb=0, rxtx_factor=1.0, flavorid="1", vcpus=2, extra_specs={},
    )
    return objects.Instance(
        id=1, uuid="6f4d8a5c-2b1e-4c3d-9a7b-1e2f3a4b5c6d", memory_kb="2097152",
        display_name="nova-tier", vcpus=2, project_id="p", user_id="u",
        image_ref="155d900f-4e14-4e4c-a73d-069cbf4541e6", root_gb=10, ephemeral_gb=0,
        system_metadata={"image_disk_format": "raw"}, instance_type_id=2, flavor=flavor,
        new_flavor=None, old_flavor=None, pci_devices=objects.PciDeviceList(),
        numa_topology=None, config_drive="", vm_mode=None, vm_state=None, kernel_id=None,
        ramdisk_id=None, os_type="linux", ephemeral_key_uuid=None, vcpu_model=None,
        host="testhost", node="testhost", task_state=None, trusted_certs=None,
        resources=None, migration_context=None,
    )


if __name__ == "__main__":
    json.dump(run_all(json.load(sys.stdin)), sys.stdout)
