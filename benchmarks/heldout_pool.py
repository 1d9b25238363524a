"""Pool several passes of ``benchmarks/gpu/heldout.py`` over the same cases into one data set.

The GPU machine's host speed drifts by up to 2.5x within minutes, so the wall of a host-bound case
measured in one pass of 9 runs depends on the minute it ran in. Pooling passes made at different
times gives each case the median over all their runs (GPU time, busy time and wall alike); the kept
trace, config and every other field come from the first pass, and ``passes`` in the summary and in
each case records when each pass ran and what it measured alone.

    python benchmarks/heldout_pool.py PASS.tar.gz PASS.tar.gz... -o heldout.tar.gz

Every pass must hold the same cases with the same torch and transformers.

With ``--walls ROUND_ROBIN.tar.gz...`` (``heldout.py --round-robin``: every case measured in rounds with a
host probe each), each case's wall is the median over the *quiet* rounds instead (:func:`quiet_rounds`,
chosen by the host probe alone, never by the walls), of every run given (:func:`pooled_quiet_walls`: the
host's speed differs from run to run too, so a wall rests on several); the passes' walls stay beside it
(``wall_us_passes``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
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


QUIET = 1.10
"""A round is quiet when both host probes before it are within this factor of their fastest in the run."""
MIN_WALLS = 9
"""Fewest quiet walls a case's wall median may rest on."""


class PoolError(Exception):
    """Passes that cannot be pooled."""


def quiet_rounds(probes: Sequence[dict[str, Any]], within: float = QUIET) -> list[int]:
    """The rounds whose host probes (launch and Python loop) were both within ``within`` of their fastest."""
    fast = {k: min(p[k] for p in probes) for k in ("launch_us", "python_loop_ns")}
    return [p["round"] for p in probes if all(p[k] <= within * v for k, v in fast.items())]


def probe_line(probes: Sequence[dict[str, Any]]) -> str:
    """The host probe's spread over the rounds."""
    parts = []
    for key, unit in (("launch_us", "us per tiny kernel launch"), ("python_loop_ns", "ns per Python loop step")):
        v = sorted(p[key] for p in probes)
        parts.append(f"{v[0]:.1f} / {statistics.median(v):.1f} / {v[-1]:.1f} {unit}")
    return f"Host probe over {len(probes)} rounds (min / median / max): " + "; ".join(parts) + "."


def load_walls(path: Path) -> dict[str, Any]:
    """The ``walls.json`` of a ``heldout.py --round-robin`` run (its folder or ``.tar.gz``), with the run's
    provenance from its ``summary.json`` (``started_utc``, ``gpu``, ``torch``, ``transformers``)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = _unpack(path, Path(tmp))
        if not (folder / "walls.json").is_file():
            raise PoolError(f"{path}: no walls.json (not a heldout.py --round-robin run)")
        data: dict[str, Any] = json.loads((folder / "walls.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
    for key in ("started_utc", "gpu", "torch", "transformers"):
        data.setdefault(key, summary.get(key))
    return data


def quiet_walls(data: dict[str, Any], role: str | None = None) -> dict[str, list[float]]:
    """Per case (of ``role``, or every case), its walls (us) in the quiet rounds of a round-robin run."""
    quiet = set(quiet_rounds(data["host_probes"]))
    return {
        c["case"]: [w["us"] for w in c["walls"] if w["round"] in quiet]
        for c in data["cases"]
        if role is None or c["role"] == role
    }


def pooled_quiet_walls(runs: Sequence[dict[str, Any]], role: str | None = None) -> dict[str, list[float]]:
    """Per case, its quiet-round walls (:func:`quiet_walls`, each run's rounds chosen by that run's own
    probes) of every run that measured it, first run first."""
    out: dict[str, list[float]] = {}
    for data in runs:
        for case, kept in quiet_walls(data, role).items():
            out.setdefault(case, []).extend(kept)
    return out


def walls_method(data: dict[str, Any]) -> str:
    """How a round-robin run's quiet walls were measured and chosen, for reports."""
    quiet = quiet_rounds(data["host_probes"])
    return (
        f"round robin over the cases ({len(data['host_probes'])} rounds, each starting with a host probe; "
        f"{data['timed_per_round']} timed forwards per case per round after an untimed one), the "
        f"{len(quiet)} rounds whose probes were both within {QUIET - 1:.0%} of their fastest kept. "
        + probe_line(data["host_probes"])
    )


