"""The prediction side of the TP runs: capture on meta, shard for ``--tp N``, simulate, compare per rank.

For every run in the measured summaries of ``tp_run.py`` (``summary.json``), this captures the
same model and phase on meta with opgraph (same preset, layers, shapes and dtype), shards it with
``opgraph.transforms.shard_tensor_parallel`` the way the run was sharded (embedding and lm_head
modes from the run), simulates the TP job (one in-order stream per rank, eager host, the ranks'
collectives synchronised) and compares, per rank:

- compute: the union of the rank's simulated compute spans with the union of its measured
  non-NCCL kernel, memcpy and memset intervals (no collective in either);
- collective transfer: the rank's simulated collective spans with the measured transfer, per
  collective the shortest of the ranks' NCCL kernels (an NCCL kernel spins from its launch until
  the last peer has launched, so the rank that arrived last measured the transfer alone); the
  rest of a rank's NCCL kernel time is its **wait** (host skew between the eager ranks), reported
  apart and not a property of the model;
- GPU time, twice: raw (the union of every measured device interval, waits included: what the
  first run compared, off by up to 2500%) and without the wait (``gpu - wait``), against the
  union of the rank's simulated device spans;
- end to end: the measured wall time of a step (median over ``--wall-repeats`` steps without the
  profiler, the ranks lined up before each) with the simulated makespan.

Collectives are costed twice: from the hardware's interconnect numbers (what ``simulate --tp``
does today) and, with ``--collective-fit``, from the measured alpha-beta fit
(``hardware.collective_fit``). Writes a ``TpComparisonReport`` JSON; ``--graphs-dir`` also keeps
each sharded graph (``validators.collectives --graph`` replays their collectives).

    python3 benchmarks/gpu/tp_predict.py --measured $OUT/tp/*/summary.json --hardware h100 \\
        --collective-fit $OUT/collective_fit.json --graphs-dir /tmp/tp-graphs --out $OUT/tp_compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_cli import entry_point, parser  # noqa: E402
from pydantic import Field  # noqa: E402
from tp_run import TpCase, TpRunSummary  # noqa: E402

from opgraph.ir import FrozenModel  # noqa: E402

GPU_TOLERANCE = 0.10
"""The issue's target: GPU time within 10% per rank."""
COLLECTIVE_TOLERANCE = 0.15
"""The issue's target: collective time within 15% per rank."""


class RankPrediction(FrozenModel):
    """One rank's simulated times, microseconds per step."""

    rank: int
    gpu_us: float
    """Union of the rank's device spans (compute engines and link)."""
    compute_us: float
    """Union of its compute spans."""
    collective_us: float
    """Sum of its collective spans."""
    collective_wait_us: float
    """Time its collectives waited for the other ranks."""
    makespan_us: float


class RankComparison(FrozenModel):
    """Measured against predicted, one rank (errors are ``predicted / measured - 1``)."""

    rank: int
    measured_gpu_us: float | None
    """Raw: union of every device interval of the rank's trace, NCCL waits included."""
    predicted_gpu_us: float
    gpu_err: float | None
    """``predicted_gpu_us / measured_gpu_us - 1`` (raw: the waits make it meaningless when they are large)."""
    measured_compute_us: float | None = None
    """Union of the rank's non-NCCL device intervals."""
    predicted_compute_us: float = 0.0
    compute_err: float | None = None
    measured_nccl_us: float | None
    """Sum of the rank's NCCL kernels: transfer plus wait."""
    predicted_collective_us: float
    """Collective spans plus their simulated wait."""
    collective_err: float | None
    """Against the raw NCCL time (waits included)."""
    measured_wall_us: float | None
    predicted_makespan_us: float
    measured_wait_us: float | None = None
    """The rank's NCCL time beyond the transfer: spinning while the other ranks arrive."""
    measured_transfer_us: float | None = None
    """Per step, the sum over the collectives of the shortest rank's kernel (the same on every rank)."""
    predicted_transfer_us: float = 0.0
    """The rank's simulated collective spans, without waiting."""
    transfer_err: float | None = None
    measured_gpu_nowait_us: float | None = None
    """``measured_gpu_us - measured_wait_us``: the rank's device time without waiting for peers."""
    gpu_nowait_err: float | None = None
    """``predicted_gpu_us / measured_gpu_nowait_us - 1``."""
    wall_err: float | None = None
    """``predicted_makespan_us / measured_wall_us - 1``."""


