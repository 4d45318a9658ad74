"""The pure planning half of the Placement reporter: desired vs actual -> actions."""

from __future__ import annotations

import ast
import functools
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from oslo_config import cfg

from accel_agent import exception
from accel_agent.config import registry
from accel_agent.devices.inventory import OWNER_TRAIT, Inventory, Provider, type_trait
from accel_agent.exception import InvalidConfig
from accel_agent.reporting import placement as placement_package
from accel_agent.reporting import placement_opts
from accel_agent.reporting.placement import PlacementReporter, answers
from accel_agent.reporting.placement.client import build_adapter
from accel_agent.reporting.placement.plan import (
    CreateProvider,
    DeleteProvider,
    ProviderState,
    Refuse,
    SetInventory,
    SetTraits,
    describe_inventory_change,
    plan,
    plan_provider,
    provider_uuid,
    same_inventories,
)

ROOT = str(uuid.uuid4())
HOST = "compute1"


def gpu(bus: str = "84", *, total: int = 16, rc: str = "VGPU", traits: Any = None) -> Provider:
    address = f"0000:{bus}:00.0"
    return Provider(
        name=f"{HOST}_pci_0000_{bus}_00_0",
        parent_provider=HOST,
        parent_device=address,
        parent_devices=(address,),
        pci_address=address,
        physical_gpu=address,
        numa_node=None,
        device_type="nvidia-35",
        resource_class=rc,
        total=total,
        used=0,
        traits=traits if traits is not None else (type_trait("nvidia-35"), OWNER_TRAIT),
    )


def record(total: int, reserved: int = 0, **overrides: Any) -> dict[str, Any]:
    return {
        "total": total,
        "reserved": reserved,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": 1.0,
        **overrides,
    }


def state_of(
    provider: Provider,
    *,
    inventories: dict[str, Any] | None = None,
    traits: Any = None,
    usages: dict[str, int] | None = None,
    rp_uuid: str | None = None,
) -> ProviderState:
    """What Placement holds once ``provider`` was synced (overridable)."""
    return ProviderState(
        uuid=rp_uuid or provider_uuid(provider.name),
        name=provider.name,
        generation=7,
        parent_uuid=ROOT,
        inventories=inventories
        if inventories is not None
        else {provider.resource_class: provider.inventory_record()},
        traits=frozenset(traits if traits is not None else provider.traits),
        usages=usages or {},
    )


def test_provider_uuid_is_deterministic_and_name_specific() -> None:
    assert provider_uuid("a") == provider_uuid("a") != provider_uuid("b")
    assert uuid.UUID(provider_uuid("a")).version == 5
    # Pinned: a provider's UUID must never change between releases (Placement
    # keys allocations by it), so the scheme is written out here.
    assert provider_uuid("compute1.example.org_pci_0000_84_00_0") == (
        "0c798f08-985b-535c-912f-f2fd7b1d6fc0"
    )
    assert provider_uuid("compute1.example.org_mtty_mtty") == (
        "cd52b99c-036a-5fb6-8aae-8be5b3a73c7c"
    )


def test_new_provider_created_traits_first_then_inventory() -> None:
    desired = gpu()
    actions = plan_provider(desired.name, desired, None, ROOT)
    expected_uuid = provider_uuid(desired.name)
    assert actions == [
        CreateProvider(desired.name, expected_uuid, ROOT),
        SetTraits(desired.name, expected_uuid, tuple(sorted(desired.traits)), frozenset()),
        SetInventory(desired.name, expected_uuid, {"VGPU": record(16)}, {}),
    ]
    assert actions[0].describe() == f"created provider {desired.name} ({expected_uuid})"
    assert actions[2].describe() == f"set inventory of {desired.name}: VGPU total 16"


def test_in_sync_provider_needs_nothing() -> None:
    desired = gpu()
    # Placement may answer allocation_ratio as an int-valued float; still equal.
    actual = state_of(desired, inventories={"VGPU": record(16, allocation_ratio=1)})
    assert plan_provider(desired.name, desired, actual, ROOT) == []


def test_owner_trait_always_reported() -> None:
    desired = gpu(traits=(type_trait("nvidia-35"),))
    actions = plan_provider(desired.name, desired, None, ROOT)
    traits = next(a for a in actions if isinstance(a, SetTraits)).traits
    assert OWNER_TRAIT in traits


