"""Helpers shared by the benchmark scripts (run as ``python benchmarks/bench_<name>.py``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# OPGRAPH_BENCH_RESULTS redirects results (benchmarks/run_smoke.py sends smoke runs to a temporary folder).
RESULTS = Path(os.environ.get("OPGRAPH_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")

TINY_LLAMA: dict[str, object] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
"""A two-layer llama config small enough to capture (and run on the CPU) in well under a second: the
smoke runs' model, and the test suite's (``tests/conftest.py`` takes it from here)."""


def machine() -> str:
    """CPU model name (as lscpu prints it)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
