"""Issue time in the graphs' op order (``validators.sequence``): cases built once, called in order."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from replay_helpers import FAST, tiny_graph

from opgraph.ir import OpGraph, Other
from validators import OpConfig, Replayer, unique_configs
from validators.configs import config_key
from validators.sequence import IssueSequence, SequenceIssue, issue_in_sequence


class _Recording:
    """Stands in for a :class:`Replayer`: each config's case records its key when called."""

    device = torch.device("cpu")

    def __init__(self, without: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[str] = []
        self.without = without

    def build_case(self, cfg: OpConfig, *, moe_skew: float = 0.0) -> Callable[[], None] | None:
        return None if cfg.key in self.without else (lambda: self.calls.append(cfg.key))


def test_a_round_calls_every_use_in_program_order() -> None:
    graph = tiny_graph()
    configs = unique_configs([graph])
    rep = _Recording()
    with IssueSequence([graph], configs, rep) as seq:  # type: ignore[arg-type]
        sampled = seq.round()
        want = [config_key(op) for op in graph.ops if config_key(op) in {c.key for c in configs}]
        assert rep.calls == want and seq.calls == len(want)
        # One host time per use, by config.
        assert {k: len(v) for k, v in sampled.items()} == {k: want.count(k) for k in set(want)}
        assert all(x >= 0 for xs in sampled.values() for x in xs)
    assert seq.calls == 0  # closed: the cases are freed


def test_medians_over_uses_and_rounds() -> None:
    rounds = [{"a": [1.0, 9.0], "b": [4.0]}, {"a": [2.0], "b": [6.0, 5.0]}]
    out = SequenceIssue.of_rounds(rounds, calls=3)
    assert out.us_by_key == {"a": 2.0, "b": 5.0} and out.rounds == 2 and out.calls == 3


def test_ops_without_a_recipe_are_left_out_and_named() -> None:
    graph = tiny_graph()
    extra = Other(id=len(graph.ops), fn="mystery", target="aten.mystery.default")
    graph = OpGraph(ops=(*graph.ops, extra), edges=graph.edges, metadata=graph.metadata)
    configs = unique_configs([graph])
    rep = Replayer("cpu", FAST)
    built = {c.key for c in configs if rep.build_case(c) is not None}
    result = issue_in_sequence([graph], configs, rep, rounds=2)
    assert config_key(extra) not in built and built
    assert result.rounds == 2 and result.calls == sum(config_key(op) in built for op in graph.ops)
    assert set(result.us_by_key) == built
    assert "mystery" in result.note


def test_replay_options_default_to_issue_in_sequence() -> None:
    from validators import ReplayOptions

    assert ReplayOptions().issue_in_sequence
    rep = Replayer("cpu", FAST)
    assert rep.sequence_issue_us == {}
    # A config with no recipe has no case.
    assert rep.build_case(unique_configs([OpGraph(ops=(Other(id=0, fn="x", target="aten.x.default"),))])[0]) is None


@pytest.mark.parametrize("flag", ["--issue-in-burst", "--issue-in-sequence"])
def test_replay_cli_takes_the_issue_flag(tmp_path, flag: str) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from opgraph.cli.app import app
    from opgraph.ir import save_graph

    g = save_graph(tiny_graph(), tmp_path / "g.json")
    res = CliRunner().invoke(
        app, ["replay", str(g), "--device", "cpu", "-o", str(tmp_path / "r.jsonl"), "--limit", "2", "-q", flag]
    )
    assert res.exit_code == 0, res.output


def test_issue_times_round_trip_and_bad_files_say_what(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from opgraph.ir import LoadError, save_model
    from validators import load_issue

    seq = SequenceIssue(us_by_key={"a": 12.5}, calls=3, rounds=2, device_name="gpu", created="2026-11-26")
    assert load_issue(save_model(seq, tmp_path / "i.json")) == seq
    (tmp_path / "bad.json").write_text('{"us_by_key": {"a": -1}}')
    with pytest.raises(LoadError, match="not an issue-time file"):
        load_issue(tmp_path / "bad.json")
    with pytest.raises(LoadError, match="no such file"):
        load_issue(tmp_path / "missing.json")


def test_issue_only_needs_cuda_and_never_overwrites_replay_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from opgraph.cli.app import app
    from opgraph.ir import OpgraphError, save_graph
    from validators import time_issue

    g = save_graph(tiny_graph(), tmp_path / "g.json")
    with pytest.raises(OpgraphError, match="needs a CUDA device"):
        time_issue([g], device="cpu")
    runner = CliRunner()
    res = runner.invoke(app, ["replay", str(g), "--issue-only", "--device", "cpu", "-o", str(tmp_path / "i.json")])
    assert res.exit_code == 2 and "needs a CUDA device" in res.output and "Traceback" not in res.output
    kept = tmp_path / "replay.jsonl"
    kept.write_text("{}\n")
    res = runner.invoke(app, ["replay", str(g), "--issue-only", "--device", "cuda", "-o", str(kept)])
    assert res.exit_code == 2 and "names replay results" in res.output
    assert kept.read_text() == "{}\n"