def test_total_change_updates_inventory_and_says_so() -> None:
    desired = gpu(total=8)
    actual = state_of(gpu(total=16))
    [action] = plan_provider(desired.name, desired, actual, ROOT)
    assert isinstance(action, SetInventory) and not action.warns
    assert action.inventories == {"VGPU": record(8)}
    assert action.describe() == (
        f"updated inventory of {desired.name}: VGPU total 16 -> 8, max_unit 16 -> 8"
    )


def test_trait_change_replaces_the_set() -> None:
    desired = gpu()
    actual = state_of(desired, traits=(*desired.traits, "CUSTOM_OLD"))
    [action] = plan_provider(desired.name, desired, actual, ROOT)
    assert isinstance(action, SetTraits)
    assert set(action.traits) == set(desired.traits)
    assert action.describe() == f"updated traits of {desired.name}: -CUSTOM_OLD"


def test_resource_class_change_without_allocations_replaces_the_class() -> None:
    desired = gpu(rc="CUSTOM_NVIDIA_35")
    [action] = plan_provider(desired.name, desired, state_of(gpu()), ROOT)
    assert isinstance(action, SetInventory)
    assert action.inventories == {"CUSTOM_NVIDIA_35": record(16)}


def test_resource_class_change_keeps_allocated_class_drained() -> None:
    desired = gpu(rc="CUSTOM_NVIDIA_35")
    actual = state_of(gpu(), usages={"VGPU": 3})
    [action] = plan_provider(desired.name, desired, actual, ROOT)
    assert isinstance(action, SetInventory) and action.warns
    assert action.inventories == {
        "CUSTOM_NVIDIA_35": record(16),
        "VGPU": record(16, reserved=16),
    }
    assert "VGPU kept, drained, while 3 allocated" in action.describe()
    # Once written, nothing more happens until the allocations go.
    settled = state_of(gpu(), inventories=dict(action.inventories), usages={"VGPU": 3})
    assert plan_provider(desired.name, desired, settled, ROOT) == []
    freed = state_of(gpu(), inventories=dict(action.inventories))
    [final] = plan_provider(desired.name, desired, freed, ROOT)
    assert isinstance(final, SetInventory)
    assert final.inventories == {"CUSTOM_NVIDIA_35": record(16)}


def test_total_below_allocations_is_written_with_a_warning() -> None:
    desired = gpu(total=2)
    [action] = plan_provider(desired.name, desired, state_of(gpu(), usages={"VGPU": 5}), ROOT)
    assert isinstance(action, SetInventory) and action.warns
    assert action.inventories == {"VGPU": record(2)}
    assert "below the 5 allocated" in action.describe()


def test_removed_provider_without_allocations_is_deleted() -> None:
    actual = state_of(gpu())
    assert plan_provider(actual.name, None, actual, ROOT) == [
        DeleteProvider(actual.name, actual.uuid)
    ]


def test_removed_provider_with_allocations_is_drained_not_deleted() -> None:
    actual = state_of(gpu(), usages={"VGPU": 2})
    [action] = plan_provider(actual.name, None, actual, ROOT)
    assert isinstance(action, SetInventory) and action.drain and action.warns
    assert action.inventories == {"VGPU": record(16, reserved=16)}
    assert action.describe().startswith(f"drained {actual.name}: 2 allocated")
    drained = state_of(gpu(), inventories=dict(action.inventories), usages={"VGPU": 2})
    assert plan_provider(actual.name, None, drained, ROOT) == []


def test_returning_gpu_is_undrained() -> None:
    desired = gpu()
    drained = state_of(desired, inventories={"VGPU": record(16, reserved=16)}, usages={"VGPU": 1})
    [action] = plan_provider(desired.name, desired, drained, ROOT)
    assert isinstance(action, SetInventory)
    assert action.inventories == {"VGPU": record(16)}


@pytest.mark.parametrize("exists", [False, True])
def test_zero_total_is_never_written(exists: bool) -> None:
    desired = gpu(total=0)
    actual = state_of(gpu()) if exists else None
    actions = plan_provider(desired.name, desired, actual, ROOT)
    assert actions == (
        [DeleteProvider(desired.name, provider_uuid(desired.name))] if exists else []
    )
    assert not any(
        rec["total"] == 0
        for a in actions
        if isinstance(a, SetInventory)
        for rec in a.inventories.values()
    )


def test_foreign_provider_is_never_touched() -> None:
    foreign = state_of(gpu(), traits=("COMPUTE_NODE",), rp_uuid=str(uuid.uuid4()))
    assert plan_provider(foreign.name, None, foreign, ROOT) == []
    [refusal] = plan_provider(foreign.name, gpu(), foreign, ROOT)
    assert isinstance(refusal, Refuse)
    assert "not created by accel-agent" in refusal.describe()


