"""``opgraph verify``: the coverage report against golden files, exit codes, expectation files."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from conftest import check_golden
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.ir import GraphMetadata, OpGraph, OpKind, save_graph
from validators.coverage import (
    CoverageReport,
    ExpectationError,
    auto_expectation,
    available_families,
    format_report,
    load_expectation,
    load_expectation_file,
    verify_graph,
)

runner = CliRunner()


def test_report_matches_golden(tmp_path: Path, graphs: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    save_graph(graphs.llama_like("meta-llama/Llama-3.1-8B-Instruct", with_softmax=True), "llama.json")
    res = runner.invoke(app, ["verify", "llama.json", "--expect", "llama"])
    assert res.exit_code == 0, res.output
    check_golden("verify/llama_report.txt", res.output)
    res = runner.invoke(app, ["verify", "llama.json", "-v"])
    assert res.exit_code == 0, res.output
    check_golden("verify/llama_report_verbose.txt", res.output)


def test_missing_required_exits_1_and_matches_golden(
    tmp_path: Path, graphs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    save_graph(graphs.llama_like("mistralai/Mixtral-8x7B-v0.1", "MixtralForCausalLM"), "mixtral.json")
    res = runner.invoke(app, ["verify", "mixtral.json"])
    assert res.exit_code == 1
    check_golden("verify/mixtral_missing_moe.txt", res.output)
    assert "STATUS: ✗ MISSING REQUIRED OPERATORS: moe" in res.output


def test_counts_and_json(tmp_path: Path, graphs: ModuleType) -> None:
    g = graphs.llama_like(layers=3)
    report = verify_graph(g, load_expectation("llama"))
    counts = {r.operator: r.count for r in report.operators}
    assert counts["attention"] == 3 and counts["rmsnorm"] == 2 * 3 + 1 and counts["linear"] == 7 * 3 + 1
    assert counts["softmax"] == 0 and report.ok
    assert report.total_ops == sum(1 for o in g.ops if o.kind.value != "view")
    assert report.unmatched == {"add": 3}
    path = save_graph(g, tmp_path / "g.json")
    res = runner.invoke(app, ["verify", str(path), "--expect", "qwen-moe", "--json"])
    assert res.exit_code == 1
    data = json.loads(res.output)
    assert data["ok"] is False and data["missing_required"] == ["moe"] and data["family"] == "qwen-moe"


def test_auto_picks_by_architecture_then_model_name() -> None:
    def g(model: str, arch: str = "") -> OpGraph:
        return OpGraph(metadata=GraphMetadata(model=model, architecture=arch))

    assert auto_expectation(g("whatever", "Qwen3MoeForCausalLM")).family == "qwen-moe"
    assert auto_expectation(g("whatever", "GptOssForCausalLM")).family == "gpt-oss"
    assert auto_expectation(g("Qwen/Qwen3-30B-A3B-Instruct-2507")).family == "qwen-moe"
    assert auto_expectation(g("Qwen/Qwen2.5-Coder-7B-Instruct")).family == "qwen"
    assert auto_expectation(g("bigscience/bloom-560m")).family == "bloom"
    with pytest.raises(ExpectationError, match="no model family"):
        auto_expectation(g("my-model", "MyForCausalLM"))


def test_every_builtin_family_loads() -> None:
    families = available_families()
    assert {"llama", "qwen", "qwen-moe", "mixtral", "gpt-oss", "deepseek", "gemma", "bloom"} <= set(families)
    for name in families:
        e = load_expectation(name)
        assert e.family == name and e.required and e.architectures
        assert set(e.required) | set(e.optional) <= set(e.operators)


def test_user_expectation_file(tmp_path: Path, graphs: ModuleType) -> None:
    spec = tmp_path / "mine.toml"
    spec.write_text(
        'required = ["residual_add", "linear"]\n'
        '[operators.residual_add]\ndescription = "residual"\n'
        '[[operators.residual_add.match]]\nkind = "elementwise"\nfn = "add"\ntarget = "aten.add.*"\n'
    )
    e = load_expectation_file(spec)
    assert e.family == "mine"
    report = verify_graph(graphs.llama_like(), e)
    assert report.ok and report.operators[0].count == 2
    assert "residual_add" in format_report(report)
    res = runner.invoke(app, ["verify", str(save_graph(graphs.llama_like(), tmp_path / "g.json")), "-e", str(spec)])
    assert res.exit_code == 0 and "Expectations: mine" in res.output

    bad = tmp_path / "bad.toml"
    bad.write_text('required = ["nonesuch"]\n')
    with pytest.raises(ExpectationError, match="unknown operator"):
        load_expectation_file(bad)
    bad.write_text("required = [\n")
    with pytest.raises(ExpectationError, match="not valid TOML"):
        load_expectation_file(bad)


def test_cli_errors(tmp_path: Path, graphs: ModuleType) -> None:
    path = save_graph(graphs.llama_like(), tmp_path / "g.json")
    res = runner.invoke(app, ["verify", str(path), "--expect", "nosuch"])
    assert res.exit_code == 2 and "unknown model family" in res.output
    res = runner.invoke(app, ["verify", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["verify", "--list"])
    assert res.exit_code == 0 and "qwen-moe" in res.output


def test_absent_optional_operator_is_no_cross(graphs: ModuleType) -> None:
    report = verify_graph(
        graphs.llama_like("mistralai/Mixtral-8x7B-v0.1", "MixtralForCausalLM"), load_expectation("mixtral")
    )
    lines = format_report(report).splitlines()
    crossed = [line.split()[1] for line in lines if line.lstrip().startswith("✗")]
    assert crossed == ["moe"]  # the missing required operator; softmax, topk, sliding_window are optional
    assert any(line.split()[:3] == ["-", "topk", "(optional)"] for line in lines)


@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3_text"])
def test_gemma_gated_tanh_gelu_counts_as_gelu(tmp_path: Path, model_type: str) -> None:
    pytest.importorskip("transformers")
    from opgraph.capture import capture
    from tests.opgraph.capture.test_capture_architectures import tiny_config

    g = capture(tiny_config(tmp_path, model_type), seq_len=8)
    acts = {(o.fn, o.gated) for o in g.ops_of(OpKind.ACTIVATION)}  # type: ignore[attr-defined]
    assert ("geglu_tanh", True) in acts  # gelu(gate, approximate="tanh") * up, one op
    report = verify_graph(g, auto_expectation(g))
    assert report.family == "gemma" and report.ok, report.missing_required
    assert next(r for r in report.operators if r.operator == "gelu").count == 2


def test_gemma_3_preset_verifies_with_auto_expectations(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "g.json"
    res = runner.invoke(app, ["capture", "gemma-3-27b", "--layers", "1", "--seq-len", "8", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["verify", str(out), "--expect", "auto"])
    assert res.exit_code == 0, res.output
    assert "STATUS: ✓ ALL REQUIRED OPERATORS COVERED" in res.output


OLD_REPORT = (
    '{"model":"tiny-llama","architecture":"LlamaForCausalLM","phase":"prefill","source":"g.json",'
    '"family":"llama","auto":true,"total_definitions":2,"total_ops":5,"operators":[{"operator":"rmsnorm",'
    '"required":true,"count":3,"definitions":{"rmsnorm_h64":3},"description":"RMS norm"}],"unmatched":{"add":2}}'
)
"""A coverage report as ``verify --json`` saved it before its first three fields came from ``GraphIdentity``."""


def test_an_older_saved_report_round_trips_identically() -> None:
    report = CoverageReport.model_validate_json(OLD_REPORT)
    # same fields, same order, same values; it reads as schema_version 1, saved after the graph's identity
    versioned = OLD_REPORT.replace('"phase":"prefill",', '"phase":"prefill","schema_version":1,')
    assert report.model_dump_json() == versioned
    assert report.ok and report.operators[0].covered


def test_report_names_the_graph_as_its_metadata_does(graphs: ModuleType) -> None:
    g = graphs.llama_like("org/Some-Llama", phase="decode")
    report = verify_graph(g, load_expectation("llama"), source="g.json")
    md = g.metadata
    assert (report.model, report.architecture, report.phase) == (md.model, md.architecture, "decode")
    assert report.source == "g.json"