class CaseComparison(FrozenModel):
    """One run (model, phase, TP degree) under one way of costing collectives."""

    case: TpCase
    cost_model: str
    collectives: str
    """``interconnect`` (the hardware file's link numbers) or ``calibrated`` (the measured fit)."""
    ranks: tuple[RankComparison, ...]
    collective_ops: int
    """Collectives per rank in the sharded graph."""
    measured_nccl_transfer_us: float | None = None
    """Per step: the sum over collectives of the shortest NCCL kernel of the ranks (the rank that
    arrived last waits for nobody: its kernel is the transfer alone)."""
    predicted_collective_transfer_us: float = 0.0
    """Per step: rank 0's simulated collective spans, without waiting."""
    transfer_err: float | None = None
    """``predicted_collective_transfer_us / measured_nccl_transfer_us - 1``."""
    predicted_collectives: dict[str, int] = Field(default_factory=dict)
    """Collectives per rank in the sharded graph, by kind."""
    measured_collectives: dict[str, int] = Field(default_factory=dict)
    """c10d collective calls per step in rank 0's trace, by kind (the run's sharding)."""
    notes: tuple[str, ...] = ()

    @property
    def max_gpu_err(self) -> float | None:
        """Largest |GPU error| over the ranks."""
        return _largest_abs(r.gpu_err for r in self.ranks)

    @property
    def max_wait_us(self) -> float | None:
        """Largest measured wait of a rank, microseconds per step (a wait is never negative)."""
        return _largest_abs(r.measured_wait_us for r in self.ranks)


def _largest_abs(xs: Iterable[float | None]) -> float | None:
    """The largest absolute value of ``xs`` (``None`` values left out), or ``None`` when none is left."""
    vals = [abs(x) for x in xs if x is not None]
    return max(vals) if vals else None


class TpComparisonReport(FrozenModel):
    """Every comparison of one ``tp_predict.py`` call."""

    hardware: str
    device_name: str = ""
    """The GPU the measurements ran on."""
    comparisons: tuple[CaseComparison, ...]
    gpu_tolerance: float = GPU_TOLERANCE
    collective_tolerance: float = COLLECTIVE_TOLERANCE
    created: str = ""
    measured_files: tuple[str, ...] = Field(default_factory=tuple)


def capture_case(case: TpCase, cache: dict[tuple[Any, ...], Any] | None = None) -> Any:
    """The unsharded graph of ``case``'s model and phase, captured on meta (memoised in ``cache``)."""
    from opgraph.capture import capture

    key = (case.model, case.phase, case.batch, case.seq_len, case.kv_len, case.layers, case.dtype)
    if cache is not None and key in cache:
        return cache[key]
    kw: dict[str, Any] = {"phase": case.phase, "batch": case.batch, "dtype": case.dtype, "layers": case.layers}
    if case.phase == "prefill":
        kw["seq_len"] = case.seq_len
    else:
        kw["kv_len"] = case.kv_len
    graph = capture(case.model, **kw)
    if cache is not None:
        cache[key] = graph
    return graph


def shard_case(graph: Any, case: TpCase) -> Any:
    """``graph`` sharded as the run was (its TP degree, embedding and lm_head modes)."""
    from opgraph.transforms import shard_tensor_parallel

    return shard_tensor_parallel(graph, case.tp, embedding=case.embedding, lm_head=case.lm_head)  # type: ignore[arg-type]


