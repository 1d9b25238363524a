"""``opgraph sweep`` writes test modules that pytest collects and runs through the replay validators."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from typer.testing import CliRunner

from opgraph.catalog import build_catalog, save_catalog
from opgraph.cli.app import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[3]

# A stand-in replay for the generated module's own run: passes small GEMMs, fails the others.
FAKE_REPLAY_CONFTEST = """
import validators
from dataclasses import dataclass

@dataclass
class Result:
    status: str
    reason: str = ""

def replay_op(op, device="cpu"):
    assert device == "cpu"
    return Result("ok") if op.m <= 16 and op.n <= 128 else Result("mismatch", f"n={op.n}")

validators.replay_op = replay_op
"""


def _catalog(tmp_path: Path, graphs: ModuleType) -> Path:
    cat = build_catalog([graphs.llama_like(phase="prefill"), graphs.llama_like(phase="decode")])
    return save_catalog(cat, tmp_path / "data" / "catalog.json")


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_generated_module_runs_under_pytest(tmp_path: Path, graphs: ModuleType) -> None:
    cat = _catalog(tmp_path, graphs)
    out_dir = tmp_path / "tests" / "sweeps"
    plain = out_dir / "test_gemm_traced.py"
    embedded = out_dir / "test_gemm_embedded.py"
    res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "-o", str(plain)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output
    res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "-o", str(embedded), "--embed"])
    assert res.exit_code == 0, res.output
    text = plain.read_text()
    assert "from validators import replay_op" in text and "'../../data/catalog.json'" in text
    compile(text, str(plain), "exec")
    compile(embedded.read_text(), str(embedded), "exec")
    (out_dir / "conftest.py").write_text(FAKE_REPLAY_CONFTEST)
    proc = _pytest([str(plain), str(embedded)], cwd=tmp_path)
    # 5 GEMM shapes x (prefill, decode) in each module; the fake replay fails only the lm head (n=256)
    assert "4 failed, 16 passed" in proc.stdout, proc.stdout + proc.stderr
    failed = {
        line.split("[", 1)[1].split("]")[0] for line in proc.stdout.splitlines() if "test_gemm_model_traced[" in line
    }
    assert failed == {"gemm_n256_k64-m1-bf16", "gemm_n256_k64-m16-bf16"}
    assert "replay mismatch: n=256" in proc.stdout
    assert proc.returncode == 1


def test_generated_module_uses_the_real_replay_or_skips_with_reason(tmp_path: Path, graphs: ModuleType) -> None:
    cat = _catalog(tmp_path, graphs)
    out = tmp_path / "test_add_traced.py"
    assert runner.invoke(app, ["sweep", str(cat), "--op", "add", "-o", str(out)]).exit_code == 0
    proc = _pytest([str(out)], cwd=tmp_path)
    try:
        from validators import replay_op  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        assert proc.returncode == 0 and "validators.replay_op cannot be imported" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout + proc.stderr


def test_sweep_cli_options_and_errors(tmp_path: Path, graphs: ModuleType) -> None:
    cat = _catalog(tmp_path, graphs)
    res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "-o", str(tmp_path / "t.py"), "--dry-run"])
    assert res.exit_code == 0 and "gemm_n64_k64-m16-bf16" in res.output and not (tmp_path / "t.py").exists()
    res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "-o", str(tmp_path / "t.txt")])
    assert res.exit_code == 2 and ".py" in res.output
    res = runner.invoke(app, ["sweep", str(cat), "--op", "conv2d", "-o", str(tmp_path / "t.py")])
    assert res.exit_code == 2 and "known operations" in res.output
    res = runner.invoke(
        app, ["sweep", str(cat), "--op", "gemm", "-o", str(tmp_path / "t.py"), "--all-cases", "--max-cases", "1"]
    )
    assert res.exit_code == 2 and "max_cases" in res.output


def _one_line_error(args: list[str]) -> str:
    """Run ``opgraph`` with ``args``; assert a one-line error with exit 2 and return it."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_sweep_refuses_a_device_replay_cannot_use(tmp_path: Path, graphs: ModuleType) -> None:
    cat = _catalog(tmp_path, graphs)
    for device in ("tpu", "cuda:x", "cpu:0", "CUDA"):
        out = tmp_path / "t.py"
        line = _one_line_error(["sweep", str(cat), "--op", "gemm", "-o", str(out), "--device", device])
        assert f"--device: unknown device {device!r}" in line and "cuda:N" in line
        assert not out.exists()
    for device in ("cuda", "cuda:1"):
        out = tmp_path / f"test_{device.replace(':', '_')}.py"
        res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "-o", str(out), "--device", device])
        assert res.exit_code == 0, res.output
        assert f'"OPGRAPH_SWEEP_DEVICE", "{device}"' in out.read_text()


def test_sweep_names_an_unknown_phase_and_the_valid_ones(tmp_path: Path, graphs: ModuleType) -> None:
    cat = _catalog(tmp_path, graphs)
    line = _one_line_error(["sweep", str(cat), "--op", "gemm", "--phase", "bogus", "-o", str(tmp_path / "t.py")])
    assert "--phase: unknown phase 'bogus'" in line and "valid phases: " in line, line
    assert "prefill" in line.split("valid phases: ")[1]
    res = runner.invoke(app, ["sweep", str(cat), "--op", "gemm", "--phase", "prefill", "--dry-run", "-o", "t.py"])
    assert res.exit_code == 0, res.output
