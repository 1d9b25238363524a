"""Catalog: config hashing, merging with provenance, persistence and queries."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgraph.catalog import (
    Catalog,
    CatalogBuilder,
    CatalogError,
    ConfigSource,
    add_graph_files,
    build_catalog,
    config_hash,
    filter_entries,
    load_catalog,
    merge_catalogs,
    operation_name,
    save_catalog,
    select_op,
    summarize,
    tensor_layout,
)
from opgraph.ir import AtenCall, DType, Elementwise, Gemm, LoadError, OpGraph, OpKind, TensorSpec, save_graph


def _add(
    alpha: object = 1, strides: tuple[int, ...] | None = None, dtype: DType = DType.bf16, **kw: object
) -> Elementwise:
    return Elementwise(
        id=kw.pop("id", 0),  # type: ignore[arg-type]
        fn="add",
        numel=32,
        hidden=8,
        target="aten.add.Tensor",
        dtype=dtype,
        inputs=(TensorSpec(shape=(4, 8), dtype=dtype, strides=strides), TensorSpec(shape=(4, 8), dtype=dtype)),
        outputs=(TensorSpec(shape=(4, 8), dtype=dtype),),
        call=AtenCall(args=({"tensor": 0}, {"tensor": 1}), keywords={"alpha": alpha}),
        **kw,  # type: ignore[arg-type]
    )


def test_hash_ignores_identity_and_keeps_config() -> None:
    base = config_hash(_add())
    assert config_hash(_add(id=7, layer=3, scope="model.layers.3", step=2)) == base
    assert config_hash(_add(strides=(8, 1))) == base  # explicit contiguous strides are the same layout
    assert config_hash(_add(strides=(1, 4))) != base  # a transposed input is not
    assert config_hash(_add(alpha=2)) != base  # non-tensor call arguments are config
    assert config_hash(_add(dtype=DType.fp16)) != base
    assert config_hash(Gemm(id=0, m=8, n=16, k=32)) != config_hash(Gemm(id=0, m=16, n=16, k=32))
    assert len(base) == 64 and int(base, 16) >= 0


def test_tensor_layout_names() -> None:
    assert tensor_layout((4, 8), None) == "contiguous"
    assert tensor_layout((4, 8), (8, 1)) == "contiguous"
    assert tensor_layout((4, 8), (1, 4)) == "transposed"
    assert tensor_layout((4, 8), (0, 1)) == "broadcast"
    assert tensor_layout((4, 8), (16, 1)) == "strided"
    assert tensor_layout((1, 8), (99, 1)) == "contiguous"  # size-1 dims take any stride


def test_merge_counts_provenance(graphs: ModuleType) -> None:
    prefill = graphs.llama_like(phase="prefill")
    decode = graphs.llama_like(phase="decode")
    qwen = graphs.llama_like("tiny-qwen", "Qwen2ForCausalLM", vocab=512, hardware="H100")
    cat = build_catalog([prefill, decode, qwen])
    kernel_ops = sum(1 for g in (prefill, decode, qwen) for o in g.ops if o.kind is not OpKind.VIEW)
    assert sum(e.uses for e in cat.entries) == kernel_ops
    assert all(e.op.kind is not OpKind.VIEW for e in cat.entries)
    assert cat.models == ("tiny-llama", "tiny-qwen")
    # q_proj/o_proj at 16 tokens: 2 per layer x 2 layers in each prefill graph, shared by both models.
    hits = select_op(list(cat.entries), "gemm_n64_k64")
    prefill_hit = next(e for e in hits if e.op.m == 16)  # type: ignore[attr-defined]
    assert prefill_hit.uses == 8
    assert prefill_hit.models == ("tiny-llama", "tiny-qwen")
    assert {(s.model, s.count, s.hardware) for s in prefill_hit.sources} == {
        ("tiny-llama", 4, ""),
        ("tiny-qwen", 4, "H100"),
    }
    decode_hit = next(e for e in hits if e.op.m == 1)  # type: ignore[attr-defined]
    assert decode_hit.phases == ("decode",)
    assert [g.model for g in cat.graphs] == ["tiny-llama", "tiny-llama", "tiny-qwen"]
    # entries sorted and unique
    keys = [(e.operation, e.op.definition, e.hash) for e in cat.entries]
    assert keys == sorted(keys) and len({e.hash for e in cat.entries}) == len(cat.entries)


def test_views_only_when_asked(graphs: ModuleType) -> None:
    g = graphs.llama_like()
    assert "view" not in build_catalog([g]).operations
    assert "view" in build_catalog([g], include_views=True).operations


def test_same_graph_twice_is_skipped_unless_forced(graphs: ModuleType) -> None:
    g = graphs.llama_like()
    b = CatalogBuilder()
    first = b.add_graph(g)
    again = b.add_graph(g)
    assert not first.skipped and again.skipped and again.new_configs == 0
    once = b.build()
    forced = b.add_graph(g, force=True)
    assert not forced.skipped and forced.new_configs == 0
    assert sum(e.uses for e in b.build().entries) == 2 * sum(e.uses for e in once.entries)


def test_merge_catalogs_equals_building_at_once(graphs: ModuleType) -> None:
    a = graphs.llama_like(phase="prefill")
    b = graphs.llama_like(phase="decode")
    c = graphs.llama_like("tiny-qwen", "Qwen2ForCausalLM", vocab=512)
    merged = merge_catalogs(build_catalog([a, b]), build_catalog([c]))
    assert merged == build_catalog([a, b, c])
    assert merge_catalogs(merged, build_catalog([c])) == merged  # graphs already in: nothing added
    with pytest.raises(CatalogError, match="share"):
        merge_catalogs(merged, build_catalog([c, graphs.llama_like("other")]))


@settings(max_examples=20, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(min_value=0, max_value=10_000))
def test_catalog_independent_of_op_order_and_ids(graphs: ModuleType, rnd: random.Random, offset: int) -> None:
    g = graphs.llama_like(layers=3)
    ops = list(g.ops)
    rnd.shuffle(ops)
    renumbered = tuple(o.model_copy(update={"id": offset + i, "layer": None}) for i, o in enumerate(ops))
    shuffled = OpGraph(metadata=g.metadata, ops=renumbered)
    a, b = build_catalog([g]), build_catalog([shuffled])
    assert [(e.hash, e.uses) for e in a.entries] == [(e.hash, e.uses) for e in b.entries]


def test_save_load_round_trip(tmp_path: Path, graphs: ModuleType) -> None:
    cat = build_catalog([graphs.llama_like(), graphs.llama_like(phase="decode")])
    for name in ("cat.json", "cat.json.gz"):
        path = save_catalog(cat, tmp_path / name)
        assert load_catalog(path) == cat
        assert Catalog.model_validate_json(cat.model_dump_json()) == cat
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cat.json", "cat.json.gz"]  # no temp files left


OLD_CONFIG_SOURCE = (
    '{"model":"tiny-llama","architecture":"LlamaForCausalLM","phase":"decode","stage":"decode",'
    '"device":"meta","hardware":"H100","count":3}'
)
"""A config source as catalogs saved it before its first three fields came from ``GraphIdentity``."""


def test_an_older_saved_config_source_round_trips_identically() -> None:
    source = ConfigSource.model_validate_json(OLD_CONFIG_SOURCE)
    assert source.model_dump_json() == OLD_CONFIG_SOURCE  # same fields, same order, same values
    assert source.key() == ("tiny-llama", "LlamaForCausalLM", "decode", "decode", "meta", "H100")


def test_load_rejects_an_edited_entry(tmp_path: Path, graphs: ModuleType) -> None:
    path = save_catalog(build_catalog([graphs.llama_like()]), tmp_path / "cat.json")
    data = json.loads(path.read_text())
    data["entries"][0]["op"]["dtype"] = "fp32"
    path.write_text(json.dumps(data))
    with pytest.raises(LoadError, match="does not match its op"):
        load_catalog(path)


def test_add_graph_files_leaves_catalog_untouched_on_bad_graph(tmp_path: Path, graphs: ModuleType) -> None:
    good = save_graph(graphs.llama_like(), tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    cat_path = tmp_path / "cat.json"
    add_graph_files(cat_path, [good])
    before = cat_path.read_bytes()
    with pytest.raises(LoadError):
        add_graph_files(cat_path, [save_graph(graphs.llama_like("x"), tmp_path / "x.json"), bad])
    assert cat_path.read_bytes() == before


def test_queries(graphs: ModuleType) -> None:
    cat = build_catalog(
        [graphs.llama_like(), graphs.llama_like(phase="decode"), graphs.llama_like("tiny-qwen", vocab=512)]
    )
    rows = summarize(list(cat.entries))
    assert rows[0].operation == "gemm" and rows[0].uses == max(r.uses for r in rows)
    gemm = next(r for r in rows if r.operation == "gemm")
    assert gemm.configs == len(select_op(list(cat.entries), "gemm"))
    only_qwen = filter_entries(cat, model="TINY-Q*")
    assert {m for e in only_qwen for m in e.models} == {"tiny-qwen"}
    assert {e.op.m for e in filter_entries(cat, phase="decode") if e.operation == "gemm"} == {1}  # type: ignore[attr-defined]
    assert {e.operation for e in select_op(list(cat.entries), "norm")} == {"rmsnorm"}
    assert {e.op.definition for e in select_op(list(cat.entries), "gemm_n128_*")} == {"gemm_n128_k64"}
    h = cat.entries[0].hash
    assert [e.hash for e in select_op(list(cat.entries), h[:10])] == [h]
    with pytest.raises(CatalogError, match=r"known operations: .*gemm"):
        select_op(list(cat.entries), "conv2d")


def test_operation_names() -> None:
    assert operation_name(Gemm(id=0, m=1, n=2, k=2)) == "gemm"
    assert operation_name(Gemm(id=0, m=1, n=2, k=2, batch=4)) == "bmm"
    assert operation_name(Gemm(id=0, m=1, n=2, k=2, groups=8)) == "grouped_gemm"
    assert operation_name(_add()) == "add"
