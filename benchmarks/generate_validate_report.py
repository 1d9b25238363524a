"""Issue 20's validation, CPU side: each measured HF ``generate`` (``benchmarks/gpu/generate_validate.py``)
captured on meta as a planned generation and simulated with the CLI's defaults (``-H h100``: the shipped
device and host profiles), compared in total and step by step.

HF ``generate`` with N new tokens runs N forwards (a prefill and N-1 decodes); ``opgraph capture
--phase generate --new-tokens K`` records K+1 forwards, so K = N-1.

Per step: the measured time of forward ``i`` is its wall from its start to the next forward's start (the
host's clock in forward hooks: the forward and the sampling and bookkeeping ``generate`` does after it;
the last one: to ``generate``'s return; data that lack that clock leave the last step out); the
simulated time of step ``i`` is where the step's last span ends less where step ``i-1``'s ends (the
prefill: from 0), so the simulated steps add up to the makespan. The measured total is the median wall of
the timed runs; it also holds ``generate``'s set-up before the first forward pass, which the simulation
charges as the host profile's ``generate_setup_us`` (left out of the first simulated step, as the measured
steps start after it).

The host profile's generate-loop terms are fitted on the data's ``train`` cases alone (other models,
depths, batches and lengths than the validated cases): ``--fit-host-profile HOST_JSON`` writes them into
HOST_JSON, then reports with the CLI's defaults.

    python benchmarks/generate_validate_report.py [benchmarks/results/gpu/h100/generate/run4/generate_validate.json]
    python benchmarks/generate_validate_report.py DATA --fit-host-profile hardware/catalog/h100-sxm.host.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgraph.ir.timeline import union_length
from opgraph.trace.kineto import is_device_event, launch_times

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout_pool import QUIET, probe_line, quiet_rounds

DEFAULT = Path(__file__).resolve().parent / "results" / "gpu" / "h100" / "generate" / "run4" / "generate_validate.json"


@dataclass(frozen=True)
class StepComparison:
    """Measured against simulated step times of one generation (errors relative to the measured)."""

    measured_us: tuple[float, ...]
    simulated_us: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.measured_us) != len(self.simulated_us):
            raise ValueError(f"{len(self.measured_us)} measured steps but {len(self.simulated_us)} simulated")
        if not self.measured_us:
            raise ValueError("no steps to compare")

    @property
    def errors(self) -> tuple[float, ...]:
        """Relative error of each step: (simulated - measured) / measured."""
        return tuple((s - m) / m for m, s in zip(self.measured_us, self.simulated_us, strict=True))

    @property
    def prefill_error(self) -> float:
        """The prefill's (step 0's) error."""
        return self.errors[0]

    @property
    def decode_errors(self) -> tuple[float, ...]:
        """The decode steps' errors (steps 1..)."""
        return self.errors[1:]

    @property
    def median_decode_error(self) -> float:
        """The median of the decode steps' signed errors."""
        return statistics.median(self.decode_errors)

    @property
    def worst(self) -> tuple[int, float]:
        """The step (prefill included) with the largest error in magnitude, and that error."""
        step = max(range(len(self.errors)), key=lambda i: (abs(self.errors[i]), -i))
        return step, self.errors[step]

    @property
    def sum_error(self) -> float:
        """The error of the steps' sum."""
        return (sum(self.simulated_us) - sum(self.measured_us)) / sum(self.measured_us)


def step_ends(spans: Iterable[Any]) -> dict[int, float]:
    """Where each step's last span ends (spans without a step are left out)."""
    ends: dict[int, float] = {}
    for sp in spans:
        if sp.step is not None:
            ends[sp.step] = max(ends.get(sp.step, 0.0), sp.end_us)
    return ends