def predict_ranks(sharded: Any, tp: int, hw: Any, model: Any) -> list[RankPrediction]:
    """Simulate the ``tp``-rank job of a sharded graph; each rank's times."""
    from opgraph.ir import OpKind
    from opgraph.ir.timeline import union_length
    from simulators import HostConfig, HostMode, SimulationConfig, simulate

    config = SimulationConfig.standard(1, policy="stream", host=HostConfig(mode=HostMode.EAGER))
    config = SimulationConfig.model_validate({**config.model_dump(), "tp": tp})
    result = simulate(sharded, hw, model, config)
    stats = result.stats()
    spans = result.timeline().spans
    out: list[RankPrediction] = []
    for r in range(tp):
        prefix = f"rank{r}/" if tp > 1 else ""
        mine = [s for s in spans if s.track.startswith(prefix) and s.category != "host" and "host" not in s.track]
        dev = [(s.start_us, s.start_us + s.dur_us) for s in mine]
        comp = [(s.start_us, s.start_us + s.dur_us) for s in mine if s.kind is not OpKind.COLLECTIVE]
        coll = sum(s.dur_us for s in mine if s.kind is OpKind.COLLECTIVE)
        wait = stats.collective_wait_us[r] if r < len(stats.collective_wait_us) else 0.0
        out.append(
            RankPrediction(
                rank=r,
                gpu_us=union_length(dev),
                compute_us=union_length(comp),
                collective_us=coll,
                collective_wait_us=wait,
                makespan_us=stats.makespan_us,
            )
        )
    return out


def _err(pred: float, meas: float | None) -> float | None:
    return pred / meas - 1 if meas else None


def nccl_split(measured: Sequence[Any]) -> tuple[float, dict[int, float]] | None:
    """Per step: (transfer, {rank: wait}) from the ranks' NCCL kernels (``RankResult`` s).

    The i-th NCCL kernel of every rank is the same collective; its transfer is the shortest of the
    ranks' kernels (the rank that launched last waited for nobody), a rank's wait its kernel beyond
    that. ``None`` when the ranks' kernel lists do not line up (different counts).
    """
    traced = [m for m in measured if m.trace is not None]
    lists = [m.trace.nccl_kernel_us for m in traced]
    if not lists or not all(lists) or len({len(x) for x in lists}) != 1:
        return None
    steps = max(traced[0].trace.steps, 1)
    mins = [min(col) for col in zip(*lists, strict=True)]
    transfer = sum(mins) / steps
    waits = {
        m.rank: sum(k - lo for k, lo in zip(ks, mins, strict=True)) / steps for m, ks in zip(traced, lists, strict=True)
    }
    return transfer, waits


def nccl_transfer_us(measured: Sequence[Any]) -> float | None:
    """Per step: sum over the collectives of the shortest of the ranks' NCCL kernels (``None`` when
    the ranks' kernel lists do not line up)."""
    split = nccl_split(measured)
    return None if split is None else split[0]


