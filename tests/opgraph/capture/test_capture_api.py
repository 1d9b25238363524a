"""The Python API: phases, tagging, tracing() on custom modules, OPGRAPH_TRACE, profiling on cpu."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import opgraph
from opgraph.capture import capture, profile_capture
from opgraph.capture.autotrace import hook_file
from opgraph.capture.moe_model import expert_counts
from opgraph.ir import OpGraph, OpKind, Stage, load_graph
from tests.conftest import TINY_LLAMA


def test_generate_tags_stage_and_step(tiny_config: str) -> None:
    g = capture(tiny_config, phase="generate", seq_len=8, new_tokens=3)
    g.lint()
    steps = sorted({o.step for o in g.ops if o.step is not None})
    assert steps == [0, 1, 2, 3]
    for o in g.ops:
        assert o.stage is (Stage.PREFILL if o.step == 0 else Stage.DECODE)
    att = g.ops_of(OpKind.ATTENTION)
    assert [(o.q_len, o.kv_len) for o in att] == [(8, 8)] * 2 + [(1, 9)] * 2 + [(1, 10)] * 2 + [(1, 11)] * 2  # type: ignore[attr-defined]
    # Each step picks its next token as generate does (tests/opgraph/capture/test_greedy_loop.py):
    # one argmax among the loop's bookkeeping, the same ops every step.
    sampler = [o for o in g.ops if o.scope == "sampler"]
    by_step = [[o.kind for o in sampler if o.step == s] for s in range(4)]
    assert [sum(o.kind is OpKind.TOPK for o in sampler if o.step == s) for s in range(4)] == [1, 1, 1, 1]
    assert by_step[0] == by_step[1] and len(by_step[0]) > 1
    # Decode step 1 reads the KV cache the prefill wrote: a data edge across steps.
    writes = {o.id for o in g.ops if o.step == 0 and o.definition.startswith("kv_cache_write")}
    step1 = {o.id for o in g.ops if o.step == 1}
    assert any(e.src in writes and e.dst in step1 for e in g.edges)


def test_model_folder_and_module(tmp_path: Path, tiny_config: str) -> None:
    g1 = capture(str(Path(tiny_config).parent), seq_len=4)
    assert g1.metadata.model == str(Path(tiny_config).parent) and g1.metadata.architecture == "LlamaForCausalLM"
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    g2 = capture(model, seq_len=4)
    assert [o.definition for o in g2.ops if o.kind is OpKind.GEMM] == [
        o.definition for o in g1.ops if o.kind is OpKind.GEMM
    ]


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.down = torch.nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.nn.functional.gelu(self.norm(self.up(x)))).softmax(-1)
        return out


def test_tracing_custom_module() -> None:
    model = TwoLayer()
    x = torch.randn(4, 16)
    with opgraph.tracing() as t:
        model(x)
    g = t.graph
    g.lint()
    kinds = [o.kind for o in g.ops]
    assert kinds == [OpKind.GEMM, OpKind.NORM, OpKind.ACTIVATION, OpKind.GEMM, OpKind.SOFTMAX]
    assert [o.scope for o in g.ops] == ["up", "norm", "", "down", ""]
    assert g.ops[0].flops == 2 * 4 * 16 * 32 + 4 * 32  # addmm with bias
    # The data flow is a chain.
    assert {(e.src, e.dst) for e in g.edges} == {(0, 1), (1, 2), (2, 3), (3, 4)}


def test_meta_item_is_an_assumption_not_a_crash() -> None:
    x = torch.empty(4, 4, device="meta")
    with opgraph.tracing() as t:
        n = int((x > 0).sum().item())
        idx = torch.nonzero(x)
    assert n == 1 and idx.shape == (16, 2)
    notes = " ".join(t.graph.metadata.assumptions)
    assert ".item()" in notes and "nonzero" in notes


def test_expert_counts_balanced_and_skewed() -> None:
    assert expert_counts(2048 * 8, 128, 2048) == [128] * 128
    # 8 decode tokens picking 8 of 128 experts uniformly reach 128 (1 - (1 - 8/128)^8) = 51.6 of them, not
    # 64: the 64 pairs spread evenly over 52 (this asserted [1] * 64 before routing counted collisions).
    assert expert_counts(8 * 8, 128, 8) == [2] * 12 + [1] * 40
    assert expert_counts(8, 128, 1) == [1] * 8  # one token: its own k experts
    skewed = expert_counts(64, 8, 16, skew=1.0)
    assert sum(skewed) == 64 and max(skewed) <= 16 and skewed == sorted(skewed, reverse=True) and skewed[0] > 8


def test_profile_on_cpu_attributes_ops(tiny_config: str) -> None:
    between: list[int] = []
    result = profile_capture(
        tiny_config, seq_len=8, device="cpu", wall_repeats=3, between_runs=lambda: between.append(1)
    )
    assert len(between) == 3 and len(result.wall_runs_us) == 3  # paired with each timed run
    assert result.wall_us == sorted(result.wall_runs_us)[1]
    tl = result.timeline
    ids = {s.op_id for s in tl.spans if s.op_id is not None}
    gemm_ids = {o.id for o in result.graph.ops_of(OpKind.GEMM)}
    assert gemm_ids <= ids  # every GEMM has measured work attributed to it
    assert tl.source.kind.value == "measured" and result.wall_us > 0 and result.wall_profiled_us > 0
    assert all(s.kind is result.graph.op(s.op_id).kind for s in tl.spans if s.op_id is not None)


def test_opgraph_trace_env_on_unmodified_script(tmp_path: Path) -> None:
    script = tmp_path / "infer.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))
            with torch.no_grad():
                model(torch.randn(2, 8))
            """
        )
    )
    # The shipped .pth line run at interpreter start (as site-packages would), via sitecustomize.
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(hook_file().read_text())
    out = tmp_path / "out.json.gz"
    env = {**os.environ, "OPGRAPH_TRACE": str(out), "PYTHONPATH": str(hook_dir)}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    g: OpGraph = load_graph(out)
    # Everything the script ran is there: weight initialisation (fills), then the forward.
    assert [o.kind for o in g.ops][-3:] == [OpKind.GEMM, OpKind.ACTIVATION, OpKind.GEMM]
    assert {o.kind for o in g.ops[:-3]} == {OpKind.MEMORY}
    assert g.metadata.model == "infer.py" and g.metadata.phase == "trace"


