"""Run every ``benchmarks/bench_*.py`` in ``--smoke`` mode (tiny sizes), as CI does.

Smoke runs check that the benchmarks still work; they do not check speed targets (those are
measured by hand at full size and recorded in ``benchmarks/results/``). Smoke results are written
to a temporary folder so the committed results stay as measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="opgraph-smoke-") as tmp:
        env = {**os.environ, "OPGRAPH_BENCH_RESULTS": tmp}
        for script in sorted(HERE.glob("bench_*.py")):
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, str(script), "--smoke"], env=env, cwd=HERE.parent, text=True, capture_output=True
            )
            took = time.perf_counter() - start
            status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"{script.name:32s} {status:18s} {took:6.1f} s", flush=True)
            if proc.returncode != 0:
                failed.append(script.name)
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    if failed:
        print(f"smoke benchmarks failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