def compare_run(
    case: TpCase, measured: Sequence[Any], preds: Sequence[RankPrediction], cost_model: str, collectives: str,
    predicted_collectives: dict[str, int], notes: Sequence[str] = (),
) -> CaseComparison:  # fmt: skip
    """Join one run's measured ranks (``RankResult``) with the predicted ones."""
    by_rank = {m.rank: m for m in measured}
    split = nccl_split(measured)
    transfer = split[0] if split is not None else None
    rows = []
    for p in preds:
        m = by_rank.get(p.rank)
        tr = m.trace if m is not None else None
        mg = tr.gpu_busy_us if tr is not None and tr.gpu_busy_us > 0 else None
        mn = tr.nccl_us if tr is not None and tr.nccl_us > 0 else None
        mc = tr.compute_busy_us if tr is not None and tr.compute_busy_us > 0 else None
        wait = split[1].get(p.rank) if split is not None else None
        nowait = mg - wait if mg is not None and wait is not None else None
        wall = m.wall_us if m is not None and m.wall_us > 0 else None
        pc = p.collective_us + p.collective_wait_us
        rows.append(
            RankComparison(
                rank=p.rank,
                measured_gpu_us=mg,
                predicted_gpu_us=p.gpu_us,
                gpu_err=_err(p.gpu_us, mg),
                measured_compute_us=mc,
                predicted_compute_us=p.compute_us,
                compute_err=_err(p.compute_us, mc),
                measured_nccl_us=mn,
                predicted_collective_us=pc,
                collective_err=_err(pc, mn),
                measured_wall_us=wall,
                predicted_makespan_us=p.makespan_us,
                measured_wait_us=wait,
                measured_transfer_us=transfer,
                predicted_transfer_us=p.collective_us,
                transfer_err=_err(p.collective_us, transfer),
                measured_gpu_nowait_us=nowait,
                gpu_nowait_err=_err(p.gpu_us, nowait),
                wall_err=_err(p.makespan_us, wall),
            )
        )
    pred_transfer = preds[0].collective_us if preds else 0.0
    first = by_rank.get(0)
    measured_calls = dict(first.trace.collective_calls) if first is not None and first.trace is not None else {}
    return CaseComparison(
        case=case, cost_model=cost_model, collectives=collectives, ranks=tuple(rows),
        collective_ops=sum(predicted_collectives.values()), predicted_collectives=dict(predicted_collectives),
        measured_collectives=measured_calls, notes=tuple(notes), measured_nccl_transfer_us=transfer,
        predicted_collective_transfer_us=pred_transfer, transfer_err=_err(pred_transfer, transfer),
    )  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e3:.2f}"


def _worst(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals, key=abs) if vals else None


