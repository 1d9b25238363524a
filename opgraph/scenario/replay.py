"""The replay step of a run: replay the unique ops of every phase's graph on a device."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from opgraph.ir import OpgraphError
from opgraph.scenario.context import RunContext
from opgraph.scenario.phases import PhaseRun
from opgraph.scenario.result import ReplaySummary

REPLAY_FILE = "replay.jsonl"
"""The replay results in the output folder."""


def replay_ops(ctx: RunContext, runs: Sequence[PhaseRun]) -> ReplaySummary | None:
    """Replay the unique ops of the phases' graphs as the scenario's ``[replay]`` asks; None without one."""
    rp = ctx.scenario.replay
    if rp is None:
        return None
    from validators import ReplayOptions, TimingConfig, run_replay

    timing = TimingConfig(
        warmup_ms=5.0,
        min_warmup=1,
        min_samples=min(3, rp.max_samples),
        max_samples=rp.max_samples,
        max_time_s=rp.max_time_s,
    )
    kinds = set(rp.kinds)
    try:
        run = run_replay(
            [r.graph for r in runs],
            device=rp.device,
            out=ctx.write(REPLAY_FILE),
            options=ReplayOptions(timing=timing, check=rp.check, energy=False),
            select=(lambda c: c.op.kind in kinds) if kinds else None,
            limit=rp.max_configs,
        )
    except OpgraphError as exc:
        raise ctx.err(exc, "replay") from None
    statuses = Counter(r.status.value for r in run.results)
    return ReplaySummary(
        device=rp.device,
        device_name=run.device_name,
        configs=len(run.configs),
        total_configs=run.total_configs,
        statuses=dict(sorted(statuses.items())),
        results=REPLAY_FILE,
    )
