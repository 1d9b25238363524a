"""``opgraph serve-sim`` serves every shipped preset (two or three layers, a few requests).

Each preset has its own sizes and MoE routing (Qwen3-30B-A3B: 128 experts top-8, gpt-oss-120b: 128
top-4, DeepSeek-V3: 256 top-8 after three dense layers), which once made the rebatch templates
ambiguous; a new preset is served here as soon as it ships.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from opgraph.capture import presets
from opgraph.cli.app import app
from simulators.serving import ServingResult

PRESETS = presets()


def _layers(config: dict[str, object]) -> int:
    """Two layers, or enough to hold the first MoE layer of a model whose first layers are dense."""
    dense = config.get("first_k_dense_replace")
    return max(2, int(dense) + 1) if isinstance(dense, int) else 2


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_serve_sim_serves_every_shipped_preset(name: str, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    layers = _layers(PRESETS[name].config)
    args = ["serve-sim", name, "--layers", str(layers), "--poisson", "20", "-n", "6"]
    res = CliRunner().invoke(app, [*args, "--prompt-len", "8..300", "--output-len", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    result = ServingResult.model_validate_json(out.read_text())
    assert result.summary.completed == 6 and not result.dropped
    assert result.summary.ttft_ms.p50 > 0 and result.summary.tpot_ms.p50 > 0