def simulated_steps(spans: Iterable[Any]) -> list[float]:
    """Each step's simulated time: its end less the end of the step before (step 0: from 0)."""
    ends = step_ends(spans)
    if sorted(ends) != list(range(len(ends))):
        raise ValueError(f"the timeline's steps are not 0..n: {sorted(ends)[:8]}")
    out, before = [], 0.0
    for step in range(len(ends)):
        end = max(ends[step], before)  # a step cannot end before the one it follows
        out.append(end - before)
        before = end
    return out


def capture_args(case: dict[str, Any], tmp: Path) -> list[str]:
    """The capture command's model and shape arguments: the case's exact config when it overrides the
    preset's, else the preset cut to the case's layers."""
    if case.get("overrides") and "config" in case:
        folder = tmp / f"{case['case']}-config"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(case["config"]))
        model = [str(folder / "config.json")]
    else:
        model = [case["preset"], "--layers", str(case["layers"])]
    shape = ["--batch", str(case["batch"]), "--seq-len", str(case["prompt"])]
    return [*model, "--phase", "generate", *shape, "--new-tokens", str(case["new_tokens"] - 1)]


def simulate_case(
    case: dict[str, Any], tmp: Path, config: Path | None = None, setup_us: float = 0.0
) -> tuple[float, list[float]]:
    """Capture and simulate ``case`` with the CLI's defaults (or the simulation ``config`` file):
    (makespan, per-step simulated times). The first step leaves out ``setup_us``, the host profile's
    ``generate_setup_us`` (generate's preamble, which the measured steps start after)."""
    from opgraph.ir import load_timeline

    graph, timeline = tmp / f"{case['case']}.json.gz", tmp / f"{case['case']}.timeline.json.gz"
    if not graph.exists():
        capture = [sys.executable, "-m", "opgraph", "capture", *capture_args(case, tmp), "-o", str(graph)]
        subprocess.run(capture, check=True, capture_output=True)
    sim = [sys.executable, "-m", "opgraph", "simulate", str(graph), "-H", "h100", "--policy", "stream", "--json"]
    if config is not None:
        sim += ["--config", str(config)]
    out = json.loads(subprocess.run([*sim, "-o", str(timeline)], check=True, capture_output=True, text=True).stdout)
    steps = simulated_steps(load_timeline(timeline).spans)
    steps[0] -= setup_us
    return float(out["generation"]["makespan_us"]), steps


def shipped_setup_us() -> float:
    """The shipped H100 host profile's ``generate_setup_us`` (what the CLI's default simulation adds)."""
    from hardware import hardware_host_profile, load_host_profile

    path = hardware_host_profile("h100-sxm")
    return load_host_profile(path).generate_setup_us if path is not None else 0.0


def compare_steps(case: dict[str, Any], simulated: Sequence[float]) -> StepComparison:
    """A case's measured steps against the simulated ones; data without ``generate``'s return clock
    (``setup_us`` absent: the first run's) time the last forward alone, so the last step is left out."""
    measured = list(case["step_wall_us"])
    sim = list(simulated)
    if "setup_us" not in case:
        measured, sim = measured[:-1], sim[:-1]
    return StepComparison(tuple(measured), tuple(sim))


SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


@dataclass(frozen=True)
class TracedForward:
    """One forward of a profiled ``generate`` (times in us; host times include the profiler's overhead)."""

    host_us: float
    """The forward's host time (its ``opgraph_forward_<i>`` range)."""
    gpu_busy_us: float
    """Device time of the work it launched (the union of its kernels', copies' and fills' intervals)."""
    kernels: int
    """Kernels it launched."""
    syncs: int
    """Host-device synchronisations inside it."""