def test_take_over_makes_a_novas_provider_ours_in_place() -> None:
    """[placement] take_over_providers: Nova's provider of our name keeps its UUID
    (its allocations stay valid), gets the owner trait and our inventory."""
    desired = gpu()
    nova_uuid = str(uuid.uuid4())
    nova = state_of(gpu(total=16), traits=(), rp_uuid=nova_uuid, inventories={"VGPU": record(14)})
    assert not nova.owned
    actions = plan_provider(desired.name, desired, nova, ROOT, take_over=True)
    assert not any(isinstance(a, CreateProvider | DeleteProvider | Refuse) for a in actions)
    traits, inventory = actions
    assert isinstance(traits, SetTraits) and traits.uuid == nova_uuid
    assert OWNER_TRAIT in traits.traits
    assert isinstance(inventory, SetInventory) and inventory.uuid == nova_uuid
    # a Nova provider the agent has nothing for is still left alone
    assert plan_provider(desired.name, None, nova, ROOT, take_over=True) == []


def test_take_over_drops_novas_owner_trait_from_the_provider_it_takes() -> None:
    """Nova 34 tags the pGPU providers it makes OWNER_NOVA.  Taken over, the
    provider is the agent's and says only that: owner_nova_filter asks
    OWNER_NOVA of the root (never written by the agent) and of PCI request
    groups, never of a VGPU group's provider, so nothing Nova schedules needs
    it there; kept, a Nova PCI group of the same class would match a provider
    Nova's PCI tracker does not know (tests/functional/test_owner_nova.py)."""
    desired = gpu()
    nova = state_of(gpu(), traits=("OWNER_NOVA",), rp_uuid=str(uuid.uuid4()))
    [traits] = plan_provider(desired.name, desired, nova, ROOT, take_over=True)
    assert isinstance(traits, SetTraits) and traits.uuid == nova.uuid
    assert traits.traits == ("CUSTOM_MDEV_NVIDIA_35", "CUSTOM_OWNER_ACCEL_AGENT")
    assert traits.describe() == (
        f"updated traits of {desired.name}: +CUSTOM_MDEV_NVIDIA_35 "
        "+CUSTOM_OWNER_ACCEL_AGENT -OWNER_NOVA"
    )


def test_own_uuid_without_owner_trait_is_adopted() -> None:
    # Crash between POST /resource_providers and the traits PUT.
    desired = gpu()
    half = state_of(desired, inventories={}, traits=())
    assert half.owned
    actions = plan_provider(desired.name, desired, half, ROOT)
    assert [type(a) for a in actions] == [SetTraits, SetInventory]


def test_plan_covers_the_subtree_in_name_order() -> None:
    keep, change, new = gpu("84"), gpu("85", total=4), gpu("86")
    gone = state_of(gpu("83"))
    actual = {
        gone.name: gone,
        keep.name: state_of(keep),
        change.name: state_of(gpu("85")),
    }
    actions = plan([new, change, keep], actual, ROOT)
    assert [(type(a).__name__, a.name) for a in actions] == [
        ("DeleteProvider", gone.name),
        ("SetInventory", change.name),
        ("CreateProvider", new.name),
        ("SetTraits", new.name),
        ("SetInventory", new.name),
    ]


def test_inventory_comparison_and_description() -> None:
    assert same_inventories({"VGPU": record(4)}, {"VGPU": record(4, allocation_ratio=1)})
    assert not same_inventories({"VGPU": record(4)}, {"VGPU": record(4, reserved=1)})
    assert not same_inventories({"VGPU": record(4)}, {"PGPU": record(4)})
    text = describe_inventory_change({"VGPU": record(4)}, {"CUSTOM_X": record(2)})
    assert text == "CUSTOM_X total 2 (new class); VGPU removed"


def test_disabled_reporter_does_nothing_and_says_so() -> None:
    reporter = PlacementReporter(None, HOST)
    result = reporter.sync(Inventory(host=HOST, providers=(gpu(),)))
    assert not result.attempted and result.ok
    assert reporter.health() == {
        "enabled": False,
        "state": "disabled",
        "syncing_since": None,
        "sync_deadline": 60,
        "last_success": None,
        "last_error": None,
        "consecutive_failures": 0,
        "providers": 0,
        "next_attempt_at": None,
    }


