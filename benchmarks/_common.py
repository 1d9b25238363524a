"""Helpers shared by the benchmark scripts (run as ``python benchmarks/bench_<name>.py``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# OPGRAPH_BENCH_RESULTS redirects results (benchmarks/run_smoke.py sends smoke runs to a temporary folder).
RESULTS = Path(os.environ.get("OPGRAPH_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def machine() -> str:
    """CPU model name (as lscpu prints it)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