def traced_forwards(trace: dict[str, Any]) -> list[TracedForward]:
    """Per forward of a profiler trace whose forwards are marked ``opgraph_forward_<i>``."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    marks = sorted(
        (int(e["name"].rsplit("_", 1)[1]), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("opgraph_forward_")
    )
    launches = launch_times(events)
    gpu: dict[Any, list[tuple[float, float, str]]] = {}
    for e in events:
        if is_device_event(e):
            corr = e.get("args", {}).get("correlation")
            gpu.setdefault(corr, []).append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["cat"]))
    out = []
    for _, lo, hi in marks:
        work = [w for c, t in launches.items() if lo <= t <= hi for w in gpu.get(c, [])]
        out.append(
            TracedForward(
                host_us=hi - lo,
                gpu_busy_us=union_length((a, b) for a, b, _ in work),
                kernels=sum(1 for *_, cat in work if cat == "kernel"),
                syncs=sum(1 for e in events if e.get("name") in SYNCS and lo <= float(e["ts"]) <= hi),
            )
        )
    return out


def pct(x: float) -> str:
    """A relative error as a signed percentage."""
    return f"{x * 100:+.1f}%"


def fastest_passes(cases: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case, its measured pass of the lowest median wall (the host's slowdowns only add time)."""
    best: dict[str, dict[str, Any]] = {}
    for c in cases:
        if "error" in c:
            continue
        kept = best.get(c["case"])
        if kept is None or c["wall_us"]["median"] < kept["wall_us"]["median"]:
            best[c["case"]] = c
    return best


TRAIN = "train"
"""The ``role`` of a measured case that the host profile's generate-loop terms may be fitted on."""


def _row(c: dict[str, Any], pred: float, cmp: StepComparison, with_pass: bool) -> str:
    meas, fastest = c["wall_us"]["median"], min(c["wall_us"]["runs"])
    step, worst = cmp.worst
    row = [c["case"] + (" (training)" if c.get("role") == TRAIN else "")]
    if with_pass:
        probe = c.get("host_probe", {})
        row += [str(c.get("pass", 0))]
        row += [f"{probe['launch_us']:.1f}" if "launch_us" in probe else ""]
        row += [f"{probe['python_loop_ns']:.0f}" if "python_loop_ns" in probe else ""]
    row += [f"{meas / 1e3:.1f}", f"{fastest / 1e3:.1f}", f"{pred / 1e3:.1f}"]
    row += [pct((pred - meas) / meas), pct((pred - fastest) / fastest), pct(cmp.prefill_error)]
    row += [f"{statistics.median(v[1:]) / 1e3:.2f}" for v in (cmp.measured_us, cmp.simulated_us)]
    row += [pct(cmp.median_decode_error), f"{pct(worst)} (step {step})"]
    return "| " + " | ".join(row) + " |"


