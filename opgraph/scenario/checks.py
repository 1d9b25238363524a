"""The check step of a run: every expectation of the scenario evaluated against what the run found.

:func:`planned_checks` lists the expectation ids a run will report (for test collection) without
running anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from opgraph.fmt import fmt_pct, fmt_us_sig, fmt_x
from opgraph.scenario.model import SERVING_METRICS, Bound, Expectations, Limit, Scenario, ServingSection
from opgraph.scenario.phases import PhaseRun
from opgraph.scenario.result import ExpectationResult, ReplaySummary, ScenarioSummary

FAILED_REPLAY = frozenset({"error", "oom", "mismatch"})
"""Replay statuses that count against ``replay_failures``."""


def check_phase(scenario: Scenario, run: PhaseRun) -> list[ExpectationResult]:
    """The phase's expectations (operators, makespan, utilisation, speedup, engines, errors), evaluated."""
    exp: Expectations = scenario.expectations(run.spec)
    label = run.spec.label
    out: list[ExpectationResult] = []

    def add(check: str, passed: bool, value: float | str | None, limit: str, message: str) -> None:
        out.append(
            ExpectationResult(
                id=f"{label}/{check}",
                phase=label,
                check=check,
                passed=passed,
                value=value,
                limit=limit,
                message=message,
            )
        )

    if run.coverage is not None:
        cov = run.coverage
        missing = cov.missing_required
        req = sum(o.required for o in cov.operators)
        add(
            "operators",
            not missing,
            ", ".join(missing) if missing else f"{req} of {req}",
            f"family {run.coverage_family}",
            f"missing required operators: {', '.join(missing)} (see {label}.coverage.txt)"
            if missing
            else f"all {req} required operators of {run.coverage_family} are present",
        )
    rows = {r.engines: r for r in run.rows}
    for check, bound, attr, fmt in (
        ("makespan_us", exp.makespan_us, "makespan_us", fmt_us_sig),
        ("utilization", exp.utilization, "utilization", fmt_pct),
        ("speedup", exp.speedup, "speedup", fmt_x),
    ):
        if bound is None:
            continue
        n = bound.engines or run.recommended
        value = float(getattr(rows[n], attr))
        ok, limit = within(value, bound, fmt)
        noun = check.removesuffix("_us")
        engines = f"{n} engine" + ("s" if n > 1 else "")
        add(check, ok, value, limit, f"{noun} {fmt(value)} ({engines}) {'is' if ok else 'is not'} {limit}")
    if exp.recommended_engines is not None:
        ok, limit = within(float(run.recommended), exp.recommended_engines, lambda v: f"{v:g}")
        add(
            "recommended_engines",
            ok,
            float(run.recommended),
            limit,
            f"the sweep recommends {run.recommended} engine(s), {'within' if ok else 'outside'} {limit}",
        )
    if exp.max_error is not None and run.comparison is not None:
        c = run.comparison
        values: dict[str, float | None] = {
            "gpu_time": abs(c.row("gpu_time").rel_error),
            "wall_time": abs(c.row("wall_time").rel_error),
            "median_op": c.median_abs_rel_error,
        }
        for key in ("gpu_time", "wall_time", "median_op"):
            limit_value = getattr(exp.max_error, key)
            if limit_value is None:
                continue
            v = values[key]
            ok = v is not None and math.isfinite(v) and v <= limit_value
            limit = f"<= {limit_value * 100:g}%"
            shown = "n/a" if v is None else f"{v * 100:.1f}%"
            add(
                f"max_error.{key}",
                ok,
                v,
                limit,
                f"|{key} error| {shown} against the measured timeline ({run.compare_engines} engine(s)) "
                f"{'is' if ok else 'is not'} {limit}",
            )
    return out


def check_replay(scenario: Scenario, replay: ReplaySummary | None) -> list[ExpectationResult]:
    """The ``replay_failures`` expectation, evaluated (none without a replay or a limit)."""
    limits = [
        e.replay_failures
        for e in (scenario.expect, *(p.expect for p in scenario.phases))
        if e is not None and e.replay_failures is not None
    ]
    if replay is None or not limits:
        return []
    limit = min(limits)
    bad = sum(n for st, n in replay.statuses.items() if st in FAILED_REPLAY)
    ok = bad <= limit
    detail = ", ".join(f"{st} {n}" for st, n in replay.statuses.items())
    return [
        ExpectationResult(
            id="replay/replay_failures",
            phase="replay",
            check="replay_failures",
            passed=ok,
            value=float(bad),
            limit=f"<= {limit}",
            message=f"{bad} of {replay.configs} replayed configs failed (error, oom or mismatch; {detail}), "
            f"{'within' if ok else 'above'} the limit {limit}",
        )
    ]


def within(value: float, bound: Bound | Limit, fmt: Callable[[float], str]) -> tuple[bool, str]:
    """Whether ``value`` is within ``bound``, and the bound as text (values shown with ``fmt``)."""
    ok = (bound.min is None or value >= bound.min) and (bound.max is None or value <= bound.max)
    if bound.min is not None and bound.max is not None:
        limit = f"within [{fmt(bound.min)}, {fmt(bound.max)}]"
    elif bound.min is not None:
        limit = f">= {fmt(bound.min)}"
    else:
        assert bound.max is not None
        limit = f"<= {fmt(bound.max)}"
    return ok, limit


def planned_checks(scenario: Scenario) -> list[str]:
    """The ids of the expectations a run of ``scenario`` reports, in order (for test collection)."""
    ids: list[str] = []
    for p in scenario.phases:
        exp = scenario.expectations(p)
        if exp.operators is not None:
            ids.append(f"{p.label}/operators")
        for check in ("makespan_us", "utilization", "speedup", "recommended_engines"):
            if getattr(exp, check) is not None:
                ids.append(f"{p.label}/{check}")
        if exp.max_error is not None and p.measured:
            for key in ("gpu_time", "wall_time", "median_op"):
                if getattr(exp.max_error, key) is not None:
                    ids.append(f"{p.label}/max_error.{key}")
    if scenario.replay is not None and any(
        e is not None and e.replay_failures is not None for e in (scenario.expect, *(p.expect for p in scenario.phases))
    ):
        ids.append("replay/replay_failures")
    if scenario.serving is not None:
        ids += serving_check_ids(scenario.serving)
    return ids


def serving_check_ids(section: ServingSection) -> list[str]:
    """Ids of the serving expectations a run reports (``serving/ttft_p99_ms``), in order."""
    exp = section.expect
    return [f"serving/{name}" for name in (*SERVING_METRICS, "dropped") if getattr(exp, name) is not None]


def failure_lines(summary: ScenarioSummary) -> list[str]:
    """One line per failed expectation: ``prefill makespan_us: ...``."""
    return [f"{e.phase} {e.check}: {e.message}" for e in summary.failures]
