"""Pool several passes of ``benchmarks/gpu/heldout.py`` over the same cases into one data set.

The GPU machine's host speed drifts by up to 2.5x within minutes, so the wall of a host-bound case
measured in one pass of 9 runs depends on the minute it ran in. Pooling passes made at different
times gives each case the median over all their runs (GPU time, busy time and wall alike); the kept
trace, config and every other field come from the first pass, and ``passes`` in the summary and in
each case records when each pass ran and what it measured alone.

    python benchmarks/heldout_pool.py PASS.tar.gz PASS.tar.gz... -o heldout.tar.gz

Every pass must hold the same cases with the same torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

from heldout import stats  # noqa: E402

POOLED = ("gpu_us", "wall_us", "busy_us")
"""The per-case measurements whose runs are pooled."""


class PoolError(Exception):
    """Passes that cannot be pooled."""


def _unpack(path: Path, into: Path) -> Path:
    """The folder holding a pass's ``summary.json`` (a ``.tar.gz`` is unpacked into ``into``)."""
    if path.is_dir():
        folder = path
    else:
        with tarfile.open(path) as tar:
            tar.extractall(into, filter="data")
        found = sorted(into.rglob("summary.json"))
        if not found:
            raise PoolError(f"{path}: no summary.json inside")
        folder = found[0].parent
    if not (folder / "summary.json").is_file():
        raise PoolError(f"{path}: no summary.json")
    return folder


def pool(folders: Sequence[Path], out: Path) -> dict[str, Any]:
    """Write the pooled data set of the pass ``folders`` (first pass first) into the folder ``out``;
    returns its summary."""
    summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
    first = summaries[0]
    for f, s in zip(folders[1:], summaries[1:], strict=True):
        for key in ("torch", "transformers"):
            if s.get(key) != first.get(key):
                raise PoolError(f"{f}: {key} {s.get(key)} where the first pass has {first.get(key)}")
    names = [c["case"] for c in first["cases"] if c.get("status", "ok") == "ok"]
    out.mkdir(parents=True, exist_ok=True)
    for p in folders[0].iterdir():
        if p.name.endswith(".config.json") or p.suffix != ".json":  # traces, configs, the log
            shutil.copy2(p, out / p.name)
    passes = [{"started_utc": s.get("started_utc", ""), "runs_per_case": s.get("runs_per_case")} for s in summaries]
    rows = {c["case"]: c for c in first["cases"]}
    for name in names:
        records = []
        for f in folders:
            path = f / f"{name}.json"
            if not path.is_file():
                raise PoolError(f"{f}: no {name}.json (every pass must hold the same cases)")
            records.append(json.loads(path.read_text()))
        pooled = dict(records[0])
        for key in POOLED:
            if all(key in r for r in records):
                pooled[key] = stats([x for r in records for x in r[key]["runs"]])
        pooled["runs"] = sum(int(r["runs"]) for r in records)
        pooled["passes"] = [
            {"started_utc": p["started_utc"], **{k: r[k]["median"] for k in ("gpu_us", "wall_us") if k in r}}
            for p, r in zip(passes, records, strict=True)
        ]
        (out / f"{name}.json").write_text(json.dumps(pooled, indent=1) + "\n")
        rows[name] = {
            **rows[name],
            "gpu_us": pooled["gpu_us"]["median"],
            "wall_us": pooled["wall_us"]["median"],
            "wall_spread": pooled["wall_us"]["spread"],
        }
    summary = {
        **first,
        "cases": [rows[c["case"]] for c in first["cases"]],
        "runs_per_case": sum(int(p["runs_per_case"] or 0) for p in passes),
        "passes": passes,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: pool the passes and write the pooled ``heldout.tar.gz``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("passes", type=Path, nargs="+", help="heldout.tar.gz files (or folders) of heldout.py, first first")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the pooled .tar.gz to write")
    args = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folders = [_unpack(p, Path(tmp) / f"pass{i}") for i, p in enumerate(args.passes)]
            summary = pool(folders, Path(tmp) / "pooled" / "heldout")
            part = args.out.with_name(args.out.name + ".part")
            with tarfile.open(part, "w:gz") as tar:
                tar.add(Path(tmp) / "pooled" / "heldout", arcname="heldout")
            part.replace(args.out)
    except (PoolError, OSError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(summary['cases'])} cases pooled over {len(summary['passes'])} passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
