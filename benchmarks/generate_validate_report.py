"""Issue 20's validation, CPU side: each measured HF ``generate`` (``benchmarks/gpu/generate_validate.py``)
captured on meta as a planned generation and simulated with the CLI's defaults (``-H h100``: the shipped
device and host profiles), total time compared with the measured median wall.

HF ``generate`` with N new tokens runs N forwards (a prefill and N-1 decodes); ``opgraph capture
--phase generate --new-tokens K`` records K+1 forwards, so K = N-1.

    python benchmarks/generate_validate_report.py [benchmarks/results/gpu/h100/generate/generate_validate.json]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results" / "gpu" / "h100" / "generate" / "generate_validate.json"


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0] if argv else DEFAULT).read_text())
    print(f"measured on {data['gpu']} (torch {data['torch']}, transformers {data['transformers']}, {data['date']})")
    print("| case | forwards | measured wall ms (median) | predicted ms | error |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for c in data["cases"]:
            if "error" in c:
                print(f"| {c['case']} | | {c['error']} | | |")
                continue
            graph = Path(tmp) / f"{c['case']}.json.gz"
            capture = [sys.executable, "-m", "opgraph", "capture", c["preset"], "--phase", "generate"]
            capture += ["--batch", str(c["batch"]), "--seq-len", str(c["prompt"])]
            capture += ["--new-tokens", str(c["new_tokens"] - 1), "--layers", str(c["layers"]), "-o", str(graph)]
            subprocess.run(capture, check=True, capture_output=True)
            sim = [sys.executable, "-m", "opgraph", "simulate", str(graph), "-H", "h100", "--policy", "stream"]
            sim.append("--json")
            out = json.loads(subprocess.run(sim, check=True, capture_output=True, text=True).stdout)
            pred, meas = out["generation"]["makespan_us"], c["wall_us"]["median"]
            err = (pred - meas) / meas * 100
            print(f"| {c['case']} | {c['forwards']} | {meas / 1e3:.1f} | {pred / 1e3:.1f} | {err:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
