"""Issue 21 from the CLI: `replay --collectives`, `calibrate --collectives`, `simulate --tp N --collective-fit`.

The fit is made from the committed 4 x H100 sweep (benchmarks/results/gpu/h100x4/run2); bad input is
one line on stderr and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_LLAMA, cli_runner, one_error_line

from hardware.collective_fit import CollectiveCalibration
from opgraph.cli.app import app
from opgraph.ir import CollectiveKind, OpKind, load_timeline

SWEEP = REPO / "benchmarks" / "results" / "gpu" / "h100x4" / "run2" / "collectives.jsonl"


@pytest.fixture(scope="module")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    out = d / "g.json.gz"
    res = cli_runner().invoke(app, ["capture", str(d / "config.json"), "-o", str(out), "--seq-len", "32"])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def fit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "fit.json"
    res = cli_runner().invoke(
        app, ["calibrate", "--collectives", str(SWEEP), "-H", "h100", "--heldout", "-o", str(out)]
    )
    assert res.exit_code == 0, res.stderr
    return out


def test_calibrate_collectives_fits_every_measured_collective_and_group(fit: Path) -> None:
    cal = CollectiveCalibration.load(fit)
    measured = {
        (json.loads(line)["collective"], json.loads(line)["group_size"]) for line in SWEEP.read_text().splitlines()
    }
    assert {(f.collective.value, f.group_size) for f in cal.fits} == measured
    assert "H100" in cal.device_name and cal.link_bandwidth_gbps is not None  # -H h100: efficiencies vs its link


def test_calibrate_collectives_prints_the_fits_and_the_heldout_line(tmp_path: Path) -> None:
    res = cli_runner().invoke(
        app, ["calibrate", "--collectives", str(SWEEP), "--heldout", "-o", str(tmp_path / "f.json")]
    )
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split()[:2] == ["collective", "ranks"]
    assert sum(1 for line in lines if line.split()[:1] == ["all_reduce"]) == 2  # groups of 2 and 4
    held = [line for line in lines if line.startswith("held out")]
    assert len(held) == 1 and "median" in held[0]
    assert f"--collective-fit {tmp_path / 'f.json'}" in res.stdout


def test_max_spread_reaches_the_fit(tmp_path: Path) -> None:
    # The broadcast over 4 ranks keeps 12 of its 15 sizes at the default spread; at a spread of 1
    # (100% of the median) every size is kept.
    wide = tmp_path / "wide.json"
    res = cli_runner().invoke(app, ["calibrate", "--collectives", str(SWEEP), "--max-spread", "1", "-o", str(wide)])
    assert res.exit_code == 0, res.stderr
    default = tmp_path / "default.json"
    assert cli_runner().invoke(app, ["calibrate", "--collectives", str(SWEEP), "-o", str(default)]).exit_code == 0
    kept = {str(p): {(f.collective, f.group_size): len(f.points) for f in CollectiveCalibration.load(p).fits}
            for p in (wide, default)}  # fmt: skip
    key = (CollectiveKind.BROADCAST, 4)
    assert kept[str(wide)][key] > kept[str(default)][key]


def test_simulate_tp_costs_collectives_from_the_fit(tiny_graph: Path, fit: Path, tmp_path: Path) -> None:
    cal = CollectiveCalibration.load(fit)
    timelines = {}
    for label, extra in (("fit", ["--collective-fit", str(fit)]), ("link", [])):
        out = tmp_path / f"{label}.json"
        res = cli_runner().invoke(
            app, ["simulate", str(tiny_graph), "--tp", "2", "-c", "roofline", "-o", str(out), *extra]
        )
        assert res.exit_code == 0, res.stderr
        timelines[label] = load_timeline(out)
        if label == "fit":
            assert f"collectives costed by the measured fit {fit}" in res.stdout
    colls = [
        s
        for s in timelines["fit"].spans
        if s.kind is OpKind.COLLECTIVE and s.on_device and s.track.startswith("rank0/")
    ]
    assert colls
    from opgraph.ir import Collective, load_graph
    from opgraph.study import shard_for_tp

    ops = {o.id: o for o in shard_for_tp(load_graph(tiny_graph), 2)[0].ops}
    for span in colls:
        op = ops[span.op_id]
        assert isinstance(op, Collective) and op.group_size == 2
        assert span.dur_us == pytest.approx(cal.predict(op.collective, op.bytes, 2) * 1e6, rel=1e-6)
    link = [
        s
        for s in timelines["link"].spans
        if s.kind is OpKind.COLLECTIVE and s.on_device and s.track.startswith("rank0/")
    ]
    assert sorted(s.dur_us for s in link) != sorted(s.dur_us for s in colls)  # not the hardware file's link
    # compute ops are the roofline's either way
    # (device spans only: the host's waits depend on when the collectives end)
    comp = {s.op_id: s.dur_us for s in timelines["link"].spans if s.kind is OpKind.GEMM and s.on_device}
    assert comp and all(
        s.dur_us == pytest.approx(comp[s.op_id])
        for s in timelines["fit"].spans
        if s.kind is OpKind.GEMM and s.on_device
    )


def test_simulate_names_the_collectives_the_fit_lacks(tiny_graph: Path, tmp_path: Path) -> None:
    only_g2 = tmp_path / "g2.jsonl"
    only_g2.write_text("".join(line + "\n" for line in SWEEP.read_text().splitlines() if '"group_size":2' in line))
    fit = tmp_path / "g2.json"
    assert cli_runner().invoke(app, ["calibrate", "--collectives", str(only_g2), "-o", str(fit)]).exit_code == 0
    res = cli_runner().invoke(
        app, ["simulate", str(tiny_graph), "--tp", "4", "-c", "roofline", "--collective-fit", str(fit)]
    )
    assert res.exit_code == 0, res.stderr
    lacking = [line for line in res.stdout.splitlines() if "not in the fit" in line]
    assert len(lacking) == 1 and "all_reduce_g4_b" in lacking[0] and "all_gather_g4_b" in lacking[0]


def test_bad_collective_input_is_one_line_exit_2(tiny_graph: Path, fit: Path, tmp_path: Path) -> None:
    r = cli_runner()
    err = one_error_line(r.invoke(app, ["simulate", str(tiny_graph), "--collective-fit", str(fit)]))
    assert "--collective-fit" in err and "--tp" in err
    err = one_error_line(r.invoke(app, ["simulate", str(tiny_graph), "--tp", "2", "--collective-fit", str(tiny_graph)]))
    assert str(tiny_graph) in err
    not_measurements = tmp_path / "x.jsonl"
    not_measurements.write_text('{"a": 1}\n{"a": 2}\n')
    err = one_error_line(
        r.invoke(app, ["calibrate", "--collectives", str(not_measurements), "-o", str(tmp_path / "f")])
    )
    assert str(not_measurements) in err
    err = one_error_line(r.invoke(app, ["calibrate", str(SWEEP), "--heldout", "-o", str(tmp_path / "f.json")]))
    assert "--heldout" in err and "--collectives" in err
    err = one_error_line(r.invoke(app, ["calibrate", str(SWEEP), "-o", str(tmp_path / "f.json")]))
    assert "--hardware" in err
    err = one_error_line(r.invoke(app, ["replay", "--sizes", "4K..1M", str(tiny_graph)]))
    assert "--sizes" in err and "--collectives" in err
    assert "missing GRAPH" in one_error_line(r.invoke(app, ["replay", "-o", str(tmp_path / "r.jsonl")]))
    err = one_error_line(r.invoke(app, ["replay", "--collectives", "--tp", "2", "-o", str(tmp_path / "c.jsonl")]))
    assert "--tp" in err and "GRAPH" in err
    err = one_error_line(r.invoke(app, ["replay", "--collectives", "--tp", "1", str(tiny_graph)]))
    assert "--tp" in err


def test_replay_collectives_outside_torchrun_is_one_line(
    tiny_graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    err = one_error_line(cli_runner().invoke(app, ["replay", "--collectives", "-o", str(tmp_path / "c.jsonl")]))
    assert "torchrun" in err
    monkeypatch.setenv("WORLD_SIZE", "2")  # checked before any process group starts
    err = one_error_line(
        cli_runner().invoke(app, ["replay", "--collectives", str(tiny_graph), "-o", str(tmp_path / "c.jsonl")])
    )
    assert "no collective" in err and "--tp N" in err
    err = one_error_line(
        cli_runner().invoke(app, ["replay", "--collectives", "--sizes", "4Q", "-o", str(tmp_path / "c.jsonl")])
    )
    assert "--sizes" in err
    err = one_error_line(cli_runner().invoke(app, ["replay", "--collectives", "-o", str(tmp_path / "c.json")]))
    assert "JSONL" in err


def test_replay_collectives_of_a_graph_sharded_on_the_fly_under_torchrun(tiny_graph: Path, tmp_path: Path) -> None:
    out = tmp_path / "graph_collectives.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", "-m", "opgraph",
        "replay", "--collectives", "--device", "cpu", "--tp", "2", str(tiny_graph), "-o", str(out), "-q",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from opgraph.ir import load_graph
    from opgraph.study import shard_for_tp
    from validators.collectives import graph_cases, load_measurements

    expected, _ = graph_cases(shard_for_tp(load_graph(tiny_graph), 2)[0])
    ms = load_measurements(out)
    assert {(m.collective, m.bytes, m.group_size, m.uses) for m in ms} == {
        (c.collective, c.bytes, c.group_size, c.uses) for c in expected
    }
    assert all(m.backend == "gloo" and m.median_us > 0 for m in ms)
