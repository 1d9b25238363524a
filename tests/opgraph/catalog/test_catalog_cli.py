"""``opgraph ops add`` and ``opgraph ops CATALOG [OP]`` in-process."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from conftest import check_golden
from typer.testing import CliRunner

from opgraph.catalog import load_catalog
from opgraph.cli.app import app
from opgraph.ir import save_graph

runner = CliRunner()


def _graph_files(tmp_path: Path, graphs: ModuleType) -> list[Path]:
    return [
        save_graph(graphs.llama_like(phase="prefill"), tmp_path / "llama-prefill.json"),
        save_graph(graphs.llama_like(phase="decode"), tmp_path / "llama-decode.json.gz"),
        save_graph(graphs.llama_like("tiny-qwen", "Qwen2ForCausalLM", vocab=512), tmp_path / "qwen.json"),
    ]


def test_add_creates_then_extends(tmp_path: Path, graphs: ModuleType) -> None:
    a, b, c = _graph_files(tmp_path, graphs)
    cat = tmp_path / "catalog.json"
    res = runner.invoke(app, ["ops", "add", str(cat), str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "created" in res.output and "2 graphs" in res.output
    n_before = len(load_catalog(cat))
    res = runner.invoke(app, ["ops", "add", str(cat), str(a), str(c)])
    assert res.exit_code == 0, res.output
    assert "extended" in res.output and "already in the catalog, skipped" in res.output
    after = load_catalog(cat)
    assert len(after.graphs) == 3 and len(after) > n_before


def test_list_and_show_json(tmp_path: Path, graphs: ModuleType) -> None:
    cat = tmp_path / "catalog.json"
    assert runner.invoke(app, ["ops", "add", str(cat), *map(str, _graph_files(tmp_path, graphs))]).exit_code == 0
    res = runner.invoke(app, ["ops", str(cat), "--json"])
    assert res.exit_code == 0, res.output
    listing = json.loads(res.output)
    ops = {r["operation"]: r for r in listing["operations"]}
    assert set(ops) == {"gemm", "rmsnorm", "rope", "attention", "add", "silu", "embedding"}
    assert listing["configs"] == sum(r["configs"] for r in listing["operations"])
    assert listing["models"] == ["tiny-llama", "tiny-qwen"]

    res = runner.invoke(app, ["ops", str(cat), "gemm", "--json", "--model", "tiny-qwen"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["configs"] == len(shown["entries"]) > 0
    for e in shown["entries"]:
        assert e["models"] == ["tiny-qwen"] and e["inputs"][1]["layout"] == "transposed"
    uses = [e["uses"] for e in shown["entries"]]
    assert uses == sorted(uses, reverse=True)

    # `show` spelled out gives the same as the shorthand
    res2 = runner.invoke(app, ["ops", "show", str(cat), "gemm", "--json", "--model", "tiny-qwen"])
    assert json.loads(res2.output) == shown


def test_tables_and_errors(tmp_path: Path, graphs: ModuleType) -> None:
    cat = tmp_path / "catalog.json"
    runner.invoke(app, ["ops", "add", str(cat), *map(str, _graph_files(tmp_path, graphs))])
    res = runner.invoke(app, ["ops", str(cat)])
    assert res.exit_code == 0 and "rmsnorm" in res.output and "configs" in res.output
    res = runner.invoke(app, ["ops", str(cat), "add"])  # the elementwise op named add, not the subcommand
    assert res.exit_code == 0 and "add_h64" in res.output
    res = runner.invoke(app, ["ops", str(cat), "conv2d"])
    assert res.exit_code == 2 and "known operations" in res.output
    res = runner.invoke(app, ["ops", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["ops", "add", str(cat), str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_catalog_golden(tmp_path: Path, graphs: ModuleType) -> None:
    """Config hashes are a stored contract: a change here invalidates every saved catalog."""
    cat = tmp_path / "catalog.json"
    assert runner.invoke(app, ["ops", "add", str(cat), *map(str, _graph_files(tmp_path, graphs))]).exit_code == 0
    rows = []
    for op in ("gemm", "rmsnorm", "attention", "add", "embedding"):
        res = runner.invoke(app, ["ops", str(cat), op, "--json"])
        assert res.exit_code == 0, res.output
        rows += [
            {k: e[k] for k in ("operation", "definition", "sizes", "dtypes", "hash", "uses", "models", "phases")}
            for e in json.loads(res.output)["entries"]
        ]
    check_golden("catalog/handmade_configs.json", rows)
