"""Sweep loader: exact traced configs, all_cases products, ids, and judging replay results."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest

from opgraph.catalog import Catalog, build_catalog, config_hash
from opgraph.ir import Attention, DType, GraphMetadata, OpGraph
from validators.sweep import SweepCase, SweepError, SweepLoader, check_replay, sweep_params


@pytest.fixture(scope="module")
def catalog(graphs: ModuleType) -> Catalog:
    return build_catalog(
        [
            graphs.llama_like(phase="prefill"),
            graphs.llama_like(phase="decode"),
            graphs.llama_like("tiny-llama-fp16", dtype=DType.fp16),
        ]
    )


def test_exact_configs_deduplicated_and_most_used_first(catalog: Catalog) -> None:
    cases = SweepLoader(catalog).cases("gemm")
    hashes = [c.hash for c in cases]
    assert len(hashes) == len(set(hashes)) == len([e for e in catalog.entries if e.operation == "gemm"])
    assert [c.uses for c in cases] == sorted((c.uses for c in cases), reverse=True)
    assert all(c.traced for c in cases)
    ids = [c.id for c in cases]
    assert "gemm_n64_k64-m16-bf16" in ids and "gemm_n64_k64-m1-bf16" in ids and "gemm_n64_k64-m16-fp16" in ids
    assert len(set(ids)) == len(ids)


def test_params_are_pytest_params_with_ids(catalog: Catalog) -> None:
    params = sweep_params(catalog, "rmsnorm")
    assert [p.id for p in params] == [c.id for c in SweepLoader(catalog).cases("rmsnorm")]
    assert all(len(p.values) == 1 and p.values[0].kind.value == "norm" for p in params)
    assert SweepLoader(catalog).get_suite_parameters("rmsnorm") == params


def test_all_cases_is_the_product_of_shapes_dtypes_options(catalog: Catalog) -> None:
    loader = SweepLoader(catalog)
    exact = loader.cases("gemm")
    every = loader.cases("gemm", all_cases=True)
    shapes = {(c.op.m, c.op.n, c.op.k) for c in exact}  # type: ignore[attr-defined]
    dtypes = {c.op.dtype for c in exact}
    assert len(every) == len(shapes) * len(dtypes)
    assert {c.hash for c in exact} <= {c.hash for c in every}
    made = [c for c in every if not c.traced]
    assert made and all(c.uses == 0 and c.models == () for c in made)
    # decode shapes were only traced in bf16; the product makes their fp16 twins, with consistent tensors
    twin = next(c for c in made if c.op.m == 1 and c.op.dtype is DType.fp16)  # type: ignore[attr-defined]
    assert all(t.dtype is DType.fp16 for t in (*twin.op.inputs, *twin.op.outputs))
    assert twin.op.bytes_read == sum(t.nbytes for t in twin.op.inputs)  # derived again, not copied
    assert twin.hash == config_hash(twin.op)


def test_all_cases_options_and_invalid_combinations_dropped() -> None:
    ops = (
        Attention(id=0, batch=1, q_len=8, kv_len=8, heads=4, kv_heads=2, head_dim=16, causal=True),
        Attention(id=1, batch=1, q_len=4, kv_len=8, heads=4, kv_heads=2, head_dim=16, causal=False),
    )
    cat = build_catalog([OpGraph(metadata=GraphMetadata(model="m"), ops=ops)])
    cases = SweepLoader(cat).cases("attention", all_cases=True)
    assert len(cases) == 4  # 2 shapes x 2 causal flags
    ids = {c.id for c in cases}
    assert "gqa_ragged_prefill_full_h4_kv2_d16-b1_q8_kv8-bf16-nocausal" in ids
    assert "gqa_ragged_prefill_causal_h4_kv2_d16-b1_q4_kv8-bf16-causal" in ids
    assert len(SweepLoader(cat).cases("attention", all_cases=True, limit=3)) == 3


def test_limits_and_errors(catalog: Catalog) -> None:
    loader = SweepLoader(catalog)
    with pytest.raises(SweepError, match="max_cases"):
        loader.cases("gemm", all_cases=True, max_cases=2)
    assert len(loader.cases("gemm", all_cases=True, limit=2)) == 2
    with pytest.raises(SweepError, match="known operations"):
        loader.cases("conv2d")
    assert {c.op.dtype for c in loader.cases("gemm", model="tiny-llama-fp16")} == {DType.fp16}


def test_case_json_round_trip(catalog: Catalog) -> None:
    for c in SweepLoader(catalog).cases("add"):
        assert SweepCase.from_json(c.to_json()) == c


@dataclass
class _Result:
    status: str
    reason: str = ""


def test_check_replay_statuses() -> None:
    check_replay(_Result("ok"))
    with pytest.raises(pytest.skip.Exception, match="no recipe"):
        check_replay(_Result("unsupported", "no recipe for aten.foo"))
    with pytest.raises(pytest.fail.Exception, match="mismatch: max_rel"):
        check_replay(_Result("mismatch", "max_rel 0.5"))
    with pytest.raises(pytest.fail.Exception, match="error"):
        check_replay(_Result("error", "boom"))


def test_equally_used_configs_in_numeric_size_order() -> None:
    from opgraph.ir import Gemm

    sizes = (2048, 1, 256, 16)
    ops = [Gemm(id=i, m=m, n=4096, k=4096) for i, m in enumerate(sizes)]
    ops.append(Gemm(id=len(ops), m=256, n=4096, k=4096))  # m256 used twice: first
    loader = SweepLoader(build_catalog([OpGraph(metadata=GraphMetadata(model="m"), ops=tuple(ops))]))
    ids = [c.id for c in loader.cases("gemm")]
    assert ids == [f"gemm_n4096_k4096-m{m}-bf16" for m in (256, 1, 16, 2048)]
    # The same order from a catalog built from the ops in another order.
    again = SweepLoader(build_catalog([OpGraph(metadata=GraphMetadata(model="m"), ops=tuple(reversed(ops)))]))
    assert [c.id for c in again.cases("gemm")] == ids
