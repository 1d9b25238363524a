"""``opgraph capture``: summary, golden output, presets list, and bad input (one line, exit 2, no file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")

from conftest import check_golden  # type: ignore[import-not-found]

from opgraph.cli.app import app
from opgraph.ir import load_graph
from tests.conftest import CAPTURED_WITH, TINY_LLAMA, skip_unless_captured_with

runner = CliRunner()
TINY = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def _config(tmp_path: Path, data: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_capture_writes_graph_and_golden_summary(tmp_path: Path) -> None:
    out = tmp_path / "g.json.gz"
    res = runner.invoke(app, ["capture", _config(tmp_path, TINY), "-o", str(out), "--seq-len", "8"])
    assert res.exit_code == 0, res.output
    assert "Qwen3MoeForCausalLM" in res.output and "assumed: MoE routing" in res.output
    g = load_graph(out)
    summary = g.summary()
    summary["definitions"] = sorted({o.definition for o in g.ops})
    summary["metadata"] = {
        k: v for k, v in g.metadata.model_dump(mode="json").items() if k not in ("model", "versions")
    }
    skip_unless_captured_with(CAPTURED_WITH, "the capture summary golden")
    check_golden("capture/qwen3_moe_tiny_prefill.json", summary)


def test_phase_sizes_the_phase_reads_are_accepted(tmp_path: Path) -> None:
    for args in (
        ["--phase", "decode", "--kv-len", "64"],
        ["--phase", "generate", "--seq-len", "8", "--new-tokens", "2"],
    ):
        res = runner.invoke(app, ["capture", "llama-3.2-1b", "--layers", "1", *args, "-o", str(tmp_path / "g.json")])
        assert res.exit_code == 0, res.output


def test_list_presets() -> None:
    res = runner.invoke(app, ["capture", "--list"])
    assert res.exit_code == 0
    for name in ("llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3", "gemma-3-27b", "bloom-560m"):
        assert name in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-model"], "unknown model 'no-such-model'"),
        (["llama-3.2-1b", "--seq-len", "0"], "--seq-len: must be at least 1"),
        (["llama-3.2-1b", "--dtype", "int3"], "unknown dtype"),
        (["llama-3.2-1b", "--device", "cuda"], None),
        # sizes the phase would ignore are refused, not dropped silently
        (["llama-3.2-1b", "--phase", "prefill", "--new-tokens", "5"], "--new-tokens: only applies to --phase generate"),
        (["llama-3.2-1b", "--new-tokens", "5"], "--new-tokens: only applies to --phase generate, not prefill"),
        (["llama-3.2-1b", "--phase", "decode", "--seq-len", "100"], "--seq-len: only applies to --phase prefill or"),
        (["llama-3.2-1b", "--kv-len", "100"], "--kv-len: only applies to --phase decode, not prefill"),
        (["llama-3.2-1b", "--phase", "generate", "--kv-len", "100"], "--kv-len: only applies to --phase decode"),
        (["llama-3.2-1b", "--timeline", "t.json"], "--timeline: only applies with --profile"),
        (["llama-3.2-1b", "--wall-repeats", "5"], "--wall-repeats: only applies with --profile"),
        (["llama-3.2-1b", "--profile", "--device", "cpu", "--wall-repeats", "0"], "--wall-repeats: 0 is out of range"),
        # a skew of MoE expert loads on a dense model would change nothing
        (["llama-3.2-1b", "--layers", "1", "--moe-skew", "2"], "--moe-skew: llama-3.2-1b has no MoE experts"),
        # meta builds no weights: a seed would change nothing
        (["llama-3.2-1b", "--seed", "3"], "--seed: only applies to a model built on cpu or cuda"),
        (["llama-3.2-1b", "--device", "cpu", "--seed", "-1"], "--seed: must be 0 or more"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_file(tmp_path: Path, args: list[str], message: str | None) -> None:
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", *args, "-o", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    if message:
        assert message in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".g.json*"))


LEARNED_POSITIONS = {
    # GPT-2's ``wpe`` holds n_positions rows; OPT's ``embed_positions`` two more (its offset)
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_head": 2, "n_layer": 1,
             "n_positions": 64, "vocab_size": 128},
    "opt": {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 32, "ffn_dim": 64,
            "num_attention_heads": 2, "num_hidden_layers": 1, "max_position_embeddings": 64, "vocab_size": 128,
            "word_embed_proj_dim": 32},
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(LEARNED_POSITIONS))
def test_positions_past_a_learned_table_are_refused(tmp_path: Path, model_type: str) -> None:
    config = _config(tmp_path, LEARNED_POSITIONS[model_type])
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", config, "--seq-len", "65", "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (
        f"error: --seq-len: 65 positions exceed the model's learned position table (64 positions) ({config} "
        "supports at most 64 positions)"
    )
    assert not out.exists()
    res = runner.invoke(app, ["capture", config, "--seq-len", "64", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert not any("max_position_embeddings" in a for a in load_graph(out).metadata.assumptions)


def test_rotary_positions_past_the_limit_are_captured_and_stated(tmp_path: Path) -> None:
    """transformers runs a RoPE model past max_position_embeddings (a decode over 4,096 cached tokens of
    Vicuna's 4,096 is 4,097 positions): capture does too, and the graph says so."""
    out = tmp_path / "g.json"
    res = runner.invoke(
        app, ["capture", "vicuna-7b", "--layers", "1", "--phase", "decode", "--kv-len", "4096", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    said = "4097 positions exceed vicuna-7b's max_position_embeddings (4096)"
    assert said in res.output
    graph = load_graph(out)
    assert any(a.startswith(said) for a in graph.metadata.assumptions)
    attention = next(op for op in graph.ops if op.kind.value == "attention")
    assert attention.kv_len == 4097
    within = tmp_path / "w.json"
    res = runner.invoke(
        app, ["capture", "vicuna-7b", "--layers", "1", "--phase", "decode", "--kv-len", "4095", "-o", str(within)]
    )
    assert res.exit_code == 0, res.output
    assert not any("max_position_embeddings" in a for a in load_graph(within).metadata.assumptions)


@pytest.mark.parametrize("version", ["4.51.3", "5.16.1"])
def test_an_older_transformers_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import transformers

    monkeypatch.setattr(transformers, "__version__", version)
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", "llama-3.2-1b", "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (
        f"error: transformers: version {version} is older than 5.17, the oldest opgraph captures with "
        "(pip install -U 'transformers>=5.17')"
    )
    assert not out.exists()


def test_unknown_model_lists_presets_and_other_ways(tmp_path: Path) -> None:
    res = runner.invoke(app, ["capture", "nope/nothing", "-o", str(tmp_path / "g.json")])
    assert "llama-3.1-8b" in res.stderr and "config.json" in res.stderr and "Hugging Face cache" in res.stderr


def test_config_transformers_cannot_build(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["capture", _config(tmp_path, {"model_type": "not_a_model"}), "-o", str(tmp_path / "g.json")]
    )
    assert res.exit_code == 2 and "transformers cannot build this config" in res.stderr


def test_unsupported_architecture(tmp_path: Path) -> None:
    cfg = {"model_type": "t5", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_kv": 8, "d_ff": 64, "vocab_size": 64}
    res = runner.invoke(app, ["capture", _config(tmp_path, cfg), "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 2 and "unsupported architecture" in res.stderr
    assert not (tmp_path / "g.json").exists()


def test_local_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--acme--tiny-moe" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", "acme/tiny-moe", "-o", str(out), "--seq-len", "4", "--layers", "1"])
    assert res.exit_code == 0, res.output
    assert load_graph(out).metadata.num_layers == 1
    # --weights: a cached snapshot without weight files is one line; with them, they are loaded
    args = ["capture", "acme/tiny-moe", "--device", "cpu", "--weights", "--seq-len", "4", "-o", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "acme/tiny-moe (hf-cache): has no weights to load" in res.stderr
    import torch
    import transformers

    torch.manual_seed(3)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(snap)).save_pretrained(snap)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert load_graph(out).metadata.capture.weights == "checkpoint"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": 66}, "hidden size"),  # not a multiple of the 4 heads: transformers rejects it
        ({"intermediate_size": -5}, "intermediate_size"),  # torch would refuse the negative dimension
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 4 query heads cannot form groups of 3
    ],
)
def test_config_with_impossible_sizes_is_one_line_exit_2(tmp_path: Path, change: dict[str, int], field: str) -> None:
    path = _config(tmp_path, {**TINY_LLAMA, **change})  # head_dim from hidden_size / 4 heads
    for device in ("meta", "cpu"):
        args = ["capture", path, "--device", device, "--seq-len", "4", "-o", str(tmp_path / "g.json")]
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and field in lines[0], lines
        assert "internal error" not in lines[0] and not (tmp_path / "g.json").exists()


def test_config_whose_model_fails_an_assertion_is_one_line_exit_2(tmp_path: Path) -> None:
    # transformers accepts the config (with a warning) but torch's nn.Embedding asserts that the
    # padding index lies inside the vocabulary while the model is built.
    cfg = {**TINY_LLAMA, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "pad_token_id": 128 + 64}
    path = _config(tmp_path, cfg)
    res = runner.invoke(app, ["capture", path, "--seq-len", "4", "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: transformers cannot build this model (Padding_idx must be within ")
    assert "pad_token_id (192) must be below vocab_size (128)" in lines[0]
    assert not (tmp_path / "g.json").exists()


def test_an_assertion_after_the_model_is_built_stays_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the model's constructor is taken as transformers rejecting the config; a failed assertion
    # in opgraph's own steps is a bug to report.
    from opgraph.capture import moe_model

    def broken(*args: object) -> None:
        raise AssertionError("a bug in opgraph")

    monkeypatch.setattr(moe_model, "install", broken)
    args = ["capture", _config(tmp_path, TINY_LLAMA), "--seq-len", "4", "-o", str(tmp_path / "g.json")]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "internal error AssertionError: a bug in opgraph" in res.stderr


def test_more_layers_than_the_model_has_is_refused(tmp_path: Path) -> None:
    res = runner.invoke(app, ["capture", _config(tmp_path, TINY), "--layers", "1000", "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--layers" in lines[0] and "1000" in lines[0] and "has 2" in lines[0]
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize(("given", "expected"), [([], None), (["--wall-repeats", "7"], 7)])
def test_profile_times_the_plain_runs_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: list[str], expected: int | None
) -> None:
    # `--wall-repeats` reaches profile_capture (`validate` records it so that its profile step's command
    # reproduces the run); left out, the run times as many as profile_capture does by default.
    import inspect

    from opgraph.capture import profile
    from opgraph.ir import OpgraphError

    seen: dict[str, object] = {}

    def fake(model: str, **kwargs: object) -> None:
        seen.update(kwargs)
        raise OpgraphError("stopped after the call", where="profile")

    default = inspect.signature(profile.profile_capture).parameters["wall_repeats"].default
    monkeypatch.setattr(profile, "profile_capture", fake)
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", "llama-3.2-1b", "--profile", "--device", "cpu", *given, "-o", str(out)])
    assert res.exit_code == 2 and "stopped after the call" in res.stderr, res.output
    assert seen["wall_repeats"] == (default if expected is None else expected)