def test_options_register_and_list() -> None:
    conf = cfg.ConfigOpts()
    registry.register(conf)
    registry.register(conf)  # idempotent
    conf([], default_config_files=[])
    assert conf.placement.enabled is False
    assert conf.placement.create_root_provider is False
    assert conf.placement.max_conflict_retries == 4
    assert conf.placement.service_type == "placement"
    assert conf.placement.timeout == 30
    [(group, opts)] = placement_opts.list_opts()
    names = [o.dest for o in opts]
    assert group == "placement" and len(names) == len(set(names))
    assert {"enabled", "sync_interval", "auth_type", "endpoint", "token", "password"} <= set(names)
    assert PlacementReporter.from_conf(_with_host(conf)).health()["state"] == "disabled"


def _with_host(conf: cfg.ConfigOpts) -> cfg.ConfigOpts:
    conf.set_override("host", HOST)
    return conf


def _conf_from(tmp_path: Path, ini: str) -> cfg.ConfigOpts:
    path = tmp_path / "agent.conf"
    path.write_text("[placement]\nenabled = true\n" + ini)
    conf = cfg.ConfigOpts()
    registry.register(conf)
    conf(["--config-file", str(path)], default_config_files=[])
    return conf


def test_adapter_from_conf_needs_usable_auth(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="needs auth_type"):
        build_adapter(_conf_from(tmp_path, ""))
    with pytest.raises(InvalidConfig, match="auth_url"):
        build_adapter(_conf_from(tmp_path, "auth_type = password\n"))
    # Plugin options (endpoint, token) are read once keystoneauth loads the plugin.
    conf = _conf_from(
        tmp_path, "auth_type = admin_token\nendpoint = http://127.0.0.1:1\ntoken = admin\n"
    )
    adapter = build_adapter(conf)
    assert adapter.service_type == "placement"
    assert adapter.get_endpoint() == "http://127.0.0.1:1"  # no catalog lookup


# --- answers: read with a bound, JSON, checked for their shape --------------------------