def test_layers_beyond_the_model_raise_a_typed_error(tiny_config: str) -> None:
    from opgraph.capture import LayersError

    with pytest.raises(LayersError, match=r"3 layers asked for, but .* has 2"):
        capture(tiny_config, seq_len=4, layers=3)
    g = capture(tiny_config, seq_len=4, layers=2)
    assert {o.layer for o in g.ops if o.layer is not None} == {0, 1}


def test_a_claim_with_bad_fields_fails_in_the_pass_that_made_it() -> None:
    from opgraph.capture.lowering import GroupFieldsError, Lowering
    from opgraph.capture.recorder import Recorder

    rec = Recorder()
    with rec.recording():
        torch.nn.functional.relu(torch.ones(2, 3))
    lw = Lowering(rec.events, rec.calls)
    lw.current_pass = "my-pass"
    with pytest.raises(GroupFieldsError, match=r"lowering pass 'my-pass' claimed a 'activation' op .*: hidden:"):
        lw.claim([0], OpKind.ACTIVATION, {"fn": "relu", "numel": 6, "hidden": 0})
    with pytest.raises(GroupFieldsError, match="heads: Extra inputs are not permitted"):
        lw.claim([0], OpKind.ACTIVATION, {"fn": "relu", "numel": 6, "hidden": 3, "heads": 2})
    assert lw.claim([0], OpKind.ACTIVATION, {"fn": "relu", "numel": 6, "hidden": 3}).members == [0]


def test_free_events_skip_events_claimed_before_or_during_the_walk() -> None:
    from opgraph.capture.lowering import Lowering
    from opgraph.capture.recorder import Recorder

    rec = Recorder()
    with rec.recording():
        x = torch.ones(2, 3)
        torch.nn.functional.relu(torch.nn.functional.relu(torch.nn.functional.relu(x)))
    lw = Lowering(rec.events, rec.calls)
    relus = [ev.index for ev in rec.events if ev.fn == "relu"]
    assert len(relus) == 3
    fields = {"fn": "relu", "numel": 6, "hidden": 3}
    lw.claim([relus[0]], OpKind.ACTIVATION, fields)
    seen = []
    for ev in lw.free_events():
        seen.append(ev.index)
        if ev.index == relus[1]:  # claiming the next relu now: the walk must not reach it
            lw.claim([relus[2]], OpKind.ACTIVATION, fields)
    assert relus[1] in seen and relus[0] not in seen and relus[2] not in seen
    assert all(lw.free(i) for i in seen if i != relus[1])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "bf61"}, "--dtype: unknown dtype 'bf61' (one of bf16, fp16, fp32)"),
        ({"attn_impl": "flash"}, "--attn-impl: unknown attention implementation 'flash'"),
        ({"device": "gpu"}, "--device: unknown device 'gpu'"),
        ({"phase": "decoding"}, "--phase: unknown phase 'decoding'"),
        ({"batch": 0}, "--batch: must be at least 1"),
        ({"moe_skew": 9.0}, "--moe-skew: must be between 0 (balanced) and 8"),
        ({"seed": -1}, "--seed: must be 0 or more"),
        ({"devcie": "cpu"}, "unknown capture option 'devcie'"),
    ],
)
def test_a_typo_in_the_options_fails_when_they_are_made(options: dict[str, object], message: str) -> None:
    from opgraph.capture import CaptureError, CaptureOptions

    with pytest.raises(CaptureError) as info:
        CaptureOptions(**options)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_capture_modules_import_no_cycle() -> None:
    # The phase runner lives in capture/phase.py so that host timing does not import the API back.
    import ast

    root = Path(opgraph.__file__).parent / "capture"
    modules = {f"opgraph.capture.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}
    deps: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        deps[name] = {m for m in found if m in modules and m != name}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d})) for d in deps[start])

    assert not [m for m in modules if reaches(m, m, set())]
