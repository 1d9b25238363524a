"""Helpers shared by the benchmark scripts (run as ``python benchmarks/bench_<name>.py``)."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


@functools.cache
def machine() -> str:
    """CPU model name (as lscpu prints it)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def write_results(stem: str, rows: Sequence[dict[str, Any]], lines: Sequence[str], load_note: str) -> None:
    """``RESULTS/<stem>.json`` (the rows and the machine) and ``RESULTS/<stem>.md`` (``lines``, then the
    1-, 5- and 15-minute load averages at the end of the run, followed by ``load_note`` in parentheses)."""
    meta = {"machine": machine(), "cores": 2, "python": platform.python_version()}
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": list(rows)}, indent=2) + "\n")
    loadavg = Path("/proc/loadavg")
    load = loadavg.read_text().split()[:3] if loadavg.exists() else []
    footer = f"\nLoad average at the end of the run: {' '.join(load)} ({load_note})."
    (RESULTS / f"{stem}.md").write_text("\n".join([*lines, footer]) + "\n")
