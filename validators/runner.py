"""``run_replay``: graphs in, results streamed to JSONL, coverage out; resumable and torchrun-aware.

This is what ``opgraph replay`` calls. Bad graphs (unreadable, from a newer schema) are reported
and skipped while the others replay; results are appended line by line as they are measured;
``resume`` skips configs already in the output (or in part files an interrupted torchrun left).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opgraph.ir import LoadError, OpGraph, OpgraphError, load_graph
from validators import distributed
from validators.configs import Estimator, OpConfig, cost_estimator, unique_configs
from validators.replay import Replayer, ReplayOptions, graph_skew, replay_configs
from validators.results import (
    Coverage,
    ReplayResult,
    ResultWriter,
    coverage,
    done_keys,
    iter_results,
    load_results,
)
from validators.sequence import SequenceIssue

ResultCallback = Callable[[ReplayResult, int, int], None]
"""Called with each new result, its position and the number of configs this process replays."""


@dataclass
class ReplayRun:
    """What a replay run did."""

    configs: list[OpConfig]
    """Configs selected for this run (all ranks)."""
    results: list[ReplayResult]
    """One result per selected config that has one (this run's and, on resume, earlier ones)."""
    coverage: Coverage
    """Coverage of ``results`` over ``configs``."""
    total_configs: int
    """Unique configs in the graphs before ``kinds``/``limit`` selection."""
    new: int = 0
    """Results measured by this process in this run."""
    resumed: int = 0
    """Configs skipped because an earlier run recorded them."""
    skipped_graphs: list[str] = field(default_factory=list)
    """One line per graph that could not be loaded."""
    device_name: str = ""
    """The device's model name."""
    energy_note: str = ""
    """Why energy was not measured, when it was asked for or possible."""
    rank: int = 0
    """This process's rank."""
    world_size: int = 1
    """Processes in the torchrun job."""
    out: Path | None = None
    """The JSONL output."""


def load_graphs(
    sources: Sequence[str | Path | OpGraph], warn: Callable[[str], None]
) -> tuple[list[OpGraph], list[str]]:
    """Load graphs, reporting (not raising) those that fail; :class:`LoadError` if none loads."""
    graphs: list[OpGraph] = []
    skipped: list[str] = []
    for src in sources:
        if isinstance(src, OpGraph):
            graphs.append(src)
            continue
        try:
            graphs.append(load_graph(src))
        except OpgraphError as exc:
            line = f"{exc.one_line()}; skipped"
            skipped.append(line)
            warn(line)
    if not graphs:
        raise LoadError(
            f"none of the {len(sources)} graph{'s' if len(sources) != 1 else ''} could be loaded",
            hint="see the lines above",
        )
    return graphs, skipped


def time_issue(
    graphs: Sequence[str | Path | OpGraph],
    *,
    device: str = "cuda",
    out: str | Path | None = None,
    options: ReplayOptions | None = None,
    select: Callable[[OpConfig], bool] | None = None,
    warn: Callable[[str], None] | None = None,
) -> SequenceIssue:
    """Only the host issue time of every config, in the graphs' op order (:mod:`validators.sequence`),
    saved to ``out``: minutes of replay not needed, so it can be timed right before the run it
    should predict (a shared host's speed drifts). Needs a CUDA device (on a CPU a call is the op)."""
    from opgraph.ir import save_model
    from validators.results import now_iso
    from validators.sequence import issue_in_sequence

    warn = warn or (lambda _m: None)
    if device.split(":")[0] != "cuda":
        raise OpgraphError(
            f"issue timing needs a CUDA device, not {device!r}",
            where="--device",
            hint="on a CPU a call runs the whole op; use --device cuda",
        )
    loaded, _ = load_graphs(graphs, warn)
    replayer = Replayer(device, options or ReplayOptions(check=False, energy=False, sm_clock=False))
    try:
        configs = [c for c in unique_configs(loaded) if select is None or select(c)]
        seq = issue_in_sequence(loaded, configs, replayer, moe_skew=graph_skew(loaded))
    finally:
        replayer.close()
    if seq.note:
        warn(seq.note)
    seq = seq.model_copy(update={"device_name": replayer.device_name, "created": now_iso()})
    if out is not None:
        save_model(seq, out)
    return seq


def _fold_parts(out: Path) -> None:
    """Append results from part files of an interrupted torchrun to ``out`` and remove the parts."""
    parts = distributed.part_files(out)
    if not parts:
        return
    have = done_keys([out])
    with ResultWriter(out) as w:
        for part in parts:
            for r in iter_results(part):
                if r.key not in have:
                    w.write(r)
                    have.add(r.key)
    for part in parts:
        part.unlink(missing_ok=True)


def run_replay(
    graphs: Sequence[str | Path | OpGraph],
    *,
    device: str = "cpu",
    out: str | Path | None = None,
    resume: bool = False,
    options: ReplayOptions | None = None,
    estimate: Estimator | None = None,
    select: Callable[[OpConfig], bool] | None = None,
    limit: int | None = None,
    on_result: ResultCallback | None = None,
    warn: Callable[[str], None] | None = None,
) -> ReplayRun:
    """Replay every unique config of ``graphs`` on ``device``, streaming results to ``out``.

    Under ``torchrun`` (``WORLD_SIZE > 1``) configs are sharded over ranks and rank 0 gathers the
    results into ``out``; ``device="cuda"`` then means each rank's own GPU.
    """
    warn = warn or (lambda _m: None)
    loaded, skipped = load_graphs(graphs, warn)
    options = options or ReplayOptions()
    dev_type = device.split(":")[0]
    ctx = distributed.init(dev_type)
    rank, world = (ctx.rank, ctx.world_size) if ctx else (0, 1)
    if ctx is not None and dev_type == "cuda":
        device = f"cuda:{ctx.local_rank}"
    out_path = Path(out) if out is not None else None
    try:
        replayer = Replayer(device, options, rank=rank)
        all_configs = unique_configs(loaded, estimate=estimate or cost_estimator())
        configs = [c for c in all_configs if select is None or select(c)]
        if limit is not None:
            configs = configs[: max(limit, 0)]
        if out_path is not None and rank == 0:
            if resume:
                _fold_parts(out_path)
            else:
                if out_path.exists():
                    out_path.unlink()
                for part in distributed.part_files(out_path):
                    part.unlink(missing_ok=True)
        if ctx is not None:
            distributed.barrier(ctx)
        done = done_keys([out_path]) if (out_path is not None and resume) else set()
        todo = [c for c in configs if c.key not in done]
        mine = distributed.shard(todo, rank, world) if ctx else todo
        if options.issue_in_sequence and replayer.device.type == "cuda" and mine:
            from validators.sequence import issue_in_sequence

            seq = issue_in_sequence(loaded, mine, replayer, moe_skew=graph_skew(loaded))
            replayer.sequence_issue_us = seq.us_by_key
            if seq.note:
                warn(seq.note)
        target = None
        if out_path is not None:
            target = distributed.part_path(out_path, rank) if ctx else out_path
        new: list[ReplayResult] = []
        writer = ResultWriter(target) if target is not None else None
        try:
            for i, r in enumerate(
                replay_configs(
                    mine, device, options, writer=writer, moe_skew=graph_skew(loaded), rank=rank, replayer=replayer
                )
            ):
                new.append(r)
                if on_result is not None:
                    on_result(r, i + 1, len(mine))
        finally:
            if writer is not None:
                writer.close()
            replayer.close()
        if ctx is not None:
            gathered = distributed.gather_results(ctx, new)
            if rank == 0 and out_path is not None:
                with ResultWriter(out_path) as w:
                    for r in gathered:
                        w.write(r)
            distributed.barrier(ctx)
            if target is not None:
                target.unlink(missing_ok=True)
            if rank == 0:
                new = gathered
        keys = {c.key for c in configs}
        if rank == 0 and out_path is not None and out_path.exists():
            by_key = {r.key: r for r in load_results(out_path) if r.key in keys}
        else:
            by_key = {r.key: r for r in new}
        results = [by_key[c.key] for c in configs if c.key in by_key]
        return ReplayRun(
            configs=configs,
            results=results,
            coverage=coverage(results),
            total_configs=len(all_configs),
            new=len(new),
            resumed=len(configs) - len(todo),
            skipped_graphs=skipped,
            device_name=replayer.device_name,
            energy_note=replayer.energy_note,
            rank=rank,
            world_size=world,
            out=out_path,
        )
    finally:
        if ctx is not None:
            distributed.finish(ctx)
