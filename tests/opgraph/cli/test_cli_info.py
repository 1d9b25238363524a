"""`opgraph info` given a file that is not a graph says what it is, in one line."""

from __future__ import annotations

from pathlib import Path

from conftest import cli_runner, one_error_line

from opgraph.cli.app import app

REPO = Path(__file__).resolve().parents[3]
GRAPH = REPO / "tests" / "data" / "h100" / "llama-3.2-1b-l2-prefill256.graph.json.gz"


def test_info_on_an_ops_catalog_says_it_is_a_catalog(tmp_path: Path) -> None:
    # QA: it said "hash_version: Extra inputs are not permitted (got 1) (and 2 more problems)".
    for name in ("cat.json", "cat.json.gz"):
        catalog = tmp_path / name
        assert cli_runner().invoke(app, ["ops", "add", str(catalog), str(GRAPH)]).exit_code == 0
        err = one_error_line(cli_runner().invoke(app, ["info", str(catalog)]))
        assert "is an ops catalog, not an OpGraph" in err and str(catalog) in err
        assert "opgraph ops show" in err and "hash_version" not in err


def test_info_on_a_broken_graph_still_names_the_problem(tmp_path: Path) -> None:
    # Only a catalog is named as one: a graph-like file keeps its own error.
    bad = tmp_path / "bad.json"
    bad.write_text('{"hash_version": 1, "ops": [], "edges": []}')
    err = one_error_line(cli_runner().invoke(app, ["info", str(bad)]))
    assert "catalog" not in err and str(bad) in err