def report(data: dict[str, Any], tmp: Path, base: Path | None = None) -> list[str]:
    """The report's lines (markdown); ``base`` is where the data's traces are (their section is left
    out without it)."""
    versions = f"torch {data['torch']}, transformers {data['transformers']}, {data['date']}"
    lines = [f"measured on {data['gpu']} ({versions})", ""]
    cols = "| measured ms (median) | fastest ms | predicted ms | error | error vs fastest | prefill error "
    cols += "| decode step: measured ms (median) | predicted ms | median step error | worst step error |"
    sims: dict[str, tuple[float, list[float]]] = {}
    rows, details, errors = [], [], []
    setup = shipped_setup_us()
    for c in data["cases"]:
        if "error" in c:
            errors.append(f"- {c['case']} pass {c.get('pass', 0)}: {c['error']}")
            continue
        if c["case"] not in sims:
            sims[c["case"]] = simulate_case(c, tmp, setup_us=setup)
        pred, sim_steps = sims[c["case"]]
        cmp = compare_steps(c, sim_steps)
        rows.append(_row(c, pred, cmp, "host_probes" not in data))
        label = f"{c['case']} pass {c['pass']}" if "pass" in c else c["case"]
        details.append(f"- {label}: " + ", ".join(step_line(cmp)))
    best = fastest_passes(data["cases"])
    if any(c.get("pass", 0) for c in data["cases"]):
        lines += ["Per case, its faster pass (the host's slowdowns only add time):", ""]
        lines += ["| case " + cols, "|---|" + "---:|" * 10]
        for name, c in best.items():
            lines.append(_row(c, sims[name][0], compare_steps(c, sims[name][1]), False))
        lines += ["", "Every pass (host probe: us per tiny kernel launch, ns per pure-Python loop step):", ""]
    if "host_probes" in data:
        quiet = quiet_rounds(data["host_probes"])
        lines += [probe_line(data["host_probes"]), ""]
        lines += [f"Quiet rounds (both probes within {QUIET - 1:.0%} of their fastest): {quiet}", ""]
        lines += ["| case " + cols, "|---|" + "---:|" * 10]
        quiet_details = []
        for c in data["cases"]:
            if "error" in c or "hooked_runs" not in c:
                continue
            q = restrict(c, quiet)
            qcmp = compare_steps(q, sims[c["case"]][1])
            lines.append(_row(q, sims[c["case"]][0], qcmp, False))
            quiet_details.append(f"- {c['case']} (quiet rounds): " + ", ".join(step_line(qcmp)))
        details = quiet_details + details
        lines += ["", "All rounds:", "", "| case " + cols, "|---|" + "---:|" * 10, *rows]
    else:
        lines += ["| case | pass | probe us | probe ns " + cols, "|---|" + "---:|" * 13, *rows]
    if errors:
        lines += ["", "Failed:", "", *errors]
    lines += ["", "Per step (step: measured / simulated ms, error):", "", *details]
    if base is not None:
        lines += trace_section(data, base)
    return lines


def restrict(case: dict[str, Any], rounds: Sequence[int]) -> dict[str, Any]:
    """``case`` measured over ``rounds`` only: walls and per-forward medians of those rounds' runs."""
    if not rounds:
        raise ValueError("no rounds to keep")
    walls = [case["wall_us"]["runs"][r] for r in rounds]
    hooked = [case["hooked_runs"][r] for r in rounds]
    n = min(len(h["step_wall_us"]) for h in hooked)
    steps = [statistics.median(h["step_wall_us"][i] for h in hooked) for i in range(n)]
    return {
        **case,
        "wall_us": {"median": statistics.median(walls), "min": min(walls), "runs": walls},
        "setup_us": statistics.median(h["setup_us"] for h in hooked),
        "step_wall_us": steps,
    }


def trace_section(data: dict[str, Any], base: Path) -> list[str]:
    """A table of the profiled runs' forwards (decode medians), for the cases that have a trace."""
    import gzip

    rows = []
    for c in data["cases"]:
        path = base / str(c.get("trace", ""))
        if "trace" not in c or not path.is_file():
            continue
        with gzip.open(path, "rt") as fh:
            fwd = traced_forwards(json.load(fh))
        if len(fwd) < 2:
            continue
        dec = fwd[1:]
        med = [statistics.median(getattr(f, k) for f in dec) for k in ("host_us", "gpu_busy_us", "kernels", "syncs")]
        row = [c["case"], f"{fwd[0].host_us / 1e3:.2f}", f"{fwd[0].gpu_busy_us / 1e3:.2f}"]
        row += [f"{med[0] / 1e3:.2f}", f"{med[1] / 1e3:.2f}", f"{med[2]:.0f}", f"{med[3]:.0f}"]
        rows.append("| " + " | ".join(row) + " |")
    if not rows:
        return []
    head = "| case | prefill host ms | prefill GPU busy ms | decode host ms | decode GPU busy ms | kernels | syncs |"
    intro = "Profiled runs (one generate under torch.profiler, whose overhead inflates host times; "
    intro += "decode: medians per forward):"
    return ["", intro, "", head, "|---|---:|---:|---:|---:|---:|---:|", *rows]