class Body:
    """A response body handing out ``chunks``; counts what was taken."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.taken = 0

    def read(self, amt: int, decode_content: bool) -> bytes:
        assert decode_content is False  # never inflated by the reader
        chunk = self.chunks.pop(0)[:amt] if self.chunks else b""
        self.taken += len(chunk)
        return chunk


def test_an_answer_is_read_whole_up_to_the_bound() -> None:
    raw = Body([b'{"a": ', b"1}"])
    assert answers.read_body(raw, {}, limit=8) == b'{"a": 1}'


def test_a_declared_length_above_the_bound_is_refused_unread() -> None:
    raw = Body([b"x" * 9])
    with pytest.raises(answers.AnswerRejected, match="Content-Length 9 exceeds the 8 bytes"):
        answers.read_body(raw, {"Content-Length": "9"}, limit=8)
    with pytest.raises(answers.AnswerRejected, match="is not a number"):
        answers.read_body(raw, {"Content-Length": "1_0"}, limit=8)
    assert raw.taken == 0


def test_a_body_past_the_bound_stops_the_read_there() -> None:
    raw = Body([b"x" * 5] * 1000)
    with pytest.raises(answers.AnswerRejected, match=r"exceeds the 8 bytes .* read stopped"):
        answers.read_body(raw, {}, limit=8)
    assert raw.taken == 10 and len(raw.chunks) == 998


def test_a_compressed_body_is_not_inflated() -> None:
    raw = Body([b"\x1f\x8b"])
    with pytest.raises(answers.AnswerRejected, match="'gzip'-encoded body"):
        answers.read_body(raw, {"Content-Encoding": "gzip"})
    assert raw.taken == 0


RP = {"uuid": ROOT, "name": HOST, "generation": 3, "parent_provider_uuid": None,
      "root_provider_uuid": ROOT, "links": []}


def test_answers_as_placement_sends_them_pass() -> None:
    listing = answers.provider_list({"resource_providers": [RP]})
    assert listing == [answers.ProviderRef(ROOT, HOST, 3, None)]
    written = answers.inventories(
        {"inventories": {"VGPU": record(16)}, "resource_provider_generation": 4}, written=True
    )
    assert (written.records, written.generation) == ({"VGPU": record(16)}, 4)
    assert answers.traits({"traits": ["A"], "resource_provider_generation": 1}).names == ("A",)
    assert answers.usages({"usages": {"VGPU": 2}, "resource_provider_generation": 1}) == {
        "VGPU": 2
    }


@pytest.mark.parametrize(
    "shape, doc, reason",
    [
        (answers.provider_list, {}, "resource_providers is missing"),
        (answers.provider_list, [], "the body is a list, not an object"),
        (answers.provider_list, {"resource_providers": {}}, "resource_providers is an object"),
        (answers.provider_list, {"resource_providers": [{**RP, "uuid": None}]},
         "resource_providers[0].uuid is null, not a string"),
        (answers.provider_list, {"resource_providers": [{**RP, "uuid": "a/../b"}]},
         "resource_providers[0].uuid is a string 'a/../b', not a UUID"),
        (answers.provider, {**RP, "uuid": "{" + ROOT + "}"}, "uuid is a string '{"),
        (answers.provider, {**RP, "generation": "3"}, "generation is a string '3', not an"),
        (answers.provider, {**RP, "generation": 3.0}, "generation is a number 3.0, not an"),
        (answers.provider, {**RP, "name": 7}, "name is a number 7, not a string"),
        (answers.provider, {**RP, "parent_provider_uuid": 1}, "parent_provider_uuid is a num"),
        (answers.inventories, {"inventories": {"VGPU": {**record(1), "total": None}}},
         "inventories.VGPU.total is null, not an integer"),
        (answers.inventories, {"inventories": {"VGPU": {**record(1), "allocation_ratio": 1e999}}},
         "inventories.VGPU.allocation_ratio is not a finite number"),
        (answers.inventories, {"inventories": {"VGPU": {**record(1), "allocation_ratio": 10**400}}},
         "inventories.VGPU.allocation_ratio is not a finite number"),
        (answers.inventories, {"inventories": {"VGPU": 16}}, "inventories.VGPU is a number"),
        (answers.traits, {"traits": "CUSTOM_X"}, "traits is a string 'CUSTOM_X', not a list"),
        (answers.traits, {"traits": [None]}, "traits[0] is null, not a string"),
        (answers.usages, {"usages": {"VGPU": True}}, "usages.VGPU is a boolean true"),
        (functools.partial(answers.traits, written=True), {"traits": []},
         "resource_provider_generation is missing"),
    ],
)
def test_an_answer_of_the_wrong_shape_is_rejected_saying_where(
    shape: Any, doc: Any, reason: str
) -> None:
    with pytest.raises(answers.AnswerRejected) as caught:
        shape(doc)
    assert str(caught.value).startswith(reason), str(caught.value)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "a body that is not JSON"),
        (b"\xff\xfe{}", "a body that is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "a JSON body nested too deeply"),
    ],
)
def test_a_body_that_is_no_json_is_rejected(data: bytes, reason: str) -> None:
    with pytest.raises(answers.AnswerRejected, match=re.escape(reason)):
        answers.decode_json(data)


# --- the package's shape (issue 22) -----------------------------------------------------

PACKAGE = Path(placement_package.__file__).parent

# What planning may use: data in, data out.  No client, no clock, no log, no
# randomness: the whole plan is unit-tested above without any of them.
PLAN_MAY_IMPORT = {
    "__future__",
    "collections.abc",
    "dataclasses",
    "typing",
    "uuid",
    "accel_agent.devices.inventory",
    "accel_agent.reporting.placement.answers",  # INVENTORY_FIELDS, a constant
}


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_the_plan_needs_no_http_nor_any_other_io() -> None:
    assert _imported(PACKAGE / "plan.py") - PLAN_MAY_IMPORT == set()


def test_the_reporter_stays_in_small_modules() -> None:
    """No module of 500 lines or more, no class of 300 or more: each part
    of a sync stays readable on its own."""
    too_big = []
    for path in sorted(PACKAGE.glob("*.py")):
        text = path.read_text()
        if text.count("\n") >= 500:
            too_big.append(f"{path.name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length >= 300:
                    too_big.append(f"{path.name}: class {node.name}, {length} lines")
    assert too_big == []


def test_a_rejected_answer_is_an_outage_of_the_agent_s_own_kind() -> None:
    """Raised by the client, defined with the agent's other exceptions: a
    Placement sending what it never sends is as good as down (the whole sync
    fails and backs off), and the message names the request."""
    error = exception.PlacementAnswerRejected(
        method="GET", url="/resource_providers", reason="uuid is missing", request_id="req-1"
    )
    assert isinstance(error, exception.PlacementUnavailable)
    assert error.message == (
        "Placement's answer to GET /resource_providers rejected: uuid is missing (request req-1)"
    )