def comparison_table(report: TpComparisonReport, cost_model: str | None = None) -> str:
    """A Markdown table of the comparisons: per run and collective costing, measured (ms) and the
    worst rank's error of each part (compute, transfer, GPU without wait, raw GPU, wall), and the
    largest wait of a rank.

    Rows of ``cost_model`` only when given. Numbers are per step; errors ``predicted / measured - 1``.
    """
    head = (
        "| run | costing | compute ms | err | transfer ms | err | GPU-wait ms | err | max wait ms | raw GPU err "
        "| wall ms | err |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for c in report.comparisons:
        if cost_model is not None and c.cost_model != cost_model:
            continue
        r0 = c.ranks[0] if c.ranks else None

        def med(vals: Iterable[float | None]) -> float | None:
            xs = [v for v in vals if v is not None]
            return statistics.median(xs) if xs else None

        lines.append(
            f"| {c.case.name} | {c.cost_model}, {c.collectives} "
            f"| {_ms(med(r.measured_compute_us for r in c.ranks))} | {_pct(_worst(r.compute_err for r in c.ranks))} "
            f"| {_ms(r0.measured_transfer_us if r0 else None)} | {_pct(_worst(r.transfer_err for r in c.ranks))} "
            f"| {_ms(med(r.measured_gpu_nowait_us for r in c.ranks))} "
            f"| {_pct(_worst(r.gpu_nowait_err for r in c.ranks))} | {_ms(c.max_wait_us)} "
            f"| {_pct(_worst(r.gpu_err for r in c.ranks))} "
            f"| {_ms(med(r.measured_wall_us for r in c.ranks))} | {_pct(_worst(r.wall_err for r in c.ranks))} |"
        )
    return "\n".join(lines)


def load_summaries(path: str | Path) -> list[TpRunSummary]:
    """The ``TpRunSummary`` of a ``summary.json``, or each of a JSON array of them (``tp_summary.json``)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    items = data if isinstance(data, list) else [data]
    return [TpRunSummary.model_validate(item) for item in items]


def run(args: argparse.Namespace) -> TpComparisonReport:
    """Predict and compare every run of the measured summaries."""
    from hardware import load_hardware, resolve_cost_model
    from opgraph.ir import Collective, OpKind, save_graph

    hw = load_hardware(args.hardware)
    cal = None
    if args.collective_fit is not None:
        from hardware.collective_fit import CalibratedCollectiveModel, CollectiveCalibration, CollectivesCostedApart

        cal = CollectiveCalibration.load(args.collective_fit)
    # (cost model label, collectives label, model): each cost model with the interconnect's
    # collective costs and, given a fit, with the measured ones.
    models: list[tuple[str, str, Any]] = []
    for spec in args.cost_model or ["roofline"]:
        base = resolve_cost_model(spec)
        label = Path(spec).name if ("/" in spec or spec.endswith(".json")) else spec
        models.append((label, "interconnect", base))
        if cal is not None:
            models.append((label, "calibrated", CollectivesCostedApart(base, CalibratedCollectiveModel(cal))))
    graphs: dict[tuple[Any, ...], Any] = {}
    comparisons: list[CaseComparison] = []
    device_names: set[str] = set()
    summaries = [s for path in args.measured for s in load_summaries(path)]
    for summary in summaries:
        for tp_run in summary.runs:
            case = tp_run.case
            device_names.update(r.device_name for r in tp_run.ranks)
            t0 = time.perf_counter()
            graph = capture_case(case, graphs)
            sharded = shard_case(graph, case) if case.tp > 1 else graph
            if args.graphs_dir is not None:
                args.graphs_dir.mkdir(parents=True, exist_ok=True)
                save_graph(sharded, args.graphs_dir / f"{case.name}.json.gz")
            if args.graphs_only:
                print(f"{case.name}: sharded graph kept ({time.perf_counter() - t0:.0f} s)", flush=True)
                continue
            kinds = [o.collective.value for o in sharded.ops_of(OpKind.COLLECTIVE) if isinstance(o, Collective)]
            by_kind = {k: kinds.count(k) for k in sorted(set(kinds))}
            for model_label, label, model in models:
                try:
                    preds = predict_ranks(sharded, case.tp, hw, model)
                except Exception as exc:  # one cost model failing must not lose the others' comparisons
                    print(f"{case.name} [{model_label}, {label}]: {type(exc).__name__}: {exc}"[:400], flush=True)
                    continue
                comparisons.append(
                    compare_run(case, tp_run.ranks, preds, model_label, label, by_kind, sharded.metadata.assumptions)
                )
                c = comparisons[-1]
                r0 = c.ranks[0]
                ce = _pct(_worst(r.compute_err for r in c.ranks))
                ge = _pct(_worst(r.gpu_nowait_err for r in c.ranks))
                raw = _pct(_worst(r.gpu_err for r in c.ranks))
                we = _pct(_worst(r.wall_err for r in c.ranks))
                print(
                    f"{case.name} [{model_label}, {label}]: predicted compute {r0.predicted_compute_us / 1e3:.2f} ms "
                    f"({ce}), transfer {r0.predicted_transfer_us / 1e3:.2f} ms ({_pct(c.transfer_err)}), gpu "
                    f"{r0.predicted_gpu_us / 1e3:.2f} ms (without wait {ge}, raw {raw}), makespan "
                    f"{r0.predicted_makespan_us / 1e3:.2f} ms (wall {we}); max wait {_ms(c.max_wait_us)} ms "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    report = TpComparisonReport(
        hardware=hw.name,
        device_name=", ".join(sorted(device_names)),
        comparisons=tuple(comparisons),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        measured_files=tuple(str(p) for p in args.measured),
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(comparison_table(report) + "\n", encoding="utf-8")
    return report


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--measured", type=Path, nargs="+", required=True, help="summary.json files of tp_run.py")
    ap.add_argument("--hardware", default="h100")
    ap.add_argument(
        "--cost-model", action="append", default=None, help="roofline (default), a calibrated table JSON...; repeatable"
    )
    ap.add_argument("--collective-fit", type=Path, default=None, help="a CollectiveCalibration JSON")
    ap.add_argument("--graphs-dir", type=Path, default=None, help="keep each sharded graph here")
    ap.add_argument("--graphs-only", action="store_true", help="only capture, shard and keep the graphs (--graphs-dir)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, help="also write the Markdown comparison table here")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.graphs_only and args.graphs_dir is None:
        ap.error("--graphs-only needs --graphs-dir")
    return args


main = entry_point(run, parse_args, "Entry point.")

if __name__ == "__main__":
    sys.exit(main())