def runs_method(runs: Sequence[dict[str, Any]]) -> str:
    """How the quiet walls of several round-robin runs were measured, chosen and pooled, for reports."""
    if len(runs) == 1:
        return walls_method(runs[0])
    each = "; ".join(
        f"{d.get('started_utc', '?')}: {len(d['host_probes'])} rounds, {len(quiet_rounds(d['host_probes']))} quiet"
        for d in runs
    )
    return (
        f"{len(runs)} round-robin runs pooled (each round starting with a host probe; "
        f"{runs[0]['timed_per_round']} timed forwards per case per round after an untimed one; a round quiet "
        f"when both its probes were within {QUIET - 1:.0%} of their fastest in its run): {each}."
    )


def _unpack(path: Path, into: Path) -> Path:
    """The folder holding a pass's ``summary.json`` (a ``.tar.gz`` is unpacked into ``into``)."""
    if path.is_dir():
        folder = path
    else:
        try:
            with tarfile.open(path) as tar:
                tar.extractall(into, filter="data")
        except tarfile.TarError as exc:
            raise PoolError(f"{path}: not a folder or .tar.gz of heldout.py ({str(exc).splitlines()[0]})") from exc
        found = sorted(into.rglob("summary.json"))
        if not found:
            raise PoolError(f"{path}: no summary.json inside")
        folder = found[0].parent
    if not (folder / "summary.json").is_file():
        raise PoolError(f"{path}: no summary.json")
    return folder


PASS_WALLS = "the passes' timed runs, one case after another: no round-robin run built it (device memory)"
"""A case's ``wall_source`` when its walls are the passes' (``--pass-walls-where-unbuilt``)."""


def pool(
    folders: Sequence[Path], out: Path, walls: Sequence[dict[str, Any]] = (), pass_walls_where_unbuilt: bool = False
) -> dict[str, Any]:
    """Write the pooled data set of the pass ``folders`` (first pass first) into the folder ``out``;
    returns its summary. With ``walls`` (round-robin runs' ``walls.json``, :func:`load_walls`), each case's
    wall is the median of its quiet-round walls over the runs (:func:`pooled_quiet_walls`); with
    ``pass_walls_where_unbuilt``, a case no run built (none of its walls in any round) keeps the passes'
    walls, its ``wall_source`` saying so."""
    summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
    first = summaries[0]
    for f, s in zip(folders[1:], summaries[1:], strict=True):
        for key in ("torch", "transformers"):
            if s.get(key) != first.get(key):
                raise PoolError(f"{f}: {key} {s.get(key)} where the first pass has {first.get(key)}")
    names = [c["case"] for c in first["cases"] if c.get("status", "ok") == "ok"]
    quiet = pooled_quiet_walls(walls, "heldout") if walls else None
    for run in walls:
        for key in ("torch", "transformers"):
            if run.get(key) != first.get(key):
                raise PoolError(
                    f"--walls run of {run.get('started_utc')}: {key} {run.get(key)} where the passes have "
                    f"{first.get(key)}"
                )
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
        unbuilt = not any(c["case"] == name for run in walls for c in run["cases"])
        if quiet is not None and unbuilt and pass_walls_where_unbuilt:
            pooled["wall_source"] = PASS_WALLS
        elif quiet is not None:
            kept = quiet.get(name, [])
            if len(kept) < MIN_WALLS:
                raise PoolError(f"{name}: {len(kept)} quiet round-robin walls, at least {MIN_WALLS} needed (--walls)")
            pooled["wall_us_passes"] = pooled["wall_us"]
            pooled["wall_us"] = stats(kept)
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
    if walls:
        summary["walls"] = {
            "method": runs_method(walls),
            "started_utc": ", ".join(str(run.get("started_utc", "")) for run in walls),
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: pool the passes and write the pooled ``heldout.tar.gz``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("passes", type=Path, nargs="+", help="heldout.tar.gz files (or folders) of heldout.py, first first")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the pooled .tar.gz to write")
    ap.add_argument(
        "--walls",
        type=Path,
        nargs="+",
        default=[],
        help="heldout.py --round-robin runs: walls from their quiet rounds, pooled",
    )
    ap.add_argument(
        "--pass-walls-where-unbuilt",
        action="store_true",
        help="a case the --walls runs did not build (device memory) keeps the passes' walls, and says so",
    )
    args = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folders = [_unpack(p, Path(tmp) / f"pass{i}") for i, p in enumerate(args.passes)]
            walls = [load_walls(p) for p in args.walls]
            summary = pool(folders, Path(tmp) / "pooled" / "heldout", walls, args.pass_walls_where_unbuilt)
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