def step_line(cmp: StepComparison) -> Sequence[str]:
    """One ``step: measured/simulated (error)`` item per step."""
    return [
        f"{i}: {m / 1e3:.2f}/{s / 1e3:.2f} ({pct(e)})"
        for i, (m, s, e) in enumerate(zip(cmp.measured_us, cmp.simulated_us, cmp.errors, strict=True))
    ]


@dataclass(frozen=True)
class LoopFit:
    """The host profile's generate-loop terms fitted on training generations (times in us)."""

    step_us: float
    """Median over the training cases' steps (quiet rounds) of measured minus simulated step time, the
    simulation run without the terms (host-bound steps: the missing host time)."""
    setup_us: float
    """Median of the training cases' measured time before the prompt's forward pass."""
    cases: tuple[str, ...]
    residuals_us: tuple[float, ...]

    def note(self, source: str) -> str:
        """The host profile note that says where the terms came from."""
        spread = sorted(self.residuals_us)
        return (
            f"generate_step_us {self.step_us:.1f} and generate_setup_us {self.setup_us:.1f} fitted by "
            f"benchmarks/generate_validate_report.py --fit-host-profile on {source} ({len(self.cases)} training "
            f"generations: {', '.join(self.cases)}; {len(spread)} steps, residuals {spread[0]:.0f}.."
            f"{spread[-1]:.0f} us)"
        )


def fit_loop_terms(data: dict[str, Any], tmp: Path, host_profile: Path) -> LoopFit:
    """Fit :class:`LoopFit` on the ``train`` cases of ``data`` (their quiet rounds when the data has host
    probes), simulated with ``host_profile`` less its generate-loop terms."""
    from hardware import load_host_profile

    train = [c for c in data["cases"] if c.get("role") == TRAIN and "error" not in c]
    if not train:
        raise ValueError("the data has no training generations (cases with role 'train')")
    zeroed = tmp / "host-without-loop-terms.json"
    load_host_profile(host_profile).model_copy(update={"generate_step_us": 0.0, "generate_setup_us": 0.0}).save(zeroed)
    config = tmp / "fit-config.json"
    config.write_text(json.dumps({"host": {"host_profile": str(zeroed)}}))
    rounds = quiet_rounds(data["host_probes"]) if "host_probes" in data else None
    residuals: list[float] = []
    setups: list[float] = []
    for c in train:
        _, steps = simulate_case(c, tmp, config)
        q = restrict(c, rounds) if rounds else c
        cmp = compare_steps(q, steps)
        residuals += [m - s for m, s in zip(cmp.measured_us, cmp.simulated_us, strict=True)]
        setups.append(float(q["setup_us"]))
    return LoopFit(
        statistics.median(residuals), statistics.median(setups), tuple(c["case"] for c in train), tuple(residuals)
    )


def main(argv: list[str]) -> int:
    """The report of DATA; with ``--fit-host-profile HOST_JSON``, first fit the host profile's
    generate-loop terms on DATA's training cases and write them into HOST_JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT, help="generate_validate.json")
    parser.add_argument("--fit-host-profile", type=Path, default=None, metavar="HOST_JSON")
    args = parser.parse_args(argv)
    path: Path = args.data
    data = json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        if args.fit_host_profile is not None:
            from hardware import load_host_profile

            # The captures are kept for the report; only their simulations change with the new terms.
            fit = fit_loop_terms(data, Path(tmp), args.fit_host_profile)
            profile = load_host_profile(args.fit_host_profile)
            notes = [n for n in profile.notes if not n.startswith("generate_step_us ")]
            profile.model_copy(
                update={
                    "generate_step_us": round(fit.step_us, 1),
                    "generate_setup_us": round(fit.setup_us, 1),
                    "notes": (*notes, fit.note(f"{path.parent.name}/{path.name} ({data['date']})")),
                }
            ).save(args.fit_host_profile)
            print(f"fitted: {fit.note(path.name)}", file=sys.stderr)
        print("\n".join(report(data, Path(tmp), path.parent)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
