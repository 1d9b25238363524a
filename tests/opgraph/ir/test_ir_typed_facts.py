"""Facts code depends on are typed fields of an op, not parts of its definition: how the host issues it
(``issue``) and what makes a GEMM an expert GEMM (``Gemm.expert``). Files written before the fields
existed say them only in definitions; they load with the fields derived from those (the legacy path),
and every op keeps the config key and hash it had, so shipped device profiles keep theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware.profile import DeviceProfile
from opgraph.ir import (
    ExpertGemm,
    ExpertPart,
    ExpertsImpl,
    Gemm,
    HostIssue,
    Norm,
    OpGraph,
    host_syncs,
    is_nested,
    load_graph,
    parse_op,
    save_graph,
)
from opgraph.ir.configs import config_hash, config_key

CATALOG = Path(__file__).parents[3] / "hardware" / "catalog"


def _legacy_gemm(op_id: int, definition: str, **fields: object) -> dict[str, object]:
    """A GEMM as a graph file written before the typed facts existed holds it: no ``issue``, no ``expert``."""
    return {
        "kind": "gemm",
        "id": op_id,
        "m": 4,
        "n": 64,
        "k": 32,
        "target": "moe_experts_down",
        "definition": definition,
        **fields,
    }


def test_a_legacy_graph_file_loads_with_the_typed_facts_derived(tmp_path: Path) -> None:
    ops = [
        _legacy_gemm(0, "moe_grouped_mm_e8_h32_i32_topk2_down@sync"),
        _legacy_gemm(1, "moe_grouped_mm_e8_h32_i32_topk2_down@nested"),
        _legacy_gemm(2, "moe_batched_mm_e16_h64_i32_topk4_gate_up", batch=64, m=1),
        _legacy_gemm(3, "moe_loop_e8_n64_k32_topk2_down", groups=8),
        _legacy_gemm(4, "moe_eager_e8_h32_i32_topk2_gate_up"),
        _legacy_gemm(5, "gemm_n64_k32", target="aten.mm.default"),
        {"kind": "norm", "id": 6, "rows": 4, "hidden": 64, "definition": "rmsnorm_h64"},
    ]
    path = tmp_path / "old.graph.json"
    path.write_text(json.dumps({"schema_version": 1, "ops": ops, "edges": []}))
    g = load_graph(path)
    assert [op.issue for op in g.ops] == [HostIssue.SYNC, HostIssue.NESTED, *[HostIssue.CALL] * 5]
    assert host_syncs(g) == (0,) and [is_nested(op) for op in g.ops] == [False, True, *[False] * 5]
    experts = [op.expert for op in g.ops if isinstance(op, Gemm)]
    down, up = ExpertPart.DOWN, ExpertPart.GATE_UP
    assert experts == [
        ExpertGemm(impl=ExpertsImpl.GROUPED_MM, experts=8, top_k=2, part=down),
        ExpertGemm(impl=ExpertsImpl.GROUPED_MM, experts=8, top_k=2, part=down),
        ExpertGemm(impl=ExpertsImpl.BATCHED_MM, experts=16, top_k=4, part=up),
        ExpertGemm(impl=ExpertsImpl.LOOP, experts=8, top_k=2, part=down),
        ExpertGemm(impl=ExpertsImpl.LOOP, experts=8, top_k=2, part=up),  # transformers' eager loop
        None,
    ]
    # Saved again, the file holds the fields; it reads back the same and keeps every definition.
    again = load_graph(save_graph(g, tmp_path / "new.graph.json"))
    assert again == g and [op.definition for op in again.ops] == [op["definition"] for op in ops]
    raw = json.loads((tmp_path / "new.graph.json").read_text())
    assert raw["ops"][0]["issue"] == "sync" and raw["ops"][2]["expert"]["impl"] == "batched_mm"


def test_the_typed_facts_hold_whatever_the_definition_says() -> None:
    expert = ExpertGemm(impl=ExpertsImpl.GROUPED_MM, experts=8, top_k=2, part=ExpertPart.DOWN)
    synced = Gemm(id=3, m=4, n=64, k=32, definition="experts_down", issue=HostIssue.SYNC, expert=expert)
    nested = Gemm(id=4, m=4, n=64, k=32, definition="experts_down", issue=HostIssue.NESTED, expert=expert)
    norm = Norm(id=5, rows=4, hidden=64, definition="renamed@nested")  # a mark in a name set by hand
    g = OpGraph(ops=(synced, nested, norm))
    assert host_syncs(g) == (3,) and [is_nested(op) for op in g.ops] == [False, True, True]
    # A field given, even as its default, is never overridden by the definition: a file written now
    # says a GEMM is no expert GEMM and is issued as a call, whatever its name.
    named = parse_op(
        {"kind": "gemm", "id": 0, "m": 4, "n": 64, "k": 32, "expert": None, "issue": "call",
         "definition": "moe_grouped_mm_e8_h32_i32_topk2_down@nested"}
    )  # fmt: skip
    assert isinstance(named, Gemm) and named.expert is None and named.issue is HostIssue.CALL
    assert parse_op(json.loads(synced.model_dump_json())) == synced


def test_an_op_keeps_its_key_and_hash_where_its_fields_say_what_its_definition_says() -> None:
    definition = "moe_grouped_mm_e8_h32_i32_topk2_down@nested"
    legacy = Gemm(id=0, m=4, n=64, k=32, groups=8, definition=definition)
    typed = Gemm(
        id=1, m=4, n=64, k=32, groups=8, definition=definition, issue=HostIssue.NESTED,
        expert=ExpertGemm(impl=ExpertsImpl.GROUPED_MM, experts=8, top_k=2, part=ExpertPart.DOWN),
    )  # fmt: skip
    assert legacy == typed.model_copy(update={"id": 0})
    assert config_key(legacy) == config_key(typed) and config_hash(legacy) == config_hash(typed)
    # Fields that say something else key another config.
    other = typed.model_copy(update={"issue": HostIssue.CALL})
    assert config_key(other) != config_key(typed) and config_hash(other) != config_hash(typed)
    loop = typed.model_copy(update={"expert": typed.expert.model_copy(update={"impl": ExpertsImpl.LOOP})})  # type: ignore[union-attr]
    assert config_key(loop) != config_key(typed) and config_hash(loop) != config_hash(typed)


@pytest.mark.parametrize("name", ["h100-sxm", "h200"])
def test_shipped_profile_gemms_keep_their_keys_and_get_typed_facts(name: str) -> None:
    """The shipped profiles were written before the fields existed: their expert GEMMs get the fields
    from their definitions, and every GEMM point's saved key is still its op's config key."""
    profile = DeviceProfile.model_validate_json((CATALOG / f"{name}.profile.json").read_text())
    gemms = [p for p in profile.points if isinstance(p.op, Gemm)]
    assert gemms and all(p.key == config_key(p.op) for p in gemms if not p.tag)
    assert all(p.key.startswith(f"{config_key(p.op)}-{p.tag}") for p in gemms if p.tag)  # write-back: + dirty MiB
    impl_named = {"grouped_mm": ExpertsImpl.GROUPED_MM, "batched_mm": ExpertsImpl.BATCHED_MM}
    impl_named |= {"bmm": ExpertsImpl.BMM, "loop": ExpertsImpl.LOOP}
    seen = set()
    for p in gemms:
        op = p.op
        assert isinstance(op, Gemm)
        impl = next((v for k, v in impl_named.items() if op.definition.startswith(f"moe_{k}_e")), None)
        assert (op.expert.impl if op.expert else None) == impl, op.definition
        if op.expert is not None:
            seen.add(op.expert.impl)
            assert f"_e{op.expert.experts}_" in op.definition and f"_topk{op.expert.top_k}_" in op.definition
        assert op.issue is HostIssue.CALL
    assert seen == set(ExpertsImpl)
